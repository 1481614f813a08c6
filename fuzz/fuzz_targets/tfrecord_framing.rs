//! TFRecord framing: the slice decoder, the streaming reader (fed in small pieces), the index
//! builder and the source must agree on any input, and never panic.
//!
//! The first input byte is a control byte: bit 0 turns CRC checks off, the rest sets the size
//! of the pieces the streaming reader is fed.

#![no_main]

use std::io::Read;

use bytes::Bytes;
use chute_core::{Field, Source};
use chute_formats::tfrecord::{
    FramingOptions, IndexMode, RECORD_FIELD, TfRecordOptions, TfRecordReader, TfRecordSource,
    TfRecordWriter, build_index, records,
};
use libfuzzer_sys::fuzz_target;

/// A reader that hands out at most `step` bytes per call.
struct Pieces<'a> {
    data: &'a [u8],
    step: usize,
}

impl Read for Pieces<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.step.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&control, input)) = data.split_first() else {
        return;
    };
    let options = FramingOptions {
        verify_checksums: control & 1 == 0,
        // Small, so that declared lengths up to it are cheap to ask for.
        max_record_bytes: 1 << 16,
    };
    let step = usize::from(control >> 1) + 1;

    let sliced: Result<Vec<(u64, Vec<u8>)>, String> = records(input, "fuzz", options)
        .map(|r| r.map(|r| (r.offset, input[r.data].to_vec())))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string());
    let streamed: Result<Vec<(u64, Vec<u8>)>, String> =
        TfRecordReader::new(Pieces { data: input, step }, "fuzz", options)
            .map(|r| r.map(|(offset, data)| (offset, data.to_vec())))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string());
    assert_eq!(sliced, streamed);

    let Ok(found) = sliced else { return };
    // An index of a readable shard lists the same records.
    let index = build_index(input, "fuzz", options).expect("a readable shard indexes");
    assert_eq!(index.len(), found.len());
    for (entry, (offset, data)) in index.iter().zip(&found) {
        assert_eq!(
            (entry.offset, entry.size),
            (*offset, data.len() as u64 + 16)
        );
    }
    // The random-access source reads the same bytes.
    let source_options = TfRecordOptions {
        verify_checksums: options.verify_checksums,
        max_record_bytes: options.max_record_bytes,
        example: None,
        index: IndexMode::Scan,
    };
    let source = TfRecordSource::from_bytes(
        vec![("fuzz".to_owned(), Bytes::copy_from_slice(input))],
        source_options,
    )
    .expect("a readable shard opens");
    for (id, (_, data)) in found.iter().enumerate() {
        let sample = source.read(id as u64).expect("a readable record reads");
        let Some(Field::Bytes(got)) = sample.get(RECORD_FIELD) else {
            panic!("raw records have a record field")
        };
        assert_eq!(&got[..], &data[..]);
    }
    // With checksums verified, the framing is canonical: writing the records again gives the
    // input back.
    if options.verify_checksums {
        let mut w = TfRecordWriter::new(Vec::new());
        for (_, data) in &found {
            w.write_record(data).unwrap();
        }
        assert_eq!(w.into_inner().unwrap(), input);
    }
});
