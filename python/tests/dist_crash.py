"""Crashes under torchrun, run by test_distributed.py (CPU, gloo).

    torchrun --max-restarts=1 --nproc_per_node=N dist_crash.py kill DATA DIR
        Trains one epoch (drop_last), checkpointing every 5 steps (each rank's loader state
        and model with torch.save, written under a temporary name and renamed; rank 0 marks
        the step complete after a barrier). On the first attempt rank 1 SIGKILLs itself at
        step 13; torchrun restarts every rank, which resumes from the last complete
        checkpoint. Each rank appends the ids of every step to DIR/ids-RANK-ATTEMPT.jsonl.
    torchrun --nproc_per_node=N dist_crash.py fail DATA DIR
        A Python dataset whose sample 37 raises on whichever rank reads it: that rank's
        next() raises the error, the process exits, and torchrun ends the job.
"""

import datetime
import json
import os
import signal
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

import chute
from dist_common import SEQ, token_model, torch_load, torch_save, train_tokens

EVERY = 5


class Flaky:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == 37:
            raise ValueError("sample 37 is broken on purpose")
        return {"x": np.full(4, i, dtype=np.int64)}


def main() -> None:
    mode, data, folder = sys.argv[1:4]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # torchrun's store outlives a restart: keys of this attempt under their own prefix, so a
    # restarted rank never reads the address of a dead one.
    timeout = datetime.timedelta(seconds=60)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt-{attempt}", store),
                            rank=rank, world_size=world, timeout=timeout)
    if mode == "fail":
        loader = chute.Loader(Flaky(200), batch_size=4, shuffle=True, seed=1, num_workers=2)
        model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
        for batch in loader:
            model(torch.as_tensor(batch["x"]).float()).sum().backward()
        dist.destroy_process_group()
        return
    model, ddp, opt = token_model()
    loader = chute.Loader(chute.tokens(data, seq_len=SEQ, dtype="uint32"), batch_size=8,
                          shuffle=True, seed=5, num_workers=2, drop_last=True, output="torch")
    done_file = os.path.join(folder, "complete.json")
    step = 0
    if os.path.exists(done_file):
        with open(done_file) as f:
            step = json.load(f)["step"]
        torch_load(os.path.join(folder, f"ckpt-{step}-rank{rank}.pt"), model, opt, loader)
    log = open(os.path.join(folder, f"ids-{rank}-{attempt}.jsonl"), "a")
    for ids in train_tokens(loader, ddp, opt):
        step += 1
        log.write(json.dumps({"step": step, "ids": ids}) + "\n")
        log.flush()
        if step % EVERY == 0:
            torch_save(os.path.join(folder, f"ckpt-{step}-rank{rank}.pt"), model, opt, loader)
            dist.barrier()
            if rank == 0:
                with open(done_file + ".tmp", "w") as f:
                    json.dump({"step": step}, f)
                os.replace(done_file + ".tmp", done_file)
            dist.barrier()
        if attempt == 0 and rank == 1 and step == 13:
            os.kill(os.getpid(), signal.SIGKILL)
    log.close()
    loader.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
