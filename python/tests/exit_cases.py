"""A Python process that uses chute and then ends normally, at one of the points a training
job ends: run by test_exit.py many times in a row, which fails on any non-zero exit or any
`terminate called` / `panicked` / `Fatal Python error` line.

    python exit_cases.py CASE TOKEN_FILE
"""

import multiprocessing
import os
import signal
import sys
import threading
import time

import numpy as np

import chute

SEQ = 15


def tokens(path: str, **kw) -> chute.Loader:
    source = chute.tokens(path, seq_len=SEQ, dtype="uint32")
    return chute.Loader(source, batch_size=4, shuffle=True, num_workers=2, **kw)


class Squares:
    """A map-style dataset whose __getitem__ holds the GIL a while."""

    def __len__(self) -> int:
        return 400

    def __getitem__(self, i: int):
        x = np.full(8, i, dtype=np.int64)
        for _ in range(200):
            x = x + 0
        return {"x": x}


class Stream:
    def __iter__(self):
        for i in range(10**6):
            yield {"x": np.array([i])}


def slow(sample):
    time.sleep(0.01)
    return sample


def child(loader: chute.Loader) -> None:
    # A forked child: the inherited loader starts its own threads, then the child ends.
    for i, _ in enumerate(loader):
        if i == 3:
            break


def main() -> None:
    case, path = sys.argv[1], sys.argv[2]
    keep = []  # loaders left alive until the interpreter ends
    if case == "alive":
        loader = tokens(path)
        it = iter(loader)
        next(it)
        keep.append((loader, it))
    elif case == "exhausted":
        loader = tokens(path)
        for _ in loader:
            pass
        keep.append(loader)
    elif case == "closed":
        with tokens(path) as loader:
            for _ in loader:
                pass
    elif case == "persistent":
        loader = tokens(path, persistent_workers=True, prefetch_factor=4)
        for epoch in range(2):
            for i, _ in enumerate(loader):
                if epoch == 1 and i == 2:
                    break
        keep.append(loader)
    elif case == "python":
        # Worker threads busy in a Python __getitem__ and a Python transform at exit.
        loader = chute.Loader(Squares(), batch_size=8, num_workers=3, transforms=[slow])
        it = iter(loader)
        next(it)
        keep.append((loader, it))
    elif case == "iterable":
        loader = chute.Loader(Stream(), batch_size=8, num_workers=1)
        it = iter(loader)
        next(it)
        keep.append((loader, it))
    elif case == "metrics":
        loader = tokens(path, metrics_port=0)
        chute.serve_metrics(0)
        it = iter(loader)
        next(it)
        keep.append((loader, it))
    elif case == "ctrl-c":
        # As a terminal's Ctrl-C finds it: a shell that started the tests in the background
        # handed this process SIGINT ignored (see test_behaviour.py).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        loader = tokens(path, transforms=[slow])
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            for _ in range(10**6):
                for _ in loader:
                    pass
        except KeyboardInterrupt:
            pass
        keep.append(loader)
    elif case == "fork":
        loader = tokens(path)
        it = iter(loader)
        next(it)
        ctx = multiprocessing.get_context("fork")
        p = ctx.Process(target=child, args=(loader,))
        p.start()
        p.join(60)
        assert p.exitcode == 0, p.exitcode
        keep.append((loader, it))
    elif case == "torch":
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"file://{path}.pg{os.getpid()}", rank=0,
                                world_size=1)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(SEQ + 1, 1))
        loader = tokens(path, output="torch")
        for i, batch in enumerate(loader):
            model(batch["tokens"].float()).sum().backward()
            if i == 5:
                break
        dist.destroy_process_group()
        keep.append(loader)
    else:
        raise SystemExit(f"unknown case {case!r}")
    print("done", flush=True)


if __name__ == "__main__":
    main()
