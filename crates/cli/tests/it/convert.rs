//! `chute convert`: every input to every output, read back; parallel output identical to
//! serial; failures leave no shard under a final name.

use std::path::{Path, PathBuf};

use super::{chute, json, ok};

const FORMATS: [(&str, &str); 3] = [
    ("webdataset", "tar"),
    ("tfrecord", "tfrecord"),
    ("parquet", "parquet"),
];

/// `chute cat` of every shard in `dir` (sorted), one JSON value per record.
fn cat_all(dir: &Path, ext: &str) -> Vec<serde_json::Value> {
    let mut shards: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    shards.sort();
    let mut args = vec!["cat".to_string()];
    args.extend(shards.iter().map(|p| p.display().to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ok(&args).lines().map(json).collect()
}

fn convert(input: &[&Path], to: &str, out: &Path, extra: &[&str]) -> String {
    let mut args = vec!["convert", "--to", to, "-o", out.to_str().unwrap(), "-q"];
    args.extend(input.iter().map(|p| p.to_str().unwrap()));
    args.extend_from_slice(extra);
    ok(&args)
}

fn text(v: &serde_json::Value) -> String {
    // `cat` shows bytes as their length and first 16 bytes in hex.
    let hex = v["head"].as_str().unwrap();
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    String::from_utf8(bytes).unwrap()
}

#[test]
fn csv_to_every_format_keeps_every_value() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("t.csv");
    let mut body = String::from("id,Label,score,name\n");
    for i in 0..25 {
        let score = if i == 3 {
            String::new()
        } else {
            format!("{}", i as f64 * 0.5)
        };
        body.push_str(&format!("k{i},{},{score},\"a,{i}\nb\"\n", i % 4));
    }
    std::fs::write(&csv, body).unwrap();
    for (to, ext) in FORMATS {
        let out = dir.path().join(to);
        convert(&[&csv], to, &out, &["--shard-size", "10", "--key", "id"]);
        let rows = cat_all(&out, ext);
        assert_eq!(rows.len(), 25, "{to}");
        let shards = std::fs::read_dir(&out).unwrap().count();
        assert_eq!(shards, 3, "{to}: 25 rows in shards of 10");
        for (i, r) in rows.iter().enumerate() {
            let f = &r["fields"];
            match to {
                "webdataset" => {
                    assert_eq!(r["key"], format!("k{i}"));
                    assert_eq!(text(&f["label"]), (i % 4).to_string(), "lower-cased name");
                    assert_eq!(text(&f["name"]), format!("a,{i}\nb"));
                    if i == 3 {
                        assert!(f.get("score").is_none(), "an empty cell is left out");
                    } else {
                        assert_eq!(text(&f["score"]), format!("{}", i as f64 * 0.5));
                    }
                }
                _ => {
                    assert_eq!(f["Label"], i % 4);
                    if i == 3 {
                        assert!(f["score"].is_null(), "an empty number is NaN: {f}");
                    } else {
                        assert_eq!(f["score"], i as f64 * 0.5);
                    }
                    if to == "parquet" {
                        assert_eq!(f["name"], format!("a,{i}\nb"));
                    } else {
                        assert_eq!(text(&f["name"]), format!("a,{i}\nb"));
                    }
                    assert!(f.get("id").is_none(), "the key column is not a field");
                }
            }
        }
    }
}

#[test]
fn jsonl_lists_nested_values_and_nulls() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.jsonl");
    let mut body = String::new();
    for i in 0..12 {
        let opt = if i % 3 == 0 {
            "null".to_string()
        } else {
            i.to_string()
        };
        body.push_str(&format!(
            "{{\"label\": {}, \"x\": [{i}, 1.5], \"meta\": {{\"a\": {i}}}, \"opt\": {opt}}}\n",
            i % 2
        ));
        if i == 5 {
            body.push('\n'); // blank lines are skipped
        }
    }
    std::fs::write(&path, body).unwrap();
    for (to, ext) in FORMATS {
        let out = dir.path().join(to);
        convert(&[&path], to, &out, &["--shard-size", "5"]);
        let rows = cat_all(&out, ext);
        assert_eq!(rows.len(), 12, "{to}");
        for (i, r) in rows.iter().enumerate() {
            let f = &r["fields"];
            match to {
                "webdataset" => {
                    assert_eq!(r["key"], format!("{i:09}"));
                    assert_eq!(text(&f["x.json"]), format!("[{}.0,1.5]", i));
                    assert_eq!(text(&f["meta.json"]), format!("{{\"a\":{i}}}"));
                }
                _ => {
                    assert_eq!(f["label"], i % 2);
                    assert_eq!(f["x"], serde_json::json!([i as f64, 1.5]));
                    if i % 3 == 0 {
                        assert!(f["opt"].is_null(), "{to}: null in a number column is NaN");
                    } else {
                        assert_eq!(f["opt"], i as f64);
                    }
                }
            }
        }
    }
    // Lists of different lengths do not fit a Parquet fixed-size list: said before writing.
    let ragged = dir.path().join("ragged.jsonl");
    std::fs::write(&ragged, "{\"x\": [1]}\n{\"x\": [1, 2]}\n").unwrap();
    let out = chute(&[
        "convert",
        ragged.to_str().unwrap(),
        "--to",
        "parquet",
        "-o",
        dir.path().join("r").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("different lengths"));
    // Not JSON: the file and byte offset of the line.
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"x\": 1}\n{\"x\": \n").unwrap();
    let out = chute(&[
        "convert",
        bad.to_str().unwrap(),
        "--to",
        "tfrecord",
        "-o",
        dir.path().join("b").to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("bad.jsonl at byte 9"), "{err}");
}

#[test]
fn image_folder_labels_by_sorted_class_and_groups_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("imgs");
    for (class, n) in [("zebra", 3), ("ant", 2)] {
        std::fs::create_dir_all(root.join(class)).unwrap();
        for i in 0..n {
            std::fs::write(
                root.join(class).join(format!("{i}.jpg")),
                format!("{class}{i}"),
            )
            .unwrap();
            std::fs::write(root.join(class).join(format!("{i}.json")), "{}").unwrap();
        }
    }
    std::fs::write(root.join("zebra/.hidden.jpg"), "x").unwrap();
    let out = dir.path().join("wds");
    convert(
        &[&root],
        "webdataset",
        &out,
        &["--shard-size", "2", "--workers", "3"],
    );
    let rows = cat_all(&out, "tar");
    let keys: Vec<&str> = rows.iter().map(|r| r["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["ant/0", "ant/1", "zebra/0", "zebra/1", "zebra/2"]);
    for r in &rows {
        let key = r["key"].as_str().unwrap();
        let label = if key.starts_with("ant") { "0" } else { "1" };
        assert_eq!(
            text(&r["fields"]["cls"]),
            label,
            "torchvision's ImageFolder labels"
        );
        assert_eq!(text(&r["fields"]["jpg"]), key.replace('/', ""));
        assert_eq!(text(&r["fields"]["json"]), "{}");
    }
    let out = dir.path().join("pq");
    convert(&[&root], "parquet", &out, &[]);
    let rows = cat_all(&out, "parquet");
    assert_eq!(rows[4]["fields"]["cls"], 1);
}

#[test]
fn npy_columns_share_the_first_axis() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..24u8).flat_map(|v| (v as f32).to_le_bytes()).collect();
    let x = dir.path().join("x.npy");
    std::fs::write(
        &x,
        chute::formats::write_npy(chute::core::DType::F32, &[6, 2, 2], &data).unwrap(),
    )
    .unwrap();
    let labels: Vec<u8> = (0..6i16).flat_map(|v| (v * 10).to_le_bytes()).collect();
    let y = dir.path().join("y.npy");
    std::fs::write(
        &y,
        chute::formats::write_npy(chute::core::DType::I16, &[6], &labels).unwrap(),
    )
    .unwrap();
    for (to, ext) in FORMATS {
        let out = dir.path().join(to);
        convert(&[&x, &y], to, &out, &["--shard-size", "4"]);
        let rows = cat_all(&out, ext);
        assert_eq!(rows.len(), 6);
        for (i, r) in rows.iter().enumerate() {
            let f = &r["fields"];
            let want: Vec<f64> = (0..4).map(|k| (i * 4 + k) as f64).collect();
            match to {
                "webdataset" => {
                    // A .npy member of shape [2, 2]: 128 bytes of header, then the data.
                    assert_eq!(f["x.npy"]["bytes"], 128 + 16);
                    assert_eq!(f["y.npy"]["bytes"], 128 + 2);
                }
                _ => {
                    assert_eq!(f["x"], serde_json::json!(want), "{to}: flattened, C order");
                    assert_eq!(f["y"], i * 10);
                }
            }
        }
    }
    let short = dir.path().join("short.npy");
    std::fs::write(
        &short,
        chute::formats::write_npy(chute::core::DType::I16, &[5], &labels[..10]).unwrap(),
    )
    .unwrap();
    let out = chute(&[
        "convert",
        x.to_str().unwrap(),
        short.to_str().unwrap(),
        "--to",
        "parquet",
        "-o",
        dir.path().join("bad").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("same number"));
}

#[test]
fn shards_do_not_depend_on_the_number_of_workers() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("t.csv");
    let mut body = String::from("a,b,c\n");
    for i in 0..1000 {
        body.push_str(&format!("{i},{}.25,word{}\n", i * 3, i % 7));
    }
    std::fs::write(&csv, body).unwrap();
    for (to, _) in FORMATS {
        let one = dir.path().join(format!("{to}-1"));
        let four = dir.path().join(format!("{to}-4"));
        convert(&[&csv], to, &one, &["--shard-size", "64", "--workers", "1"]);
        convert(
            &[&csv],
            to,
            &four,
            &["--shard-size", "64", "--workers", "4"],
        );
        let mut names: Vec<_> = std::fs::read_dir(&one)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names.len(), 16);
        for n in names {
            assert_eq!(
                std::fs::read(one.join(&n)).unwrap(),
                std::fs::read(four.join(&n)).unwrap(),
                "{to}: {n:?}"
            );
        }
    }
}

