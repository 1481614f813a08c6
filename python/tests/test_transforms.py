"""Python transforms on chute's worker threads: what they get, what they may return, their RNG
and their exceptions."""

import sys

import numpy as np
import pytest

import chute
from conftest import SEQ, WINDOW, epoch_ids, ids


def test_sample_dict_and_returned_fields(source100):
    seen = []

    def enrich(sample):
        seen.append((sample["__index__"], sample["tokens"].dtype, sample["tokens"].shape))
        t = sample["tokens"]
        assert t.flags.writeable
        t[0] = -1  # a copy: chute's data is not affected
        i = sample["__index__"]
        return {
            "tokens": sample["tokens"],
            "label": i % 3,
            "weights": np.full((2, 2), i, dtype=np.float32),
            "caption": f"sample {i}",
            "blob": bytes([i]) * (i % 4),
            "__index__": 12345,  # ignored on the way back
        }

    loader = chute.Loader(source100, batch_size=4, transforms=[enrich])
    batch = next(iter(loader))
    assert [s[0] for s in seen] == [0, 1, 2, 3]
    assert all(d == np.int64 and s == (WINDOW,) for _, d, s in seen), "the batch's dtype, not uint32"
    assert list(batch) == ["tokens", "label", "weights", "caption", "blob"]
    assert batch["tokens"][:, 0].tolist() == [-1] * 4
    assert batch["tokens"][:, 1].tolist() == [1, 17, 33, 49]
    assert batch["label"].dtype == np.int64 and batch["label"].tolist() == [0, 1, 2, 0]
    assert batch["weights"].dtype == np.float32 and batch["weights"].shape == (4, 2, 2)
    assert batch["weights"][3].tolist() == [[3, 3], [3, 3]]
    assert batch["caption"] == ["sample 0", "sample 1", "sample 2", "sample 3"]
    assert batch["blob"] == [b"", b"\x01", b"\x02\x02", b"\x03\x03\x03"]


