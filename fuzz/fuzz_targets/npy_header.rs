//! numpy's `.npy` header: never panics, never allocates what the header merely claims, and a
//! header that parses describes an array that `write_npy` writes back to the same header.

#![no_main]

use chute_core::npy::{NpyHeader, read_npy, write_npy};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let whole = read_npy(data, "fuzz");
    let Ok((header, start)) = NpyHeader::parse(data, "fuzz") else {
        assert!(whole.is_err(), "read_npy accepted a header parse refused");
        return;
    };
    assert!(start <= data.len(), "the data starts past the input");
    if let Ok((h, body)) = whole {
        assert_eq!(h, header);
        assert_eq!(body.len(), header.data_len());
    }
    // Round trip through the writer for arrays small enough to build.
    if header.data_len() <= 1 << 16 {
        let bytes = vec![0u8; header.data_len()];
        let written = write_npy(header.dtype(), header.shape(), &bytes).expect("a parsed header writes");
        let (again, body) = read_npy(&written, "re-written").expect("chute's own .npy reads");
        assert_eq!(again.dtype(), header.dtype());
        assert_eq!(again.shape(), header.shape());
        assert_eq!(body.len(), bytes.len());
    }
});
