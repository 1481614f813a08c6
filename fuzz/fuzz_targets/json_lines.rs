//! JSON Lines records: any bytes (as a plain, gzip or zstd file) open or fail with an error,
//! never panic; every sample of what opens reads, or fails with an error naming the line, one
//! by one and as a batch.

#![no_main]

use bytes::Bytes;
use chute_core::{BufferPool, Source};
use chute_formats::ipc::ArrowOptions;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let name = ["fuzz.jsonl", "fuzz.jsonl.gz", "fuzz.jsonl.zst", "fuzz.json"][pick as usize % 4];
    let contents = vec![(name.to_string(), Bytes::copy_from_slice(rest))];
    let Ok(source) = chute_formats::json::from_bytes(contents, ArrowOptions::default()) else {
        return;
    };
    let n = source.manifest().total_samples();
    let ids: Vec<u64> = (0..n.min(1 << 12)).collect();
    for &id in &ids {
        let _ = source.read(id);
    }
    if !ids.is_empty() {
        let _ = source.collate(&ids, &BufferPool::new(4));
    }
});
