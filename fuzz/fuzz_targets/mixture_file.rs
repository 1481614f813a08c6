//! Mixture files (`chute_dataset::mixture::file`) and the mixture they build: any bytes either give
//! a clear error or a mixture whose draws are consistent (each position's draw number is the
//! count of its component's earlier positions), never a panic or a hang. Components are
//! synthetic sources named by their paths' lengths, so no file is opened.

#![no_main]

use std::path::Path;
use std::sync::Arc;

use chute_core::{Array, Field, FnSource, Sample, Source};
use chute_dataset::mixture::file::mixture_from_json;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let open = |paths: &[std::path::PathBuf], _: &chute_dataset::OpenOptions| {
        let len = 1 + paths.iter().map(|p| p.as_os_str().len() as u64).sum::<u64>() % 50;
        let src = FnSource::new("fuzz", len, |id| {
            Ok(Sample::new(id).with("v", Field::Array(Array::scalar_i64(id as i64))))
        });
        Ok(Arc::new(src) as Arc<dyn Source>)
    };
    let Ok(m) = mixture_from_json(data, "fuzz.json", Path::new(""), &open) else {
        return;
    };
    let k = m.components().len();
    let mut counts = vec![0u64; k];
    for g in 0..m.samples_per_epoch().min(256) {
        let (c, n) = m.locate(g, 0);
        assert!(c < k);
        assert_eq!(n, counts[c], "position {g}");
        counts[c] += 1;
        m.read(g).expect("a synthetic component reads");
    }
});
