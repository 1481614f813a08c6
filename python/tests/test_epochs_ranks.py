"""Epochs follow the consumer (a pass that took exactly len(loader) batches ends the epoch), and
rank / world size are found as the launchers set them (torchrun, Lightning, SLURM)."""

from typing import List

import numpy as np
import pytest

import chute
from conftest import SEQ, epoch_ids, ids, write_tokens


def take(loader, n: int) -> List[List[int]]:
    """The ids of the next n batches of a new pass, never asking for batch n + 1."""
    it = iter(loader)
    return [ids(next(it)) for _ in range(n)]


@pytest.mark.parametrize("shuffle", [False, True, "block:1"])
def test_exactly_len_batches_per_epoch_gives_every_epoch_in_full(source100, shuffle):
    reference = chute.Loader(source100, batch_size=8, shuffle=shuffle, seed=5)
    full = [epoch_ids(reference) for _ in range(3)]
    loader = chute.Loader(source100, batch_size=8, shuffle=shuffle, seed=5, num_workers=2)
    n = len(loader)
    for epoch in range(3):
        assert loader.epoch == epoch
        assert loader.state_dict()["epoch"] == epoch
        assert take(loader, n) == full[epoch], f"epoch {epoch}"
        # Over with its last batch: the property and the state agree on the next epoch.
        assert loader.epoch == epoch + 1
        assert loader.state_dict()["epoch"] == epoch + 1
        assert loader.state_dict()["delivered"] == 0


def test_for_loop_and_range_len_mix(source100):
    loader = chute.Loader(source100, batch_size=8, shuffle=True, seed=1)
    n = len(loader)
    a = epoch_ids(loader)  # asks for the end: StopIteration
    b = take(loader, n)  # never asks
    c = epoch_ids(loader)
    assert len(a) == len(b) == len(c) == n
    assert a != b and b != c  # three distinct epochs, none empty
    assert loader.epoch == 3


def test_a_pass_that_breaks_early_continues_its_epoch(source100):
    loader = chute.Loader(source100, batch_size=8, shuffle=True, seed=1)
    whole = epoch_ids(chute.Loader(source100, batch_size=8, shuffle=True, seed=1))
    head = take(loader, 4)
    assert loader.epoch == 0
    assert head + epoch_ids(loader) == whole


def test_set_epoch_after_a_full_pass(source100):
    reference = chute.Loader(source100, batch_size=10, shuffle=True, seed=2)
    full = [epoch_ids(reference) for _ in range(3)]
    loader = chute.Loader(source100, batch_size=10, shuffle=True, seed=2)
    take(loader, len(loader))
    loader.set_epoch(1)  # the epoch it already stands at: kept, as DistributedSampler users do
    assert take(loader, len(loader)) == full[1]
    loader.set_epoch(0)  # another epoch: its start
    assert epoch_ids(loader) == full[0]


def test_resume_from_a_state_taken_after_exactly_len_batches(source100):
    loader = chute.Loader(source100, batch_size=8, shuffle=True, seed=4)
    take(loader, len(loader))
    state = loader.state_dict()
    again = chute.Loader(source100, batch_size=8, shuffle=True, seed=4)
    again.load_state_dict(state)
    assert again.epoch == 1
    assert epoch_ids(again) == take(loader, len(loader))


class Stream:
    """An iterable dataset with a length (the iterable engine's path)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        for i in range(self.n):
            yield {"x": np.array([i], dtype=np.int64)}


def test_iterable_dataset_exactly_len_batches(tmp_path):
    loader = chute.Loader(Stream(40), batch_size=8)
    n = len(loader)
    for epoch in range(3):
        it = iter(loader)
        got = [np.asarray(next(it)["x"]).ravel().tolist() for _ in range(n)]
        assert sum(got, []) == list(range(40)), f"epoch {epoch}"
        assert loader.epoch == epoch + 1
        assert loader.state_dict()["epoch"] == epoch + 1


# Ranks ---------------------------------------------------------------------------------------


def test_rank_from_torchrun_variables(source100, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = chute.Loader(source100, batch_size=5)
    assert (loader.rank, loader.world_size, loader.rank_from) == (1, 2, "RANK/WORLD_SIZE")
    s = loader.stats()
    assert (s["rank"], s["world_size"]) == (1, 2)


def test_world_size_without_rank_is_an_error_not_rank_0(source100, monkeypatch):
    # Lightning's DDP launcher: WORLD_SIZE, LOCAL_RANK and NODE_RANK, no RANK.
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("NODE_RANK", "0")
    with pytest.raises(chute.ConfigError, match="RANK is not.*train_dataloader"):
        chute.Loader(source100, batch_size=5)
    # The fix the message names: explicit arguments.
    loader = chute.Loader(source100, batch_size=5, rank=1, world_size=2)
    assert (loader.rank, loader.world_size) == (1, 2)


def test_slurm_variables_where_nothing_else_is_set(source100, monkeypatch):
    monkeypatch.setenv("SLURM_PROCID", "2")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    loader = chute.Loader(source100, batch_size=5)
    assert (loader.rank, loader.world_size, loader.rank_from) == (2, 4, "SLURM")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert chute.Loader(source100, batch_size=5).rank_from == "RANK/WORLD_SIZE"


def test_world_size_argument_alone_needs_a_rank(source100):
    with pytest.raises(chute.ConfigError, match="pass rank="):
        chute.Loader(source100, batch_size=5, world_size=2)


def test_rank_from_an_initialized_process_group(tmp_path, source100):
    torch = pytest.importorskip("torch")
    dist = torch.distributed
    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this build")
    # A one-process group whose world claims nothing the environment says: the group wins.
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0,
                            world_size=1)
    try:
        loader = chute.Loader(source100, batch_size=5)
        assert (loader.rank, loader.world_size, loader.rank_from) == (0, 1, "torch.distributed")
    finally:
        dist.destroy_process_group()


def test_tokens_file_fixture_sanity(tmp_path):
    # The helpers above rely on ids(): windows of consecutive tokens.
    path = write_tokens(tmp_path / "t.bin", 10)
    loader = chute.Loader(chute.tokens(path, seq_len=SEQ, dtype="uint32"), batch_size=10)
    assert epoch_ids(loader) == [list(range(10))]
