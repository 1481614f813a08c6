//! The tar decoder and the WebDataset layer on top of it: on any input, never panic, and
//! every way of reading agrees with every other:
//!
//! - the slice reader and the streaming decoder (fed in pieces) find the same members, or
//!   fail with the same error;
//! - members lie inside the input, in order, block-aligned, and each one decodes alone from
//!   its own range (what the index relies on);
//! - WebDataset samples read in one pass equal the samples read through the index, one range
//!   at a time; and samples chute can write back read back the same.
//!
//! The first input byte is a control byte: it sets the size of the pieces the streaming
//! decoder is fed.

#![no_main]

use bytes::Bytes;
use chute_formats::check::same_sample;
use chute_formats::tar::{BLOCK_SIZE, TarDecoder, TarOptions, TarSlice};
use chute_formats::webdataset::{SampleWriter, Samples, ShardIndex, read_sample};
use libfuzzer_sys::fuzz_target;

/// Small limits, so hostile sizes hit them too.
const OPTIONS: TarOptions = TarOptions {
    max_member_size: 1 << 20,
    max_header_size: 4096,
};

type Found = Vec<(Vec<u8>, u64, u64, u64)>;

fn slice_members(data: &[u8]) -> Result<Found, String> {
    let mut t = TarSlice::new(data, "fuzz", OPTIONS);
    let mut out = Vec::new();
    while let Some((m, d)) = t.next_member().map_err(|e| e.to_string())? {
        assert_eq!(d.len() as u64, m.size);
        assert_eq!(d.as_ptr(), data[m.data_offset as usize..].as_ptr());
        out.push((m.path.to_vec(), m.header_offset, m.data_offset, m.size));
    }
    // Done means done.
    assert!(matches!(t.next_member(), Ok(None)));
    Ok(out)
}

fn streamed_members(data: &[u8], piece: usize) -> Result<Found, String> {
    let mut d = TarDecoder::new("fuzz", OPTIONS);
    let mut out = Vec::new();
    for chunk in data.chunks(piece) {
        let mut rest = chunk;
        while !rest.is_empty() {
            let (used, m) = d.decode(rest).map_err(|e| e.to_string())?;
            assert!(used <= rest.len());
            if let Some(m) = m {
                out.push((m.path.to_vec(), m.header_offset, m.data_offset, m.size));
            } else {
                assert_eq!(used, rest.len(), "no member, yet input left over");
            }
            rest = &rest[used..];
        }
    }
    d.finish().map_err(|e| e.to_string())?;
    Ok(out)
}

fuzz_target!(|input: &[u8]| {
    let Some((&control, data)) = input.split_first() else {
        return;
    };
    let piece = 1 + usize::from(control) * 7;

    let sliced = slice_members(data);
    let streamed = streamed_members(data, piece);
    match (&sliced, &streamed) {
        (Ok(a), Ok(b)) => assert_eq!(a, b),
        (Err(a), Err(b)) => assert_eq!(a, b),
        // The slice reader checks a member's data is all there before handing it out; the
        // streaming decoder hands out the header at once and fails at the end instead.
        (Err(a), Ok(_)) | (Ok(_), Err(a)) => panic!("readers disagree: {a}"),
    }

    if let Ok(members) = &sliced {
        let block = BLOCK_SIZE as u64;
        let mut prev_end = 0;
        for (path, header, data_at, size) in members {
            assert!(*header >= prev_end && header % block == 0 && data_at % block == 0);
            assert!(header < data_at && data_at + size <= data.len() as u64);
            let end = (data_at + size).div_ceil(block) * block;
            prev_end = end;
            // Each member decodes alone from its range.
            let range = &data[*header as usize..(end as usize).min(data.len())];
            let mut f = TarSlice::fragment(range, *header, "fuzz", OPTIONS);
            let (m, _) = f.next_member().unwrap().expect("the member is there");
            assert_eq!(
                (&m.path.to_vec(), m.data_offset, m.size),
                (path, *data_at, *size)
            );
        }
    }

    // WebDataset: one pass versus the index, range by range.
    let shard = Bytes::copy_from_slice(data);
    let samples: Result<Vec<_>, _> = Samples::new(shard.clone(), "fuzz", OPTIONS).collect();
    let index = ShardIndex::scan(data, "fuzz", OPTIONS);
    let (samples, index) = match (samples, index) {
        (Ok(s), Ok(i)) => (s, i),
        (Err(_), Err(_)) => return,
        (s, i) => panic!("one pass {:?} vs scan {:?}", s.err(), i.err()),
    };
    assert_eq!(samples.len(), index.len());
    for (i, (sample, span)) in samples.iter().zip(index.spans()).enumerate() {
        let one = read_sample(&shard, *span, "fuzz", OPTIONS).expect("an indexed sample reads");
        assert_eq!(sample.index, i as u64);
        same_sample(sample, &one).unwrap();
    }
    let reparsed = ShardIndex::parse(&index.to_text(), "fuzz.idx").unwrap();
    assert_eq!(reparsed, index);

    // Write back what chute can write (keys and names it accepts), and read it again.
    let mut w = SampleWriter::new(Vec::new(), "fuzz-out");
    let mut written = Vec::new();
    for s in &samples {
        if w.write_sample(s).is_ok() {
            written.push(s);
        }
    }
    let out = w.finish().unwrap();
    let back: Vec<_> = Samples::new(Bytes::from(out), "fuzz-out", TarOptions::default())
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(back.len(), written.len());
    for (a, b) in written.iter().zip(&back) {
        same_sample(a, b).unwrap();
    }
});
