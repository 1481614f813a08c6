"""Numeric columns with nulls against the same columns without, side by side in one run:
16 float32 columns and an int64 label written by pyarrow to Parquet and to an Arrow IPC file,
once with no nulls and once with `--holes` of the values null (chute fills them and adds a
`<name>_valid` column for each), read by `chute.Loader` in file order and with a global
shuffle, in batches of 4096 rows.

    python benchsuite/nulls_vs_dense.py [--rows 1000000] [--rounds 5] [--holes 0.1]

Reports rows per second of the first epoch (which decodes, and fills the nulls) and of the
second (Parquet keeps the decoded data, `cache_bytes`; Arrow's record batches stay decoded),
the median of `--rounds` interleaved rounds (page cache warm: each file is read right before
its run),
and the ratio with nulls to without; and, to tell what the masks cost as columns from what the
nulls cost, a third file of 34 columns (17 more float32) without nulls; and the nulls' files
read with `nulls="fill"` (filled, no masks). Needs pyarrow, numpy.
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--holes", type=float, default=0.1)
    ap.add_argument("--batch", type=int, default=4096)
    args = ap.parse_args()

    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    import chute

    tmp = Path(tempfile.mkdtemp(prefix="chute-nulls-"))
    rng = np.random.default_rng(0)
    cols = {f"f{k}": rng.standard_normal(args.rows, dtype=np.float32) for k in range(16)}
    cols["label"] = rng.integers(0, 1000, args.rows, dtype=np.int64)
    dense = pa.table(cols)
    holed = pa.table({
        k: pa.array(v, mask=rng.random(args.rows) < args.holes) for k, v in cols.items()
    })
    # As many columns as the nulls' batches have (their masks included), none null: what the
    # column count alone costs.
    wide = pa.table({**cols, **{f"g{k}": rng.standard_normal(args.rows, dtype=np.float32)
                                for k in range(17)}})
    names = ("dense", "nulls", "wide", "filled")
    files = {}
    for name, tbl in (("dense", dense), ("nulls", holed), ("wide", wide)):
        files[("parquet", name)] = tmp / f"{name}.parquet"
        pq.write_table(tbl, files[("parquet", name)], row_group_size=131072)
        files[("arrow", name)] = tmp / f"{name}.arrow"
        feather.write_feather(tbl, files[("arrow", name)], compression="uncompressed",
                              chunksize=131072)
    for fmt in ("parquet", "arrow"):  # the nulls' files read with nulls="fill": no masks
        files[(fmt, "filled")] = files[(fmt, "nulls")]
    for p in files.values():
        p.read_bytes()

    def epoch(fmt, name, shuffle):
        path = files[(fmt, name)]
        path.read_bytes()  # the page cache warmed right before each side
        nulls = "fill" if name == "filled" else "mask"
        src = (chute.parquet(path, cache_bytes=1 << 31, nulls=nulls) if fmt == "parquet"
               else chute.arrow(path, nulls=nulls))
        loader = chute.Loader(src, batch_size=args.batch, shuffle=shuffle, seed=1,
                              num_workers=2)
        out = []
        for e in range(2):  # the first epoch decodes (and keeps it, for Parquet)
            loader.set_epoch(e)
            t = time.perf_counter()
            n = 0
            for b in loader:
                n += len(b["label"])
            out.append(n / (time.perf_counter() - t))
        return out

    cases = [(fmt, shuffle) for fmt in ("parquet", "arrow") for shuffle in (False, True)]
    runs = {(c, name): [] for c in cases for name in names}
    for _ in range(args.rounds):
        for c in cases:
            for name in names:
                runs[(c, name)].append(epoch(c[0], name, c[1]))
    for fmt, shuffle in cases:
        for e, which in enumerate(("first epoch", "later epoch")):
            d, h, w, f = (statistics.median(r[e] for r in runs[((fmt, shuffle), name)])
                          for name in names)
            order = "shuffle" if shuffle else "file order"
            print(f"{fmt:8s} {order:10s} {which:11s} no nulls {d / 1e6:6.2f} M rows/s   "
                  f"{args.holes:.0%} nulls {h / 1e6:6.2f} M rows/s   ratio {h / d:.2f}   "
                  f"34 columns, no nulls {w / 1e6:6.2f} M rows/s   ratio {w / d:.2f}   "
                  f"nulls=\"fill\" {f / 1e6:6.2f} M rows/s   ratio {f / d:.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
