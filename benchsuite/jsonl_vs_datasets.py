"""JSON Lines records end to end, side by side in one run: a `.jsonl` file of chat rows (a
`messages` list of `{role, content}` objects, `tags`, a `meta` object, an id), read whole in
batches by

- `chute.Loader(chute.dataset(path), batch_size=B)`: opening (schema inference, decoding on
  every core) and the epoch;
- `datasets.load_dataset("json", data_files=path)` then `ds.iter(batch_size=B)`: its Arrow
  conversion and cache, then its Python formatting (a fresh cache folder each round);
- pyarrow's own `pyarrow.json.read_json(path)` then `to_pylist()` of each batch, the limit.

    python benchsuite/jsonl_vs_datasets.py [--rows 200000] [--batch 256] [--rounds 5]

Reports rows per second, the median of `--rounds` interleaved rounds, and chute's ratios.
Needs datasets, pyarrow.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from nested_vs_datasets import rows  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    import datasets
    import pyarrow.json as pj

    import chute

    datasets.disable_progress_bars()
    tmp = Path(tempfile.mkdtemp(prefix="chute-jsonl-"))
    path = tmp / "chat.jsonl"
    with open(path, "w") as f:
        for r in rows(args.rows):
            f.write(json.dumps(r) + "\n")
    n = args.rows

    def run_chute():
        seen = 0
        for b in chute.Loader(chute.dataset(path), batch_size=args.batch, num_workers=2):
            seen += len(b["messages"])
        return seen

    def run_datasets():
        cache = tempfile.mkdtemp(dir=tmp)
        ds = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=cache)
        seen = 0
        for b in ds.iter(batch_size=args.batch):
            seen += len(b["messages"])
        return seen

    def run_pyarrow():
        seen = 0
        for b in pj.read_json(path).to_batches(args.batch):
            seen += len(b.to_pylist())
        return seen

    cases = {"chute": run_chute, "datasets": run_datasets, "pyarrow": run_pyarrow}
    times = {k: [] for k in cases}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            t = time.perf_counter()
            assert fn() == n, name
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{n} JSON Lines rows ({path.stat().st_size / 1e6:.0f} MB), batch {args.batch}, "
          f"median of {args.rounds} rounds, end to end")
    for name, t in med.items():
        print(f"  {name:10s} {n / t:12,.0f} rows/s  ({t:.3f} s)")
    for peer in ("datasets", "pyarrow"):
        print(f"  chute / {peer}: {med[peer] / med['chute']:.2f}x")


if __name__ == "__main__":
    main()
