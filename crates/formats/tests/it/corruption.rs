//! Every kind of damage is reported as its [`Corruption`] kind, whichever format finds it:
//! what a caller (and Python's `CorruptDataError.kind`) tells apart without reading messages.

use chute_core::{Corruption, Error};
use chute_formats::tar::{TarOptions, TarSlice, TarWriter};
use chute_formats::tfrecord::{FramingOptions, TfRecordWriter, records};
use chute_formats::webdataset::ShardIndex;

fn tfrecord(n: usize) -> Vec<u8> {
    let mut w = TfRecordWriter::new(Vec::new());
    for i in 0..n {
        w.write_record(format!("record {i}").as_bytes()).unwrap();
    }
    w.into_inner().unwrap()
}

fn first_error(data: &[u8], options: FramingOptions) -> Error {
    records(data, "x.tfrecord", options)
        .find_map(Result::err)
        .expect("an error")
}

#[test]
fn tfrecord_damage_by_kind() {
    let good = tfrecord(3);
    let cut = first_error(&good[..good.len() - 5], FramingOptions::default());
    assert_eq!(cut.corruption(), Some(Corruption::Truncated), "{cut}");
    assert!(
        cut.to_string()
            .contains("x.tfrecord at byte 48: truncated: record:"),
        "{cut}"
    );

    let mut flipped = good.clone();
    flipped[14] ^= 1; // in the first record's data
    let e = first_error(&flipped, FramingOptions::default());
    assert_eq!(e.corruption(), Some(Corruption::Checksum), "{e}");
    flipped = good.clone();
    flipped[0] ^= 1; // in the first length
    let e = first_error(&flipped, FramingOptions::default());
    assert_eq!(e.corruption(), Some(Corruption::Checksum), "{e}");

    let small = FramingOptions {
        max_record_bytes: 4,
        ..Default::default()
    };
    let e = first_error(&good, small);
    assert_eq!(e.corruption(), Some(Corruption::TooLarge), "{e}");
}

#[test]
fn tar_and_index_damage_by_kind() {
    let mut w = TarWriter::new(Vec::new());
    w.append("a.txt", b"hello").unwrap();
    let shard = w.finish().unwrap();
    let read = |data: &[u8]| {
        let mut t = TarSlice::new(data, "s.tar", TarOptions::default());
        loop {
            match t.next_member() {
                Ok(Some(_)) => {}
                Ok(None) => return None,
                Err(e) => return Some(e),
            }
        }
    };
    assert!(read(&shard).is_none());
    let e = read(&shard[..700]).expect("cut");
    assert_eq!(e.corruption(), Some(Corruption::Truncated), "{e}");
    let mut bad = shard.clone();
    bad[0] ^= 0x40; // the name: the header checksum no longer matches
    let e = read(&bad).expect("bad checksum");
    assert_eq!(e.corruption(), Some(Corruption::Checksum), "{e}");

    let e = ShardIndex::parse("not an index\n", "s.tar.idx").unwrap_err();
    assert_eq!(e.corruption(), Some(Corruption::Malformed), "{e}");
}

#[test]
fn only_corrupt_errors_have_a_kind() {
    let io = Error::io("x", std::io::Error::other("disk"));
    assert_eq!(io.corruption(), None);
    let names: Vec<&str> = Corruption::ALL.iter().map(|k| k.name()).collect();
    assert_eq!(
        names,
        [
            "truncated",
            "checksum",
            "malformed",
            "stale_index",
            "too_large",
            "unsupported"
        ]
    );
}
