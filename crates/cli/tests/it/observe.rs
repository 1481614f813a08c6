//! `chute doctor`, `chute bench --plot` and `--metrics-port`, run as a user would.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::{json, ok, token_file};

/// A PNG's width and height, after checking its signature and its header chunk.
pub(crate) fn png_size(path: &Path) -> (u32, u32) {
    let b = std::fs::read(path).unwrap();
    assert_eq!(
        &b[..8],
        b"\x89PNG\r\n\x1a\n",
        "{} is not a PNG",
        path.display()
    );
    assert_eq!(&b[12..16], b"IHDR");
    let be = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
    assert!(b.ends_with(&[0, 0, 0, 0, b'I', b'E', b'N', b'D', 0xAE, 0x42, 0x60, 0x82]));
    (be(16), be(20))
}

#[test]
fn bench_plots_a_run_as_png_and_as_a_page() {
    let dir = tempfile::tempdir().unwrap();
    let bin = token_file(dir.path(), "t", 120_000, 7);
    let png = dir.path().join("run.png");
    let html = dir.path().join("run.html");
    for out in [&png, &html] {
        ok(&[
            "bench",
            bin.to_str().unwrap(),
            "--seq-len",
            "31",
            "--batch-size",
            "8",
            "--step-ms",
            "2",
            "--workers",
            "2",
            "--quiet",
            "--plot",
            out.to_str().unwrap(),
        ]);
    }
    // Four panels of 260 pixels and a title.
    assert_eq!(png_size(&png), (1000, 1080));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>"));
    assert!(page.contains("<svg") && page.contains("</svg>"));
    for caption in ["throughput", "queue depth", "worker time per stage"] {
        assert!(page.contains(caption), "{caption}");
    }
    let bad = Command::new(env!("CARGO_BIN_EXE_chute"))
        .args(["bench", bin.to_str().unwrap(), "--seq-len", "31", "--quiet"])
        .args(["--plot", dir.path().join("run.gif").to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("must end in .png"));
}

#[test]
fn doctor_reports_stages_trials_and_a_recommendation() {
    let dir = tempfile::tempdir().unwrap();
    let bin = token_file(dir.path(), "t", 200_000, 3);
    let png = dir.path().join("doctor.png");
    let out = json(&ok(&[
        "doctor",
        bin.to_str().unwrap(),
        "--seq-len",
        "63",
        "--batch-size",
        "16",
        "--seconds",
        "0.2",
        "--try-workers",
        "1,2",
        "--step-ms",
        "5",
        "--json",
        "--plot",
        png.to_str().unwrap(),
    ]));
    let stages: Vec<&str> = out["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stage"].as_str().unwrap())
        .collect();
    assert_eq!(stages, ["read", "transform", "collate"]);
    let trials = out["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 2);
    assert!(
        trials
            .iter()
            .all(|t| t["samples_per_sec"].as_f64().unwrap() > 0.0)
    );
    assert_eq!(out["required_samples_per_sec"].as_f64(), Some(16.0 / 0.005));
    assert!(["read", "transform", "collate"].contains(&out["bottleneck"].as_str().unwrap()));
    assert!([1, 2].contains(&out["recommended_workers"].as_u64().unwrap()));
    assert!(out["predicted_wait_fraction"].as_f64().unwrap() >= 0.0);
    assert_eq!(png_size(&png), (1000, 560));
    // Plain words.
    let text = ok(&[
        "doctor",
        bin.to_str().unwrap(),
        "--seq-len",
        "63",
        "--seconds",
        "0.1",
        "--try-workers",
        "1",
    ]);
    assert!(text.contains("bottleneck: "), "{text}");
    assert!(text.contains("recommended: num_workers=1"), "{text}");
}

#[test]
fn doctor_advises_indexes_and_a_reduced_size_decode_on_jpeg_shards() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("demo");
    ok(&[
        "demo",
        "--keep",
        data.to_str().unwrap(),
        "--images",
        "64",
        "--epochs",
        "1",
        "--step-ms",
        "0",
        "--json",
    ]);
    let shard = data.join("train-000000.tar");
    let doctor = |ops: &str| {
        json(&ok(&[
            "doctor",
            shard.to_str().unwrap(),
            "--batch-size",
            "8",
            "--seconds",
            "0.3",
            "--try-workers",
            "1,2",
            "--transform",
            ops,
            "--json",
        ]))
    };
    let rules = |d: &serde_json::Value| -> Vec<String> {
        d["advice"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["rule"].as_str().unwrap().to_string())
            .collect()
    };
    // A flip between the decode and the resize: the decode runs at full size.
    let unfused = doctor(
        r#"{"jpg": [{"op": "decode"}, {"op": "horizontal_flip"}, {"op": "resize", "size": 32}], "cls": [{"op": "label"}]}"#,
    );
    assert_eq!(unfused["bottleneck"], "transform", "{unfused}");
    let r = rules(&unfused);
    assert!(r.contains(&"reduced-decode".into()), "{r:?}");
    assert!(r.contains(&"not-indexed".into()), "{r:?}");
    let fields = unfused["fields"].to_string();
    assert!(fields.contains("JPEG image"), "{fields}");
    // Fused (resize right after decode), and indexed: neither rule.
    ok(&["index", shard.to_str().unwrap()]);
    let fused = doctor(
        r#"{"jpg": [{"op": "decode"}, {"op": "resize", "size": 32}, {"op": "horizontal_flip"}], "cls": [{"op": "label"}]}"#,
    );
    let r = rules(&fused);
    assert!(!r.contains(&"reduced-decode".into()), "{r:?}");
    assert!(!r.contains(&"not-indexed".into()), "{r:?}");
}

/// A port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn bench_serves_metrics_while_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let bin = token_file(dir.path(), "t", 50_000, 5);
    let port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_chute"))
        .args(["bench", bin.to_str().unwrap(), "--seq-len", "31", "--quiet"])
        .args(["--batch-size", "4", "--step-ms", "2", "--metrics-hold", "5"])
        .args(["--metrics-port", &port.to_string(), "--json"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let mut body = String::new();
    while t0.elapsed() < Duration::from_secs(20) {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
            write!(s, "GET /metrics HTTP/1.1\r\n\r\n").unwrap();
            body.clear();
            s.read_to_string(&mut body).unwrap();
            if body.contains(r#"chute_samples_total{rank="0",loader="0",stage="delivered"}"#) {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    assert!(
        body.contains(r#"chute_samples_total{rank="0",loader="0",stage="delivered"}"#),
        "{body}"
    );
    assert!(body.contains("chute_batch_wait_seconds_bucket"));
}
