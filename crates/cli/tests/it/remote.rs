//! The command line over remote shards: nginx and the fault proxy that `scripts/test.sh`
//! starts when `CHUTE_TEST_SERVERS=1` (see `crates/chute/tests/it/remote.rs`). Without them
//! each test prints why and passes without checking anything.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::{json, ok};

struct Servers {
    dir: PathBuf,
    http: String,
    proxy: String,
}

fn servers(test: &str) -> Option<Servers> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let (Some(dir), Some(http), Some(proxy)) = (
        var("CHUTE_TEST_HTTP_DIR"),
        var("CHUTE_TEST_HTTP_URL"),
        var("CHUTE_TEST_PROXY_URL"),
    ) else {
        eprintln!(
            "skipping {test}: no test servers (CHUTE_TEST_HTTP_DIR/_URL, CHUTE_TEST_PROXY_URL \
             unset); run CHUTE_TEST_SERVERS=1 ./scripts/test.sh to start them"
        );
        return None;
    };
    let dir = PathBuf::from(dir).join(test);
    std::fs::create_dir_all(&dir).unwrap();
    Some(Servers {
        dir,
        http: format!("{http}/{test}"),
        proxy: format!("{proxy}/{test}"),
    })
}

/// `n` WebDataset shards `wds-NN.tar` of 30 random samples, with index files; their paths.
fn shards(dir: &Path, n: u64) -> Vec<PathBuf> {
    chute::formats::testing::random_webdataset(dir, "wds", &vec![30; n as usize], 7)
}

/// `chute bench ARGS --json --digest --quiet` with short retry settings.
fn bench(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["bench", "--json", "--digest", "--quiet", "--timeout", "1"];
    all.extend_from_slice(args);
    json(&ok(&all))
}

#[test]
fn urls_manifests_and_the_node_cache() {
    let Some(sv) = servers("cli_cache") else {
        return;
    };
    let paths = shards(&sv.dir, 8);
    let pattern = sv.dir.join("wds-{00..07}.tar");
    let local = bench(&[
        pattern.to_str().unwrap(),
        "--shuffle",
        "block",
        "--epochs",
        "2",
    ]);
    assert!(local.get("remote").is_none(), "{local}");
    let urls = format!("{}/wds-{{00..07}}.tar", sv.http);
    let cache = tempfile::tempdir().unwrap();
    let cache_dir = cache.path().join("c");
    let cache_s = cache_dir.to_str().unwrap();
    let first = bench(&[
        &urls,
        "--shuffle",
        "block",
        "--epochs",
        "2",
        "--cache-dir",
        cache_s,
    ]);
    assert_eq!(first["digest"], local["digest"], "{first}");
    let r = &first["remote"];
    assert_eq!(r["shards_fetched"], 8, "each shard downloaded once: {r}");
    let total: u64 = paths
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert!(r["bytes_fetched"].as_u64().unwrap() >= total, "{r}");
    let entries = std::fs::read_dir(&cache_dir).unwrap().count();
    assert_eq!(entries, 8, "one cache entry per shard");
    // Another process on the node: every shard from the cache, none downloaded.
    let second = bench(&[&urls, "--shuffle", "block", "--cache-dir", cache_s]);
    let r = &second["remote"];
    assert_eq!(r["shards_fetched"], 0, "{r}");
    assert_eq!(r["cache_hits"], 8, "{r}");

    // A manifest read by URL, its shard paths relative to it.
    ok(&["index", pattern.to_str().unwrap()]);
    let by_manifest = bench(&[&format!("{}/manifest.json", sv.http), "--shuffle", "block"]);
    let one_epoch = bench(&[pattern.to_str().unwrap(), "--shuffle", "block"]);
    assert_eq!(by_manifest["digest"], one_epoch["digest"]);
    // verify and inspect take URLs; index writes a local manifest for remote shards.
    let url0 = format!("{}/wds-00.tar", sv.http);
    let out = ok(&["verify", &url0, &format!("{}/wds-01.tar", sv.http)]);
    assert!(out.contains("2 shard(s), 60 sample(s) read: ok"), "{out}");
    let out = ok(&["inspect", &url0]);
    assert!(out.contains("k0000"), "{out}");
    let m = cache.path().join("remote.json");
    let out = ok(&["index", &urls, "-o", m.to_str().unwrap()]);
    assert!(out.contains("8 remote shard(s)"), "{out}");
    let text = std::fs::read_to_string(&m).unwrap();
    assert!(text.contains(&url0), "{text}");
}

