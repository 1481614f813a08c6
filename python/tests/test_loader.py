"""chute.Loader's arguments, one by one, and the batches they give."""

import os

import numpy as np
import pytest

import chute
from conftest import SEQ, WINDOW, epoch_ids, ids, write_tokens


def test_defaults_one_sample_per_batch_in_order(source100):
    loader = chute.Loader(source100)
    assert len(loader) == 100
    batches = list(loader)
    assert len(batches) == 100
    first = batches[0]
    assert list(first) == ["tokens"]
    t = first["tokens"]
    assert isinstance(t, np.ndarray)
    assert t.dtype == np.int64 and t.shape == (1, WINDOW)
    assert [ids(b)[0] for b in batches] == list(range(100))
    assert (loader.batch_size, loader.num_workers, loader.shuffle, loader.seed) == (1, 0, "none", 0)
    assert (loader.rank, loader.world_size, loader.drop_last, loader.on_error) == (0, 1, False, "raise")


def test_batch_size_and_drop_last(source100):
    loader = chute.Loader(source100, batch_size=16)
    sizes = [len(ids(b)) for b in loader]
    assert sizes == [16] * 6 + [4] and len(loader) == 7
    loader = chute.Loader(source100, batch_size=16, drop_last=True)
    got = epoch_ids(loader)
    assert [len(b) for b in got] == [16] * 6 and len(loader) == 6
    assert sum(got, []) == list(range(96))


@pytest.mark.parametrize("bad", [0, -3])
def test_bad_batch_size_is_a_config_error(source100, bad):
    with pytest.raises(chute.ConfigError, match="batch_size"):
        chute.Loader(source100, batch_size=bad)


def test_shuffle_false_true_and_names(source100):
    in_order = sum(epoch_ids(chute.Loader(source100, batch_size=10, shuffle=False)), [])
    assert in_order == list(range(100))
    assert sum(epoch_ids(chute.Loader(source100, batch_size=10, shuffle="none")), []) == in_order

    on = chute.Loader(source100, batch_size=10, shuffle=True)
    assert on.shuffle == "global"
    e0 = sum(epoch_ids(on), [])
    e1 = sum(epoch_ids(on), [])
    assert sorted(e0) == sorted(e1) == list(range(100))
    assert e0 != in_order and e1 != e0, "a new permutation each epoch"
    named = chute.Loader(source100, batch_size=10, shuffle="global")
    assert sum(epoch_ids(named), []) == e0


def test_block_shuffle_keeps_shards_together(shards):
    source = chute.tokens(shards, seq_len=SEQ, dtype="uint32")
    assert len(source) == 100 and [n for _, n in source.shards] == [20, 13, 30, 7, 30]
    for mode, window in [("block", 4), ("block:1", 1), ("block:2", 2)]:
        loader = chute.Loader(source, batch_size=5, shuffle=mode)
        assert loader.shuffle == f"block:{window}"
        order = sum(epoch_ids(loader), [])
        assert sorted(order) == list(range(100))
        assert order != list(range(100))
    # block:1 visits one shard at a time.
    order = sum(epoch_ids(chute.Loader(source, batch_size=5, shuffle="block:1")), [])
    bounds = np.cumsum([0, 20, 13, 30, 7, 30])
    shard_of = [int(np.searchsorted(bounds, i, side="right")) - 1 for i in order]
    runs = [s for k, s in enumerate(shard_of) if k == 0 or s != shard_of[k - 1]]
    assert sorted(runs) == [0, 1, 2, 3, 4], f"each shard read in one run: {runs}"


@pytest.mark.parametrize("bad", ["sideways", "block:0", "block:x", 3])
def test_bad_shuffle_is_a_config_error(source100, bad):
    with pytest.raises(chute.ConfigError, match="shuffle") as e:
        chute.Loader(source100, shuffle=bad)
    assert isinstance(e.value, ValueError)


def test_seed_changes_the_order_and_only_the_seed_does(source100):
    def order(seed, **kw):
        return sum(epoch_ids(chute.Loader(source100, batch_size=8, shuffle=True, seed=seed, **kw)), [])

    assert order(1) == order(1)
    assert order(1) != order(2)
    assert order(2**64 - 1) != order(1)
    with pytest.raises(chute.ConfigError, match="seed"):
        chute.Loader(source100, seed=-1)
    with pytest.raises(chute.ConfigError, match="seed"):
        chute.Loader(source100, seed=2**64)


def rng_transform(sample, rng):
    sample["noise"] = rng.integers(0, 1 << 30, size=3)
    return sample


