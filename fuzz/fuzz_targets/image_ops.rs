//! Image decoding through the ops pipeline (`chute_ops`): any bytes as a `jpg` field, under a
//! pipeline the first byte picks (a plain decode, the fused crop and resize paths that decode
//! a region or a DCT-scaled image, normalize and CHW into the batch slot, a small pixel limit),
//! either decode or fail with an error; never a panic, never an allocation the header merely
//! claims. Both ways the engine runs a pipeline: `apply`, and `apply_into` a batch slot. Images
//! are limited to 2^16 pixels (`max_image_pixels`) so an execution stays cheap.

#![no_main]

mod common;

use bytes::Bytes;
use chute_core::{Field, Sample, SampleRng, Transform};
use chute_ops::SampleOps;
use libfuzzer_sys::fuzz_target;

const SPECS: [&str; 6] = [
    r#"{"jpg": [{"op": "decode"}]}"#,
    r#"{"jpg": [{"op": "decode"}, {"op": "random_resized_crop", "size": 32}, {"op": "horizontal_flip"}]}"#,
    r#"{"jpg": [{"op": "decode"}, {"op": "resize", "size": 16}, {"op": "center_crop", "size": 16}]}"#,
    r#"{"jpg": [{"op": "decode"}, {"op": "resize", "size": [24, 24]}, {"op": "normalize", "mean": [0.5, 0.5, 0.5], "std": [0.2, 0.2, 0.2]}, {"op": "chw"}]}"#,
    r#"{"jpg": [{"op": "decode", "max_pixels": 4096}]}"#,
    r#"{"jpg": [{"op": "decode", "mode": "gray"}, {"op": "random_resized_crop", "size": [8, 12]}]}"#,
];

fuzz_target!(|data: &[u8]| {
    common::limit("max_image_pixels", 1 << 16);
    let Some((&pick, image)) = data.split_first() else {
        return;
    };
    let Ok(pipeline) = SampleOps::from_json(SPECS[pick as usize % SPECS.len()]) else {
        return; // a spec this build refuses (an op it lacks) tests nothing
    };
    let sample = Sample::new(7).with("jpg", Field::Bytes(Bytes::copy_from_slice(image)));
    let mut s = sample.clone();
    let _ = pipeline.apply(&mut s, &mut SampleRng::for_sample(1, 0, 7));
    let slots = pipeline.slots().to_vec();
    if !slots.is_empty() {
        let mut bufs: Vec<Vec<u8>> = slots.iter().map(|slot| vec![0u8; slot.nbytes()]).collect();
        let mut out: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        let mut s = sample;
        let _ = pipeline.apply_into(&mut s, &mut SampleRng::for_sample(1, 0, 7), &mut out);
    }
});