def test_none_means_edited_in_place_and_transforms_chain(source100):
    def halve(sample):
        sample["tokens"] = sample["tokens"] // 2

    def plus_one(sample):
        sample["tokens"] = sample["tokens"] + 1
        return sample

    batch = next(iter(chute.Loader(source100, batch_size=2, transforms=[halve, plus_one])))
    np.testing.assert_array_equal(batch["tokens"][0], np.arange(WINDOW) // 2 + 1)


def test_rng_argument_is_per_sample_and_deterministic(source100):
    def noisy(sample, rng):
        assert isinstance(rng, np.random.Generator)
        sample["noise"] = rng.random(4)
        return sample

    def draws(**kw):
        loader = chute.Loader(source100, batch_size=10, transforms=noisy, seed=1, **kw)
        return {i: n.tolist() for b in loader for i, n in zip(ids(b), b["noise"])}

    a = draws(num_workers=0)
    assert draws(num_workers=3) == a
    assert draws(num_workers=2, shuffle=True) == a, "depends on the sample, not its position"
    assert len({tuple(v) for v in a.values()}) == 100, "each sample its own stream"

    other_seed = chute.Loader(source100, batch_size=10, transforms=noisy, seed=2)
    assert next(iter(other_seed))["noise"].tolist() != [a[i] for i in range(10)]

    loader = chute.Loader(source100, batch_size=10, transforms=noisy, seed=1)
    epoch_ids(loader)
    e1 = next(iter(loader))["noise"].tolist()
    assert e1 != [a[i] for i in range(10)], "a new draw each epoch"


def test_which_callables_get_an_rng(source100):
    got = {}

    def one(sample):
        got["one"] = True

    def two(sample, rng):
        got["two"] = type(rng).__name__

    def named(sample, rng=None):
        got["named"] = type(rng).__name__

    def optional(sample, scale=2):
        got["optional"] = scale

    class Callable:
        def __call__(self, sample, rng):
            got["object"] = type(rng).__name__

    next(iter(chute.Loader(source100, transforms=[one, two, named, optional, Callable()])))
    assert got == {
        "one": True,
        "two": "Generator",
        "named": "Generator",
        "optional": 2,
        "object": "Generator",
    }


class Boom(Exception):
    pass


@pytest.mark.parametrize("workers", [0, 2])
def test_an_exception_comes_back_as_itself(source100, workers):
    raised = []

    def explode(sample):
        if sample["__index__"] == 13:
            e = Boom("thirteen")
            raised.append(e)
            raise e
        return sample

    loader = chute.Loader(source100, batch_size=5, transforms=[explode], num_workers=workers)
    it = iter(loader)
    for _ in range(2):
        next(it)
    with pytest.raises(Boom) as info:
        next(it)
    assert info.value is raised[0]
    if sys.version_info >= (3, 11):  # exception notes (PEP 678)
        assert any("sample 13" in n and "train.bin" in n for n in info.value.__notes__)
    frames, tb = [], info.value.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert "explode" in frames, "the traceback reaches into the transform"
    assert ids(next(it)) == [15, 16, 17, 18, 19], "the next batch follows"


def test_bad_return_values_are_type_errors(source100):
    with pytest.raises(TypeError, match="returned list"):
        next(iter(chute.Loader(source100, transforms=lambda s: [1, 2])))
    with pytest.raises(TypeError, match="cannot batch"):
        next(iter(chute.Loader(source100, transforms=lambda s: {"x": object()})))
    with pytest.raises(TypeError, match="keys must be str"):
        next(iter(chute.Loader(source100, transforms=lambda s: {1: s["tokens"]})))
    with pytest.raises(TypeError, match="callables"):
        chute.Loader(source100, transforms=[42])


def test_differing_shapes_come_as_a_list_or_padded_and_ranks_that_disagree_fail(source100):
    def ragged(sample):
        sample["x"] = np.full(sample["__index__"] + 1, sample["__index__"], dtype=np.int32)
        return sample

    batch = next(iter(chute.Loader(source100, batch_size=4, transforms=ragged)))
    assert [x.tolist() for x in batch["x"]] == [[i] * (i + 1) for i in range(4)]
    loader = chute.Loader(source100, batch_size=4, transforms=ragged, pad=True)
    assert loader.pad is True
    batch = next(iter(loader))
    assert batch["x"].shape == (4, 4) and batch["x_mask"].sum(axis=1).tolist() == [1, 2, 3, 4]
    assert batch["x"][3].tolist() == [3, 3, 3, 3] and batch["x"][0].tolist() == [0, 0, 0, 0]

    def ranks(sample):
        sample["x"] = np.zeros((1,) * (sample["__index__"] + 1))
        return sample

    with pytest.raises(chute.ChuteError, match="collate"):
        next(iter(chute.Loader(source100, batch_size=4, transforms=ranks)))


def test_keyboard_interrupt_in_a_transform_is_not_skipped(source100):
    def interrupt(sample):
        if sample["__index__"] == 3:
            raise KeyboardInterrupt
        return sample

    loader = chute.Loader(source100, batch_size=5, transforms=interrupt, on_error="skip")
    it = iter(loader)
    with pytest.raises(KeyboardInterrupt):
        next(it)
    assert ids(next(it)) == [5, 6, 7, 8, 9], "raised once; the loader goes on"


def test_big_endian_and_scalar_values(source100):
    def f(sample):
        return {
            "be": np.arange(3, dtype=">i4"),
            "scalar": 2.5,
            "flag": True,
            "strided": np.arange(10)[::2],
        }

    b = next(iter(chute.Loader(source100, batch_size=2, transforms=f)))
    assert b["be"].dtype == np.int32 and b["be"][1].tolist() == [0, 1, 2]
    assert b["scalar"].dtype == np.float64 and b["scalar"].shape == (2,)
    assert b["flag"].dtype == np.bool_ and b["flag"].tolist() == [True, True]
    assert b["strided"][0].tolist() == [0, 2, 4, 6, 8]
