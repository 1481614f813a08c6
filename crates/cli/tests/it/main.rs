//! The `chute` command, run as a user would (one test binary).

mod convert;
mod observe;
mod remote;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn chute(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_chute"))
        .args(args)
        .output()
        .expect("chute runs")
}

pub(crate) fn ok(args: &[&str]) -> String {
    let out = chute(args);
    assert!(
        out.status.success(),
        "chute {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A token file of `n` pseudo-random uint16 tokens written through `chute tokens`.
fn token_file(dir: &Path, name: &str, n: usize, seed: u64) -> PathBuf {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let text: Vec<String> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 50_000).to_string()
        })
        .collect();
    let txt = dir.join(format!("{name}.txt"));
    std::fs::write(&txt, text.join(" ")).unwrap();
    let bin = dir.join(format!("{name}.bin"));
    ok(&["tokens", txt.to_str().unwrap(), "-o", bin.to_str().unwrap()]);
    bin
}

pub(crate) fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn bench(file: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "bench",
        file.to_str().unwrap(),
        "--seq-len",
        "31",
        "--json",
        "--digest",
    ];
    args.extend_from_slice(extra);
    json(&ok(&args))
}

fn read_ids(path: &Path) -> Vec<u64> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect()
}

#[test]
fn digest_is_the_same_for_any_workers_and_prefetch() {
    let dir = tempfile::tempdir().unwrap();
    let f = token_file(dir.path(), "a", 40_000, 1);
    let digest = |w: &str, p: &str| {
        let s = bench(
            &f,
            &[
                "--workers",
                w,
                "--prefetch",
                p,
                "--batch-size",
                "7",
                "--epochs",
                "2",
            ],
        );
        assert_eq!(s["samples"], 2 * 1250, "{s}");
        s["digest"].as_str().unwrap().to_string()
    };
    let d = digest("1", "2");
    assert_eq!(d.len(), 32);
    for (w, p) in [("4", "2"), ("1", "1"), ("1", "8"), ("0", "1"), ("8", "8")] {
        assert_eq!(digest(w, p), d, "workers {w} prefetch {p}");
    }
    // A different seed is a different stream.
    let other = bench(
        &f,
        &[
            "--workers",
            "2",
            "--batch-size",
            "7",
            "--epochs",
            "2",
            "--seed",
            "1",
        ],
    );
    assert_ne!(other["digest"].as_str().unwrap(), d);
}

#[test]
fn rank_ids_partition_the_epoch_with_equal_counts() {
    let dir = tempfile::tempdir().unwrap();
    let a = token_file(dir.path(), "a", 10_000, 2);
    let b = token_file(dir.path(), "b", 7_000, 3);
    let n = 10_000 / 32 + 7_000 / 32; // windows of seq_len + 1 = 32 tokens
    for shuffle in ["none", "global", "block:1"] {
        for drop_last in [false, true] {
            let mut all = Vec::new();
            let mut counts = Vec::new();
            for rank in 0..3 {
                let ids = dir.path().join(format!("ids-{shuffle}-{drop_last}-{rank}"));
                let mut args = vec![
                    "bench",
                    a.to_str().unwrap(),
                    b.to_str().unwrap(),
                    "--seq-len",
                    "31",
                    "--json",
                    "--shuffle",
                    shuffle,
                    "--world-size",
                    "3",
                    "--batch-size",
                    "8",
                    "--ids",
                    ids.to_str().unwrap(),
                ];
                let rank = rank.to_string();
                args.extend(["--rank", rank.as_str()]);
                if drop_last {
                    args.push("--drop-last");
                }
                let s = json(&ok(&args));
                let got = read_ids(&ids);
                assert_eq!(s["samples"].as_u64().unwrap(), got.len() as u64);
                counts.push((got.len(), s["batches"].as_u64().unwrap()));
                all.extend(got);
            }
            assert!(
                counts.iter().all(|c| *c == counts[0]),
                "{shuffle}: {counts:?}"
            );
            let total = all.len();
            all.sort();
            all.dedup();
            if drop_last {
                assert_eq!(all.len(), total, "no repeats");
                assert!(n - total < 3 * 8);
            } else {
                assert_eq!(all, (0..n as u64).collect::<Vec<_>>(), "{shuffle}");
                assert!(total - n < 3);
            }
        }
    }
}