@pytest.mark.parametrize("shuffle", ["global", "block:2"])
def test_same_batches_for_any_num_workers(shards, shuffle):
    source = chute.tokens(shards, seq_len=SEQ, dtype="uint32")

    def run(workers):
        loader = chute.Loader(
            source, batch_size=7, shuffle=shuffle, seed=3, num_workers=workers,
            transforms=[rng_transform],
        )
        out = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            for b in loader:
                out.append((b["tokens"].copy(), b["noise"].copy()))
        return out

    reference = run(0)
    assert len(reference) == 2 * 15
    for workers in (1, 2, 4):
        got = run(workers)
        assert len(got) == len(reference)
        for (t0, n0), (t1, n1) in zip(reference, got):
            np.testing.assert_array_equal(t0, t1)
            np.testing.assert_array_equal(n0, n1)


@pytest.mark.parametrize(
    "workers, factor, depth", [(0, 2, 2), (0, None, 2), (1, 2, 2), (4, 3, 12), (2, 1, 2)]
)
def test_prefetch_factor_is_per_worker(source100, workers, factor, depth):
    loader = chute.Loader(source100, batch_size=9, num_workers=workers, prefetch_factor=factor)
    assert loader.prefetch == depth
    assert sum(epoch_ids(loader), []) == list(range(100))


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_prefetch_factor(source100, bad):
    with pytest.raises(chute.ConfigError, match="prefetch_factor"):
        chute.Loader(source100, prefetch_factor=bad)


@pytest.mark.parametrize("bad", [-1, 5000])
def test_bad_num_workers(source100, bad):
    with pytest.raises(chute.ConfigError, match="num_workers"):
        chute.Loader(source100, num_workers=bad)


@pytest.mark.parametrize("world_size", [2, 3, 4, 7])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True, "block:2"])
def test_ranks_partition_the_epoch_exactly(shards, world_size, drop_last, shuffle):
    source = chute.tokens(shards, seq_len=SEQ, dtype="uint32")
    per_rank = []
    for rank in range(world_size):
        loader = chute.Loader(
            source, batch_size=4, shuffle=shuffle, seed=9, rank=rank,
            world_size=world_size, drop_last=drop_last, num_workers=rank % 3,
        )
        batches = epoch_ids(loader)
        assert len(batches) == len(loader)
        per_rank.append(batches)
    counts = {len(b) for b in per_rank}
    assert len(counts) == 1, f"every rank has the same number of batches: {counts}"
    every = [i for batches in per_rank for b in batches for i in b]
    if drop_last:
        assert len(every) == len(set(every)), "disjoint"
        assert len(every) > 100 - world_size * 4
    else:
        assert set(every) == set(range(100)), "the union is the whole dataset"
        assert len(every) - len(set(every)) < world_size, "fewer than world_size repeats"
        if 100 % world_size == 0:
            assert len(every) == 100, "disjoint"


