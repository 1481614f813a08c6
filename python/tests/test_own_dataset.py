"""Your own map-style dataset on chute's threads: default_collate's structures, the engine's
guarantees (order for any number of workers, ranks, resume, skip, errors), DataLoader's
arguments. The comparisons with torch's own DataLoader and default_collate run where torch is
installed (CI: CHUTE_TEST_TORCH=1)."""

import collections
import os
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest

import chute
from conftest import run_python

Point = collections.namedtuple("Point", "x y")


class Zoo:
    """Every structure and leaf default_collate batches."""

    def __len__(self):
        return 37

    def __getitem__(self, i):
        return {
            "image": np.full((2, 3), i, dtype=np.uint8),
            "label": i,
            "weight": i / 4,
            "flag": i % 2 == 0,
            "name": f"item-{i}",
            "raw": bytes([i, i + 1]),
            "nothing": None,
            "pair": (np.float32(i), [i, -i]),
            "point": Point(np.arange(3, dtype=np.int16) + i, float(i)),
            "nested": {"a": {"b": np.int64(i * 10)}},
        }


def ids(loader, key="label"):
    return [int(v) for b in loader for v in b[key]]


def test_a_zoo_of_structures_collates_like_default_collate_shapes():
    (first, *_) = list(chute.Loader(Zoo(), batch_size=8))
    assert first["image"].shape == (8, 2, 3) and first["image"].dtype == np.uint8
    assert first["label"].dtype == np.int64 and list(first["label"]) == list(range(8))
    assert first["weight"].dtype == np.float64 and first["weight"][2] == 0.5
    assert first["flag"].dtype == np.bool_ and list(first["flag"][:2]) == [True, False]
    assert first["name"][:2] == ["item-0", "item-1"]
    assert first["raw"][1] == b"\x01\x02"
    assert first["nothing"] == [None] * 8
    pair = first["pair"]
    assert isinstance(pair, list) and pair[0].dtype == np.float32
    assert [list(v) for v in pair[1]] == [list(range(8)), [-i for i in range(8)]]
    assert isinstance(first["point"], Point) and first["point"].x.shape == (8, 3)
    assert list(first["nested"]["a"]["b"]) == [i * 10 for i in range(8)]


def test_order_is_the_same_for_any_number_of_workers_and_ranks_partition():
    want = ids(chute.Loader(Zoo(), batch_size=5, shuffle=True, seed=7, num_workers=0))
    assert sorted(want) == list(range(37))
    for workers in (1, 3):
        assert ids(chute.Loader(Zoo(), batch_size=5, shuffle=True, seed=7, num_workers=workers)) == want
    parts = [ids(chute.Loader(Zoo(), batch_size=4, shuffle=True, seed=7, rank=r, world_size=3,
                              drop_last=True)) for r in range(3)]
    assert len({len(p) for p in parts}) == 1
    flat = [i for p in parts for i in p]
    assert len(flat) == len(set(flat))


