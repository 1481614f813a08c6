"""A Hugging Face dataset (rows of 16 float32 + an int64 label, written by `datasets` and
memory-mapped from its cache files) in batches of 4096 rows, side by side in one run:

- `chute.Loader(ds)`: native, from the Arrow table (and the indices mapping when shuffled);
- `DataLoader(ds.with_format("torch"))`: torch's loader over `datasets`' own batched fetch
  (`__getitems__`), with 0 and 2 worker processes;
- `ds.with_format("arrow").iter(batch_size)`: `datasets`' Arrow iteration, as tables (no
  conversion) and with every column turned into a numpy array (what a training step needs).

    python benchsuite/hf_vs_dataloader.py [--rows 2000000] [--rounds 5] [--workers 2]

Reports rows per second, the median of `--rounds` interleaved rounds (page cache warm: the
cache files are read once before). Needs datasets, torch, numpy.
"""

import argparse
import statistics
import tempfile
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4096)
    args = ap.parse_args()

    import datasets
    import torch

    import chute

    tmp = tempfile.mkdtemp(prefix="chute-hf-")
    rng = np.random.default_rng(0)
    cols = {f"f{k}": rng.standard_normal(args.rows, dtype=np.float32) for k in range(16)}
    cols["label"] = rng.integers(0, 1000, args.rows, dtype=np.int64)
    datasets.Dataset.from_dict(cols).save_to_disk(f"{tmp}/ds", num_shards=4)
    ds = datasets.load_from_disk(f"{tmp}/ds")
    shuffled = ds.shuffle(seed=0)
    for f in ds.cache_files:  # warm the page cache
        with open(f["filename"], "rb") as fh:
            while fh.read(1 << 24):
                pass
    b, n = args.batch, args.rows

    def chute_run(data, shuffle):
        loader = chute.Loader(data, batch_size=b, shuffle=shuffle, num_workers=args.workers)
        rows = 0
        for batch in loader:
            rows += len(batch["label"])
        return rows

    def dataloader_run(data, workers, shuffle):
        dl = torch.utils.data.DataLoader(
            data.with_format("torch"), batch_size=b, shuffle=shuffle, num_workers=workers
        )
        rows = 0
        for batch in dl:
            rows += len(batch["label"])
        return rows

    def arrow_run(data, to_numpy):
        rows = 0
        for t in data.with_format("arrow").iter(batch_size=b):
            if to_numpy:
                _ = [c.to_numpy() for c in t.columns]
            rows += t.num_rows
        return rows

    cases = {
        "chute, file order": lambda: chute_run(ds, False),
        "chute, global shuffle": lambda: chute_run(ds, True),
        "chute, ds.shuffle() indices mapping": lambda: chute_run(shuffled, False),
        "DataLoader(num_workers=0), in order": lambda: dataloader_run(ds, 0, False),
        f"DataLoader(num_workers={args.workers}), in order": lambda: dataloader_run(
            ds, args.workers, False
        ),
        f"DataLoader(num_workers={args.workers}), shuffle=True": lambda: dataloader_run(
            ds, args.workers, True
        ),
        "with_format('arrow').iter(), tables": lambda: arrow_run(ds, False),
        "with_format('arrow').iter(), to numpy": lambda: arrow_run(ds, True),
    }
    rates = {k: [] for k in cases}
    for r in range(args.rounds):
        for name, run in cases.items():
            t0 = time.perf_counter()
            rows = run()
            dt = time.perf_counter() - t0
            assert rows == n, (name, rows)
            rates[name].append(rows / dt)
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    print(f"\n{n:,} rows of 16 float32 + int64, batches of {b}, medians of {args.rounds}:")
    dl_ref = statistics.median(rates[f"DataLoader(num_workers={args.workers}), in order"])
    for name, v in rates.items():
        m = statistics.median(v)
        print(f"| {name} | {m / 1e6:.2f} M rows/s | {m / dl_ref:.2f}x DataLoader({args.workers}) |")


if __name__ == "__main__":
    main()
