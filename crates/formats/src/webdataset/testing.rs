//! Helpers shared by the tests of the WebDataset modules.

use bytes::Bytes;
use chute_core::{Error, Field, Sample};

use super::writer::NamedBytes;
use super::{KEY_FIELD, SampleWriter, Samples};
use crate::tar::{TarOptions, TarWriter};

/// The name of in-memory shards in tests.
pub(super) const URI: &str = "mem://shard.tar";

/// One shard of `samples`, written by [`SampleWriter`].
pub(super) fn shard(samples: &[(&str, &[NamedBytes<'_>])]) -> Vec<u8> {
    let mut w = SampleWriter::new(Vec::new(), "mem");
    for (k, f) in samples {
        w.write(k, f).unwrap();
    }
    w.finish().unwrap()
}

/// Every sample of a shard in memory named [`URI`], in one pass.
pub(super) fn read_all(data: &[u8]) -> Result<Vec<Sample>, Error> {
    Samples::new(Bytes::copy_from_slice(data), URI, TarOptions::default()).collect()
}

/// A sample as (key, [(field, bytes)]).
pub(super) type Plain = (String, Vec<(String, Vec<u8>)>);

/// (key, [(field, bytes)]) without the __key__ field, which is checked here.
pub(super) fn plain(s: &Sample) -> Plain {
    let (first, rest) = s.fields.split_first().expect("a __key__ field");
    assert_eq!(first.0, KEY_FIELD);
    match &first.1 {
        Field::Text(k) => assert_eq!(&k[..], s.key.as_bytes()),
        other => panic!("__key__ is {other:?}"),
    }
    let fields = rest
        .iter()
        .map(|(n, f)| match f {
            Field::Bytes(b) => (n.to_string(), b.to_vec()),
            other => panic!("field {n} is {other:?}"),
        })
        .collect();
    (s.key.clone(), fields)
}

/// An [`Error::Corrupt`]'s reason; panics on any other error.
pub(super) fn reason(e: &Error) -> &str {
    match e {
        Error::Corrupt { reason, .. } => reason,
        other => panic!("expected a corrupt error, got {other}"),
    }
}

/// Raw tar members (path, data) with our tar writer, for layouts SampleWriter refuses.
pub(super) fn raw(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut w = TarWriter::new(Vec::new());
    for (p, d) in members {
        w.append(p, d).unwrap();
    }
    w.finish().unwrap()
}
