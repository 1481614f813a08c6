"""chute.Loader against torch.utils.data.DataLoader on the token workload, side by side.

Token file of uint16 ids, seq_len 1024, batch 16, shuffled, int64 out. The torch side is the
equivalent map-style Dataset (window i = tokens[i*(L+1):(i+1)*(L+1)] from np.memmap, astype
int64), DataLoader(num_workers=2, shuffle=True, batch_size=16). Each loader runs in its own
subprocess so peak RSS (summed over the process tree: DataLoader's workers are processes) is
measured separately. Also measures chute's per-batch cost of crossing into Python.

Usage: python benchsuite/python_tokens.py TOKENS.bin [--batches N]
Needs: the chute package (pip install .), numpy, torch.
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

SEQ, BATCH = 1024, 16


def tree_rss_bytes(pid: int) -> int:
    """RSS of pid and all its descendants (DataLoader workers are child processes)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return total


def run_chute(path: str, batches: int, workers: int) -> dict:
    import chute

    loader = chute.Loader(chute.tokens(path, seq_len=SEQ, dtype="uint16", out_dtype="int64"),
                          batch_size=BATCH, shuffle=True, num_workers=workers, drop_last=True)
    return consume(iter_epochs(loader), batches)


def iter_epochs(loader):
    while True:
        yield from loader


def run_torch(path: str, batches: int, workers: int) -> dict:
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Windows(Dataset):
        def __init__(self, path):
            self.path = path
            self.n = os.path.getsize(path) // 2 // (SEQ + 1)
            self.data = None

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            if self.data is None:  # open per worker process
                self.data = np.memmap(self.path, dtype=np.uint16, mode="r")
            w = self.data[i * (SEQ + 1):(i + 1) * (SEQ + 1)].astype(np.int64)
            return torch.from_numpy(w)

    dl = DataLoader(Windows(path), batch_size=BATCH, shuffle=True, num_workers=workers,
                    drop_last=True, persistent_workers=True)

    def forever():
        while True:
            yield from dl

    return consume(forever(), batches)


def consume(it, batches: int) -> dict:
    peak = [0]
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], tree_rss_bytes(os.getpid()))
            time.sleep(0.02)

    for _ in range(20):  # warm up: workers started, pages mapped
        next(it)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    dt = time.perf_counter() - start
    stop.set()
    t.join()
    return {"batches": batches, "seconds": dt, "batches_per_sec": batches / dt,
            "peak_rss_mb": peak[0] / 1e6}


def crossing_overhead(path: str, n: int) -> dict:
    """Per-batch cost of chute's Python iteration when batches are always ready: tiny batches
    (seq_len 15, batch 4) with 2 workers far ahead of the consumer, minus what the Rust engine
    itself spends per batch in the same configuration (chute bench)."""
    import chute

    loader = chute.Loader(chute.tokens(path, seq_len=15, dtype="uint16", out_dtype="int64"),
                          batch_size=4, shuffle=True, num_workers=2, prefetch_factor=8)
    it = iter_epochs(loader)
    for _ in range(1000):
        next(it)
    start = time.perf_counter()
    for _ in range(n):
        next(it)
    py_us = (time.perf_counter() - start) / n * 1e6
    return {"python_us_per_batch": py_us}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--batches", type=int, default=2000)
    ap.add_argument("--which", default=None)
    a = ap.parse_args()
    if a.which == "chute":
        print(json.dumps(run_chute(a.path, a.batches, 2)))
        return
    if a.which == "torch":
        print(json.dumps(run_torch(a.path, a.batches, 2)))
        return
    if a.which == "crossing":
        print(json.dumps(crossing_overhead(a.path, 20000)))
        return
    results = {}
    for which in ["torch", "chute", "crossing"]:
        out = subprocess.run([sys.executable, __file__, a.path, "--batches", str(a.batches),
                              "--which", which], capture_output=True, text=True, check=True)
        results[which] = json.loads(out.stdout)
        print(which, results[which], flush=True)
    ratio = results["chute"]["batches_per_sec"] / results["torch"]["batches_per_sec"]
    print(json.dumps({"chute_over_torch_batches_per_sec": ratio,
                      "rss_chute_mb": results["chute"]["peak_rss_mb"],
                      "rss_torch_mb": results["torch"]["peak_rss_mb"],
                      "python_us_per_batch": results["crossing"]["python_us_per_batch"]}))


if __name__ == "__main__":
    main()
