"""What the torchrun scripts of this folder (dist_train.py, dist_ckpt.py, dist_crash.py,
dist_elastic.py) share: the gloo process group, the model with DDP and SGD, the training step
on chute token batches (the ids of its samples with it), gathering what every rank saw, and
checkpoints of model, optimizer and loader (torch.distributed.checkpoint, or torch.save per
rank). Imported by those scripts: torchrun runs each as `python -u path/to/script.py`, which
puts the script's own folder first on sys.path, whatever the working directory.

Nothing here is kept in a module global: at exit the scripts' objects go as their main()
leaves them (test_exit.py holds dist_train.py's exit).
"""

import datetime
import json
import os
from typing import Iterator, List, Tuple

import torch
import torch.distributed as dist
from torch import nn

SEQ = 15  # tokens per sequence: a sample is SEQ + 1 tokens, whose first is id * (SEQ + 1)


def init(seconds: float = 120) -> Tuple[int, int]:
    """The gloo process group from torchrun's environment; (rank, world size)."""
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=seconds))
    return dist.get_rank(), dist.get_world_size()


def ddp_sgd(model: nn.Module) -> Tuple[nn.Module, nn.Module, torch.optim.Optimizer]:
    """(model, its DistributedDataParallel wrapper, SGD on it)."""
    ddp = nn.parallel.DistributedDataParallel(model)
    return model, ddp, torch.optim.SGD(ddp.parameters(), lr=0.01)


def token_model() -> Tuple[nn.Module, nn.Module, torch.optim.Optimizer]:
    """The model of the token jobs (seeded: the same weights on every rank and in every job),
    with DDP and SGD."""
    torch.manual_seed(0)
    return ddp_sgd(nn.Sequential(nn.Embedding(1 << 16, 8), nn.Flatten(), nn.Linear(8 * SEQ, 4)))


def step(ddp: nn.Module, opt: torch.optim.Optimizer, x, y) -> None:
    """One training step. backward() is an all-reduce: every rank must take this step."""
    loss = nn.functional.cross_entropy(ddp(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def token_ids(batch) -> List[int]:
    """The global sample ids of a token batch (token files whose tokens are their positions)."""
    return (batch["tokens"][:, 0] // (SEQ + 1)).tolist()


def token_step(ddp: nn.Module, opt: torch.optim.Optimizer, batch) -> List[int]:
    """One training step on a token batch (class 0 for every sample); its sample ids."""
    x = batch["tokens"][:, :SEQ] % (1 << 16)
    step(ddp, opt, x, torch.zeros(len(x), dtype=torch.long))
    return token_ids(batch)


def train_tokens(loader, ddp: nn.Module, opt: torch.optim.Optimizer) -> Iterator[List[int]]:
    """Trains on the loader's batches, yielding each step's sample ids after the step; the
    caller may stop (break) at any step."""
    for batch in loader:
        yield token_step(ddp, opt, batch)


def gather(obj) -> list:
    """Every rank's obj, in rank order (all_gather_object)."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, obj)
    return everyone


def write_json(path: str, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f)


def dcp_save(path: str, model: nn.Module, opt: torch.optim.Optimizer, loader) -> None:
    """Model, optimizer and loader (a Stateful) through torch.distributed.checkpoint."""
    import torch.distributed.checkpoint as dcp

    dcp.save({"model": model.state_dict(), "optim": opt.state_dict(), "loader": loader},
             checkpoint_id=path)


def dcp_load(path: str, model: nn.Module, opt: torch.optim.Optimizer, loader) -> None:
    """What dcp_save wrote (dcp.load restores the loader and fills the state dicts in place),
    then the model's state set from it."""
    import torch.distributed.checkpoint as dcp

    state = {"model": model.state_dict(), "optim": opt.state_dict(), "loader": loader}
    dcp.load(state, checkpoint_id=path)
    model.load_state_dict(state["model"])


def torch_save(path: str, model: nn.Module, opt: torch.optim.Optimizer, loader) -> None:
    """This rank's model, optimizer and loader state_dict() with torch.save, under a temporary
    name renamed into place (a rank killed meanwhile leaves no partial file)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save({"model": model.state_dict(), "optim": opt.state_dict(),
                "loader": loader.state_dict()}, path + ".tmp")
    os.replace(path + ".tmp", path)


def torch_load(path: str, model: nn.Module, opt: torch.optim.Optimizer, loader) -> None:
    state = torch.load(path, weights_only=False)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    loader.load_state_dict(state["loader"])
