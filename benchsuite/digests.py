"""Batch digests of every format and shuffle mode, to show a change leaves the delivered
stream unchanged (the house issue's check: the same `chute bench --digest` before and after).

    python benchsuite/digests.py --chute OLD/chute --out before.json
    python benchsuite/digests.py --chute target/release/chute --out after.json --compare before.json

The datasets are written by the peers' own writers where there is one: numpy (token files),
the `webdataset` package's ShardWriter (tar shards of JPEGs, labels and JSON), pyarrow (Parquet
with several row groups) and chute's TFRecord writer (`chute convert`, whose bytes TensorFlow
reads, see testdata/tfrecord/README.md) plus TensorFlow's own files in testdata/tfrecord.
Needs numpy, pillow, pyarrow and webdataset.
"""

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SHUFFLES = ["none", "global", "block", "block:3"]


def make_data(chute: str, d: Path) -> dict:
    """Writes the datasets under `d` (once) and returns {name: (paths, extra args)}."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import webdataset as wds
    from PIL import Image

    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    sets = {}

    tok = d / "tokens"
    if not tok.exists():
        tok.mkdir()
        for i, n in enumerate([50_000, 33_333, 20_001]):
            rng.integers(0, 50_000, n, dtype=np.uint16).tofile(tok / f"part-{i}.bin")
    sets["tokens"] = ([str(tok / f"part-{i}.bin") for i in range(3)], ["--seq-len", "127"])

    w = d / "wds"
    if not w.exists():
        w.mkdir()
        with wds.ShardWriter(str(w / "shard-%06d.tar"), maxcount=37) as sink:
            for i in range(150):
                h, wd = int(rng.integers(40, 90)), int(rng.integers(40, 90))
                px = rng.integers(0, 255, (h, wd, 3), dtype=np.uint8)
                buf = io.BytesIO()
                Image.fromarray(px).save(buf, format="JPEG", quality=90)
                sink.write({"__key__": f"s{i:05d}", "jpg": buf.getvalue(), "cls": str(i % 10),
                            "json": json.dumps({"i": i}).encode()})
    shards = sorted(str(p) for p in w.glob("*.tar"))
    sets["webdataset"] = (shards, [])
    spec = json.dumps({"jpg": {"as": "image", "ops": [
        {"op": "decode"}, {"op": "random_resized_crop", "size": 32}, {"op": "horizontal_flip"},
        {"op": "normalize", "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}, {"op": "chw"}]},
        "cls": [{"op": "label"}]})
    sets["webdataset-images"] = (shards, ["--transform", spec])

    pqd = d / "parquet"
    if not pqd.exists():
        pqd.mkdir()
        for f in range(2):
            n = 5_000 + f * 1_234
            t = pa.table({
                "x": pa.array(rng.standard_normal(n).astype(np.float32)),
                "y": pa.array(rng.integers(0, 1 << 40, n, dtype=np.int64)),
                "v": pa.array(list(rng.standard_normal((n, 4)).astype(np.float32)),
                              type=pa.list_(pa.float32(), 4)),
            })
            pq.write_table(t, pqd / f"part-{f}.parquet", row_group_size=1_500)
    sets["parquet"] = (sorted(str(p) for p in pqd.glob("*.parquet")), ["--chunk-rows", "700"])

    tfd = d / "tfrecord"
    if not tfd.exists():
        tfd.mkdir()
        jl = d / "rows.jsonl"
        with open(jl, "w") as f:
            for i in range(900):
                f.write(json.dumps({"id": i, "score": float(rng.standard_normal()),
                                    "emb": [float(v) for v in rng.standard_normal(3)],
                                    "name": f"row-{i}"}) + "\n")
        subprocess.run([chute, "convert", str(jl), "--to", "tfrecord", "-o", str(tfd),
                        "--shard-size", "211"], check=True, capture_output=True)
    sets["tfrecord"] = (sorted(str(p) for p in tfd.glob("*.tfrecord")), [])
    sets["tfrecord-tensorflow"] = ([str(ROOT / "testdata/tfrecord/examples.tfrecord")], [])
    return sets


def digest(chute: str, paths, extra) -> str:
    out = subprocess.run([chute, "bench", *paths, *extra, "--digest", "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["digest"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chute", required=True)
    ap.add_argument("--data", default=str(ROOT / "bench-data/digests"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--compare")
    a = ap.parse_args()
    sets = make_data(a.chute, Path(a.data))
    results = {}
    for name, (paths, extra) in sets.items():
        for shuffle in SHUFFLES:
            for opts in (["--workers", "1"], ["--workers", "3", "--drop-last"],
                         ["--workers", "2", "--world-size", "3", "--rank", "1", "--epochs", "2"]):
                args = [*extra, "--shuffle", shuffle, "--batch-size", "16", "--seed", "5", *opts]
                key = f"{name} {' '.join(args[len(extra):])}"
                results[key] = digest(a.chute, paths, args)
    Path(a.out).write_text(json.dumps(results, indent=1, sort_keys=True))
    print(f"{len(results)} digests -> {a.out}")
    if a.compare:
        before = json.loads(Path(a.compare).read_text())
        diff = [k for k in before if results.get(k) != before[k]]
        for k in diff:
            print(f"DIFFERENT: {k}: {before[k]} -> {results.get(k)}")
        print(f"{len(before) - len(diff)} of {len(before)} digests unchanged")
        return 1 if diff else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
