"""TFRecord: chute against tf.data on small tf.train.Example records, side by side.

Dataset: 2,000,000 ~100-byte Examples (`label` int64, `x` 8 floats, `b` one 8-byte string) in
4 shards, written by TensorFlow's own TFRecordWriter (skipped when the shards already hold
the right count). tf.data: TFRecordDataset(files, num_parallel_reads=R).batch(1024)
.map(parse_example, num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE), with R = AUTOTUNE (the
issue's pipeline) and R = None (sequential reads: much faster here, since parallel reads
interleave record by record), every batch's tensors converted with .numpy() (chute hands out
numpy-ready buffers), and once without the conversion; median records/s of 3 epochs after a
warm-up one. chute: `chute bench --format tfrecord --batch-size 1024 --workers 2 --epochs 3`
over the manifest written by `chute index`, in order and globally shuffled, median of 3
runs. Both from page cache, side by side in one run. Prints one JSON line per loader, then a
markdown table.

Usage: CHUTE_BIN=target/release/chute python benchsuite/tfrecord_vs_tfdata.py [workdir]
(needs tensorflow; CHUTE_BIN defaults to target/release/chute)
"""
import json
import os
import statistics
import struct
import subprocess
import sys
import time

import numpy as np
import tensorflow as tf

work = sys.argv[1] if len(sys.argv) > 1 else "bench-data"
chute = os.environ.get("CHUTE_BIN", "target/release/chute")
SHARDS, PER_SHARD, BATCH = 4, 500_000, 1024
files = [os.path.join(work, f"examples-{i}-of-{SHARDS}.tfrecord") for i in range(SHARDS)]
spec = {"label": tf.io.FixedLenFeature([], tf.int64),
        "x": tf.io.FixedLenFeature([8], tf.float32),
        "b": tf.io.FixedLenFeature([], tf.string)}


def count_records(path):
    """Records in a TFRecord file, from its framing (length, crc, data, crc)."""
    n, pos = 0, 0
    with open(path, "rb") as f:
        data = f.read()
    while pos < len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        pos += 16 + length
        n += 1
    return n


os.makedirs(work, exist_ok=True)
rng = np.random.default_rng(0)
for i, path in enumerate(files):
    if os.path.exists(path) and count_records(path) == PER_SHARD:
        continue
    labels = rng.integers(0, 1000, PER_SHARD)
    xs = rng.standard_normal((PER_SHARD, 8), dtype=np.float32)
    bs = rng.bytes(8 * PER_SHARD)
    with tf.io.TFRecordWriter(path + ".tmp") as w:
        for j in range(PER_SHARD):
            w.write(tf.train.Example(features=tf.train.Features(feature={
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[labels[j]])),
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=xs[j])),
                "b": tf.train.Feature(bytes_list=tf.train.BytesList(value=[bs[8 * j:8 * j + 8]])),
            })).SerializeToString())
    os.replace(path + ".tmp", path)
total = SHARDS * PER_SHARD
nbytes = sum(os.path.getsize(p) for p in files)
print(json.dumps({"records": total, "bytes": nbytes, "bytes_per_record": nbytes / total,
                  "tensorflow": tf.__version__}))


def tfdata_epoch(parallel_reads, to_numpy):
    ds = (tf.data.TFRecordDataset(files, num_parallel_reads=parallel_reads)
          .batch(BATCH)
          .map(lambda s: tf.io.parse_example(s, spec), num_parallel_calls=tf.data.AUTOTUNE)
          .prefetch(tf.data.AUTOTUNE))
    n = 0
    t = time.perf_counter()
    for batch in ds:
        if to_numpy:
            arrays = {k: v.numpy() for k, v in batch.items()}
            n += len(arrays["label"])
        else:
            n += int(batch["label"].shape[0])
    assert n == total, n
    return n / (time.perf_counter() - t)


rows = []  # (loader, records/s)
tfdata_epoch(None, True)  # page cache
for reads, to_numpy in ((tf.data.AUTOTUNE, True), (None, True), (None, False)):
    rate = statistics.median(tfdata_epoch(reads, to_numpy) for _ in range(3))
    name = (f"tf.data, num_parallel_reads={'AUTOTUNE' if reads else 'None'}, "
            + (".numpy() per batch" if to_numpy else "tensors only"))
    rows.append((name, rate))
    print(json.dumps({"loader": name, "records_per_sec_median": rate}))

manifest = os.path.join(work, "examples-manifest.json")
subprocess.run([chute, "index", *files, "-o", manifest], check=True, capture_output=True)
for shuffle in ("none", "global"):
    rates = []
    for _ in range(3):
        out = subprocess.run([chute, "bench", manifest, "--format", "tfrecord", "--batch-size",
                              str(BATCH), "--workers", "2", "--shuffle", shuffle, "--epochs", "3",
                              "--json", "--quiet"], capture_output=True, text=True, check=True)
        s = json.loads(out.stdout)
        assert s["samples"] == 3 * total, s
        rates.append(s["samples_per_sec"])
    name = f"chute bench --shuffle {shuffle} --workers 2, 3 epochs"
    rows.append((name, statistics.median(rates)))
    print(json.dumps({"loader": name, "records_per_sec_median": rows[-1][1], "runs": rates,
                      "wait_fraction": s["wait_fraction"]}))

print("\n| loader | records/s | vs tf.data AUTOTUNE reads | vs tf.data sequential reads |")
print("| --- | --- | --- | --- |")
for name, rate in rows:
    print(f"| {name} | {rate / 1e6:.2f} M | {rate / rows[0][1]:.2f}x | {rate / rows[1][1]:.2f}x |")