#[test]
fn index_option_writes_a_manifest_the_loader_shuffles_with() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("t.csv");
    let mut body = String::from("v\n");
    for i in 0..100 {
        body.push_str(&format!("{i}\n"));
    }
    std::fs::write(&csv, body).unwrap();
    for (to, ext) in [("webdataset", "tar"), ("tfrecord", "tfrecord")] {
        let out = dir.path().join(to);
        convert(&[&csv], to, &out, &["--shard-size", "30", "--index"]);
        assert!(out.join(format!("data-000003.{ext}.idx")).exists());
        let manifest = out.join("manifest.json");
        let m = json(&std::fs::read_to_string(&manifest).unwrap());
        assert_eq!(m["shards"].as_array().unwrap().len(), 4);
        let r = json(&ok(&[
            "bench",
            manifest.to_str().unwrap(),
            "--json",
            "--index",
            "require",
            "--shuffle",
            "global",
            "--batch-size",
            "10",
        ]));
        assert_eq!(r["samples"], 100, "{to}");
    }
}

#[test]
fn failures_leave_no_shard_under_a_final_name() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("imgs");
    std::fs::create_dir_all(root.join("a")).unwrap();
    std::fs::write(root.join("a/0.jpg"), "x").unwrap();
    std::fs::write(root.join("a/0.txt"), "x").unwrap();
    std::fs::write(root.join("a/1.jpg"), "x").unwrap(); // no .txt: Parquet needs a value
    let out = dir.path().join("pq");
    let r = chute(&[
        "convert",
        root.to_str().unwrap(),
        "--to",
        "parquet",
        "-o",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(!r.status.success());
    assert!(err.contains("\"a/1\"") && err.contains("\"txt\""), "{err}");
    let left: Vec<_> = std::fs::read_dir(&out).unwrap().collect();
    assert!(left.is_empty(), "nothing left behind: {left:?}");

    // An existing shard is kept unless --overwrite.
    let csv = dir.path().join("t.csv");
    std::fs::write(&csv, "v\n1\n").unwrap();
    let out = dir.path().join("tf");
    convert(&[&csv], "tfrecord", &out, &[]);
    let r = chute(&[
        "convert",
        csv.to_str().unwrap(),
        "--to",
        "tfrecord",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(!r.status.success());
    assert!(String::from_utf8_lossy(&r.stderr).contains("--overwrite"));
    convert(&[&csv], "tfrecord", &out, &["--overwrite"]);
}
