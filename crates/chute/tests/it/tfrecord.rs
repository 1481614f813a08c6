use std::path::{Path, PathBuf};

use bytes::Bytes;
use chute::Shuffle;
use chute::core::{BoxError, OnError, Sample, SampleRng};
use chute::formats::example::{Example, ExampleOptions, Feature};
use chute::formats::tfrecord::{
    TfRecordFileWriter, TfRecordOptions, TfRecordSource, WriterOptions,
};
use chute::pipeline::Loader;
use chute::pipeline::check::{Delivered, run_to_end};

/// A random Example: a scalar label, 8 floats, 3 ints, a byte string of random length.
fn record(rng: &mut SampleRng) -> Example {
    let mut ex = Example::default();
    ex.insert("label", Feature::Int64(vec![rng.below(1000) as i64 - 500]));
    let x = (0..8).map(|_| rng.next_f64() as f32).collect();
    ex.insert("x", Feature::Float(x));
    let ids = (0..3).map(|_| rng.next_u64() as i64).collect();
    ex.insert("ids", Feature::Int64(ids));
    let b: Vec<u8> = (0..rng.below(12)).map(|_| rng.next_u64() as u8).collect();
    ex.insert("b", Feature::Bytes(vec![Bytes::from(b)]));
    ex
}

/// Two shards of 23 and 18 records (the first with an index file), written by the writer;
/// `edit` may change any record (by its global number) before it is written.
fn dataset(dir: &Path, edit: impl Fn(u64, &mut Example)) -> Vec<PathBuf> {
    let mut rng = SampleRng::from_key(5);
    let mut id = 0;
    let mut paths = Vec::new();
    for (shard, n, index) in [(0, 23, true), (1, 18, false)] {
        let path = dir.join(format!("part-{shard}.tfrecord"));
        let opts = WriterOptions { gzip: false, index };
        let mut w = TfRecordFileWriter::create(&path, opts).unwrap();
        for _ in 0..n {
            let mut ex = record(&mut rng);
            edit(id, &mut ex);
            w.write_record(&ex.encode()).unwrap();
            id += 1;
        }
        w.finish().unwrap();
        paths.push(path);
    }
    paths
}

fn noop(_: &mut Sample, _: &mut SampleRng) -> Result<(), BoxError> {
    Ok(())
}

/// A loader over `paths`; `sample_path` adds a transform that does nothing, which turns the
/// columnar path off.
fn loader(
    paths: &[PathBuf],
    options: TfRecordOptions,
    shuffle: Shuffle,
    on_error: OnError,
    sample_path: bool,
) -> Loader {
    let mut b = Loader::builder(TfRecordSource::open(paths, options).unwrap())
        .batch_size(6)
        .shuffle(shuffle)
        .seed(9)
        .on_error(on_error)
        .num_workers(2);
    if sample_path {
        b = b.transform(noop);
    }
    b.build().unwrap()
}

/// Two epochs of batches, or the first error's message.
fn stream(mut loader: Loader) -> Result<Vec<Delivered>, String> {
    let run = run_to_end(&mut loader, 1).map_err(|e| e.to_string())?;
    Ok(run.into_iter().map(|(_, d)| d).collect())
}

fn both_paths(
    paths: &[PathBuf],
    options: &TfRecordOptions,
    shuffle: Shuffle,
    on_error: OnError,
) -> (
    Result<Vec<Delivered>, String>,
    Result<Vec<Delivered>, String>,
) {
    let fast = stream(loader(paths, options.clone(), shuffle, on_error, false));
    let slow = stream(loader(paths, options.clone(), shuffle, on_error, true));
    (fast, slow)
}

const SHUFFLES: [Shuffle; 3] = [Shuffle::None, Shuffle::Global, Shuffle::Block { window: 2 }];

fn example_options(features: Option<&[&str]>, scalars: bool) -> TfRecordOptions {
    TfRecordOptions {
        example: Some(ExampleOptions {
            features: features.map(|f| f.iter().map(|s| s.to_string()).collect()),
            scalars,
        }),
        ..Default::default()
    }
}