#[test]
fn a_killed_download_leaves_no_corrupt_cache_entry() {
    let Some(sv) = servers("cli_killed") else {
        return;
    };
    let paths = shards(&sv.dir, 8);
    let originals: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let cache = tempfile::tempdir().unwrap();
    let cache_s = cache.path().to_str().unwrap();
    // Through the faulty proxy (its stall makes downloads slow), killed once a shard is cached.
    let urls = format!("{}/wds-{{00..07}}.tar", sv.proxy);
    let mut child = Command::new(env!("CARGO_BIN_EXE_chute"))
        .args([
            "bench",
            &urls,
            "--shuffle",
            "block",
            "--quiet",
            "--cache-dir",
            cache_s,
        ])
        .args(["--timeout", "1", "--read-ahead", "4"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let entries = || -> Vec<PathBuf> {
        std::fs::read_dir(cache.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| !p.to_str().unwrap().ends_with(".part"))
            .collect()
    };
    let t0 = Instant::now();
    while entries().is_empty() && t0.elapsed() < Duration::from_secs(120) {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = child.kill();
    child.wait().unwrap();
    let kept = entries();
    assert!(!kept.is_empty(), "nothing was cached before the kill");
    for e in &kept {
        let bytes = std::fs::read(e).unwrap();
        assert!(
            originals.contains(&bytes),
            "{} is not a whole copy of a shard ({} bytes)",
            e.display(),
            bytes.len()
        );
    }
    // The next run (same URLs: the cache is keyed by URL and version) uses what was cached
    // and reads the same samples as the local shards.
    let again = bench(&[&urls, "--shuffle", "block", "--cache-dir", cache_s]);
    let local = bench(&[
        sv.dir.join("wds-{00..07}.tar").to_str().unwrap(),
        "--shuffle",
        "block",
    ]);
    assert_eq!(again["digest"], local["digest"]);
    assert!(again["remote"]["cache_hits"].as_u64().unwrap() >= kept.len() as u64);
}

/// Shards of uneven sizes (`counts` samples each) with index files, and their manifest.
fn uneven_shards(dir: &Path, counts: &[u64]) -> PathBuf {
    let paths: Vec<String> = chute::formats::testing::random_webdataset(dir, "plan", counts, 11)
        .into_iter()
        .map(|p| p.display().to_string())
        .collect();
    let manifest = dir.join("manifest.json");
    let mut args = vec!["index".to_string()];
    args.extend(paths);
    args.extend(["-o".into(), manifest.to_str().unwrap().into()]);
    ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    manifest
}

/// The shard of each global id, from the shards' sample counts.
fn shard_of(counts: &[u64], id: u64) -> usize {
    let mut end = 0;
    counts
        .iter()
        .position(|&n| {
            end += n;
            id < end
        })
        .unwrap()
}

#[test]
fn plan_figures_equal_what_the_ranks_read() {
    let dir = tempfile::tempdir().unwrap();
    let counts = [13, 40, 7, 25, 31, 19, 60, 11];
    let manifest = uneven_shards(dir.path(), &counts);
    let m = manifest.to_str().unwrap();
    for (shuffle, w, drop_last) in [
        ("block:1", 3, false),
        ("block:2", 4, true),
        ("none", 1, false),
        ("none", 3, false),
        ("global", 2, true),
    ] {
        let mut args = vec![
            "plan",
            m,
            "--world-size",
            &w.to_string(),
            "--batch-size",
            "4",
            "--shuffle",
            shuffle,
            "--seed",
            "3",
            "--json",
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
        if drop_last {
            args.push("--drop-last".into());
        }
        let plan = json(&ok(&args.iter().map(String::as_str).collect::<Vec<_>>()));
        let what = format!("{shuffle} w={w} drop_last={drop_last}");
        let streams = plan["streams_whole_shards"].as_bool().unwrap();
        for r in 0..w {
            let ids_file = dir.path().join(format!("ids-{r}"));
            let mut bench = vec![
                "bench",
                m,
                "--world-size",
                &w.to_string(),
                "--rank",
                &r.to_string(),
                "--batch-size",
                "4",
                "--shuffle",
                shuffle,
                "--seed",
                "3",
                "--quiet",
                "--ids",
                ids_file.to_str().unwrap(),
            ]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>();
            if drop_last {
                bench.push("--drop-last".into());
            }
            ok(&bench.iter().map(String::as_str).collect::<Vec<_>>());
            let ids: Vec<u64> = std::fs::read_to_string(&ids_file)
                .unwrap()
                .lines()
                .map(|l| l.parse().unwrap())
                .collect();
            let rank = &plan["epochs"][0]["ranks"][r as usize];
            assert_eq!(rank["samples"].as_u64(), Some(ids.len() as u64), "{what}");
            assert_eq!(
                rank["batches"].as_u64(),
                Some(ids.len().div_ceil(4) as u64),
                "{what}"
            );
            let shards: std::collections::BTreeSet<usize> =
                ids.iter().map(|&id| shard_of(&counts, id)).collect();
            if shuffle != "global" {
                assert_eq!(
                    rank["shards"].as_f64(),
                    Some(shards.len() as f64),
                    "{what} rank {r}"
                );
            }
            if streams {
                let bytes: u64 = shards
                    .iter()
                    .map(|&s| {
                        std::fs::metadata(dir.path().join(format!("plan-{s:02}.tar")))
                            .unwrap()
                            .len()
                    })
                    .sum();
                assert_eq!(rank["bytes"].as_u64(), Some(bytes), "{what} rank {r}");
            }
        }
    }
}

#[test]
fn plan_prints_nodes_and_plots_them() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = uneven_shards(dir.path(), &[13, 40, 7, 25]);
    let png = dir.path().join("plan.png");
    let text = ok(&[
        "plan",
        manifest.to_str().unwrap(),
        "--world-size",
        "4",
        "--nodes",
        "2",
        "--shuffle",
        "block:1",
        "--bandwidth",
        "1M",
        "--step-ms",
        "10",
        "--plot",
        png.to_str().unwrap(),
    ]);
    assert!(text.contains("4 ranks on 2 nodes"), "{text}");
    assert!(text.contains("node   1 (ranks 2..4)"), "{text}");
    assert!(text.contains("the steps would wait"), "{text}");
    assert_eq!(crate::observe::png_size(&png), (1000, 300));
    let bad = Command::new(env!("CARGO_BIN_EXE_chute"))
        .args([
            "plan",
            manifest.to_str().unwrap(),
            "--world-size",
            "4",
            "--nodes",
            "3",
        ])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("split evenly"));
}

#[test]
fn plan_bytes_equal_what_ranks_download_over_http() {
    let Some(s) = servers("plan_bytes") else {
        return;
    };
    let counts = [13, 40, 7, 25, 31, 19, 60, 11];
    uneven_shards(&s.dir, &counts);
    let m = format!("{}/manifest.json", s.http);
    let plan = json(&ok(&[
        "plan",
        &m,
        "--world-size",
        "3",
        "--batch-size",
        "4",
        "--shuffle",
        "block:1",
        "--json",
    ]));
    for r in 0..3u64 {
        let run = bench(&[
            &m,
            "--world-size",
            "3",
            "--rank",
            &r.to_string(),
            "--batch-size",
            "4",
            "--shuffle",
            "block:1",
        ]);
        let rank = &plan["epochs"][0]["ranks"][r as usize];
        // Whole shards downloaded: the plan's; bytes: those shards' plus their index files.
        assert_eq!(
            run["remote"]["shards_fetched"].as_f64(),
            rank["shards"].as_f64(),
            "rank {r}"
        );
        let fetched = run["remote"]["bytes_fetched"].as_u64().unwrap();
        let planned = rank["bytes"].as_u64().unwrap();
        assert!(
            fetched >= planned && fetched < planned + 8 * 4096,
            "rank {r}: {fetched} vs {planned}"
        );
    }
}
