//! Remote shards against real servers: nginx (HTTP with range requests), moto (S3) and
//! `scripts/faultproxy.py` (503, 429, bodies cut mid-way, resets, a stall, on a schedule).
//!
//! `scripts/test.sh` starts them when `CHUTE_TEST_SERVERS=1` (as `.ci/run` does) and exports
//! `CHUTE_TEST_HTTP_DIR` (the folder nginx serves), `CHUTE_TEST_HTTP_URL`,
//! `CHUTE_TEST_PROXY_URL` (the faulty proxy in front of nginx) and `CHUTE_TEST_S3_ENDPOINT` /
//! `CHUTE_TEST_S3_BUCKET` (with `AWS_*` variables for object_store). Without them every test
//! here prints why and passes without checking anything.

use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::Duration;

use chute::Shuffle;
use chute::core::{OnError, SampleRng, Source};
use chute::formats::example::{Example, Feature};
use chute::formats::tfrecord::{
    TfRecordFileWriter, TfRecordOptions, TfRecordSource, WriterOptions,
};
use chute::formats::webdataset::{
    ShardWriter, ShardWriterOptions, WebDatasetOptions, WebDatasetSource, expand_braces,
};
use chute::io::{IoSnapshot, RemoteOptions, set_remote_options};
use chute::pipeline::Loader;
use chute::pipeline::StreamDigest;

struct Servers {
    dir: PathBuf,
    http: String,
    proxy: String,
    s3: Option<(String, String)>,
}

/// The test servers, or `None` (printing why) when they are not running.
fn servers(test: &str) -> Option<Servers> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let (Some(dir), Some(http), Some(proxy)) = (
        var("CHUTE_TEST_HTTP_DIR"),
        var("CHUTE_TEST_HTTP_URL"),
        var("CHUTE_TEST_PROXY_URL"),
    ) else {
        eprintln!(
            "skipping {test}: no test servers (CHUTE_TEST_HTTP_DIR/_URL, CHUTE_TEST_PROXY_URL \
             unset); run CHUTE_TEST_SERVERS=1 ./scripts/test.sh to start nginx, moto and the \
             fault proxy"
        );
        return None;
    };
    static OPTIONS: Once = Once::new();
    OPTIONS.call_once(|| {
        // Short backoffs and timeouts so the proxy's faults cost little time; enough attempts
        // that its schedule (3 faults in 10 requests) never exhausts them.
        let mut o = RemoteOptions::default();
        o.backoff_base = Duration::from_millis(5);
        o.backoff_max = Duration::from_millis(100);
        o.timeout = Duration::from_secs(1);
        o.max_attempts = 40;
        o.read_ahead = 2;
        set_remote_options(o);
    });
    let s3 = var("CHUTE_TEST_S3_ENDPOINT").zip(var("CHUTE_TEST_S3_BUCKET"));
    Some(Servers {
        dir: PathBuf::from(dir).join(test),
        http: format!("{http}/{test}"),
        proxy: format!("{proxy}/{test}"),
        s3,
    })
}

/// Uploads every file of `dir` to the S3 test bucket under `prefix/`.
fn upload(dir: &Path, bucket: &str, prefix: &str) {
    use object_store::aws::AmazonS3Builder;
    use object_store::{ObjectStoreExt, PutPayload};
    let store = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .build()
        .unwrap();
    // A runtime for the test's own uploads; chute's reads use chute-io's runtime.
    #[allow(clippy::disallowed_methods)]
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let key = format!("{prefix}/{}", p.file_name().unwrap().to_str().unwrap());
        let data = std::fs::read(&p).unwrap();
        rt.block_on(store.put(&key.as_str().into(), PutPayload::from(data)))
            .unwrap();
    }
}

/// WebDataset shards `wds-NN.tar` of 40 random samples each, with index files.
fn write_wds(dir: &Path, shards: u64) -> Vec<PathBuf> {
    chute::formats::testing::random_webdataset(dir, "wds", &vec![40; shards as usize], 11)
}

