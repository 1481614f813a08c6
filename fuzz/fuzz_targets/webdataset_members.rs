//! WebDataset members the `auto` op decodes beyond text and JSON: msgpack, `.npz` (zip,
//! deflate) and tenbin. Never panics, never allocates what a member merely claims: a value's
//! payload is at most the input's size (msgpack, tenbin) or the decompression budget (`.npz`).

#![no_main]

use bytes::Bytes;
use chute_ops::members::{msgpack, npz, tenbin};
use libfuzzer_sys::fuzz_target;

/// The `.npz` budget here: decompressing past it is refused, whatever the archive claims.
const BUDGET: u64 = 1 << 22;

fuzz_target!(|data: &[u8]| {
    let b = Bytes::copy_from_slice(data);
    if let Ok(v) = msgpack(&b) {
        assert!(v.nbytes() <= 8 * data.len(), "msgpack made more than its input holds");
    }
    if let Ok(v) = tenbin(&b) {
        assert!(v.nbytes() <= data.len(), "tenbin arrays larger than the input");
    }
    if let Ok(v) = npz(&b, BUDGET) {
        assert!(v.nbytes() as u64 <= BUDGET, "npz decompressed past its budget");
    }
});
