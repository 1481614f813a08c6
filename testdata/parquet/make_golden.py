"""Writes pyarrow_golden.parquet (see README.md). Run: python make_golden.py"""
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

n = 50
cols = {f"f{j}": pa.array(np.arange(n, dtype=np.float32) * (j + 1) + 0.25, pa.float32())
        for j in range(16)}
cols["label"] = pa.array(np.arange(n, dtype=np.int64) * 3 - 7, pa.int64())
cols["caption"] = pa.array([f"caption {i} ✓" for i in range(n)], pa.string())
cols["emb"] = pa.FixedSizeListArray.from_arrays(
    pa.array(np.arange(n * 3, dtype=np.int32), pa.int32()), 3)
cols["blob"] = pa.array([bytes([i % 256]) * (i % 4) for i in range(n)], pa.binary())
table = pa.table(cols)
pq.write_table(table, "pyarrow_golden.parquet", row_group_size=16, compression="snappy")
pq.write_table(table, "pyarrow_golden_zstd.parquet", row_group_size=50, compression="zstd")
print(pa.__version__)
