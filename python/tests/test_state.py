"""state_dict / load_state_dict: resume before every batch, across epochs, in a new process."""

import json

import pytest

import chute
from conftest import SEQ, ids, run_python, write_tokens

EPOCHS = 2


def stream(loader, epochs=EPOCHS):
    """Every batch's ids until the loader reaches epoch `epochs`, from wherever it stands."""
    out = []
    while loader.epoch < epochs:
        out.extend(ids(b) for b in loader)
    return out


def make(shards, **kw):
    source = chute.tokens(shards, seq_len=SEQ, dtype="uint32")
    kw.setdefault("batch_size", 7)
    return chute.Loader(source, **kw)


@pytest.mark.parametrize(
    "kw",
    [
        dict(shuffle=True, num_workers=2),
        dict(shuffle="block:2", num_workers=0),
        dict(shuffle=False, drop_last=True, num_workers=1),
        dict(shuffle=True, rank=1, world_size=3, num_workers=2),
    ],
    ids=["global", "block", "drop_last", "rank1of3"],
)
def test_resume_before_every_batch(shards, kw):
    full = stream(make(shards, **kw))
    per_epoch = len(make(shards, **kw))
    assert len(full) == EPOCHS * per_epoch
    for k in range(len(full) + 1):
        loader = make(shards, **kw)
        it, taken = iter(loader), []
        while len(taken) < k:
            try:
                taken.append(ids(next(it)))
            except StopIteration:  # epoch boundary: the next iter() is the next epoch
                it = iter(loader)
        state = loader.state_dict()
        assert json.loads(json.dumps(state)) == state, "plain JSON types"
        resumed = make(shards, **kw)
        resumed.load_state_dict(state)
        assert taken + stream(resumed) == full, f"resumed after {k} batches"


def test_state_fields_and_epoch_boundary(shards):
    loader = make(shards, shuffle=True, seed=4)
    s = loader.state_dict()
    assert set(s) == {"version", "dataset", "seed", "epoch", "start", "taken", "delivered",
                      "drop_last", "world_size", "shuffle"}
    assert (s["epoch"], s["delivered"], s["seed"], s["shuffle"]) == (0, 0, 4, "global")
    it = iter(loader)
    for _ in range(len(loader)):
        next(it)
    s = loader.state_dict()
    assert (s["epoch"], s["delivered"]) == (1, 0), "after the last batch: the next epoch"
    resumed = make(shards, shuffle=True, seed=4)
    resumed.load_state_dict(s)
    assert resumed.epoch == 1
    resumed.set_epoch(1)  # an epoch loop's set_epoch keeps the resumed position
    fresh = make(shards, shuffle=True, seed=4)
    fresh.set_epoch(1)
    assert [ids(b) for b in resumed] == [ids(b) for b in fresh]


def test_state_as_json_text(shards):
    loader = make(shards, shuffle=True)
    it = iter(loader)
    next(it)
    text = json.dumps(loader.state_dict())
    resumed = make(shards, shuffle=True)
    resumed.load_state_dict(text)
    assert [ids(b) for b in resumed] == [ids(b) for b in it]


def test_resume_in_a_new_process(shards, tmp_path):
    loader = make(shards, shuffle=True, num_workers=2, seed=11)
    full = stream(make(shards, shuffle=True, num_workers=2, seed=11))
    it = iter(loader)
    taken = [ids(next(it)) for _ in range(5)]
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps(loader.state_dict()))
    proc = run_python(
        """
        import json, sys
        import chute
        import numpy as np
        state = json.load(open(sys.argv[1]))
        source = chute.tokens(sys.argv[2:], seq_len=15, dtype="uint32")
        loader = chute.Loader(source, batch_size=7, shuffle=True, num_workers=2, seed=11)
        loader.load_state_dict(state)
        out = []
        while loader.epoch < 2:
            out.extend((np.asarray(b["tokens"])[:, 0] // 16).tolist() for b in loader)
        print(json.dumps(out))
        """,
        str(state_file),
        *shards,
    )
    rest = json.loads(proc.stdout)
    assert taken + rest == full


def test_elastic_resume_on_another_world_size(shards):
    # Two ranks deliver 3 batches each; four ranks continue with the samples left.
    seen = set()
    state = None
    for rank in range(2):
        loader = make(shards, shuffle=True, rank=rank, world_size=2, batch_size=5)
        it = iter(loader)
        for _ in range(3):
            seen.update(ids(next(it)))
        state = loader.state_dict()
    rest = []
    for rank in range(4):
        loader = make(shards, shuffle=True, rank=rank, world_size=4, batch_size=5)
        loader.load_state_dict(state)
        rest.extend(i for b in loader for i in ids(b))
    assert seen | set(rest) == set(range(100)) and not (seen & set(rest))


def test_foreign_states_are_refused(shards, tmp_path):
    loader = make(shards, shuffle=True, seed=1)
    good = loader.state_dict()
    other = chute.Loader(chute.tokens(write_tokens(tmp_path / "o.bin", 50), SEQ, dtype="uint32"))
    with pytest.raises(chute.StateError, match="another dataset"):
        other.load_state_dict(good)
    cases = [
        ({**good, "seed": 2}, "seed"),
        ({**good, "shuffle": "none"}, "shuffle"),
        ({**good, "version": 99}, "version"),
        ({k: v for k, v in good.items() if k != "version"}, "version"),
        ({**good, "delivered": 10_000}, "delivered"),
        ({**good, "epoch": "zero"}, "not valid"),
        ("not json", "not valid"),
    ]
    for state, match in cases:
        with pytest.raises(chute.StateError, match=match):
            make(shards, shuffle=True, seed=1).load_state_dict(state)
    with pytest.raises(chute.StateError):
        make(shards, shuffle=True, seed=1).load_state_dict({"a": object()})
    assert issubclass(chute.StateError, chute.ChuteError)