#[test]
fn save_state_and_resume_deliver_exactly_the_uninterrupted_ids() {
    let dir = tempfile::tempdir().unwrap();
    let f = token_file(dir.path(), "a", 20_000, 4);
    let common = [
        "--batch-size",
        "9",
        "--epochs",
        "2",
        "--workers",
        "3",
        "--shuffle",
        "global",
    ];
    let full = dir.path().join("full.ids");
    let reference = bench(
        &f,
        &[&common[..], &["--ids", full.to_str().unwrap()]].concat(),
    );
    let full = read_ids(&full);
    assert_eq!(full.len() as u64, reference["samples"].as_u64().unwrap());
    // 625 windows: 70 batches per epoch; stop inside epoch 0, at its end, and inside epoch 1.
    for stop in ["13", "70", "101"] {
        let state = dir.path().join(format!("state-{stop}.json"));
        let first = dir.path().join(format!("first-{stop}.ids"));
        let rest = dir.path().join(format!("rest-{stop}.ids"));
        let a = bench(
            &f,
            &[
                &common[..],
                &[
                    "--ids",
                    first.to_str().unwrap(),
                    "--save-state-at",
                    stop,
                    state.to_str().unwrap(),
                ],
            ]
            .concat(),
        );
        assert_eq!(a["batches"].as_u64().unwrap().to_string(), stop);
        let b = bench(
            &f,
            &[
                &common[..],
                &[
                    "--ids",
                    rest.to_str().unwrap(),
                    "--resume",
                    state.to_str().unwrap(),
                ],
            ]
            .concat(),
        );
        let mut got = read_ids(&first);
        got.extend(read_ids(&rest));
        assert_eq!(got, full, "stopped at batch {stop}");
        assert!(b["samples"].as_u64().unwrap() > 0);
    }
}

