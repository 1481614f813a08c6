"""Parquet: chute's shuffled batches against pyarrow's sequential iter_batches -> numpy.

Dataset: 16 float32 columns + an int64 label, 2,000,000 rows, written by pyarrow with its
defaults (snappy). pyarrow: ParquetFile.iter_batches(batch_size=4096), every column converted
to numpy, every epoch decoding the file. chute: `chute bench FILE --batch-size 4096 --shuffle
MODE --workers 2` for 1 epoch (every row group decoded, as pyarrow does) and for 3 epochs (the
first decodes each row group once into the cache; the rest gather from memory). Both from page
cache, side by side in one run. Prints one JSON line per loader.

Usage: python benchsuite/parquet_vs_pyarrow.py [workdir]   (needs pyarrow and numpy)
"""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

work = sys.argv[1] if len(sys.argv) > 1 else "bench-data"
os.makedirs(work, exist_ok=True)
path = os.path.join(work, "table-16f32-2M.parquet")
rows = 2_000_000
if not os.path.exists(path):
    rng = np.random.default_rng(0)
    cols = {f"f{j}": rng.standard_normal(rows, dtype=np.float32) for j in range(16)}
    cols["label"] = rng.integers(0, 1000, rows, dtype=np.int64)
    pq.write_table(pa.table(cols), path)
meta = pq.ParquetFile(path).metadata
print(json.dumps({"rows": rows, "row_groups": meta.num_row_groups,
                  "bytes": os.path.getsize(path), "pyarrow": pa.__version__}))


def pyarrow_epoch():
    pf = pq.ParquetFile(path)
    n = 0
    for b in pf.iter_batches(batch_size=4096):
        arrays = [b.column(i).to_numpy() for i in range(b.num_columns)]
        n += len(arrays[0])
    return n


pyarrow_epoch()  # page cache
times = []
for _ in range(3):
    t = time.perf_counter()
    n = pyarrow_epoch()
    times.append(time.perf_counter() - t)
times.sort()
print(json.dumps({"loader": "pyarrow iter_batches(4096) -> numpy, sequential",
                  "rows_per_sec_median": n / times[1]}))

chute = os.environ.get("CHUTE", "target/release/chute")
runs = [("none", 65536), ("global", 65536), ("block:4", 65536), ("block:4", 16384),
        ("block:4", 4096)]
for epochs in (1, 3):
    for shuffle, chunk in runs:
        out = subprocess.run([chute, "bench", path, "--batch-size", "4096", "--shuffle", shuffle,
                              "--chunk-rows", str(chunk), "--workers", "2", "--epochs",
                              str(epochs), "--json", "--quiet"],
                             capture_output=True, text=True, check=True)
        s = json.loads(out.stdout)
        print(json.dumps({"loader": f"chute bench --shuffle {shuffle} --chunk-rows {chunk} "
                                    f"--workers 2, {epochs} epoch(s)",
                          "rows_per_sec": s["samples_per_sec"],
                          "wait_fraction": s["wait_fraction"]}))
