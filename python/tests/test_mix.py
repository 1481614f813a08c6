"""chute.mix: exact proportions per batch across a schedule change, component epochs,
resume from every batch in a new process, ranks, foreign states, nesting and errors."""

import json

import numpy as np
import pytest

import chute
from conftest import WINDOW, run_python, write_tokens


@pytest.fixture
def three(tmp_path):
    """Three token files whose tokens say which file and sample they are (file k's tokens
    start at k * 10**6)."""
    sizes = {"web": 50, "code": 30, "math": 12}
    paths = {}
    for k, (name, n) in enumerate(sizes.items()):
        paths[name] = write_tokens(tmp_path / f"{name}.bin", n, first=k * 10**6)
    return paths


def open_three(paths, **kw):
    srcs = {n: chute.tokens(p, seq_len=WINDOW - 1, dtype="uint32") for n, p in paths.items()}
    kw.setdefault("weights", {0: {"web": 0.5, "code": 0.3, "math": 0.2},
                              128: {"web": 0.2, "code": 0.2, "math": 0.6}})
    kw.setdefault("samples_per_epoch", 256)
    return chute.mix(srcs, source_column="source", **kw)


def origin(batch):
    """(component, sample id in it) of each row."""
    first = np.asarray(batch["tokens"])[:, 0]
    return [(int(t // 10**6), int(t % 10**6) // WINDOW) for t in first]


def test_every_batch_holds_each_share_across_a_schedule_change(three):
    loader = chute.Loader(open_three(three), batch_size=16, num_workers=2)
    position = 0
    for batch in loader:
        src = np.asarray(batch["source"])
        assert [c for c, _ in origin(batch)] == src.tolist()
        w = [0.5, 0.3, 0.2] if position < 128 else [0.2, 0.2, 0.6]
        for c in range(3):
            n = int((src == c).sum())
            assert np.floor(16 * w[c]) <= n <= np.ceil(16 * w[c]), (position, c, n)
        position += 16
    assert position == 256
    served = loader.stats()["source"]["components"]
    assert sum(v["samples"] for v in served.values()) == 256
    assert served["math"]["tokens"] == served["math"]["samples"] * WINDOW
    # Over every run of batches from a segment's start, every share is within one sample.
    stream = [c for b in chute.Loader(open_three(three), batch_size=16) for c, _ in origin(b)]
    for lo, hi, w in [(0, 128, [0.5, 0.3, 0.2]), (128, 256, [0.2, 0.2, 0.6])]:
        for end in range(lo + 16, hi + 1, 16):
            for c in range(3):
                n = stream[lo:end].count(c)
                assert abs(n - w[c] * (end - lo)) < 1, (lo, end, c, n)


def test_an_exhausted_component_starts_its_next_epoch_reshuffled(three):
    rows = [o for b in chute.Loader(open_three(three), batch_size=16) for o in origin(b)]
    math = [i for c, i in rows if c == 2]
    epochs = [math[i:i + 12] for i in range(0, len(math) - 11, 12)]
    assert len(epochs) >= 3
    for e in epochs:
        assert sorted(e) == list(range(12)), "each of its epochs holds every sample once"
    assert epochs[0] != epochs[1], "and is reshuffled"


def test_state_dict_resumes_exactly_in_a_new_process_from_every_batch(three):
    full = [origin(b) for b in chute.Loader(open_three(three), batch_size=16, seed=4)]
    states = []
    loader = chute.Loader(open_three(three), batch_size=16, seed=4)
    for _ in loader:
        states.append(json.dumps(loader.state_dict()))
    code = """
        import json, sys, numpy as np, chute
        paths, states = json.loads(sys.argv[1]), json.loads(sys.argv[2])
        srcs = {n: chute.tokens(p, seq_len=%d, dtype="uint32") for n, p in paths.items()}
        out = []
        for s in states:
            mix = chute.mix(srcs, weights={0: {"web": 0.5, "code": 0.3, "math": 0.2},
                                           128: {"web": 0.2, "code": 0.2, "math": 0.6}},
                            samples_per_epoch=256, source_column="source")
            l = chute.Loader(mix, batch_size=16, seed=4)
            l.load_state_dict(json.loads(s))
            b = next(iter(l), None)
            out.append(None if b is None else np.asarray(b["tokens"])[:, 0].tolist())
        print(json.dumps(out))
    """ % (WINDOW - 1)
    proc = run_python(code, json.dumps(three), json.dumps(states[:-1]))
    nexts = json.loads(proc.stdout)
    for i, firsts in enumerate(nexts):
        got = [(int(t // 10**6), int(t % 10**6) // WINDOW) for t in firsts]
        assert got == full[i + 1], f"resume after batch {i}"


def test_ranks_are_disjoint_runs_of_the_single_rank_stream(three):
    single = [origin(b) for b in chute.Loader(open_three(three), batch_size=8)]
    for rank in range(4):
        mine = [origin(b) for b in chute.Loader(open_three(three), batch_size=8, rank=rank,
                                                 world_size=4)]
        assert len(mine) == 8
        assert mine == single[rank::4]


def test_a_state_from_another_mixture_is_refused_naming_what_differs(three):
    loader = chute.Loader(open_three(three), batch_size=16)
    next(iter(loader))
    state = loader.state_dict()
    other = chute.Loader(open_three(three, weights={"web": 1, "code": 1, "math": 1}),
                         batch_size=16)
    with pytest.raises(chute.StateError, match="weights differs"):
        other.load_state_dict(state)


def test_nested_mixtures_policies_and_errors(three, tmp_path):
    srcs = {n: chute.tokens(p, seq_len=WINDOW - 1, dtype="uint32") for n, p in three.items()}
    inner = chute.mix({"code": srcs["code"], "math": srcs["math"]})
    outer = chute.mix({"web": srcs["web"], "rest": inner}, weights=[3, 1])
    info = outer.mixture
    assert info["policy"] == "stop_on_all" and info["components"] == [["web", 50], ["rest", 59]]  # code (30) finishes after 59
    assert len(outer) == info["samples_per_epoch"]
    comps = {c for b in chute.Loader(outer, batch_size=10) for c, _ in origin(b)}
    assert comps == {0, 1, 2}
    first = chute.mix({"web": srcs["web"], "math": srcs["math"]}, policy="stop_on_first")
    assert len(first) == 24  # math (12) runs out after 24 positions at half the draws
    # DataLoader's shuffle=True habit agrees with a mixture that shuffles its components:
    # the same batches (and states) as the loader's shuffle off.
    on = [origin(b) for b in chute.Loader(outer, batch_size=10, shuffle=True)]
    assert on == [origin(b) for b in chute.Loader(outer, batch_size=10)]
    with pytest.raises(chute.ConfigError, match="orders its own samples.*chute.mix"):
        chute.Loader(outer, shuffle="block:2")
    ordered = chute.mix({"web": srcs["web"], "math": srcs["math"]}, shuffle={"web": True,
                                                                              "math": False})
    with pytest.raises(chute.ConfigError, match='keeps component "math" in order'):
        chute.Loader(ordered, shuffle=True)
    with pytest.raises(chute.ConfigError, match="no weight for 'math'"):
        chute.mix(srcs, weights={"web": 1, "code": 1})
    with pytest.raises(chute.ConfigError, match="cycle needs samples_per_epoch"):
        chute.mix(srcs, policy="cycle")
    words = tmp_path / "w.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"label": np.arange(8)}), words)
    bad = chute.mix({"web": srcs["web"], "labels": chute.parquet(str(words))})
    with pytest.raises(chute.ChuteError, match="same fields"):
        list(chute.Loader(bad, batch_size=4))


def test_map_style_datasets_and_per_component_transforms_mix():
    class Squares:
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return {"x": np.int64(i * i)}

    def plus(sample):
        sample["x"] = sample["x"] + 1000
        return sample

    m = chute.mix({"a": Squares(), "b": Squares()}, transforms={"b": plus}, shuffle=False,
                  source_column="src")
    xs = [(int(s), int(x)) for b in chute.Loader(m, batch_size=4)
          for s, x in zip(b["src"], b["x"])]
    assert sorted(x for s, x in xs if s == 0) == [i * i for i in range(10)]
    assert sorted(x for s, x in xs if s == 1) == [i * i + 1000 for i in range(10)]
    r = chute.mix({"a": Squares(), "b": Squares()}, mode="random", samples_per_epoch=40, seed=1)
    got = [int(x) for b in chute.Loader(r, batch_size=8) for x in b["x"]]
    again = [int(x) for b in chute.Loader(r, batch_size=8, num_workers=3) for x in b["x"]]
    assert got == again and len(got) == 40
