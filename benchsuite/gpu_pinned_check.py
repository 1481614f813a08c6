"""pin_memory=True on a CUDA machine: torch sees pinned batches, and copies them to the GPU
with non_blocking=True faster than from pageable memory.

Run by hand on a machine with a CUDA GPU and torch (pip install torch, then pip install .):

    python benchsuite/gpu_pinned_check.py [--batches 200] [--seq-len 8192] [--batch-size 32]

Checks:
1. chute.Loader(pin_memory=True).pinned is True (the CUDA runtime was found: torch's bundled
   libcudart via CHUTE_CUDART, or the system's).
2. torch.from_dlpack(chute.Tensor) and torch.from_numpy(batch) report is_pinned() and share
   chute's memory (same data_ptr).
3. Host-to-device copies with non_blocking=True: pinned batches against the same loader with
   pin_memory=False (pageable). Reports both GB/s and the ratio; fails unless pinned is at
   least 2x faster.

Exits 0 with "SKIP: no CUDA" where there is no GPU (or no torch).
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=200, help="batches timed per mode")
    ap.add_argument("--seq-len", type=int, default=8191, help="tokens per sample (+1 stored)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args()

    try:
        import torch
    except ImportError:
        print("SKIP: no CUDA (torch is not installed)")
        return 0
    if not torch.cuda.is_available():
        print("SKIP: no CUDA (torch.cuda.is_available() is False)")
        return 0
    import numpy as np

    import chute  # after torch, so chute finds torch's CUDA runtime

    device = torch.device("cuda")
    window = args.seq_len + 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tokens.bin"
        samples = max(4 * args.batch_size, 512)
        rng = np.random.default_rng(0)
        rng.integers(0, 50257, size=samples * window, dtype=np.uint16).tofile(path)
        source = chute.tokens(path, seq_len=args.seq_len)

        def loader(pin: bool):
            return chute.Loader(
                source, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                pin_memory=pin, drop_last=True,
            )

        pinned = loader(True)
        if not pinned.pinned:
            print(f"FAIL: pin_memory=True fell back: {pinned.pin_memory_fallback}")
            return 1
        print(f"pinned: True (CHUTE_CUDART={os.environ.get('CHUTE_CUDART')})")

        # 2. torch sees chute's pinned memory, without a copy.
        raw = chute.Loader(source, batch_size=args.batch_size, pin_memory=True, output="dlpack")
        t = next(iter(raw))["tokens"]
        via_dlpack = torch.from_dlpack(t)
        via_numpy = torch.from_numpy(np.asarray(t))
        for name, x in [("from_dlpack", via_dlpack), ("from_numpy", via_numpy)]:
            ok = x.is_pinned() and x.data_ptr() == t.data_ptr
            print(f"torch.{name}: is_pinned={x.is_pinned()} same_memory={x.data_ptr() == t.data_ptr}")
            if not ok:
                print(f"FAIL: torch.{name} does not see pinned chute memory")
                return 1
        as_torch = next(iter(loader(True)))["tokens"]
        assert torch.from_numpy(as_torch).is_pinned()

        # 3. Host-to-device copy throughput, pinned against pageable: end to end (loader and
        # copies overlapping, reported) and the copies alone (checked).
        def h2d(pin: bool) -> float:
            ld = loader(pin)
            batches = []
            for b in ld:  # warm-up epoch: threads, pool, CUDA context
                batches.append(torch.from_numpy(b["tokens"]))
                if len(batches) == 8:
                    break
            for x in batches:
                x.to(device, non_blocking=True)
            torch.cuda.synchronize()
            moved, start = 0, time.perf_counter()
            while moved < args.batches:
                for b in ld:
                    x = torch.from_numpy(b["tokens"])
                    x.to(device, non_blocking=True)
                    # Keep the source alive until its copy is done (the pool would reuse it).
                    batches.append(x)
                    if len(batches) > 16:
                        torch.cuda.synchronize()
                        batches.clear()
                    moved += 1
                    if moved == args.batches:
                        break
            torch.cuda.synchronize()
            secs = time.perf_counter() - start
            return moved * args.batch_size * window * 8 / secs / 1e9

        # Only the copies are timed, on batches already built: time the GPU copy itself.
        def copy_rate(pin: bool) -> float:
            ld = loader(pin)
            held = []
            for b in ld:
                held.append(torch.from_numpy(b["tokens"]))
                if len(held) == 16:
                    break
            assert all(x.is_pinned() == pin for x in held)
            for x in held:
                x.to(device, non_blocking=True)
            torch.cuda.synchronize()
            rounds = max(1, args.batches // len(held))
            start = time.perf_counter()
            for _ in range(rounds):
                for x in held:
                    x.to(device, non_blocking=True)
            torch.cuda.synchronize()
            secs = time.perf_counter() - start
            return rounds * len(held) * held[0].numel() * 8 / secs / 1e9

        pinned_rate, pageable_rate = copy_rate(True), copy_rate(False)
        ratio = pinned_rate / pageable_rate
        print(f"H2D copy, non_blocking=True: pinned {pinned_rate:.1f} GB/s, "
              f"pageable {pageable_rate:.1f} GB/s, ratio {ratio:.2f}x")
        e2e_pinned, e2e_pageable = h2d(True), h2d(False)
        print(f"loader -> GPU end to end: pinned {e2e_pinned:.1f} GB/s, "
              f"pageable {e2e_pageable:.1f} GB/s")
        if ratio < 2.0:
            print(f"FAIL: pinned copies are only {ratio:.2f}x faster than pageable (want >= 2x)")
            return 1
        print("OK")
        return 0


if __name__ == "__main__":
    sys.exit(main())
