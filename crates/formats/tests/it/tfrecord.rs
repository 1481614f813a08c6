//! TFRecord and `tf.train.Example` through the public API: the conformance suite, the golden
//! files TensorFlow wrote (testdata/tfrecord/README.md), and the files chute wrote that
//! TensorFlow was checked to read.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use chute_core::{Array, DType, Error, Field, Sample, Source};
use chute_formats::check::{ReaderUnderTest, check_reader, same_sample};
use chute_formats::example::{
    Example, ExampleOptions, Feature, example_to_sample, sample_to_example,
};
use chute_formats::tfrecord::{
    Compression, FramingOptions, IndexEntry, IndexMode, RECORD_FIELD, TfRecordFileWriter,
    TfRecordOptions, TfRecordReader, TfRecordSource, TfRecordWriter, WriterOptions, build_index,
    index_path, records, write_index,
};

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/tfrecord")
        .join(name)
}

fn array(dtype: DType, shape: &[usize], data: Vec<u8>) -> Field {
    Field::Array(Array::new(dtype, shape.to_vec(), Bytes::from(data)))
}

fn i64s(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn raw_options() -> TfRecordOptions {
    TfRecordOptions {
        example: None,
        index: IndexMode::Scan,
        ..Default::default()
    }
}

fn example_options() -> TfRecordOptions {
    TfRecordOptions {
        index: IndexMode::Scan,
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------------
// The conformance suite.

/// Keys are `<stem>/<record>`: what the source gives a shard named "...shard-under-test".
fn key(i: usize) -> String {
    format!("shard-under-test/{i}")
}

/// TFRecord, read three ways: `read_all` through an in-memory source (scanning), `read_at`
/// through a file with its index file (the random-access path the loader uses).
struct TfRecordUnderTest {
    options: TfRecordOptions,
}

impl TfRecordUnderTest {
    fn encode(&self, sample: &Sample) -> Result<Vec<u8>, Error> {
        match &self.options.example {
            Some(_) => sample_to_example(sample),
            None => match sample.get(RECORD_FIELD) {
                Some(Field::Bytes(b)) => Ok(b.to_vec()),
                other => panic!("raw samples hold one record field, got {other:?}"),
            },
        }
    }
}

impl ReaderUnderTest for TfRecordUnderTest {
    fn name(&self) -> &str {
        if self.options.example.is_some() {
            "tfrecord (tf.train.Example)"
        } else {
            "tfrecord (raw)"
        }
    }

    fn write(&self, samples: &[Sample]) -> Result<Vec<u8>, Error> {
        let mut w = TfRecordWriter::new(Vec::new());
        for s in samples {
            w.write_record(&self.encode(s)?)
                .map_err(|e| Error::io("memory", e))?;
        }
        w.into_inner().map_err(|e| Error::io("memory", e))
    }

    fn read_all(&self, shard: &[u8], origin: &str) -> Result<Vec<Sample>, Error> {
        let src = TfRecordSource::from_bytes(
            vec![(origin.to_owned(), Bytes::copy_from_slice(shard))],
            self.options.clone(),
        )?;
        (0..src.manifest().total_samples())
            .map(|id| src.read(id))
            .collect()
    }

    fn read_at(&self, shard: &[u8], _origin: &str, i: usize) -> Result<Sample, Error> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard-under-test.tfrecord");
        std::fs::write(&path, shard).unwrap();
        write_index(
            &index_path(&path),
            &build_index(shard, "mem", FramingOptions::default())?,
        )?;
        let options = TfRecordOptions {
            index: IndexMode::Require,
            ..self.options.clone()
        };
        TfRecordSource::open(&[&path], options)?.read(i as u64)
    }

    fn checks_every_byte(&self) -> bool {
        true
    }
}

/// GZIP-compressed TFRecord of Examples through the streaming reader. GZIP's header has fields
/// no checksum covers (the modification time), so not every flipped byte is detectable.
struct GzipUnderTest;

impl ReaderUnderTest for GzipUnderTest {
    fn name(&self) -> &str {
        "tfrecord (gzip, streaming)"
    }

    fn write(&self, samples: &[Sample]) -> Result<Vec<u8>, Error> {
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        let mut w = TfRecordWriter::new(gz);
        for s in samples {
            w.write_record(&sample_to_example(s)?).unwrap();
        }
        Ok(w.into_inner().unwrap().finish().unwrap())
    }

    fn read_all(&self, shard: &[u8], origin: &str) -> Result<Vec<Sample>, Error> {
        let gz = flate2::read::MultiGzDecoder::new(shard);
        TfRecordReader::new(gz, origin, FramingOptions::default())
            .enumerate()
            .map(|(i, r)| {
                let (_, data) = r?;
                example_to_sample(i as u64, key(i), data, &ExampleOptions::default())
                    .map_err(|e| Error::corrupt(origin, 0, e.to_string()))
            })
            .collect()
    }

    fn read_at(&self, shard: &[u8], origin: &str, i: usize) -> Result<Sample, Error> {
        // A stream has no random access: read up to record i.
        Ok(self.read_all(shard, origin)?.swap_remove(i))
    }
}

fn raw_samples() -> Vec<Sample> {
    let records: [&[u8]; 4] = [b"first", b"", b"\x00\x01\x02 binary", &[0xab; 300]];
    records
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut s =
                Sample::new(i as u64).with(RECORD_FIELD, Field::Bytes(Bytes::copy_from_slice(r)));
            s.key = key(i);
            s
        })
        .collect()
}

