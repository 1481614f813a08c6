"""A DistributedDataParallel job whose ranks each read a Python dataset with worker processes
(worker_mode="process"), run by torchrun from test_distributed.py (CPU, gloo). Epoch 0 is
trained whole; epoch 1 is interrupted after 3 steps, the loader's state taken, and a new
loader (new worker processes) resumed from it. Rank 0 writes every rank's ids to OUT.

    torchrun --nproc_per_node=N dist_process.py TOTAL OUT
"""

import itertools
import os
import sys
import time

import numpy as np
import torch
from torch import nn

import chute
from dist_common import ddp_sgd, gather, init, step, write_json


class Numbers:
    """Sample i is a feature vector and label made by pure Python (the GIL held)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        acc = 0
        for k in range(500):
            acc = (acc * 31 + k + i) % 1_000_003
        return {"x": np.full(4, i % 97, dtype=np.float32), "y": i % 3, "id": i,
                "worker_pid": os.getpid()}


def loader(total: int) -> chute.Loader:
    return chute.Loader(Numbers(total), batch_size=6, shuffle=True, seed=11, num_workers=2,
                        worker_mode="process", output="torch")


def train(l: chute.Loader, ddp, opt, steps=None):
    """Trains on `steps` batches (all by default); the ids and the worker pids seen."""
    ids, pids = [], set()
    for batch in itertools.islice(l, steps):
        step(ddp, opt, batch["x"], batch["y"])
        ids += batch["id"].tolist()
        pids |= set(batch["worker_pid"].tolist())
    return ids, pids


def main() -> None:
    total, out = int(sys.argv[1]), sys.argv[2]
    rank, world = init()
    torch.manual_seed(0)
    _, ddp, opt = ddp_sgd(nn.Linear(4, 3))
    l = loader(total)
    assert l.worker_mode == "process" and (l.rank, l.world_size) == (rank, world)
    # Until its worker processes are ready a rank reads itself; here they read it all.
    deadline = time.monotonic() + 120
    while l.stats()["source"]["ready_processes"] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    epoch0, pids = train(l, ddp, opt)
    assert os.getpid() not in pids and len(pids) <= 2, pids
    l.set_epoch(1)
    head, _ = train(l, ddp, opt, steps=3)
    state = l.state_dict()
    l.close()
    resumed = loader(total)
    resumed.load_state_dict(state)
    rest, _ = train(resumed, ddp, opt)
    resumed.close()
    reference = loader(total)
    reference.set_epoch(1)
    whole = [i for b in reference for i in b["id"].tolist()]
    reference.close()
    everyone = gather({"epoch0": epoch0, "epoch1": head + rest, "reference": whole})
    if rank == 0:
        write_json(out, everyone)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
