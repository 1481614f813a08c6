"""nanoGPT's get_batch, as train.py has it, timed over a token file.

    data = np.memmap(path, dtype=np.uint16, mode='r')   # re-created per batch, as nanoGPT does
    ix = random offsets
    x = stack([data[i:i+block_size].astype(int64) ...]); y = the same shifted by one

We time the numpy part only (no torch, no device copy), with the same tokens per batch as
chute's [B, seq_len + 1] int64 tensor (x and y together cover seq_len + 1 tokens per row).
Prints one JSON line.
"""
import argparse
import json
import time

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("path")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--batches", type=int, default=2000)
    p.add_argument("--dtype", default="uint16")
    a = p.parse_args()
    rng = np.random.default_rng(0)
    block = a.seq_len
    n = np.memmap(a.path, dtype=a.dtype, mode="r").shape[0]

    def get_batch():
        data = np.memmap(a.path, dtype=a.dtype, mode="r")
        ix = rng.integers(0, n - block - 1, size=a.batch_size)
        x = np.stack([data[i : i + block].astype(np.int64) for i in ix])
        y = np.stack([data[i + 1 : i + 1 + block].astype(np.int64) for i in ix])
        return x, y

    for _ in range(50):  # warm up the page cache and numpy
        get_batch()
    t = time.perf_counter()
    for _ in range(a.batches):
        get_batch()
    dt = time.perf_counter() - t
    tokens = a.batches * a.batch_size * (block + 1)
    print(json.dumps({
        "loader": "nanoGPT get_batch (np.memmap + stack + astype int64)",
        "batches": a.batches,
        "seconds": dt,
        "batches_per_sec": a.batches / dt,
        "tokens_per_sec": tokens / dt,
    }))


if __name__ == "__main__":
    main()
