"""A weighted mixture of three token datasets: chute.mix against tf.data's
`sample_from_datasets`, torchdata's `MultiNodeWeightedSampler` and a weighted
`IterableDataset` under `DataLoader`, side by side in one run (issue 16).

Three uint16 token files (20M / 12M / 4M tokens), windows of 1,025 tokens as int64, batches
of 16, weights 0.5 / 0.3 / 0.2. Every loader also reports which component each sample came
from, so the script measures the largest deviation from the target share over every
1,000-sample window (sliding, all positions; chute's from an untimed pass with a `source`
column). chute runs with 2 worker threads; chute's cost of mixing is measured against one
source over the same three files.

    python benchsuite/mixture_vs_peers.py [--samples 20000] [--rounds 3] [workdir]

`--samples` per peer run (tf.data takes a quarter of it: it is slow); chute's runs are 20x
longer, so that building a loader does not weigh in its rate.

Needs: chute, numpy, torch, torchdata (>= 0.10, `torchdata.nodes`), tensorflow-cpu.
Medians of `--rounds` interleaved rounds, page cache warm.
"""

import argparse
import os
import statistics
import time

import numpy as np

import chute

SIZES = {"web": 20_000_000, "code": 12_000_000, "math": 4_000_000}
WEIGHTS = {"web": 0.5, "code": 0.3, "math": 0.2}
WIN, BATCH = 1025, 16


def write(workdir):
    paths = {}
    rng = np.random.default_rng(0)
    for name, n in SIZES.items():
        p = os.path.join(workdir, f"mix-{name}.bin")
        if not os.path.exists(p):
            # Whole windows (tf.data reads fixed-length records).
            rng.integers(0, 50_000, n // WIN * WIN, dtype=np.uint16).tofile(p)
        paths[name] = p
    return paths


def deviation(labels, window=1000):
    """The largest |share - weight| over every window of `window` consecutive samples."""
    labels = np.asarray(labels)
    worst = 0.0
    for c, w in enumerate(WEIGHTS.values()):
        cum = np.concatenate([[0], np.cumsum(labels == c)])
        counts = cum[window:] - cum[:-window]
        worst = max(worst, float(np.abs(counts / window - w).max()))
    return worst


def chute_mix(paths, n, mode, labelled=False):
    """Timed without a `source` column (as the one-source case); `labelled` adds it, for the
    deviation (an untimed pass)."""
    srcs = {k: chute.tokens(p, seq_len=WIN - 1) for k, p in paths.items()}
    mix = chute.mix(srcs, weights=WEIGHTS, mode=mode, policy="cycle", samples_per_epoch=n,
                    source_column="source" if labelled else None)
    labels = []
    for b in chute.Loader(mix, batch_size=BATCH, num_workers=2):
        _ = b["tokens"]
        if labelled:
            labels.append(b["source"])
    return n, np.concatenate(labels) if labelled else None


def chute_single(paths, n):
    src = chute.tokens(list(paths.values()), seq_len=WIN - 1)
    got = 0
    loader = chute.Loader(src, batch_size=BATCH, shuffle=True, num_workers=2)
    while got < n:
        for b in loader:
            got += len(b["tokens"])
            if got >= n:
                break
    return got, None


def tf_mix(paths, n):
    import tensorflow as tf

    def one(c, p):
        ds = tf.data.FixedLengthRecordDataset(p, record_bytes=WIN * 2)
        ds = ds.map(lambda r: tf.cast(tf.io.decode_raw(r, tf.uint16), tf.int64))
        return ds.shuffle(1000, seed=c).repeat().map(lambda x: (x, c))

    parts = [one(c, p) for c, p in enumerate(paths.values())]
    ds = tf.data.Dataset.sample_from_datasets(parts, weights=list(WEIGHTS.values()), seed=0)
    ds = ds.batch(BATCH).prefetch(tf.data.AUTOTUNE).take(n // BATCH)
    labels = [c for _, c in ds.as_numpy_iterator()]
    return n, np.concatenate(labels)


class Windows:
    """A token file's windows in a seeded random order, endlessly (one epoch after another)."""

    def __init__(self, path, c, seed):
        self.tokens = np.memmap(path, dtype=np.uint16, mode="r")
        self.n = len(self.tokens) // WIN
        self.c, self.rng = c, np.random.default_rng(seed)

    def __iter__(self):
        while True:
            for i in self.rng.permutation(self.n):
                yield self.tokens[i * WIN:(i + 1) * WIN].astype(np.int64), self.c


def torchdata_mix(paths, n):
    import torch
    from torchdata.nodes import Batcher, IterableWrapper, Loader, MultiNodeWeightedSampler

    nodes = {k: IterableWrapper(Windows(p, c, c)) for c, (k, p) in enumerate(paths.items())}
    node = Batcher(MultiNodeWeightedSampler(nodes, WEIGHTS, seed=0), batch_size=BATCH)
    labels = []
    for i, batch in enumerate(Loader(node)):
        _ = torch.from_numpy(np.stack([x for x, _ in batch]))
        labels.append([c for _, c in batch])
        if (i + 1) * BATCH >= n:
            break
    return n, np.concatenate(labels)


def iterable_mix(paths, n):
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    class Weighted(IterableDataset):
        def __iter__(self):
            its = [iter(Windows(p, c, c)) for c, p in enumerate(paths.values())]
            rng = np.random.default_rng(0)
            w = list(WEIGHTS.values())
            while True:
                yield next(its[rng.choice(3, p=w)])

    labels = []
    for i, (_, c) in enumerate(DataLoader(Weighted(), batch_size=BATCH, num_workers=0)):
        labels.append(c.numpy())
        if (i + 1) * BATCH >= n:
            break
    return n, np.concatenate(labels)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("workdir", nargs="?", default="bench-data")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    paths = write(a.workdir)
    n = a.samples
    # chute runs 20x longer, so that building the loader (a few ms) does not count.
    cn = 20 * n
    cases = {
        "chute, one source (same files)": lambda: chute_single(paths, cn),
        "chute.mix stratified": lambda: chute_mix(paths, cn, "stratified"),
        "chute.mix random": lambda: chute_mix(paths, cn, "random"),
        "tf.data sample_from_datasets": lambda: tf_mix(paths, n // 4),
        "torchdata MultiNodeWeightedSampler (main thread)": lambda: torchdata_mix(paths, n),
        "weighted IterableDataset, DataLoader(num_workers=0)": lambda: iterable_mix(paths, n),
    }
    rates = {k: [] for k in cases}
    devs = {}
    for r in range(a.rounds):
        for k, run in cases.items():
            t = time.perf_counter()
            got, labels = run()
            rates[k].append(got / (time.perf_counter() - t))
            if labels is not None:
                devs[k] = deviation(labels)
        print(f"round {r + 1}/{a.rounds}", flush=True)
    for mode in ("stratified", "random"):
        devs[f"chute.mix {mode}"] = deviation(chute_mix(paths, n, mode, labelled=True)[1])
    base = statistics.median(rates["chute, one source (same files)"])
    peers = [statistics.median(v) for k, v in rates.items() if not k.startswith("chute")]
    best = max(peers)
    print("| loader | samples/s | vs one chute source | vs the fastest peer | "
          "max deviation over 1,000-sample windows |")
    print("| --- | --- | --- | --- | --- |")
    for k, v in rates.items():
        m = statistics.median(v)
        d = f"{devs[k]:.4f}" if k in devs else "-"
        print(f"| {k} | {m:,.0f} | {m / base:.3f}x | {m / best:.2f}x | {d} |")


if __name__ == "__main__":
    main()
