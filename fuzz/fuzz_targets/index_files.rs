//! Every index-file parser (WebDataset `<shard>.idx`, TFRecord's DALI index, `manifest.json`):
//! never panics on any bytes, and whatever parses writes back to text that parses to the same
//! index.

#![no_main]

use chute_core::Manifest;
use chute_formats::tfrecord::{parse_index, write_index_to};
use chute_formats::webdataset::ShardIndex;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(index) = ShardIndex::parse_bytes(data, "fuzz.idx") {
        let again = ShardIndex::parse(&index.to_text(), "re-written").expect("chute's own index parses");
        assert_eq!(again, index);
    }
    if let Ok(entries) = parse_index(data, "fuzz.tfrecord.idx") {
        let mut text = Vec::new();
        write_index_to(&mut text, &entries).expect("writing to memory");
        assert_eq!(parse_index(&text, "re-written").expect("chute's own index parses"), entries);
    }
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(manifest) = Manifest::from_json(text, "fuzz.json")
    {
        let again = Manifest::from_json(&manifest.to_json(), "re-written").expect("chute's own manifest parses");
        assert_eq!(again, manifest);
    }
});
