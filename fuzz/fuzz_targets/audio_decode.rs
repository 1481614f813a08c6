//! Audio through `chute_ops::audio`: any bytes probed and decoded (every container and codec
//! Symphonia reads, Opus through libopus, chute's own MP4 edit-list and Matroska
//! DiscardPadding walks), then resampled and cropped: each either works or fails with an
//! error; never a panic, never an allocation a header merely claims (decoding stops at
//! `max_seconds`, here 4 s). A panic inside Symphonia (an arithmetic overflow the fuzz build
//! checks and release builds wrap) is caught quietly by `chute_ops::audio` and becomes the
//! sample's error, as users get it (`chute_core::quiet` keeps libFuzzer's hook from aborting
//! there); a panic anywhere else still fails the run.

#![no_main]

use bytes::Bytes;
use chute_ops::audio::{self, AudioLimits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let bytes = Bytes::copy_from_slice(data);
    let _ = audio::probe(&bytes);
    let limits = AudioLimits {
        max_seconds: 4.0,
        max_channels: 8,
        ..AudioLimits::default()
    };
    let Ok(a) = audio::decode(&bytes, &limits) else {
        return;
    };
    assert!(a.frames() as f64 <= 4.0 * f64::from(a.rate) + 1.0);
    assert_eq!(a.data.len(), a.channels * a.frames());
    if a.rate > 0 && a.frames() <= 1 << 16 {
        let r = audio::resample::resample(&a, 16_000);
        assert_eq!(r.frames(), audio::resample::output_frames(a.frames(), a.rate, 16_000));
        let (c, kept) = audio::crop(&r, 4000, Some(0.5));
        assert!(kept <= 4000 && c.frames() == 4000);
    }
});
