use bytes::Bytes;
use chute::core::{Array, BoxError, Field, Sample, SampleRng};
use chute::formats::parquet::{ParquetOptions, ParquetSource, ParquetWriter};
use chute::pipeline::Loader;
use chute::pipeline::check::{check_matrix, check_resume, run_to_end};
use chute::{DType, Shuffle};

fn dataset(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut paths = Vec::new();
    for (f, rows) in [(0u64, 23u64), (1, 9)] {
        let p = dir.join(format!("part-{f}.parquet"));
        let mut w = ParquetWriter::create(&p, 7).unwrap();
        for r in 0..rows {
            let id = f * 100 + r;
            let x: Vec<u8> = (0..3)
                .flat_map(|k| (id as f32 + k as f32).to_le_bytes())
                .collect();
            let s = Sample::new(id)
                .with(
                    "y",
                    Field::Array(Array::new(
                        DType::I64,
                        vec![],
                        Bytes::copy_from_slice(&(id as i64).to_le_bytes()),
                    )),
                )
                .with(
                    "x",
                    Field::Array(Array::new(DType::F32, vec![3], Bytes::from(x))),
                )
                .with("name", Field::Text(Bytes::from(format!("row-{id}"))));
            w.write(&s).unwrap();
        }
        w.finish().unwrap();
        paths.push(p);
    }
    paths
}

fn noop(_: &mut Sample, _: &mut SampleRng) -> Result<(), BoxError> {
    Ok(())
}

#[test]
fn columnar_fast_path_equals_the_sample_path() {
    let dir = tempfile::tempdir().unwrap();
    let paths = dataset(dir.path());
    for shuffle in [Shuffle::None, Shuffle::Global, Shuffle::Block { window: 2 }] {
        let build = |sample_path: bool| {
            let opts = ParquetOptions {
                chunk_rows: Some(5),
                ..Default::default()
            };
            let mut b = Loader::builder(ParquetSource::open(&paths, opts).unwrap())
                .batch_size(6)
                .shuffle(shuffle)
                .seed(3)
                .num_workers(2);
            if sample_path {
                b = b.transform(noop);
            }
            b.build().unwrap()
        };
        let fast = run_to_end(&mut build(false), 1).unwrap();
        let slow = run_to_end(&mut build(true), 1).unwrap();
        assert_eq!(fast.len(), 12, "32 rows in batches of 6, two epochs");
        let strip = |v: Vec<(chute::State, chute::pipeline::check::Delivered)>| {
            v.into_iter().map(|(_, d)| d).collect::<Vec<_>>()
        };
        assert_eq!(strip(fast), strip(slow), "{shuffle}");
    }
}

#[test]
fn parquet_loader_is_deterministic_and_resumable() {
    let dir = tempfile::tempdir().unwrap();
    let paths = dataset(dir.path());
    let make = |w: usize, p: usize| {
        Loader::builder(ParquetSource::open(&paths, ParquetOptions::default()).unwrap())
            .batch_size(5)
            .shuffle(Shuffle::Global)
            .num_workers(w)
            .prefetch(p)
            .build()
            .unwrap()
    };
    check_matrix(make, &[0, 1, 3], &[1, 4], 2).unwrap();
    check_resume(|| make(2, 2), 2).unwrap();
}
