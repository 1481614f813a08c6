//! Arrow IPC files and streams: opening any bytes never panics and never allocates what a
//! message merely claims; every sample of what opens reads, or fails with an error, one by
//! one and as a batch.

#![no_main]

use bytes::Bytes;
use chute_core::{BufferPool, Source};
use chute_formats::ipc::{ArrowOptions, ArrowSource};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let contents = vec![("fuzz.arrow".to_string(), Bytes::copy_from_slice(data))];
    let Ok(source) = ArrowSource::from_bytes(contents, ArrowOptions::default()) else {
        return;
    };
    let n = source.manifest().total_samples();
    // Row counts are bounded by the buffers: 8 rows a byte, 8 more a batch.
    assert!(n <= 9 * data.len() as u64 + 8, "{n} rows from {} bytes", data.len());
    let ids: Vec<u64> = (0..n.min(1 << 12)).collect();
    for &id in &ids {
        let _ = source.read(id);
    }
    if !ids.is_empty() {
        let _ = source.collate(&ids, &BufferPool::new(4));
    }
});
