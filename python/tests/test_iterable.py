"""Iterable datasets (``__iter__`` only) under chute.Loader: stream order or a seeded shuffle
buffer, round-robin ranks, resume through the dataset's own state or by counting."""

import json
import textwrap
import time

import numpy as np
import pytest

import chute
from conftest import run_python


class Stream:
    """An iterable of dict samples, optionally with a length."""

    def __init__(self, n=23, sized=False):
        self.n, self.sized, self.iters = n, sized, 0

    def __iter__(self):
        self.iters += 1
        for i in range(self.n):
            yield {"x": np.full(2, i, dtype=np.float32), "label": i, "name": f"s{i}"}

    def __len__(self):
        if not self.sized:
            raise TypeError("no length")
        return self.n


def labels(loader):
    return [int(v) for b in loader for v in b["label"]]


def test_stream_order_and_default_collate_structure():
    batches = list(chute.Loader(Stream(), batch_size=5))
    assert [len(b["label"]) for b in batches] == [5, 5, 5, 5, 3]
    first = batches[0]
    assert first["x"].shape == (5, 2) and first["x"].dtype == np.float32
    assert first["label"].dtype == np.int64 and first["name"] == [f"s{i}" for i in range(5)]
    assert labels(chute.Loader(Stream(), batch_size=5)) == list(range(23))
    assert [len(b["label"]) for b in chute.Loader(Stream(), batch_size=5, drop_last=True)] == [5] * 4
    with pytest.raises(TypeError, match="without __len__"):
        len(chute.Loader(Stream(), batch_size=5))
    assert len(chute.Loader(Stream(sized=True), batch_size=5)) == 5


def test_a_seeded_shuffle_buffer():
    a = labels(chute.Loader(Stream(100), batch_size=8, shuffle="buffer:16", seed=3))
    assert sorted(a) == list(range(100)) and a != list(range(100))
    assert a == labels(chute.Loader(Stream(100), batch_size=8, shuffle="buffer:16", seed=3))
    assert a != labels(chute.Loader(Stream(100), batch_size=8, shuffle="buffer:16", seed=4))
    loader = chute.Loader(Stream(100), batch_size=8, shuffle=True, seed=3)
    e0, e1 = labels(loader), labels(loader)  # each `for` is the next epoch
    assert sorted(e0) == sorted(e1) == list(range(100)) and e0 != e1
    with pytest.raises(chute.ConfigError, match="buffer"):
        chute.Loader(Stream(), shuffle="global")


def test_ranks_split_the_stream_round_robin():
    parts = [labels(chute.Loader(Stream(23), batch_size=3, rank=r, world_size=3)) for r in range(3)]
    assert parts[1] == list(range(1, 23, 3))
    assert sorted(sum(parts, [])) == list(range(23))
    # With __len__, every rank takes len // world_size samples: equal batch counts.
    sized = [list(chute.Loader(Stream(23, sized=True), batch_size=3, rank=r, world_size=3))
             for r in range(3)]
    assert len({len(p) for p in sized}) == 1
    assert sum(len(b["label"]) for p in sized for b in p) == 21


@pytest.mark.parametrize("shuffle", [False, "buffer:7"])
def test_state_dict_resumes_by_counting(shuffle):
    args = dict(batch_size=4, shuffle=shuffle, seed=9)
    whole = labels(chute.Loader(Stream(30), **args))
    loader = chute.Loader(Stream(30), **args)
    it = iter(loader)
    seen = [int(v) for _ in range(3) for v in next(it)["label"]]
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = chute.Loader(Stream(30), **args)
    resumed.load_state_dict(state)
    assert seen + labels(resumed) == whole
    with pytest.raises(chute.StateError, match="seed"):
        chute.Loader(Stream(30), batch_size=4, shuffle=shuffle, seed=1).load_state_dict(state)


class Resumable:
    """A stream that keeps its own position (torchdata's Stateful protocol)."""

    def __init__(self, n=40):
        self.n, self.pos, self.pulled = n, 0, 0

    def __iter__(self):
        while self.pos < self.n:
            i = self.pos
            self.pos += 1
            self.pulled += 1
            yield i

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, state):
        self.pos = state["pos"]


def test_a_stateful_dataset_resumes_through_its_own_state_without_replay():
    loader = chute.Loader(Resumable(), batch_size=5, rank=1, world_size=2, prefetch_factor=1)
    it = iter(loader)
    seen = [int(v) for _ in range(2) for v in next(it)]
    assert seen == list(range(1, 20, 2))
    state = loader.state_dict()
    assert state["dataset"] == {"pos": 20}
    ds = Resumable()
    resumed = chute.Loader(ds, batch_size=5, rank=1, world_size=2)
    resumed.load_state_dict(state)
    rest = [int(v) for b in resumed for v in b]
    assert rest == list(range(21, 40, 2))
    assert ds.pulled == 20  # from position 20 on: nothing replayed


def test_errors_timeouts_and_collate_fn():
    class Broken:
        def __iter__(self):
            yield 1
            raise KeyError("stream broke")

    with pytest.raises(KeyError, match="stream broke"):
        list(chute.Loader(Broken(), batch_size=4))

    class Slow:
        def __iter__(self):
            time.sleep(2)
            yield 1

    with pytest.raises(TimeoutError, match="timeout=0.2"):
        next(iter(chute.Loader(Slow(), batch_size=1, timeout=0.2)))
    got = list(chute.Loader(Stream(10), batch_size=4, collate_fn=lambda s: [d["name"] for d in s]))
    assert got == [["s0", "s1", "s2", "s3"], ["s4", "s5", "s6", "s7"], ["s8", "s9"]]
    with pytest.raises(chute.ConfigError, match="transforms"):
        chute.Loader(Stream(), transforms=[lambda s: s])


def test_torch_iterable_dataset_matches_dataloader():
    torch = pytest.importorskip("torch", reason="torch not installed: the PyPI wheel pulls ~3 GB of CUDA libraries; see README")

    class Numbers(torch.utils.data.IterableDataset):
        def __iter__(self):
            for i in range(17):
                yield {"t": torch.full((3,), float(i)), "i": i}

    ours = list(chute.Loader(Numbers(), batch_size=4))
    theirs = list(torch.utils.data.DataLoader(Numbers(), batch_size=4))
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert isinstance(a["t"], torch.Tensor) and torch.equal(a["t"], b["t"])
        assert torch.equal(torch.as_tensor(a["i"]), b["i"])


def test_resume_in_a_new_process(tmp_path):
    script = textwrap.dedent(
        """
        import json, sys
        import numpy as np
        import chute

        class Stream:
            def __iter__(self):
                for i in range(50):
                    yield {"v": i}

        loader = chute.Loader(Stream(), batch_size=6, shuffle="buffer:10", seed=2)
        if sys.argv[1] == "first":
            it = iter(loader)
            seen = [int(v) for _ in range(4) for v in next(it)["v"]]
            print(json.dumps({"state": loader.state_dict(), "seen": seen}))
        else:
            loader.load_state_dict(sys.argv[2])
            print(json.dumps([int(v) for b in loader for v in b["v"]]))
        """
    )
    run = lambda *a: run_python(script, *a).stdout
    first = json.loads(run("first"))
    rest = json.loads(run("rest", json.dumps(first["state"])))
    assert sorted(first["seen"] + rest) == list(range(50))
    assert len(first["seen"]) == 24
