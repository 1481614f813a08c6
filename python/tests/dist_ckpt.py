"""Checkpointing a DDP job's chute loader the way users write it, run by torchrun from
test_distributed.py: the loader's state_dict() beside the model and optimizer, through
torch.distributed.checkpoint (DCP) or torch.save per rank.

    torchrun --nproc_per_node=N dist_ckpt.py MODE STYLE DATA CKPT OUT
    MODE: full (one epoch), first:K (K steps, then a checkpoint) or resume (from CKPT)
    STYLE: dcp or torch_save

Rank 0 writes every rank's consumed sample ids (gathered with all_gather_object) to OUT.
"""

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

import chute

SEQ = 15


def main() -> None:
    mode, style, data, ckpt, out = sys.argv[1:6]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(1 << 16, 8), nn.Flatten(), nn.Linear(8 * SEQ, 4))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    loader = chute.Loader(chute.tokens(data, seq_len=SEQ, dtype="uint32"), batch_size=8,
                          shuffle=True, seed=7, num_workers=2, output="torch")
    if mode == "resume":
        if style == "dcp":
            state = {"model": model.state_dict(), "optim": opt.state_dict(), "loader": loader}
            dcp.load(state, checkpoint_id=ckpt)
            model.load_state_dict(state["model"])
        else:
            state = torch.load(os.path.join(ckpt, f"rank{rank}.pt"), weights_only=False)
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])
            loader.load_state_dict(state["loader"])
    stop = int(mode.split(":")[1]) if mode.startswith("first:") else None
    ids, steps = [], 0
    for batch in loader:
        x = batch["tokens"][:, :SEQ] % (1 << 16)
        ids += (batch["tokens"][:, 0] // (SEQ + 1)).tolist()
        loss = nn.functional.cross_entropy(ddp(x), torch.zeros(len(x), dtype=torch.long))
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
        if stop is not None and steps == stop:
            if style == "dcp":
                dcp.save({"model": model.state_dict(), "optim": opt.state_dict(),
                          "loader": loader}, checkpoint_id=ckpt)
            else:
                os.makedirs(ckpt, exist_ok=True)
                torch.save({"model": model.state_dict(), "optim": opt.state_dict(),
                            "loader": loader.state_dict()}, os.path.join(ckpt, f"rank{rank}.pt"))
            break
    everyone = [None] * world
    dist.all_gather_object(everyone, ids)
    dist.barrier()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(everyone, f)
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
