"""Parquet against pyarrow on the two shapes issue 17 names, side by side in one run:

- `38rg`: 5,000,000 rows of 16 float32 + an int64 label in 38 row groups (snappy);
- `2rg`: the same rows in 2 row groups.

Loaders (batches of 4,096 rows; the 16 floats stacked to `[B, 16]` float32 by every loader,
as a training step takes them):

- `chute.Loader(chute.parquet(path), num_workers=2)`, in file order and with block shuffle,
  the 16 columns stacked by `np.stack` on the training thread, or by chute's workers
  (`chute.parquet(path, stack={"x": FEATURES})`);
- `pyarrow.dataset.dataset(path).to_batches(batch_size=4096)` (pyarrow's threads; this machine
  has 2 cores), every batch stacked;
- `pyarrow.parquet.read_table(path, use_threads=False)`: one thread decoding the whole file,
  no batching (the decode rate the issue compares with).

    python benchsuite/parquet_targets.py [--rows 5000000] [--rounds 3] [workdir]

Rows per second, the median of `--rounds` interleaved rounds, page cache warm.
"""

import argparse
import os
import statistics
import time

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

import chute

FEATURES = [f"f{j}" for j in range(16)]


def write(path, rows, row_groups):
    if os.path.exists(path):
        return
    rng = np.random.default_rng(0)
    cols = {f: rng.standard_normal(rows, dtype=np.float32) for f in FEATURES}
    cols["label"] = rng.integers(0, 1000, rows, dtype=np.int64)
    pq.write_table(pa.table(cols), path, row_group_size=-(-rows // row_groups))


def chute_epoch(path, shuffle, stack):
    if stack:
        # The 16 columns stacked to [B, 16] on chute's workers.
        source = chute.parquet(path, stack={"x": FEATURES})
    else:
        source = chute.parquet(path)
    loader = chute.Loader(source, batch_size=4096, shuffle=shuffle, num_workers=2)
    n = 0
    for b in loader:
        x = np.asarray(b["x"]) if stack else np.stack([b[f] for f in FEATURES], axis=1)
        n += len(x)
    return n


def dataset_epoch(path):
    n = 0
    for b in pads.dataset(path).to_batches(batch_size=4096):
        x = np.stack([b.column(f).to_numpy() for f in FEATURES], axis=1)
        n += len(x)
    return n


def read_table(path):
    return pq.read_table(path, use_threads=False).num_rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("workdir", nargs="?", default="bench-data")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    shapes = {}
    for name, groups in [("38rg", 38), ("2rg", 2)]:
        path = os.path.join(a.workdir, f"targets-{a.rows}-{name}.parquet")
        write(path, a.rows, groups)
        shapes[name] = path
        read_table(path)  # page cache
    cases = {}
    for name, path in shapes.items():
        cases[f"{name} read_table(use_threads=False)"] = lambda p=path: read_table(p)
        cases[f"{name} pyarrow.dataset to_batches"] = lambda p=path: dataset_epoch(p)
        cases[f"{name} chute, file order, np.stack"] = lambda p=path: chute_epoch(p, False, False)
        cases[f"{name} chute, file order, stack="] = lambda p=path: chute_epoch(p, False, True)
        cases[f"{name} chute, block shuffle, np.stack"] = lambda p=path: chute_epoch(
            p, "block", False
        )
        cases[f"{name} chute, block shuffle, stack="] = lambda p=path: chute_epoch(
            p, "block", True
        )
    rates = {k: [] for k in cases}
    for r in range(a.rounds):
        for k, run in cases.items():
            t = time.perf_counter()
            n = run()
            rates[k].append(n / (time.perf_counter() - t))
        print(f"round {r + 1}/{a.rounds}", flush=True)
    for name in shapes:
        decode = statistics.median(rates[f"{name} read_table(use_threads=False)"])
        ds = statistics.median(rates[f"{name} pyarrow.dataset to_batches"])
        for k, v in rates.items():
            if k.startswith(name):
                m = statistics.median(v)
                print(f"| {k} | {m / 1e6:.1f} M rows/s | {m / ds:.2f}x dataset | "
                      f"{m / decode:.2f}x read_table |")


if __name__ == "__main__":
    main()
