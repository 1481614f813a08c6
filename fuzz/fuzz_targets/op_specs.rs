//! Op specs (`SampleOps::from_json`, the `transforms=` JSON): any text is refused with a clear
//! error or builds a pipeline that runs on a sample of every kind of field (a JPEG, a label,
//! text, an `.npy`, raw bytes), giving values or errors; never a panic. Op outputs are limited
//! to 2^16 pixels (`max_image_pixels`) so an execution stays cheap.

#![no_main]

mod common;

use std::sync::OnceLock;

use bytes::Bytes;
use chute_core::{Field, Sample, SampleRng, Transform};
use chute_ops::SampleOps;
use libfuzzer_sys::fuzz_target;

/// A 20 x 12 RGB JPEG.
fn jpeg() -> &'static Bytes {
    static JPEG: OnceLock<Bytes> = OnceLock::new();
    JPEG.get_or_init(|| {
        let pixels: Vec<u8> = (0..20 * 12 * 3).map(|i| (i * 7 % 251) as u8).collect();
        let mut out = Vec::new();
        jpeg_encoder::Encoder::new(&mut out, 90)
            .encode(&pixels, 20, 12, jpeg_encoder::ColorType::Rgb)
            .expect("encodes");
        Bytes::from(out)
    })
}

fuzz_target!(|data: &[u8]| {
    common::limit("max_image_pixels", 1 << 16);
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(pipeline) = SampleOps::from_json(text) else {
        return;
    };
    let npy = chute_core::npy::write_npy(chute_core::DType::F32, &[2, 3], &[0u8; 24])
        .expect("writes");
    let sample = Sample::new(3)
        .with("jpg", Field::Bytes(jpeg().clone()))
        .with("cls", Field::Bytes(Bytes::from_static(b"7")))
        .with("txt", Field::Text(Bytes::from_static(b"a caption")))
        .with("npy", Field::Bytes(Bytes::from(npy)))
        .with("json", Field::Bytes(Bytes::from_static(b"[1, 2.5, 3]")))
        .with("bin", Field::Bytes(Bytes::from_static(b"\x00\xff\x10")));
    let mut s = sample.clone();
    let _ = pipeline.apply(&mut s, &mut SampleRng::for_sample(2, 0, 3));
    let slots = pipeline.slots().to_vec();
    if !slots.is_empty() && slots.iter().all(|slot| slot.nbytes() <= 1 << 24) {
        let mut bufs: Vec<Vec<u8>> = slots.iter().map(|slot| vec![0u8; slot.nbytes()]).collect();
        let mut out: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        let mut s = sample;
        let _ = pipeline.apply_into(&mut s, &mut SampleRng::for_sample(2, 0, 3), &mut out);
    }
});