def test_state_dict_resumes_exactly_in_a_new_process(tmp_path):
    loader = chute.Loader(Zoo(), batch_size=4, shuffle=True, seed=2, num_workers=2)
    full = ids(loader)
    loader = chute.Loader(Zoo(), batch_size=4, shuffle=True, seed=2, num_workers=2)
    it = iter(loader)
    head = [int(v) for _ in range(3) for v in next(it)["label"]]
    state = loader.state_dict()
    script = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import chute
        from test_own_dataset import Zoo
        loader = chute.Loader(Zoo(), batch_size=4, shuffle=True, seed=2, num_workers=3)
        loader.load_state_dict(json.loads(sys.argv[1]))
        print(json.dumps([int(v) for b in loader for v in b["label"]]))
    """)
    import json

    out = run_python(script, json.dumps(state)).stdout
    assert head + json.loads(out) == full


class Flaky:
    def __len__(self):
        return 20

    def __getitem__(self, i):
        if i == 13:
            raise ValueError(f"item {i} is broken")
        return np.array([i])


def test_an_exception_is_raised_as_itself_naming_the_index_and_skip_replaces_it():
    with pytest.raises(ValueError, match="item 13 is broken") as e:
        list(chute.Loader(Flaky(), batch_size=5))
    assert any("sample 13" in n for n in getattr(e.value, "__notes__", [])), e.value
    loader = chute.Loader(Flaky(), batch_size=5, on_error="skip")
    got = [int(v) for b in loader for v in b.ravel()]
    assert len(got) == 20 and 13 not in got
    assert loader.stats()["skipped"] == 1


class Shapeshifter:
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return {"a": np.zeros(2), "b": 1} if i != 4 else {"a": np.zeros(2)}


def test_a_structure_default_collate_refuses_names_the_index_and_the_path():
    with pytest.raises(TypeError, match=r"has no key \"b\"") as e:
        list(chute.Loader(Shapeshifter(), batch_size=6))
    assert any("sample 4" in n for n in getattr(e.value, "__notes__", [])), e.value

    class Objects:
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return {"a": {"b": object()}}

    with pytest.raises(TypeError, match="a/b holds a object"):
        list(chute.Loader(Objects(), batch_size=2))


def test_dataloader_arguments():
    class Slow:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            time.sleep(1.0)
            return i

    with pytest.raises(TimeoutError, match="timeout=0.2"):
        next(iter(chute.Loader(Slow(), batch_size=4, num_workers=1, timeout=0.2)))

    seen = []
    loader = chute.Loader(list(range(30)), batch_size=3, num_workers=3, worker_init_fn=seen.append)
    assert sorted(int(v) for b in loader for v in b) == list(range(30))
    assert 1 <= len(seen) <= 3 and set(seen) <= {0, 1, 2}

    class Generator:
        def initial_seed(self):
            return 5

    by_generator = ids(chute.Loader(Zoo(), batch_size=4, shuffle=True, generator=Generator()))
    assert by_generator == ids(chute.Loader(Zoo(), batch_size=4, shuffle=True, seed=5))
    chute.Loader(Zoo(), persistent_workers=True, in_order=True)
    for kwargs, what in [(dict(sampler=[0, 1]), "shuffle="), (dict(batch_sampler=[[0]]), "shuffle="),
                         (dict(multiprocessing_context="spawn"), "threads"),
                         (dict(collate_fn=len, transforms=[lambda s: s]), "transforms"),
                         (dict(collate_fn=len, on_error="skip"), "on_error"),
                         (dict(collate_fn=3), "not callable")]:
        with pytest.raises(chute.ConfigError, match=what):
            chute.Loader(Zoo(), **kwargs)
    with pytest.raises(chute.ConfigError, match="worker_init_fn"):
        chute.Loader(_tokens_source(), worker_init_fn=print)

    class Stream:
        def __iter__(self):
            yield 1

    assert [list(b) for b in chute.Loader(Stream(), batch_size=2)] == [[1]]  # test_iterable.py


class Objects:
    """Samples default_collate refuses (an arbitrary object): only a collate_fn takes them."""

    def __len__(self):
        return 20

    def __getitem__(self, i):
        if i == 13 and getattr(self, "fail", False):
            raise KeyError(f"no item {i}")
        return {"label": i, "obj": object()}


def test_collate_fn_runs_per_batch_on_the_worker_threads(tmp_path):
    threads = set()

    def collate(samples):
        threads.add(threading.get_ident())
        return {"n": len(samples), "labels": [s["label"] for s in samples], "objs": samples}

    args = dict(batch_size=6, shuffle=True, seed=4, collate_fn=collate)
    batches = list(chute.Loader(Objects(), num_workers=2, **args))
    assert [b["n"] for b in batches] == [6, 6, 6, 2]
    assert all(isinstance(s["obj"], object) for b in batches for s in b["objs"])
    assert threading.get_ident() not in threads  # collated on worker threads
    order = [i for b in batches for i in b["labels"]]
    assert sorted(order) == list(range(20))
    # The order is chute's, whatever the number of workers, as without a collate_fn.
    assert order == [i for b in chute.Loader(Objects(), **args) for i in b["labels"]]
    # Resume mid-epoch: the rest of the epoch, exactly.
    loader = chute.Loader(Objects(), num_workers=2, **args)
    it = iter(loader)
    first = next(it)["labels"]
    state = loader.state_dict()
    resumed = chute.Loader(Objects(), num_workers=2, **args)
    resumed.load_state_dict(state)
    assert first + [i for b in resumed for i in b["labels"]] == order
    # Ranks partition.
    parts = [[i for b in chute.Loader(Objects(), rank=r, world_size=2, **args) for i in b["labels"]]
             for r in range(2)]
    assert sorted(parts[0] + parts[1]) == list(range(20))
    # Exceptions, in __getitem__ or in collate_fn, are raised as themselves.
    bad = Objects()
    bad.fail = True
    with pytest.raises(KeyError, match="no item 13"):
        list(chute.Loader(bad, batch_size=4, collate_fn=collate, num_workers=2))

    def broken(samples):
        raise ValueError("collate failed")

    with pytest.raises(ValueError, match="collate failed"):
        next(iter(chute.Loader(Objects(), batch_size=4, collate_fn=broken, num_workers=1)))
    with pytest.raises(chute.ConfigError, match="natively"):
        chute.Loader(_tokens_source(), collate_fn=collate)


def test_collate_fn_matches_dataloader_with_it():
    torch = pytest.importorskip("torch", reason="torch not installed: the PyPI wheel pulls ~3 GB of CUDA libraries; see README")

    def pad_collate(samples):
        # Variable-length sequences padded per batch, the classic custom collate_fn.
        seqs = [torch.arange(s) for s in samples]
        return torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True), torch.tensor(samples)

    data = [i % 7 + 1 for i in range(50)]
    ours = list(chute.Loader(data, batch_size=8, shuffle=True, num_workers=2, collate_fn=pad_collate))
    theirs = list(torch.utils.data.DataLoader(data, batch_size=8, shuffle=True, num_workers=2,
                                              collate_fn=pad_collate))
    assert [len(b[1]) for b in ours] == [len(b[1]) for b in theirs]
    key = lambda batch: sorted((int(n), p[: int(n)].tolist()) for p, n in zip(*batch))
    assert sorted(x for b in ours for x in key(b)) == sorted(x for b in theirs for x in key(b))
    for padded, lengths in ours:
        assert padded.shape == (len(lengths), int(lengths.max()))


def _tokens_source():
    import tempfile

    d = tempfile.mkdtemp()
    path = os.path.join(d, "t.bin")
    np.arange(100, dtype=np.uint16).tofile(path)
    return chute.tokens(path, seq_len=9)


def test_native_ops_decode_what_the_dataset_returns():
    pil = pytest.importorskip("PIL.Image", reason="pillow not installed (scripts/test.sh installs it)")
    import io

    class Jpegs:
        def __len__(self):
            return 6

        def __getitem__(self, i):
            buf = io.BytesIO()
            pil.fromarray(np.full((40, 50, 3), i * 20, dtype=np.uint8)).save(buf, format="JPEG")
            return {"jpg": buf.getvalue(), "cls": i}

    loader = chute.Loader(Jpegs(), batch_size=3, transforms={"jpg": [
        {"op": "decode"}, {"op": "center_crop", "size": 32}]})
    (a, b) = list(loader)
    assert a["jpg"].shape == (3, 32, 32, 3) and list(b["cls"]) == [3, 4, 5]
    assert abs(int(a["jpg"][1].mean()) - 20) <= 2

    class Arrays(Jpegs):
        """A file's bytes held as numpy.frombuffer's uint8 array: encoded bytes too."""

        def __getitem__(self, i):
            s = super().__getitem__(i)
            return {"jpg": np.frombuffer(s["jpg"], np.uint8), "cls": s["cls"]}

    for ops in ([{"op": "decode"}, {"op": "center_crop", "size": 32}],
                [{"op": "decode"}, {"op": "random_resized_crop", "size": 16},
                 {"op": "horizontal_flip"}]):
        arrays = list(chute.Loader(Arrays(), batch_size=3, seed=1, transforms={"jpg": ops}))
        same = list(chute.Loader(Jpegs(), batch_size=3, seed=1, transforms={"jpg": ops}))
        for x, y in zip(arrays, same):
            np.testing.assert_array_equal(x["jpg"], y["jpg"])
    # A field renamed by its ops ({"as": ...}) arrives under its new name, in place of the old.
    (a, _) = list(chute.Loader(Jpegs(), batch_size=3, transforms={"jpg": {
        "as": "image", "ops": [{"op": "decode"}, {"op": "center_crop", "size": 32}]}}))
    assert sorted(a) == ["cls", "image"] and a["image"].shape == (3, 32, 32, 3)
    # An array that is not a file's bytes is refused saying what decode takes.
    class Floats(Jpegs):
        def __getitem__(self, i):
            return {"jpg": np.zeros((4, 4), np.float32), "cls": i}

    with pytest.raises(chute.CorruptDataError, match="takes encoded bytes.*float32") as e:
        list(chute.Loader(Floats(), batch_size=3, transforms={"jpg": [{"op": "decode"}]}))
    assert "a bug" not in str(e.value)


# The seed document's class, unchanged but for _load_index, under its own DataLoader arguments.
SEED = '''
import torch
from torch.utils.data import Dataset

class EfficientDataset(Dataset):
    def __init__(self, data_path): self.data = self._load_index(data_path)
    def __len__(self): return len(self.data)
    def __getitem__(self, idx):
        sample = self.data[idx]
        processed_sample = self.transform(sample)
        return torch.tensor(processed_sample)
    def transform(self, x): return x / 255.0
    def _load_index(self, data_path):
        import numpy as np
        return np.load(data_path)
'''


def test_the_seed_dataset_delivers_what_dataloader_delivers(tmp_path):
    torch = pytest.importorskip("torch", reason="torch not installed: the PyPI wheel pulls ~3 GB of CUDA libraries; see README")
    path = tmp_path / "data.npy"
    np.save(path, np.random.default_rng(0).integers(0, 256, (300, 4, 4), dtype=np.uint8))
    scope: dict = {}
    exec(SEED, scope)
    ds = scope["EfficientDataset"](str(path))
    args = dict(batch_size=64, shuffle=True, num_workers=8, pin_memory=True, prefetch_factor=2)
    theirs = [b for b in torch.utils.data.DataLoader(ds, **args)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pin_memory without CUDA
        ours = [b for b in chute.Loader(ds, **args)]
    assert all(isinstance(b, torch.Tensor) for b in ours)
    assert [tuple(b.shape) for b in ours] == [tuple(b.shape) for b in theirs]
    key = lambda t: t.flatten().tolist()
    assert sorted(map(key, torch.cat(ours))) == sorted(map(key, torch.cat(theirs)))
    assert torch.cat(ours).dtype == torch.cat(theirs).dtype


def test_the_zoo_equals_default_collate():
    torch = pytest.importorskip("torch", reason="torch not installed: the PyPI wheel pulls ~3 GB of CUDA libraries; see README")
    from torch.utils.data import default_collate

    zoo = Zoo()
    ours = next(iter(chute.Loader(zoo, batch_size=6, output="torch")))

    def same(a, b, path="batch"):
        if isinstance(b, torch.Tensor):
            assert isinstance(a, torch.Tensor), path
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), path
        elif isinstance(b, dict):
            assert isinstance(a, dict) and list(a) == list(b), path
            for k in b:
                same(a[k], b[k], f"{path}[{k!r}]")
        elif isinstance(b, tuple) and hasattr(b, "_fields"):
            assert type(a) is type(b), path
            for i, (x, y) in enumerate(zip(a, b)):
                same(x, y, f"{path}.{b._fields[i]}")
        elif isinstance(b, list) and b and isinstance(b[0], (torch.Tensor, list, tuple, dict)):
            assert isinstance(a, list) and len(a) == len(b), path
            for i, (x, y) in enumerate(zip(a, b)):
                same(x, y, f"{path}[{i}]")
        else:
            assert a == b, path

    # default_collate has no rule for None; chute gives a list of None.
    nothing = ours.pop("nothing")
    assert nothing == [None] * 6
    with pytest.raises(TypeError):
        default_collate([None, None])
    theirs = default_collate([{k: v for k, v in zoo[i].items() if k != "nothing"} for i in range(6)])
    same(ours, theirs)


def test_a_dataset_may_reuse_its_output_buffer():
    class Reuse:
        def __init__(self):
            self.buf = np.zeros(4, dtype=np.int32)

        def __len__(self):
            return 64

        def __getitem__(self, i):
            self.buf[:] = i  # the same array every time, as some fast datasets do
            return self.buf

    rows = [r for b in chute.Loader(Reuse(), batch_size=8, num_workers=2) for r in b]
    assert [int(r[0]) for r in rows] == list(range(64))
    assert all((r == r[0]).all() for r in rows)


def test_a_failing_worker_init_fn_fails_the_loader_even_with_skip():
    def boom(worker_id):
        raise RuntimeError(f"no GPU for worker {worker_id}")

    with pytest.raises(RuntimeError, match="no GPU for worker"):
        list(chute.Loader(Zoo(), batch_size=4, num_workers=2, on_error="skip", worker_init_fn=boom))


def test_bfloat16_tensors_collate_as_default_collate_does():
    torch = pytest.importorskip("torch", reason="torch not installed: the PyPI wheel pulls ~3 GB of CUDA libraries; see README")

    class Half:
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return {"h": torch.arange(4, dtype=torch.bfloat16) * (i + 0.5), "i": i}

    ours = list(chute.Loader(Half(), batch_size=4))
    theirs = list(torch.utils.data.DataLoader(Half(), batch_size=4))
    for a, b in zip(ours, theirs):
        assert a["h"].dtype == torch.bfloat16 and torch.equal(a["h"], b["h"])
