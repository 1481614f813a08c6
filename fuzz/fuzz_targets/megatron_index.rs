//! Megatron-Core `.idx` files (`chute_formats::megatron`): any bytes, against a `.bin` of any
//! length (the input's first 8 bytes), either give a clear error or an index whose every
//! sequence lies inside the `.bin`; never a panic or an allocation the header merely claims.

#![no_main]

use bytes::Bytes;
use chute_formats::MegatronIndex;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let bin_len = u64::from_le_bytes(data[..8].try_into().expect("8 bytes")) % (1 << 40);
    let idx = Bytes::copy_from_slice(&data[8..]);
    let Ok(ix) = MegatronIndex::parse(idx, "fuzz.idx", bin_len) else {
        return;
    };
    let size = ix.dtype().size() as u64;
    let mut tokens = 0u64;
    for i in 0..ix.len().min(1 << 14) {
        let (first, len) = ix.sequence(i);
        assert!((first + len) * size <= bin_len, "sequence {i} past the .bin");
        tokens += len;
    }
    if ix.len() <= 1 << 14 {
        assert_eq!(tokens, ix.tokens());
    }
});
