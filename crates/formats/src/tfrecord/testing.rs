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

pub(super) use crate::testing::corrupt;

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