#[test]
fn resume_refuses_a_state_from_another_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let a = token_file(dir.path(), "a", 5_000, 5);
    let b = token_file(dir.path(), "b", 6_000, 6);
    let state = dir.path().join("s.json");
    bench(&a, &["--save-state-at", "2", state.to_str().unwrap()]);
    let out = chute(&[
        "bench",
        b.to_str().unwrap(),
        "--seq-len",
        "31",
        "--resume",
        state.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another dataset"), "{err}");
}

#[test]
fn tokens_from_npy_and_bad_inputs() {
    let dir = tempfile::tempdir().unwrap();
    // A .npy of int64 ids, as np.save(np.arange(3000, 3100, dtype=np.int64)) writes it.
    let mut header = b"{'descr': '<i8', 'fortran_order': False, 'shape': (100,), }".to_vec();
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(b' ');
    }
    header.push(b'\n');
    let mut npy = b"\x93NUMPY\x01\x00".to_vec();
    npy.extend((header.len() as u16).to_le_bytes());
    npy.extend(header);
    for v in 3000i64..3100 {
        npy.extend(v.to_le_bytes());
    }
    let npy_path = dir.path().join("ids.npy");
    std::fs::write(&npy_path, npy).unwrap();
    let bin = dir.path().join("ids.bin");
    ok(&[
        "tokens",
        npy_path.to_str().unwrap(),
        "-o",
        bin.to_str().unwrap(),
    ]);
    let bytes = std::fs::read(&bin).unwrap();
    assert_eq!(bytes.len(), 200, "uint16 chosen automatically");
    assert_eq!(u16::from_le_bytes([bytes[2], bytes[3]]), 3001);

    let big = dir.path().join("big.txt");
    std::fs::write(&big, "1 2 70000").unwrap();
    let out32 = dir.path().join("big.bin");
    ok(&[
        "tokens",
        big.to_str().unwrap(),
        "-o",
        out32.to_str().unwrap(),
    ]);
    assert_eq!(
        std::fs::metadata(&out32).unwrap().len(),
        12,
        "uint32 when ids exceed 65535"
    );

    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, "1 2 x3").unwrap();
    let out = chute(&[
        "tokens",
        bad.to_str().unwrap(),
        "-o",
        dir.path().join("x.bin").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.txt") && err.contains("x3"), "{err}");
    assert!(!dir.path().join("x.bin").exists());

    // A token file whose size is not a whole number of tokens is refused with its name.
    let odd = dir.path().join("odd.bin");
    std::fs::write(&odd, [0u8; 201]).unwrap();
    let out = chute(&["bench", odd.to_str().unwrap(), "--seq-len", "7"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("odd.bin"), "{err}");
}

#[test]
fn demo_runs_and_reports_the_wait() {
    let out = ok(&[
        "demo",
        "--tokens",
        "--num-tokens",
        "300000",
        "--seq-len",
        "127",
        "--step-ms",
        "0.5",
    ]);
    assert!(out.contains("waited for data"), "{out}");
    assert!(out.contains("samples/s"), "{out}");
    assert!(out.contains("read") && out.contains("collate"), "{out}");
    let s = json(&ok(&[
        "demo",
        "--tokens",
        "--num-tokens",
        "300000",
        "--seq-len",
        "127",
        "--step-ms",
        "0",
        "--json",
    ]));
    assert_eq!(s["epochs_completed"], 2);
    assert_eq!(
        s["samples"].as_u64().unwrap(),
        2 * (300_000 / 128 / 16 * 16)
    );
}

#[test]
fn image_demo_trains_on_synthetic_jpegs() {
    let out = ok(&[
        "demo",
        "--images",
        "200",
        "--batch-size",
        "16",
        "--step-ms",
        "0",
    ]);
    assert!(out.contains("drew 200 synthetic 256x256 JPEGs"), "{out}");
    assert!(
        out.contains("images/s") && out.contains("waited for images"),
        "{out}"
    );
    let s = json(&ok(&[
        "demo",
        "--images",
        "100",
        "--batch-size",
        "16",
        "--step-ms",
        "0",
        "--json",
    ]));
    assert_eq!(s["epochs_completed"], 2);
    assert_eq!(s["samples"], 2 * 96, "two epochs of 6 full batches");
    // Crops and flips come from (seed, epoch, sample): any worker count, the same batches.
    let one = json(&ok(&[
        "demo",
        "--images",
        "100",
        "--batch-size",
        "16",
        "--step-ms",
        "0",
        "--json",
        "--workers",
        "1",
    ]));
    assert_eq!(one["digest"], s["digest"]);
}

#[test]
fn audio_demo_trains_on_whisper_features_and_inspect_shows_the_clips() {
    let dir = tempfile::tempdir().unwrap();
    let keep = dir.path().join("audio");
    let keep = keep.to_str().unwrap();
    let out = ok(&[
        "demo",
        "--audio",
        "--clips",
        "24",
        "--batch-size",
        "8",
        "--epochs",
        "1",
        "--step-ms",
        "0",
        "--keep",
        keep,
    ]);
    assert!(out.contains("synthesized 24 speech-like clips"), "{out}");
    assert!(
        out.contains("float32 [8, 80, 3000]") && out.contains("clips/s"),
        "{out}"
    );
    let args = [
        "demo",
        "--audio",
        "--clips",
        "24",
        "--batch-size",
        "8",
        "--epochs",
        "1",
        "--step-ms",
        "0",
        "--json",
    ];
    let four = json(&ok(&[&args[..], &["--workers", "4"]].concat()));
    let one = json(&ok(&[&args[..], &["--workers", "1"]].concat()));
    assert_eq!(four["samples"], 24);
    assert_eq!(
        four["digest"], one["digest"],
        "the same features for any worker count"
    );
    let shard = format!("{keep}/audio-000000.tar");
    let report = json(&ok(&["inspect", &shard, "--json", "-n", "1"]));
    let first = &report["first"][0]["fields"]["wav"]["audio"];
    assert_eq!(first["codec"], "pcm_s16le", "{report}");
    assert_eq!(first["sample_rate"], 44_100);
    assert_eq!(first["channels"], 1);
    let seconds = first["seconds"].as_f64().unwrap();
    assert!((1.0..=12.0).contains(&seconds), "{seconds}");
}

#[cfg(feature = "video")]
#[test]
fn video_demo_trains_on_random_clips_and_inspect_shows_the_videos() {
    let dir = tempfile::tempdir().unwrap();
    let keep = dir.path().join("video");
    let keep = keep.to_str().unwrap();
    let args = [
        "demo",
        "--video",
        "--videos",
        "12",
        "--batch-size",
        "4",
        "--epochs",
        "1",
        "--step-ms",
        "0",
    ];
    let out = ok(&[&args[..], &["--keep", keep]].concat());
    assert!(out.contains("encoded 12 synthetic videos"), "{out}");
    assert!(
        out.contains("uint8 [4, 16, 112, 112, 3]") && out.contains("clips/s"),
        "{out}"
    );
    let four = json(&ok(&[&args[..], &["--json", "--workers", "4"]].concat()));
    let one = json(&ok(&[&args[..], &["--json", "--workers", "1"]].concat()));
    assert_eq!(four["samples"], 12);
    assert_eq!(
        four["digest"], one["digest"],
        "the same clips and crops for any worker count"
    );
    let shard = format!("{keep}/video-000000.tar");
    let report = json(&ok(&["inspect", &shard, "--json", "-n", "1"]));
    let first = &report["first"][0]["fields"]["mp4"]["video"];
    assert!(
        first["codec"] == "h264" || first["codec"] == "mpeg4",
        "{report}"
    );
    assert_eq!(
        (first["width"].clone(), first["height"].clone()),
        (320.into(), 240.into())
    );
    assert_eq!(first["fps"], 25.0);
    let frames = first["frames"].as_u64().unwrap();
    assert!((50..=100).contains(&frames), "{frames}");
    let seconds = first["seconds"].as_f64().unwrap();
    assert!((seconds - frames as f64 / 25.0).abs() < 1e-6, "{seconds}");
    assert!(report["first"][0]["fields"]["cls"].get("video").is_none());
}

fn golden(rel: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata")
        .join(rel)
        .display()
        .to_string()
}

#[test]
fn inspect_cat_and_verify_a_parquet_file() {
    let f = golden("parquet/pyarrow_golden.parquet");
    let s = json(&ok(&["inspect", &f, "--json", "-n", "2"]));
    assert_eq!(s["format"], "parquet");
    assert_eq!(s["samples"], 50);
    assert_eq!(s["shards"], 4);
    assert_eq!(s["first"][1]["fields"]["label"], -4);
    let lines = ok(&["cat", &f, "--columns", "caption,label", "--skip", "48"]);
    let rows: Vec<serde_json::Value> = lines.lines().map(json).collect();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["fields"]["caption"], "caption 48 ✓");
    assert_eq!(rows[1]["fields"]["label"], 49 * 3 - 7);
    let v = json(&ok(&[
        "verify",
        &f,
        &golden("parquet/pyarrow_golden_zstd.parquet"),
        "--json",
    ]));
    assert_eq!(
        (v["ok"].as_bool(), v["samples"].as_u64()),
        (Some(true), Some(100))
    );

    // A file cut short: verify names it, exits 1, and still checks the other shards.
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("cut.parquet");
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let out = chute(&["verify", cut.to_str().unwrap(), &f, "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v = json(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(v["samples"], 50, "the good shard was read");
    assert!(
        v["problems"][0]["shard"]
            .as_str()
            .unwrap()
            .ends_with("cut.parquet"),
        "{v}"
    );
}

#[test]
fn index_writes_manifest_and_indexes_that_the_loader_uses() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["wds-shard-000000.tar", "wds-shard-000001.tar"] {
        std::fs::copy(golden(&format!("webdataset/{name}")), dir.path().join(name)).unwrap();
    }
    let pattern = dir.path().join("wds-shard-{000000..000001}.tar");
    ok(&["index", pattern.to_str().unwrap()]);
    let manifest = dir.path().join("manifest.json");
    let m = json(&std::fs::read_to_string(&manifest).unwrap());
    assert_eq!(m["format"], "webdataset");
    assert_eq!(
        m["shards"][1]["path"], "wds-shard-000001.tar",
        "paths relative to the manifest"
    );
    assert!(dir.path().join("wds-shard-000000.tar.idx").exists());
    let m_path = manifest.to_str().unwrap();
    let via_manifest = json(&ok(&[
        "bench",
        m_path,
        "--json",
        "--digest",
        "--batch-size",
        "2",
        "--index",
        "require",
    ]));
    let via_paths = json(&ok(&[
        "bench",
        pattern.to_str().unwrap(),
        "--json",
        "--digest",
        "--batch-size",
        "2",
    ]));
    assert_eq!(via_manifest["samples"], 5);
    assert_eq!(via_manifest["digest"], via_paths["digest"]);
    let s = json(&ok(&["inspect", m_path, "--json"]));
    assert_eq!(s["format"], "webdataset");
    assert_eq!(s["first"][0]["key"], "s0");

    // A shard that changed after indexing: the manifest no longer matches, and says so.
    let f = dir.path().join("wds-shard-000001.tar");
    std::fs::copy(golden("webdataset/wds-shard-000000.tar"), &f).unwrap();
    let out = chute(&["bench", m_path, "--index", "scan"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("chute index"));
}

#[test]
fn verify_reports_every_corrupt_tfrecord_with_its_offset() {
    let dir = tempfile::tempdir().unwrap();
    let good = golden("tfrecord/examples.tfrecord");
    let bad = dir.path().join("bad.tfrecord");
    let mut bytes = std::fs::read(&good).unwrap();
    let n = bytes.len();
    bytes[40] ^= 1; // inside record 0's data
    bytes[n - 30] ^= 1; // inside the last record's data
    std::fs::write(&bad, &bytes).unwrap();
    let out = chute(&["verify", bad.to_str().unwrap(), &good, "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v = json(&String::from_utf8(out.stdout).unwrap());
    let problems = v["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 2, "{v}");
    assert_eq!(problems[0]["offset"], 0);
    assert!(problems[1]["offset"].as_u64().unwrap() > 0);
    assert!(problems[0]["reason"].as_str().unwrap().contains("crc"));
    assert_eq!(v["samples"], 10, "both shards read to the end");
    let rows = ok(&["cat", &good, "-n", "1", "--columns", "label,floats"]);
    let row = json(rows.lines().next().unwrap());
    assert_eq!(row["fields"]["label"], -2);
    assert_eq!(row["fields"]["floats"][1], 0.125);
}

#[test]
fn mixture_files_run_under_bench_and_inspect() {
    let dir = tempfile::tempdir().unwrap();
    token_file(dir.path(), "web", 40 * 17, 1);
    token_file(dir.path(), "code", 20 * 17, 2);
    std::fs::create_dir(dir.path().join("more")).unwrap();
    token_file(&dir.path().join("more"), "math", 10 * 17, 3);
    std::fs::write(
        dir.path().join("more/inner.json"),
        r#"{"components": {"math": {"path": "math.bin", "seq_len": 16}}}"#,
    )
    .unwrap();
    let mix = dir.path().join("mix.json");
    std::fs::write(
        &mix,
        r#"{"components": [
              {"name": "web", "paths": ["web.bin"], "seq_len": 16},
              {"name": "code", "path": "code.bin", "seq_len": 16, "shuffle": "none"},
              {"name": "math", "mixture": "more/inner.json"}],
            "weights": {"0": {"web": 0.5, "code": 0.3, "math": 0.2},
                        "40": {"web": 0.2, "code": 0.2, "math": 0.6}},
            "samples_per_epoch": 80}"#,
    )
    .unwrap();
    let m = mix.to_str().unwrap();
    let report = json(&ok(&["inspect", m, "--json"]));
    assert_eq!(report["format"], "mixture");
    assert_eq!(report["samples_per_epoch"], 80);
    assert_eq!(report["policy"], "cycle");
    let comps = report["components"].as_array().unwrap();
    assert_eq!(comps.len(), 3);
    // 20 + 8 web, 12 + 8 code, 8 + 24 math.
    assert_eq!(comps[0]["per_epoch"], 28);
    assert_eq!(comps[2]["per_epoch"], 32);
    assert!((comps[2]["epochs_per_epoch"].as_f64().unwrap() - 3.2).abs() < 1e-9);
    let text = ok(&["inspect", m]);
    assert!(text.contains("from sample"), "{text}");
    let b = bench(&mix, &["--batch-size", "8"]);
    assert_eq!(b["samples"], 80, "{b}");
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"{"components": {"web": {"path": "web.bin"}}, "wieghts": {}}"#,
    )
    .unwrap();
    let out = chute(&["bench", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown key \"wieghts\""), "{err}");
}

#[test]
fn a_reader_that_stops_ends_chute_quietly() {
    // `chute inspect ... | head -1` (and `cat`): once the reader is gone, chute stops, status 0,
    // without a panic's message.
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rows.jsonl");
    let rows: Vec<String> = (0..50_000)
        .map(|i| format!("{{\"text\": \"row {i} of many, long enough to fill a pipe\"}}"))
        .collect();
    std::fs::write(&path, rows.join("\n")).unwrap();
    let path = path.to_str().unwrap();
    for args in [vec!["inspect", path, "-n", "50000"], vec!["cat", path]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_chute"))
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        assert!(!first.is_empty(), "{args:?}");
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {:?} {stderr}", out.status);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}