/// TFRecord shards of 60 Examples each, with index files.
fn write_tfrecord(dir: &Path, shards: usize) -> Vec<PathBuf> {
    std::fs::create_dir_all(dir).unwrap();
    let mut rng = SampleRng::from_key(12);
    (0..shards)
        .map(|s| {
            let path = dir.join(format!("rec-{s}.tfrecord"));
            let opts = WriterOptions {
                gzip: false,
                index: true,
            };
            let mut w = TfRecordFileWriter::create(&path, opts).unwrap();
            for _ in 0..60 {
                let mut ex = Example::default();
                ex.insert("label", Feature::Int64(vec![rng.below(100) as i64]));
                let x = (0..16).map(|_| rng.next_f64() as f32).collect();
                ex.insert("x", Feature::Float(x));
                w.write_record(&ex.encode()).unwrap();
            }
            w.finish().unwrap();
            path
        })
        .collect()
}

/// The digest of one epoch of `source` for one rank, and what the source fetched.
fn digest(
    source: impl Source,
    stats: impl Fn(&dyn std::any::Any) -> IoSnapshot,
    shuffle: Shuffle,
    rank: u64,
    world: u64,
) -> (String, u64, IoSnapshot) {
    let source = std::sync::Arc::new(source);
    let mut loader = Loader::builder_arc(source.clone())
        .batch_size(8)
        .shuffle(shuffle)
        .seed(3)
        .num_workers(2)
        .distributed(rank, world)
        .build()
        .unwrap();
    let mut d = StreamDigest::new();
    let mut n = 0;
    for b in &mut loader {
        let b = b.unwrap();
        n += b.len() as u64;
        d.update(&b);
    }
    (d.hex(), n, stats(&*source as &dyn std::any::Any))
}

fn wds_stats(s: &dyn std::any::Any) -> IoSnapshot {
    s.downcast_ref::<WebDatasetSource>().unwrap().io_stats()
}

fn tfr_stats(s: &dyn std::any::Any) -> IoSnapshot {
    s.downcast_ref::<TfRecordSource>().unwrap().io_stats()
}

fn wds(paths: &[String]) -> WebDatasetSource {
    WebDatasetSource::open(paths, WebDatasetOptions::default()).unwrap()
}

fn tfr(paths: &[String]) -> TfRecordSource {
    TfRecordSource::open(paths, TfRecordOptions::default()).unwrap()
}

fn names(paths: &[PathBuf]) -> Vec<String> {
    paths
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap().to_owned())
        .collect()
}

const SHUFFLES: [Shuffle; 3] = [Shuffle::Block { window: 2 }, Shuffle::Global, Shuffle::None];

#[test]
fn webdataset_from_path_nginx_and_s3_gives_one_digest() {
    let Some(sv) = servers("wds_same") else {
        return;
    };
    let local = write_wds(&sv.dir, 5);
    let local: Vec<String> = local.iter().map(|p| p.display().to_string()).collect();
    // A brace pattern over URLs expands as over paths.
    let http = expand_braces(&format!("{}/wds-{{00..04}}.tar", sv.http)).unwrap();
    let mut sources = vec![("http", http)];
    if let Some((_, bucket)) = &sv.s3 {
        upload(&sv.dir, bucket, "wds_same");
        let s3 = (0..5)
            .map(|i| format!("s3://{bucket}/wds_same/wds-{i:02}.tar"))
            .collect();
        sources.push(("s3", s3));
    } else {
        eprintln!("no S3 server (CHUTE_TEST_S3_ENDPOINT unset): checking HTTP only");
    }
    for shuffle in SHUFFLES {
        let (want, n, none) = digest(wds(&local), wds_stats, shuffle, 0, 1);
        assert_eq!(n, 200);
        assert_eq!(none, IoSnapshot::default(), "local shards fetch nothing");
        for (what, urls) in &sources {
            let (got, _, st) = digest(wds(urls), wds_stats, shuffle, 0, 1);
            assert_eq!(got, want, "{what}, {shuffle:?}");
            assert!(st.bytes_fetched > 0, "{what}: {st:?}");
            if matches!(shuffle, Shuffle::Block { .. }) {
                // Streamed whole, each shard once, and its index file read once when the
                // source was opened (counted with the shards: what the source read).
                let size = |p: &str| std::fs::metadata(p).map_or(0, |m| m.len());
                let total: u64 = (0..5)
                    .map(|i| size(&local[i]) + size(&format!("{}.idx", local[i])))
                    .sum();
                assert_eq!(st.bytes_fetched, total, "{what}: {st:?}");
                assert_eq!(st.shards_fetched, 5, "{what}: {st:?}");
            } else if shuffle == Shuffle::Global {
                assert_eq!(st.shards_fetched, 0, "random access reads ranges: {st:?}");
            }
        }
    }
}

