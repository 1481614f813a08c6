"""A small DistributedDataParallel training job on chute batches, run by torchrun from
test_distributed.py (CPU, gloo). RANK and WORLD_SIZE come from torchrun's environment; chute
reads them too. For each drop_last setting it trains one epoch, gathers the global sample ids
every rank consumed with all_gather_object, and rank 0 writes them to OUT as JSON.

    torchrun --nproc_per_node=N dist_train.py KIND DATA OUT
    KIND: tokens (DATA a token file, ids from the tokens) or images (DATA a tar of PNGs)
"""

import os
import sys

import torch
import torch.distributed as dist
from torch import nn

import chute
from dist_common import SEQ, ddp_sgd, gather, init, step, token_model, token_step, write_json


def tokens_loader(path: str, drop_last: bool) -> chute.Loader:
    source = chute.tokens(path, seq_len=SEQ, dtype="uint32")
    return chute.Loader(source, batch_size=8, shuffle=True, seed=3, num_workers=2,
                        drop_last=drop_last, output="torch")


def images_loader(path: str, drop_last: bool) -> chute.Loader:
    ops = {"png": [{"op": "decode"}, {"op": "resize", "size": 16}, {"op": "center_crop",
                                                                   "size": 16}],
           "cls": [{"op": "label"}]}
    return chute.Loader(chute.webdataset(path), batch_size=4, shuffle=True, seed=3,
                        num_workers=2, drop_last=drop_last, transforms=ops, output="torch")


def main() -> None:
    kind, data, out = sys.argv[1:4]
    rank, world = init()
    assert (rank, world) == (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    if kind == "tokens":
        _, ddp, opt = token_model()
    else:
        torch.manual_seed(0)
        _, ddp, opt = ddp_sgd(nn.Sequential(nn.Flatten(), nn.Linear(16 * 16 * 3, 10)))
    result = {}
    for drop_last in (False, True):
        loader = (tokens_loader if kind == "tokens" else images_loader)(data, drop_last)
        assert (loader.rank, loader.world_size) == (rank, world)
        ids, steps = [], 0
        for batch in loader:
            if kind == "tokens":
                ids += token_step(ddp, opt, batch)
            else:
                step(ddp, opt, batch["png"].float() / 255, batch["cls"])
                ids += [int(k[3:]) for k in batch["__key__"]]
            steps += 1
        everyone = gather({"ids": ids, "steps": steps, "len": len(loader)})
        result["drop_last" if drop_last else "keep_last"] = everyone
        loader.close()
    dist.barrier()
    if rank == 0:
        write_json(out, result)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
