"""Checkpointing a DDP job's chute loader the way users write it, run by torchrun from
test_distributed.py: the loader's state_dict() beside the model and optimizer, through
torch.distributed.checkpoint (DCP) or torch.save per rank.

    torchrun --nproc_per_node=N dist_ckpt.py MODE STYLE DATA CKPT OUT
    MODE: full (one epoch), first:K (K steps, then a checkpoint) or resume (from CKPT)
    STYLE: dcp or torch_save

Rank 0 writes every rank's consumed sample ids (gathered with all_gather_object) to OUT.
"""

import os
import sys

import torch.distributed as dist

import chute
from dist_common import (SEQ, dcp_load, dcp_save, gather, init, token_model, torch_load,
                         torch_save, train_tokens, write_json)


def main() -> None:
    mode, style, data, ckpt, out = sys.argv[1:6]
    rank, world = init()
    model, ddp, opt = token_model()
    loader = chute.Loader(chute.tokens(data, seq_len=SEQ, dtype="uint32"), batch_size=8,
                          shuffle=True, seed=7, num_workers=2, output="torch")
    save, load = (dcp_save, dcp_load) if style == "dcp" else (torch_save, torch_load)
    where = ckpt if style == "dcp" else os.path.join(ckpt, f"rank{rank}.pt")
    if mode == "resume":
        load(where, model, opt, loader)
    stop = int(mode.split(":")[1]) if mode.startswith("first:") else None
    ids, steps = [], 0
    for step_ids in train_tokens(loader, ddp, opt):
        ids += step_ids
        steps += 1
        if stop is not None and steps == stop:
            save(where, model, opt, loader)
            break
    everyone = gather(ids)
    dist.barrier()
    if rank == 0:
        write_json(out, everyone)
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