#[test]
fn tfrecord_from_path_nginx_and_s3_gives_one_digest() {
    let Some(sv) = servers("tfr_same") else {
        return;
    };
    let local = write_tfrecord(&sv.dir, 4);
    let local_s: Vec<String> = local.iter().map(|p| p.display().to_string()).collect();
    let mut sources = vec![(
        "http",
        names(&local)
            .iter()
            .map(|n| format!("{}/{n}", sv.http))
            .collect::<Vec<_>>(),
    )];
    if let Some((_, bucket)) = &sv.s3 {
        upload(&sv.dir, bucket, "tfr_same");
        let s3 = names(&local)
            .iter()
            .map(|n| format!("s3://{bucket}/tfr_same/{n}"))
            .collect();
        sources.push(("s3", s3));
    }
    for shuffle in SHUFFLES {
        let (want, n, _) = digest(tfr(&local_s), tfr_stats, shuffle, 0, 1);
        assert_eq!(n, 240);
        for (what, urls) in &sources {
            let (got, _, st) = digest(tfr(urls), tfr_stats, shuffle, 0, 1);
            assert_eq!(got, want, "{what}, {shuffle:?}");
            assert!(st.bytes_fetched > 0, "{what}: {st:?}");
            if shuffle == Shuffle::Global {
                // Random access: each batch's records of one shard are one coalesced range
                // request, so far fewer requests than records (4 HEADs of the shards, and a
                // HEAD and a GET of each index file, included).
                assert_eq!(st.shards_fetched, 0, "{what}: {st:?}");
                assert!(st.requests <= 4 + 2 * 4 + 30 * 4, "{what}: {st:?}");
            }
        }
    }
}

#[test]
fn through_the_faulty_proxy_an_epoch_has_exactly_the_clean_samples() {
    let Some(sv) = servers("faulty") else {
        return;
    };
    let wds_local = write_wds(&sv.dir, 4);
    let tfr_local = write_tfrecord(&sv.dir, 3);
    let via = |paths: &[PathBuf]| -> Vec<String> {
        names(paths)
            .iter()
            .map(|n| format!("{}/{n}", sv.proxy))
            .collect()
    };
    let local = |paths: &[PathBuf]| -> Vec<String> {
        paths.iter().map(|p| p.display().to_string()).collect()
    };
    let mut retries = 0;
    for shuffle in [Shuffle::Block { window: 1 }, Shuffle::Global] {
        let (want, _, _) = digest(wds(&local(&wds_local)), wds_stats, shuffle, 0, 1);
        let (got, _, st) = digest(wds(&via(&wds_local)), wds_stats, shuffle, 0, 1);
        assert_eq!(got, want, "webdataset, {shuffle:?}: {st:?}");
        retries += st.retries;
        let (want, _, _) = digest(tfr(&local(&tfr_local)), tfr_stats, shuffle, 0, 1);
        let (got, _, st) = digest(tfr(&via(&tfr_local)), tfr_stats, shuffle, 0, 1);
        assert_eq!(got, want, "tfrecord, {shuffle:?}: {st:?}");
        retries += st.retries;
    }
    assert!(retries > 0, "the proxy's faults were retried");
}

#[test]
fn each_rank_fetches_about_its_share() {
    let Some(sv) = servers("ranks") else {
        return;
    };
    let local = write_wds(&sv.dir, 16);
    let total: u64 = local
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    let largest = local
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .max()
        .unwrap();
    let urls: Vec<String> = names(&local)
        .iter()
        .map(|n| format!("{}/{n}", sv.http))
        .collect();
    let world = 4;
    let mut sum = 0;
    let mut samples = 0;
    for rank in 0..world {
        let (_, n, st) = digest(
            wds(&urls),
            wds_stats,
            Shuffle::Block { window: 2 },
            rank,
            world,
        );
        samples += n;
        sum += st.bytes_fetched;
        let share = total / world;
        assert!(
            st.bytes_fetched <= share + largest && st.bytes_fetched + largest >= share,
            "rank {rank} fetched {} bytes; its share is {share} (total {total}, shards up to \
             {largest})",
            st.bytes_fetched
        );
    }
    assert_eq!(samples, 16 * 40);
    assert!(sum <= total + 2 * largest * (world - 1), "{sum} of {total}");
}