/// Samples as `example_to_sample` gives them back: fields sorted by name, a label scalar.
fn example_samples() -> Vec<Sample> {
    (0..3i64)
        .map(|i| {
            let mut s = Sample::new(i as u64)
                .with("bytes", Field::Bytes(Bytes::from(format!("payload {i}"))))
                .with(
                    "floats",
                    array(DType::F32, &[8], f32s(&[i as f32 * 0.5; 8])),
                )
                .with("ids", array(DType::I64, &[3], i64s(&[i, -i, i64::MIN])))
                .with("label", array(DType::I64, &[], i64s(&[i - 1])));
            s.key = key(i as usize);
            s
        })
        .collect()
}

#[test]
fn conformance_raw_records() {
    check_reader(
        &TfRecordUnderTest {
            options: raw_options(),
        },
        &raw_samples(),
    )
    .unwrap();
}

#[test]
fn conformance_examples() {
    check_reader(
        &TfRecordUnderTest {
            options: example_options(),
        },
        &example_samples(),
    )
    .unwrap();
}

#[test]
fn conformance_gzip_streaming() {
    check_reader(&GzipUnderTest, &example_samples()).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Files TensorFlow wrote.

/// The values `make_goldens.py` put in record `i` of examples.tfrecord, as chute reads them.
fn tf_golden_sample(i: i64) -> Sample {
    let floats: Vec<f32> = (0..8).map(|k| i as f32 + k as f32 / 8.0).collect();
    let mut s = Sample::new(i as u64)
        .with("bytes", Field::Bytes(Bytes::from(format!("record-{i}"))))
        .with("floats", array(DType::F32, &[8], f32s(&floats)))
        .with(
            "ids",
            array(DType::I64, &[4], i64s(&[i, -i, (1 << 40) + i, i64::MIN])),
        )
        .with("label", array(DType::I64, &[], i64s(&[i - 2])));
    s.key = format!("examples/{i}");
    s
}

#[test]
fn reads_examples_tensorflow_wrote() {
    let path = testdata("examples.tfrecord");
    for index in [IndexMode::Auto, IndexMode::Scan] {
        let src = TfRecordSource::open(
            &[&path],
            TfRecordOptions {
                index,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(src.manifest().total_samples(), 5);
        assert_eq!(
            src.manifest().shards[0].bytes,
            std::fs::metadata(&path).unwrap().len()
        );
        for i in 0..5 {
            let got = src.read(i as u64).unwrap();
            same_sample(&tf_golden_sample(i), &got).unwrap_or_else(|e| panic!("record {i}: {e}"));
        }
    }
    // A projection, in the order asked for.
    let options = TfRecordOptions {
        example: Some(ExampleOptions {
            features: Some(vec!["label".into(), "bytes".into()]),
            scalars: false,
        }),
        ..Default::default()
    };
    let s = TfRecordSource::open(&[&path], options)
        .unwrap()
        .read(4)
        .unwrap();
    let names: Vec<&str> = s.fields.iter().map(|(n, _)| n.as_ref()).collect();
    assert_eq!(names, ["label", "bytes"]);
    let Some(Field::Array(label)) = s.get("label") else {
        panic!()
    };
    assert_eq!(
        (label.shape.as_slice(), &label.data[..]),
        (&[1usize][..], &2i64.to_le_bytes()[..])
    );
}

#[test]
fn reencoding_matches_protobufs_deterministic_serialization() {
    let file = std::fs::read(testdata("examples.tfrecord")).unwrap();
    let first = records(&file, "examples.tfrecord", FramingOptions::default())
        .next()
        .unwrap()
        .unwrap();
    let tf_bytes = Bytes::copy_from_slice(&file[first.data]);
    let deterministic = std::fs::read(testdata("example0.deterministic.pb")).unwrap();
    // TensorFlow's own record has its map entries in another order; same content.
    assert_ne!(tf_bytes[..], deterministic[..]);
    let ex = Example::decode(&tf_bytes, "record 0").unwrap();
    assert_eq!(
        ex,
        Example::decode(&Bytes::from(deterministic.clone()), "pb").unwrap()
    );
    assert_eq!(
        ex.get("ids"),
        Some(&Feature::Int64(vec![0, 0, 1 << 40, i64::MIN]))
    );
    // chute's encoder writes exactly what protobuf's deterministic serializer writes, from an
    // Example and from the sample chute reads.
    assert_eq!(ex.encode(), deterministic);
    assert_eq!(
        sample_to_example(&tf_golden_sample(0)).unwrap(),
        deterministic
    );
}

#[test]
fn reads_gzip_tensorflow_wrote() {
    let plain = std::fs::read(testdata("examples.tfrecord")).unwrap();
    let want: Vec<(u64, Vec<u8>)> = records(&plain, "plain", FramingOptions::default())
        .map(|r| r.map(|r| (r.offset, plain[r.data].to_vec())))
        .collect::<Result<_, _>>()
        .unwrap();
    let gz = testdata("examples.tfrecord.gz");
    for compression in [Compression::Auto, Compression::Gzip] {
        let got: Vec<(u64, Vec<u8>)> =
            TfRecordReader::open(&gz, compression, FramingOptions::default())
                .unwrap()
                .map(|r| r.map(|(o, d)| (o, d.to_vec())))
                .collect::<Result<_, _>>()
                .unwrap();
        assert_eq!(got, want);
    }
    let e = TfRecordSource::open(&[&gz], Default::default()).unwrap_err();
    assert!(
        matches!(&e, Error::Config(c) if c.reason.contains("GZIP")),
        "{e}"
    );
}

#[test]
fn reads_raw_records_tensorflow_wrote_and_writes_the_same_bytes() {
    let path = testdata("raw.tfrecord");
    let file = std::fs::read(&path).unwrap();
    let long: Vec<u8> = (0..1000).map(|i| (i % 251) as u8).collect();
    let want: [&[u8]; 3] = [b"", b"a", &long];
    let src = TfRecordSource::open(&[&path], raw_options()).unwrap();
    for (i, w) in want.iter().enumerate() {
        let s = src.read(i as u64).unwrap();
        assert!(
            matches!(s.get(RECORD_FIELD), Some(Field::Bytes(b)) if &b[..] == *w),
            "record {i}"
        );
    }
    let mut writer = TfRecordWriter::new(Vec::new());
    for w in want {
        writer.write_record(w).unwrap();
    }
    assert_eq!(writer.into_inner().unwrap(), file);
    let index = build_index(&file, "raw", FramingOptions::default()).unwrap();
    assert_eq!(
        index,
        [
            IndexEntry {
                offset: 0,
                size: 16
            },
            IndexEntry {
                offset: 16,
                size: 17
            },
            IndexEntry {
                offset: 33,
                size: 1016
            },
        ]
    );
}

#[test]
fn every_flipped_bit_of_a_tensorflow_file_is_caught() {
    let file = std::fs::read(testdata("examples.tfrecord")).unwrap();
    for pos in 0..file.len() {
        let mut bad = file.clone();
        bad[pos] ^= 0x10;
        let caught =
            TfRecordSource::from_bytes(vec![("t".into(), Bytes::from(bad))], example_options())
                .and_then(|src| (0..5).try_for_each(|id| src.read(id).map(drop)));
        assert!(caught.is_err(), "byte {pos}");
    }
}

// ---------------------------------------------------------------------------------------------
// Files chute wrote, which TensorFlow was checked to read (testdata/tfrecord/README.md).

/// The samples of chute_written.tfrecord; `check_chute_written.py` in the README expects
/// exactly these values.
fn interop_samples() -> Vec<Sample> {
    (0..6i64)
        .map(|i| {
            let floats: Vec<f32> = (0..8).map(|k| i as f32 * 0.5 + k as f32 * 0.25).collect();
            let image: Vec<u8> = (0..i * 37).map(|j| ((i * 31 + j) % 256) as u8).collect();
            let small: Vec<u8> = [(i - 3) as i32, i32::MAX]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            let wide: Vec<u8> = [i as f64 + 0.5, -1e10]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            Sample::new(i as u64)
                .with("label", array(DType::I64, &[], i64s(&[i * 7 - 10])))
                .with("floats", array(DType::F32, &[8], f32s(&floats)))
                .with("image", Field::Bytes(Bytes::from(image)))
                .with(
                    "ids",
                    array(
                        DType::I64,
                        &[4],
                        i64s(&[i, -i, (1 << 40) + i, i64::MIN + i]),
                    ),
                )
                .with("small", array(DType::I32, &[2], small))
                .with("wide", array(DType::F64, &[2], wide))
                .with("text", Field::Text(Bytes::from(format!("sample {i}"))))
                .with("pixels", array(DType::U8, &[3], vec![i as u8, 128, 255]))
        })
        .collect()
}

fn write_interop(path: &Path, options: WriterOptions) {
    let mut w = TfRecordFileWriter::create(path, options).unwrap();
    for s in interop_samples() {
        w.write_sample(&s).unwrap();
    }
    assert_eq!(w.finish().unwrap(), 6);
}

/// Regenerates chute_written.tfrecord(.gz): run with `--ignored` after changing the writer,
/// then re-run the README's TensorFlow check.
#[test]
#[ignore = "writes into testdata/; run by hand, see testdata/tfrecord/README.md"]
fn write_chute_goldens() {
    write_interop(
        &testdata("chute_written.tfrecord"),
        WriterOptions::default(),
    );
    write_interop(
        &testdata("chute_written.tfrecord.gz"),
        WriterOptions {
            gzip: true,
            index: false,
        },
    );
}

#[test]
fn the_writer_still_writes_what_tensorflow_was_checked_to_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chute_written.tfrecord");
    write_interop(
        &path,
        WriterOptions {
            gzip: false,
            index: true,
        },
    );
    let golden = std::fs::read(testdata("chute_written.tfrecord")).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), golden);
    // The GZIP golden holds the same records (compressed bytes may differ between flate2
    // versions, so the comparison is on what it decompresses to).
    let gz: Vec<Vec<u8>> = TfRecordReader::open(
        testdata("chute_written.tfrecord.gz"),
        Compression::Auto,
        FramingOptions::default(),
    )
    .unwrap()
    .map(|r| r.map(|(_, d)| d.to_vec()))
    .collect::<Result<_, _>>()
    .unwrap();
    let plain: Vec<Vec<u8>> = records(&golden, "golden", FramingOptions::default())
        .map(|r| r.map(|r| golden[r.data].to_vec()))
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(gz, plain);
    // And chute reads its own file back, with the index it wrote.
    let src = TfRecordSource::open(
        &[&path],
        TfRecordOptions {
            index: IndexMode::Require,
            ..Default::default()
        },
    )
    .unwrap();
    let s = src.read(5).unwrap();
    let names: Vec<&str> = s.fields.iter().map(|(n, _)| n.as_ref()).collect();
    assert_eq!(
        names,
        [
            "floats", "ids", "image", "label", "pixels", "small", "text", "wide"
        ]
    );
    let Some(Field::Array(label)) = s.get("label") else {
        panic!()
    };
    assert_eq!(&label.data[..], &25i64.to_le_bytes());
    assert!(matches!(s.get("text"), Some(Field::Bytes(b)) if &b[..] == b"sample 5"));
}
