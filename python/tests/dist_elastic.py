"""An elastic job, run by torchrun from test_distributed.py: DDP training on chute batches with
a fixed global batch (each rank's batch is global_batch_size // WORLD_SIZE), checkpointed
through torch.distributed.checkpoint (model, optimizer and loader) after some steps, and
resumed by a job of another world size from that checkpoint.

    torchrun --nproc_per_node=N dist_elastic.py SHUFFLE DROP_LAST CKPT_IN CKPT_OUT STEPS OUT DATA...
    CKPT_IN: "-" to start fresh; STEPS: steps before checkpointing to CKPT_OUT, or "all"

Rank 0 writes every rank's consumed sample ids (gathered with all_gather_object) to OUT.
"""

import sys

import torch.distributed as dist

import chute
from dist_common import SEQ, dcp_load, dcp_save, gather, init, token_model, train_tokens, write_json

GLOBAL_BATCH = 24


def main() -> None:
    shuffle, drop_last, ckpt_in, ckpt_out, steps, out, *data = sys.argv[1:]
    rank, world = init()
    model, ddp, opt = token_model()
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
        dcp_load(ckpt_in, model, opt, loader)
    stop = None if steps == "all" else int(steps)
    ids, done = [], 0
    for step_ids in train_tokens(loader, ddp, opt):
        ids += step_ids
        done += 1
        if done == stop:
            dcp_save(ckpt_out, model, opt, loader)
            break
    everyone = gather({"ids": ids, "steps": done})
    if rank == 0:
        write_json(out, everyone)
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