#[test]
fn failures_name_the_url_the_attempts_and_the_cause() {
    let Some(sv) = servers("failures") else {
        return;
    };
    // A missing object: not retried.
    let url = format!("{}/missing.tar", sv.http);
    let e = WebDatasetSource::open(&[&url], WebDatasetOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains(&url) && e.contains("HEAD failed"), "{e}");
    // A server that answers 503 forever: retried until the attempts run out.
    let proxy = sv.proxy.rsplit_once('/').unwrap().0;
    let url = format!("{proxy}/always503/x.tar");
    let e = WebDatasetSource::open(&[&url], WebDatasetOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains(&url), "{e}");
    assert!(e.contains("after 40 attempts"), "{e}");
    assert!(e.contains("503"), "{e}");
}

#[test]
fn with_on_error_skip_a_shard_that_never_downloads_is_skipped_and_reported() {
    let Some(sv) = servers("skip_dead") else {
        return;
    };
    let local = write_wds(&sv.dir, 4);
    let proxy = sv.proxy.rsplit_once('/').unwrap().0;
    let dead = format!("{proxy}/get503/skip_dead/wds-02.tar");
    let urls: Vec<String> = names(&local)
        .iter()
        .map(|n| match n.as_str() {
            "wds-02.tar" => dead.clone(),
            n => format!("{}/{n}", sv.http),
        })
        .collect();
    let source = wds(&urls);
    assert_eq!(
        source.manifest().total_samples(),
        160,
        "the dead shard opens"
    );
    let mut loader = Loader::builder(source)
        .batch_size(8)
        .shuffle(Shuffle::Block { window: 1 })
        .num_workers(2)
        .on_error(OnError::Skip)
        .build()
        .unwrap();
    let mut keys = Vec::new();
    for b in &mut loader {
        let b = b.expect("skip keeps the epoch going");
        let Some(chute::Column::Var(k)) = b.get("__key__") else {
            panic!("keys are a variable-length column")
        };
        keys.extend((0..k.len()).map(|i| String::from_utf8(k.get(i).to_vec()).unwrap()));
    }
    let stats = loader.stats();
    assert_eq!(
        stats.skipped, 40,
        "every sample of the dead shard: {stats:?}"
    );
    let last = stats.skipped_recent.last().unwrap();
    assert!(
        last.contains(&dead) && last.contains("attempts") && last.contains("503"),
        "{last}"
    );
    assert_eq!(keys.len(), 160);
    // Shard 2 holds samples 80..120; none of them is delivered.
    assert!(
        keys.iter()
            .all(|k| !(80..120).contains(&k[1..].parse::<u32>().unwrap())),
        "{keys:?}"
    );
}

#[test]
fn token_and_parquet_files_by_url_give_the_local_digest() {
    use chute::core::{Array, DType, Field, Sample};
    use chute::formats::parquet::{ParquetOptions, ParquetSource, ParquetWriter};
    use chute::formats::{TokenOptions, TokenSource, TokenWriter};
    let Some(sv) = servers("whole_files") else {
        return;
    };
    std::fs::create_dir_all(&sv.dir).unwrap();
    let mut rng = SampleRng::from_key(13);
    let mut tokens = Vec::new();
    for f in 0..2 {
        let path = sv.dir.join(format!("tok-{f}.bin"));
        let mut w = TokenWriter::create(&path, DType::U16).unwrap();
        let ids: Vec<u32> = (0..5000).map(|_| rng.below(50_000) as u32).collect();
        w.write_tokens(&ids).unwrap();
        w.finish().unwrap();
        tokens.push(path);
    }
    let table = sv.dir.join("table.parquet");
    let mut w = ParquetWriter::create(&table, 100).unwrap();
    for i in 0..500u64 {
        let x = (rng.next_f64() as f32).to_le_bytes();
        let s = Sample::new(i)
            .with("id", Field::Array(Array::scalar_i64(i as i64)))
            .with(
                "x",
                Field::Array(Array::new(DType::F32, vec![], x.to_vec().into())),
            );
        w.write(&s).unwrap();
    }
    w.finish().unwrap();

    let opts = TokenOptions {
        seq_len: 64,
        dtype: DType::U16,
        out_dtype: DType::I64,
    };
    let no_stats = |_: &dyn std::any::Any| IoSnapshot::default();
    let mut remotes = vec![("http", sv.http.clone())];
    if let Some((_, bucket)) = &sv.s3 {
        upload(&sv.dir, bucket, "whole_files");
        remotes.push(("s3", format!("s3://{bucket}/whole_files")));
    }
    for shuffle in SHUFFLES {
        let local: Vec<String> = tokens.iter().map(|p| p.display().to_string()).collect();
        let (want, n, _) = digest(
            TokenSource::open(&local, opts).unwrap(),
            no_stats,
            shuffle,
            0,
            1,
        );
        assert_eq!(n, 2 * (5000 / 65));
        let (want_pq, rows, _) = digest(
            ParquetSource::open(&[&table], ParquetOptions::default()).unwrap(),
            no_stats,
            shuffle,
            0,
            1,
        );
        assert_eq!(rows, 500);
        for (what, base) in &remotes {
            let urls = [format!("{base}/tok-0.bin"), format!("{base}/tok-1.bin")];
            let (got, _, _) = digest(
                TokenSource::open(&urls, opts).unwrap(),
                no_stats,
                shuffle,
                0,
                1,
            );
            assert_eq!(got, want, "tokens over {what}, {shuffle:?}");
            let url = format!("{base}/table.parquet");
            let src = ParquetSource::open(&[&url], ParquetOptions::default()).unwrap();
            let (got, _, _) = digest(src, no_stats, shuffle, 0, 1);
            assert_eq!(got, want_pq, "parquet over {what}, {shuffle:?}");
        }
    }
}

