"""Checks, by hand, that TensorFlow reads what `chute convert --to tfrecord` writes (TensorFlow
is too heavy for CI). Run with a Python that has tensorflow and numpy:

    cargo build -p chute-cli
    python testdata/tfrecord/check_convert_with_tensorflow.py target/debug/chute

It writes JSON Lines and .npy inputs to a temporary folder, converts them (plain and GZIP),
reads the files back with `tf.data.TFRecordDataset` and `tf.train.Example`, and compares
every value."""

import glob
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf


def examples(pattern, compression=None):
    out = []
    for record in tf.data.TFRecordDataset(sorted(glob.glob(pattern)), compression_type=compression):
        e = tf.train.Example()
        e.ParseFromString(record.numpy())
        out.append(e.features.feature)
    return out


def main(chute):
    tmp = Path(tempfile.mkdtemp())
    rows = [{"id": f"k{i}", "label": i % 10, "x": [i, i + 1.5, 2], "meta": {"a": i},
             "opt": None if i % 3 == 0 else i} for i in range(2500)]
    (tmp / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    x = np.arange(3000 * 4, dtype=np.float32).reshape(3000, 2, 2)
    y = np.arange(3000, dtype=np.int16)
    np.save(tmp / "x.npy", x)
    np.save(tmp / "y.npy", y)
    run = lambda *a: subprocess.run([chute, "convert", "-q", *map(str, a)], check=True)
    run(tmp / "t.jsonl", "--to", "tfrecord", "-o", tmp / "jl", "--shard-size", "1000")
    run(tmp / "t.jsonl", "--to", "tfrecord", "-o", tmp / "gz", "--gzip")
    run(tmp / "x.npy", tmp / "y.npy", "--to", "tfrecord", "-o", tmp / "npy")
    for got in (examples(str(tmp / "jl" / "*.tfrecord")),
                examples(str(tmp / "gz" / "*.tfrecord.gz"), "GZIP")):
        assert len(got) == len(rows)
        for f, r in zip(got, rows):
            assert f["label"].int64_list.value == [r["label"]]
            assert list(f["x"].float_list.value) == [float(v) for v in r["x"]]
            assert f["id"].bytes_list.value == [r["id"].encode()]
            assert json.loads(f["meta"].bytes_list.value[0]) == r["meta"]
            if r["opt"] is None:
                assert np.isnan(f["opt"].float_list.value[0])
            else:
                assert f["opt"].float_list.value == [r["opt"]]
    got = examples(str(tmp / "npy" / "*.tfrecord"))
    assert len(got) == len(x)
    for i, f in enumerate(got):
        assert np.array_equal(np.array(f["x"].float_list.value, np.float32), x[i].ravel())
        assert f["y"].int64_list.value == [y[i]]
    print(f"TensorFlow {tf.__version__} read every value chute convert wrote")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "target/debug/chute")