#[test]
fn columnar_fast_path_equals_the_sample_path() {
    let dir = tempfile::tempdir().unwrap();
    let paths = dataset(dir.path(), |_, _| {});
    let options = [
        TfRecordOptions::default(),
        example_options(None, false),
        example_options(Some(&["x", "b", "label"]), true),
        TfRecordOptions {
            example: None,
            ..Default::default()
        },
    ];
    for opts in &options {
        for shuffle in SHUFFLES {
            let (fast, slow) = both_paths(&paths, opts, shuffle, OnError::Raise);
            let fast = fast.unwrap();
            assert_eq!(fast.len(), 14, "41 records in batches of 6, two epochs");
            assert_eq!(Ok(fast), slow, "{opts:?} {shuffle}");
        }
        // The fast loader did take the columnar path: it read no sample on its own.
        let mut fast = loader(&paths, opts.clone(), Shuffle::Global, OnError::Raise, false);
        run_to_end(&mut fast, 0).unwrap();
        let stats = fast.stats();
        assert_eq!((stats.samples, stats.read.items), (41, 0), "{opts:?}");
    }
}

#[test]
fn bad_records_fail_or_are_skipped_as_on_the_sample_path() {
    let dir = tempfile::tempdir().unwrap();
    // Record 30 lacks `x`; record 8 has 7 floats in it.
    let paths = dataset(dir.path(), |id, ex| {
        if id == 30 {
            ex.remove("x");
        } else if id == 8 {
            ex.insert("x", Feature::Float(vec![1.0; 7]));
        }
    });
    let other = tempfile::tempdir().unwrap();
    let missing_only = dataset(other.path(), |id, ex| {
        if id == 30 {
            ex.remove("x");
        }
    });
    for shuffle in SHUFFLES {
        let opts = TfRecordOptions::default();
        let (fast, slow) = both_paths(&paths, &opts, shuffle, OnError::Raise);
        let e = fast.unwrap_err();
        assert_eq!(Err(e.clone()), slow, "{shuffle}");
        assert!(e.contains("\"x\""), "{e}");
        // Projected, a missing feature is a read error naming the feature and the shard.
        let projected = example_options(Some(&["label", "x"]), true);
        let (fast, slow) = both_paths(&paths, &projected, shuffle, OnError::Raise);
        let e = fast.unwrap_err();
        assert_eq!(Err(e.clone()), slow, "{shuffle}");
        // Record 8's odd length is no error: its batch carries `x` as a list of arrays.
        let (fast, slow) = both_paths(&paths, &projected, shuffle, OnError::Skip);
        assert_eq!(fast, slow, "{shuffle}");
        assert_eq!(fast.unwrap().len(), 14);
        let (fast, slow) = both_paths(&missing_only, &projected, shuffle, OnError::Skip);
        assert_eq!(fast, slow, "{shuffle}");
        assert_eq!(fast.unwrap().len(), 14);
        // Without `x`, every record reads.
        let (fast, slow) = both_paths(
            &paths,
            &example_options(Some(&["label"]), true),
            shuffle,
            OnError::Raise,
        );
        assert_eq!(fast, slow, "{shuffle}");
        assert!(fast.is_ok());
    }
    let e = both_paths(
        &missing_only,
        &example_options(Some(&["label", "x"]), true),
        Shuffle::None,
        OnError::Raise,
    )
    .0
    .unwrap_err();
    assert!(
        e.contains("part-1.tfrecord")
            && e.contains("feature \"x\" (requested in features) is missing"),
        "{e}"
    );
}

#[test]
fn crc_errors_name_the_shard_and_offset_on_both_paths() {
    let dir = tempfile::tempdir().unwrap();
    let paths = dataset(dir.path(), |_, _| {});
    // Flip a byte of record 4's data, in the indexed shard.
    let index = std::fs::read_to_string(paths[0].with_extension("tfrecord.idx")).unwrap();
    let offset: u64 = index
        .lines()
        .nth(4)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let mut bytes = std::fs::read(&paths[0]).unwrap();
    bytes[offset as usize + 14] ^= 0x10;
    std::fs::write(&paths[0], bytes).unwrap();
    for shuffle in SHUFFLES {
        let opts = TfRecordOptions::default();
        let (fast, slow) = both_paths(&paths, &opts, shuffle, OnError::Raise);
        let e = fast.unwrap_err();
        assert_eq!(Err(e.clone()), slow, "{shuffle}");
        assert!(
            e.contains("part-0.tfrecord")
                && e.contains(&format!("byte {offset}"))
                && e.contains("data crc mismatch"),
            "{e}"
        );
        let (fast, slow) = both_paths(&paths, &opts, shuffle, OnError::Skip);
        assert_eq!(fast, slow, "{shuffle}");
        assert!(fast.is_ok());
    }
}
