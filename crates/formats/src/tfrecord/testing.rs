//! Helpers shared by the tests of the TFRecord modules.

use std::io::Write;

use chute_core::Error;

use super::{FramingOptions, TfRecordWriter, records};

/// `records` framed, as one file's bytes.
pub(super) fn framed(records: &[&[u8]]) -> Vec<u8> {
    let mut w = TfRecordWriter::new(Vec::new());
    for r in records {
        w.write_record(r).unwrap();
    }
    w.into_inner().unwrap()
}

/// The parts of an [`Error::Corrupt`]; panics on any other error.
pub(super) fn corrupt(e: Error) -> (String, u64, String) {
    match e {
        Error::Corrupt {
            uri,
            offset,
            reason,
            ..
        } => (uri, offset, reason),
        other => panic!("expected a corrupt error, got {other}"),
    }
}

/// Every record of `input` as `(offset, data)`, through [`records`].
pub(super) fn all(input: &[u8], options: FramingOptions) -> Result<Vec<(u64, Vec<u8>)>, Error> {
    records(input, "mem", options)
        .map(|r| r.map(|r| (r.offset, input[r.data].to_vec())))
        .collect()
}

/// `data` GZIP-compressed.
pub(super) fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}
