//! Parquet files: opening any bytes never panics, never aborts on an allocation a footer,
//! page header or row count merely claims (chute checks them first, against
//! `max_decoded_bytes` and the shard budget), and every sample of what opens reads or fails
//! with an error, one by one and as a batch. `max_decoded_bytes` is 16 MiB here, so a file
//! that declares (within the limit) a gigabyte of rows costs an execution little, and the
//! decoded cache 64 MiB.

#![no_main]

mod common;

use bytes::Bytes;
use chute_core::{BufferPool, Source};
use chute_formats::parquet::{ParquetOptions, ParquetSource};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    common::limit("max_decoded_bytes", 16 << 20);
    let contents = vec![("fuzz.parquet".to_string(), Bytes::copy_from_slice(data))];
    // A small decoded cache, so that what an execution holds stays far below the RSS limit
    // and an allocation the limits miss stands out.
    let options = ParquetOptions {
        cache_bytes: Some(64 << 20),
        ..ParquetOptions::default()
    };
    let Ok(source) = ParquetSource::from_bytes(contents, options) else {
        return;
    };
    let n = source.manifest().total_samples();
    let ids: Vec<u64> = (0..n.min(1 << 10)).collect();
    for &id in &ids {
        let _ = source.read(id);
    }
    if !ids.is_empty() {
        let _ = source.collate(&ids, &BufferPool::new(4));
    }
});
