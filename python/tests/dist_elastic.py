"""An elastic job, run by torchrun from test_distributed.py: DDP training on chute batches with
a fixed global batch (each rank's batch is global_batch_size // WORLD_SIZE), checkpointed
through torch.distributed.checkpoint (model, optimizer and loader) after some steps, and
resumed by a job of another world size from that checkpoint.

    torchrun --nproc_per_node=N dist_elastic.py SHUFFLE DROP_LAST CKPT_IN CKPT_OUT STEPS OUT DATA...
    CKPT_IN: "-" to start fresh; STEPS: steps before checkpointing to CKPT_OUT, or "all"

Rank 0 writes every rank's consumed sample ids (gathered with all_gather_object) to OUT.
"""

import datetime
import json
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

import chute

SEQ = 15
GLOBAL_BATCH = 24


def main() -> None:
    shuffle, drop_last, ckpt_in, ckpt_out, steps, out, *data = sys.argv[1:]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(1 << 16, 8), nn.Flatten(), nn.Linear(8 * SEQ, 4))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    if shuffle == "mix":
        # A mixture of two parts of the data, 2:1: its stratified batches are made for one
        # per-rank batch size, which stays fixed (the global batch follows the world size).
        source = chute.mix({"a": chute.tokens(data[:2], seq_len=SEQ, dtype="uint32"),
                            "b": chute.tokens(data[2:], seq_len=SEQ, dtype="uint32")},
                           weights={"a": 2, "b": 1}, samples_per_epoch=600, seed=4)
        loader = chute.Loader(source, batch_size=6, drop_last=drop_last == "true",
                              num_workers=2, output="torch")
    else:
        loader = chute.Loader(chute.tokens(data, seq_len=SEQ, dtype="uint32"),
                              global_batch_size=GLOBAL_BATCH, shuffle=shuffle, seed=11,
                              drop_last=drop_last == "true", num_workers=2, output="torch")
        assert loader.batch_size == GLOBAL_BATCH // world
    if ckpt_in != "-":
        state = {"model": model.state_dict(), "optim": opt.state_dict(), "loader": loader}
        dcp.load(state, checkpoint_id=ckpt_in)
        model.load_state_dict(state["model"])
    stop = None if steps == "all" else int(steps)
    ids, done = [], 0
    for batch in loader:
        x = batch["tokens"][:, :SEQ] % (1 << 16)
        ids += (batch["tokens"][:, 0] // (SEQ + 1)).tolist()
        loss = nn.functional.cross_entropy(ddp(x), torch.zeros(len(x), dtype=torch.long))
        opt.zero_grad()
        loss.backward()
        opt.step()
        done += 1
        if done == stop:
            dcp.save({"model": model.state_dict(), "optim": opt.state_dict(), "loader": loader},
                     checkpoint_id=ckpt_out)
            break
    everyone = [None] * world
    dist.all_gather_object(everyone, {"ids": ids, "steps": done})
    if rank == 0:
        with open(out, "w") as f:
            json.dump(everyone, f)
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