/// Set in the child process [`soak_memory_threads_and_files_stay_flat`] runs in.
const SOAK_CHILD: &str = "CHUTE_SOAK_CHILD";

/// The soak of RELIABILITY.md in Rust alone (issue 14; `python/tests/test_soak.py` is the
/// Python one): 10^5 batches of 4 from 6 remote WebDataset shards read through a fault
/// proxy of the test's own (a 503, a cut body, a reset and a 429 in every 100 requests),
/// one sample in 37 corrupt (its `.npy` member is not an array) and skipped, across 400
/// epoch boundaries (`block:1`, so shards download again every epoch). Run in a child
/// process of its own, so other tests' memory and threads do not count. Sampled every
/// 10,000 batches from batch 10,125 (mid-epoch): anonymous resident memory within 64 MiB of
/// its level then, the thread count moving only within the I/O runtime's DNS pool (at most
/// 4), open descriptors other than sockets unchanged and at most 16 sockets, every corrupt
/// sample of the epochs read counted as skipped, and faults retried.
#[test]
fn soak_memory_threads_and_files_stay_flat() {
    if std::env::var_os(SOAK_CHILD).is_none() {
        if servers("soak").is_none() {
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "--nocapture",
                "--test-threads",
                "1",
                "remote::soak_memory_threads_and_files_stay_flat",
            ])
            .env(SOAK_CHILD, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "the soak's child:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        if let Some(line) = stdout.lines().find(|l| l.starts_with("soak:")) {
            eprintln!("{line}");
        }
        return;
    }
    const SHARDS: u64 = 6;
    const PER_SHARD: u64 = 166;
    const BATCH: usize = 4;
    const BATCHES: u64 = 100_000;
    const BAD_EVERY: u64 = 37;
    let sv = servers("soak").expect("the parent saw the servers");
    std::fs::create_dir_all(&sv.dir).unwrap();
    let mut w = ShardWriter::new(
        sv.dir.join("soak-%02d.tar").to_str().unwrap(),
        ShardWriterOptions {
            max_count: PER_SHARD,
            write_index: true,
            ..ShardWriterOptions::default()
        },
    )
    .unwrap();
    let mut bad = 0;
    for n in 0..SHARDS * PER_SHARD {
        let body = if n % BAD_EVERY == 5 {
            bad += 1;
            b"not an npy array".to_vec()
        } else {
            let data: Vec<u8> = [n as i64; 16]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect();
            chute::core::npy::write_npy(chute::DType::I64, &[16], &data).unwrap()
        };
        w.write(&format!("{n:06}"), &[("npy", &body)]).unwrap();
    }
    w.finish().unwrap();

    let upstream = sv
        .http
        .split("://")
        .nth(1)
        .unwrap()
        .split('/')
        .next()
        .unwrap();
    let pattern = ["ok"; 24]
        .iter()
        .chain(&["503"])
        .chain(&["ok"; 24])
        .chain(&["cut"])
        .chain(&["ok"; 24])
        .chain(&["reset"])
        .chain(&["ok"; 24])
        .chain(&["429"])
        .copied()
        .collect::<Vec<_>>()
        .join(",");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/faultproxy.py");
    let mut proxy = std::process::Command::new("python3")
        .arg(&script)
        .args(["--upstream", upstream, "--pattern", &pattern])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(proxy.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let port = line.trim().rsplit(' ').next().unwrap().to_owned();
    assert!(line.contains("listening on"), "{line}");
    let urls: Vec<String> = (0..SHARDS)
        .map(|s| format!("http://127.0.0.1:{port}/soak/soak-{s:02}.tar"))
        .collect();

    let ops = chute::ops::SampleOps::from_json(r#"{"npy": [{"op": "npy"}]}"#).unwrap();
    let mut loader = Loader::builder(wds(&urls))
        .batch_size(BATCH)
        .shuffle(Shuffle::Block { window: 1 })
        .num_workers(2)
        .on_error(OnError::Skip)
        .transform(ops)
        .build()
        .unwrap();
    let before = chute::io::io_stats();
    let (mut batches, mut epochs) = (0u64, 0u64);
    let mut marks: Vec<(u64, [u64; 4])> = Vec::new();
    while batches < BATCHES {
        loader.set_epoch(epochs);
        for b in &mut loader {
            let b = b.expect("skip keeps every epoch going");
            let Some(chute::Column::Tensor(t)) = b.get("npy") else {
                panic!("npy is a tensor column");
            };
            assert_eq!(t.shape(), &[BATCH, 16]);
            let firsts: Vec<i64> = t
                .as_bytes()
                .chunks(16 * 8)
                .map(|row| i64::from_le_bytes(row[..8].try_into().unwrap()))
                .collect();
            assert!(
                firsts.iter().all(|&x| x as u64 % BAD_EVERY != 5),
                "{firsts:?}"
            );
            batches += 1;
            if batches % 10_000 == 125 && batches > 10_000 {
                let (sockets, files) = fds();
                marks.push((
                    batches,
                    [status("RssAnon"), status("Threads"), sockets, files],
                ));
            }
            if batches == BATCHES {
                break;
            }
        }
        epochs += 1;
    }
    let _ = proxy.kill();
    let _ = proxy.wait();
    assert!(epochs >= 400, "{epochs} epochs");
    let base = marks[0].1;
    for (at, [rss, _, sockets, files]) in &marks {
        // Resident memory may also fall below the first mark (the allocator gives pages
        // back); only growth counts.
        let grew = rss.saturating_sub(base[0]);
        assert!(grew <= 64 << 10, "RssAnon grew {grew} kB by batch {at}");
        assert_eq!(
            *files, base[3],
            "open files other than sockets at batch {at}"
        );
        assert!(*sockets <= 16, "{sockets} sockets open at batch {at}");
    }
    let threads: Vec<u64> = marks.iter().map(|(_, m)| m[1]).collect();
    assert!(
        threads.iter().max().unwrap() - threads.iter().min().unwrap() <= 4,
        "{marks:?}"
    );
    let stats = loader.stats();
    let full = (epochs - 1) * bad;
    assert!(
        (full..=full + bad).contains(&stats.skipped),
        "{} skipped over {epochs} epochs of {bad} corrupt samples",
        stats.skipped
    );
    let retries = chute::io::io_stats().retries - before.retries;
    assert!(retries > 20, "{retries} retries");
    println!(
        "soak: {epochs} epochs, {} skipped, {retries} retries, marks (batch, [RssAnon kB, \
         threads, sockets, other fds]) {marks:?}",
        stats.skipped
    );
}

/// This process's `/proc/self/status` field `field` (kB for sizes).
fn status(field: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// Open descriptors: (sockets, everything else).
fn fds() -> (u64, u64) {
    let (mut sockets, mut other) = (0, 0);
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        match std::fs::read_link(e.path()) {
            Ok(t) if t.to_string_lossy().starts_with("socket:") => sockets += 1,
            Ok(_) => other += 1,
            Err(_) => {} // closed meanwhile (the listing's own descriptor among them)
        }
    }
    (sockets, other)
}
