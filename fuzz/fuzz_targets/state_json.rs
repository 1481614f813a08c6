//! Loader states (`state_dict()` JSON): any text either is refused with a `StateError` or
//! resumes a loader that then delivers its batches or a clear error; never a panic or a
//! hang. The state's fingerprint, seed and shuffle are made the loader's (when it parses),
//! so the positions, counts and world size inside it are what is exercised.

#![no_main]

use chute_core::{Array, Field, FnSource, Sample, Source, State};
use chute_pipeline::Loader;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(state) = State::from_json(text) else {
        return;
    };
    for adopt in [false, true] {
        let source = FnSource::new("fuzz", 37, |id| {
            Ok(Sample::new(id).with("v", Field::Array(Array::scalar_i64(id as i64))))
        });
        let fingerprint = source.manifest().fingerprint();
        let mut state = state.clone();
        let mut builder = Loader::builder(source).batch_size(4).num_workers(0);
        if adopt {
            state.dataset = fingerprint;
            builder = builder.seed(state.seed).shuffle(state.shuffle);
        }
        let Ok(mut loader) = builder.build() else {
            continue;
        };
        if loader.restore(&state).is_err() {
            continue;
        }
        for batch in loader.by_ref().take(16) {
            let _ = batch;
        }
    }
});
