"""Nested records delivered to Python, side by side in one run: a Hugging Face dataset of chat
rows (a `messages` list of `{role, content}` structs, `tags` a list of strings, a `meta`
struct, an int id) built by `datasets`, saved and loaded as `datasets` does (memory-mapped
Arrow), read whole in batches by

- `chute.Loader(ds, batch_size=B)` (file order, and `--workers` threads);
- `datasets`' own `ds.iter(batch_size=B)` (Python formatting: `to_pydict` per batch);
- `torch.utils.data.DataLoader(ds, batch_size=B, num_workers=2, collate_fn=list)` (each row
  a `ds[i]`, then lists; `collate_fn=list` spares `default_collate`, which cannot collate
  these rows anyway).

    python benchsuite/nested_vs_datasets.py [--rows 200000] [--batch 256] [--rounds 5]

Reports rows per second, the median of `--rounds` interleaved rounds, and chute's ratio to
each peer. Needs datasets, torch, pyarrow.
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def rows(n):
    for k in range(n):
        messages = [{"role": "system", "content": "You are a helpful assistant."}] if k % 3 == 0 else []
        messages += [
            {"role": "user", "content": f"What is {k} plus {k}? Explain the steps."},
            {"role": "assistant", "content": f"{k} plus {k} is {2 * k}. " * (1 + k % 4)},
        ]
        yield {
            "messages": messages,
            "tags": [f"tag{j}" for j in range(k % 4)],
            "meta": {"source": f"s{k % 7}", "score": k / 3},
            "id": k,
        }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()

    import datasets
    import torch

    import chute

    tmp = Path(tempfile.mkdtemp(prefix="chute-nested-"))
    datasets.Dataset.from_generator(rows, gen_kwargs={"n": args.rows}).save_to_disk(str(tmp / "chat"))
    ds = datasets.load_from_disk(str(tmp / "chat"))
    n = len(ds)

    def run_chute():
        seen = 0
        for b in chute.Loader(ds, batch_size=args.batch, num_workers=args.workers):
            seen += len(b["messages"])
        return seen

    def run_iter():
        seen = 0
        for b in ds.iter(batch_size=args.batch):
            seen += len(b["messages"])
        return seen

    def run_dataloader():
        seen = 0
        dl = torch.utils.data.DataLoader(ds, batch_size=args.batch, num_workers=2,
                                         collate_fn=list)
        for b in dl:
            seen += len(b)
        return seen

    cases = {"chute.Loader": run_chute, "ds.iter": run_iter, "DataLoader(2)": run_dataloader}
    times = {k: [] for k in cases}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            t = time.perf_counter()
            assert fn() == n
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{n} chat rows, batch {args.batch}, median of {args.rounds} rounds")
    for name, t in med.items():
        print(f"  {name:14s} {n / t:12,.0f} rows/s  ({t:.3f} s)")
    for peer in ("ds.iter", "DataLoader(2)"):
        print(f"  chute / {peer}: {med[peer] / med['chute.Loader']:.2f}x")


if __name__ == "__main__":
    main()