def test_rank_and_world_size_default_to_torchrun_env(source100, monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    loader = chute.Loader(source100, batch_size=5)
    assert (loader.rank, loader.world_size, loader.local_rank) == (2, 4, 1)
    assert sum(epoch_ids(loader), []) == list(range(2, 100, 4))
    explicit = chute.Loader(source100, batch_size=5, rank=0, world_size=2)
    assert (explicit.rank, explicit.world_size) == (0, 2)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("LOCAL_RANK")
    plain = chute.Loader(source100)
    assert (plain.rank, plain.world_size, plain.local_rank) == (0, 1, 0)


@pytest.mark.parametrize(
    "var, value", [("RANK", "one"), ("RANK", "-1"), ("WORLD_SIZE", "0"), ("LOCAL_RANK", "x")]
)
def test_bad_torchrun_env_names_the_variable(source100, monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with pytest.raises(chute.ConfigError, match=var):
        chute.Loader(source100)


def test_rank_out_of_range(source100, monkeypatch):
    with pytest.raises(chute.ConfigError, match="rank"):
        chute.Loader(source100, rank=2, world_size=2)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(chute.ConfigError, match="rank"):
        chute.Loader(source100)


def test_epochs_and_set_epoch(source100):
    loader = chute.Loader(source100, batch_size=10, shuffle=True, seed=5)
    assert loader.epoch == 0
    e0 = epoch_ids(loader)
    assert loader.epoch == 1
    e1 = epoch_ids(loader)
    assert e0 != e1

    other = chute.Loader(source100, batch_size=10, shuffle=True, seed=5)
    other.set_epoch(1)
    assert other.epoch == 1 and epoch_ids(other) == e1
    # Setting the current epoch keeps the position.
    other.set_epoch(0)
    it = iter(other)
    first = ids(next(it))
    other.set_epoch(0)
    assert [first] + epoch_ids(other) == e0
    with pytest.raises(chute.ConfigError, match="epoch"):
        other.set_epoch(-1)


def test_output_dlpack_yields_chute_tensors(source100):
    batch = next(iter(chute.Loader(source100, batch_size=4, output="dlpack")))
    t = batch["tokens"]
    assert isinstance(t, chute.Tensor)
    assert t.shape == (4, WINDOW) and t.dtype == "int64" and len(t) == 4
    assert t.nbytes == 4 * WINDOW * 8 and t.ndim == 2
    assert t.data_ptr % 64 == 0
    assert "int64" in repr(t)


def test_bad_output(source100):
    with pytest.raises(chute.ConfigError, match="output"):
        chute.Loader(source100, output="pandas")


def test_token_dtypes(tmp_path):
    path = write_tokens(tmp_path / "u16.bin", 10, dtype=np.uint16)
    for out in ["int64", "int32", "uint16", "float32", np.int64, np.dtype("int32")]:
        src = chute.tokens(path, SEQ, dtype="uint16", out_dtype=out)
        t = next(iter(chute.Loader(src, batch_size=10)))["tokens"]
        assert t.dtype == np.dtype(out)
        np.testing.assert_array_equal(t.ravel(), np.arange(10 * WINDOW))
    src = chute.tokens(os.fspath(path), SEQ)  # defaults: uint16 stored, int64 out
    assert next(iter(chute.Loader(src)))["tokens"].dtype == np.int64


def test_source_accepts_paths_and_lists(tmp_path, shards):
    from pathlib import Path

    one = chute.tokens(Path(shards[0]), SEQ, dtype="uint32")
    assert len(one) == 20
    many = chute.tokens([Path(p) for p in shards], SEQ, dtype="uint32")
    assert len(many) == 100 and many.shards[1] == (shards[1], 13)
    assert many.fingerprint != one.fingerprint
    assert "samples=100" in repr(many)
    with pytest.raises(TypeError):
        chute.Loader("train.bin")


def test_stats(source100):
    loader = chute.Loader(source100, batch_size=10, num_workers=2)
    epoch_ids(loader)
    s = loader.stats()
    assert s["batches"] == 10 and s["samples"] == 100 and s["errors"] == 0
    assert s["bytes"] == 100 * WINDOW * 8
    assert {"wait_secs", "wait_fraction", "read", "transform", "collate"} <= set(s)
    assert s["read"]["items"] == 100 and s["collate"]["items"] == 10


def test_close_and_context_manager(source100):
    with chute.Loader(source100, batch_size=10, num_workers=2) as loader:
        it = iter(loader)
        kept = next(it)["tokens"]
    assert loader.closed and "closed" in repr(loader)
    assert ids({"tokens": kept}) == list(range(10)), "delivered batches stay valid"
    with pytest.raises(ValueError, match="closed"):
        next(it)
    loader.close()  # twice is fine


def test_a_dropped_generator_does_not_close_the_loader(source100):
    # `yield from` calls close() on the iterator it delegates to when the generator is
    # dropped: the loader's iterator must not take that as "close the loader".
    loader = chute.Loader(source100, batch_size=10, num_workers=2)

    def forever():
        while True:
            yield from loader

    gen = forever()
    first = [ids(next(gen)) for _ in range(3)]
    gen.close()
    del gen
    assert not loader.closed
    assert first + epoch_ids(loader) == epoch_ids(chute.Loader(source100, batch_size=10))


def test_iteration_after_an_error_continues(source100):
    def fail_on_7(sample):
        if sample["__index__"] == 7:
            raise ValueError("seven")
        return sample

    loader = chute.Loader(source100, batch_size=5, transforms=fail_on_7, num_workers=2)
    it = iter(loader)
    got, errors = [], 0
    while True:
        try:
            got.append(ids(next(it)))
        except StopIteration:
            break
        except ValueError:
            errors += 1
    assert errors == 1 and len(got) == 19
    assert 7 not in sum(got, []) and loader.stats()["errors"] == 1


def test_on_error_skip_replaces_the_sample(source100):
    def fail_on_tens(sample):
        if sample["__index__"] % 10 == 0:
            raise ValueError("bad sample")
        return sample

    loader = chute.Loader(source100, batch_size=10, transforms=[fail_on_tens], on_error="skip")
    got = epoch_ids(loader)
    assert [len(b) for b in got] == [10] * 10, "batches stay full"
    flat = sum(got, [])
    assert not any(i % 10 == 0 for i in flat)
    s = loader.stats()
    assert s["skipped"] == 10 and "bad sample" in s["skipped_recent"][0]
    with pytest.raises(chute.ConfigError, match="on_error"):
        chute.Loader(source100, on_error="ignore")
