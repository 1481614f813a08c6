"""WebDataset members as the `webdataset` package decodes them by default: msgpack, `.npz`,
tenbin, pickles (only when allowed), and the `auto` op over every field (`"*"`), compared
with the package's own decoder on shards written by its own `TarWriter`."""

import io
import pickle

import numpy as np
import pytest

import chute

wds = pytest.importorskip("webdataset")
msgpack = pytest.importorskip("msgpack")


def rows(loader):
    """Every sample of every batch, a dict each."""
    out = []
    for batch in loader:
        n = len(batch["__key__"])
        out.extend({k: v[i] for k, v in batch.items()} for i in range(n))
    return out


def same(a, b):
    """Equal values, numpy arrays compared by dtype, shape and contents."""
    if isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
                and np.array_equal(a, b))
    if isinstance(b, dict):
        return isinstance(a, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in b)
    if isinstance(b, list):
        return isinstance(a, list) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, np.generic) or (isinstance(a, np.ndarray) and a.ndim == 0):
        return a.item() == b and type(a.item()) is type(b)
    return type(a) is type(b) and a == b


def write_shard(path, n=9):
    """A shard in the package's conventions: each extension encoded by its TarWriter."""
    with wds.TarWriter(str(path)) as w:
        for i in range(n):
            w.write({
                "__key__": f"k{i:03d}",
                "txt": f"caption {i} é",
                "cls": i % 4,
                "json": {"a": [i, "x"], "b": None, "c": {"d": 1.5}},
                "mp": {"n": i, "neg": -i - 300, "l": [1.5, "s", b"\x00\xff"],
                       "m": {"x": [1, 2]}, "big": 2**63 + i, "t": True, "z": None},
                "npz": {"a": np.arange(i + 3), "b": np.eye(2, dtype=np.float32) * i,
                        "c": np.array([[1, 2]], dtype=np.uint16)},
                "ten": [np.arange(6, dtype=np.int16).reshape(2, 3) + i,
                        np.linspace(0, 1, 5), np.zeros((0, 3), dtype=np.uint8)],
                "pyd": {"p": i, "q": [1, "two"]},
                "jpg": b"\xff\xd8 not decoded by default",
                "seg.txt": f"segment {i}",
            })


def test_auto_decodes_every_member_as_the_webdataset_package(tmp_path):
    path = tmp_path / "shard-000000.tar"
    write_shard(path)
    want = {s["__key__"]: s for s in wds.WebDataset(str(path), shardshuffle=False).decode()}
    got = rows(chute.Loader(chute.webdataset(path), batch_size=4, shuffle=True, seed=3,
                            transforms={"*": [{"op": "auto", "pickle": True}]}))
    assert sorted(g["__key__"] for g in got) == sorted(want)
    for g in got:
        w = want[g["__key__"]]
        for field in ["txt", "seg.txt", "json", "mp", "npz", "ten", "pyd", "jpg"]:
            assert same(g[field], w[field]), (field, g[field], w[field])
        assert int(g["cls"]) == w["cls"]


def test_msgpack_npz_and_tenbin_ops_by_name(tmp_path):
    path = tmp_path / "shard-000000.tar"
    write_shard(path, n=4)
    want = list(wds.WebDataset(str(path), shardshuffle=False).decode())
    got = rows(chute.Loader(chute.webdataset(path), batch_size=2, transforms={
        "mp": [{"op": "msgpack"}], "npz": [{"op": "npz"}], "ten": [{"op": "tenbin"}]}))
    for g, w in zip(got, want):
        assert same(g["mp"], w["mp"]) and same(g["npz"], w["npz"]) and same(g["ten"], w["ten"])
        assert g["pyd"] == pickle.dumps(w["pyd"])  # not named: its bytes


def test_top_level_msgpack_numbers_batch_as_json_numbers_do(tmp_path):
    path = tmp_path / "shard-000000.tar"
    with wds.TarWriter(str(path)) as w:
        for i in range(6):
            w.write({"__key__": f"k{i}", "mp": [i, i + 1, i + 2], "msg": i * 1.5,
                     "msgpack": {"s": f"s{i}"}})
    (batch,) = list(chute.Loader(chute.webdataset(path), batch_size=6,
                                 transforms={"*": [{"op": "auto"}]}))
    assert batch["mp"].dtype == np.int64 and batch["mp"].tolist() == [[i, i + 1, i + 2]
                                                                       for i in range(6)]
    assert batch["msg"].tolist() == [i * 1.5 for i in range(6)]
    assert batch["msgpack"] == [{"s": f"s{i}"} for i in range(6)]


def test_gzip_members_are_decoded_after_decompression(tmp_path):
    import gzip
    import tarfile

    path = tmp_path / "shard-000000.tar"
    with tarfile.open(path, "w") as tar:
        for i in range(3):
            for name, data in [(f"k{i}.txt.gz", gzip.compress(f"text {i}".encode())),
                               (f"k{i}.mp.gz", gzip.compress(msgpack.packb({"i": i})))]:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    want = list(wds.WebDataset(str(path), shardshuffle=False).decode())
    got = rows(chute.Loader(chute.webdataset(path), batch_size=3,
                            transforms={"*": [{"op": "auto"}]}))
    for g, w in zip(got, want):
        assert g["txt.gz"] == w["txt.gz"] and g["mp.gz"] == w["mp.gz"]


def test_pickles_are_refused_unless_allowed(tmp_path):
    path = tmp_path / "shard-000000.tar"
    write_shard(path, n=2)
    loader = chute.Loader(chute.webdataset(path), batch_size=2,
                          transforms={"*": [{"op": "auto"}]})
    with pytest.raises(chute.CorruptDataError) as e:
        next(iter(loader))
    msg = str(e.value)
    assert "pyd" in msg and "runs its code" in msg and '"pickle": true' in msg
    # Named fields keep their own ops; "*" takes the rest (the pickle is left as bytes by
    # naming it without ops that unpickle).
    loader = chute.Loader(chute.webdataset(path), batch_size=2,
                          transforms={"*": [{"op": "auto"}], "pyd": []})
    batch = next(iter(loader))
    assert batch["pyd"][0] == pickle.dumps({"p": 0, "q": [1, "two"]})
    assert batch["txt"] == ["caption 0 é", "caption 1 é"]


def test_bad_members_name_the_sample_and_field(tmp_path):
    import tarfile

    path = tmp_path / "shard-000000.tar"
    bad = {
        "mp": b"\xdd\xff\xff\xff\xff",          # an array claiming 4 billion items
        "npz": b"PK\x03\x04 truncated",
        "ten": b"~TenBin~" + (1 << 40).to_bytes(8, "little"),
    }
    with tarfile.open(path, "w") as tar:
        for name, data in [(f"s-{f}.{f}", d) for f, d in bad.items()] + [("ok.txt", b"fine")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    for field in bad:
        loader = chute.Loader(chute.webdataset(path), batch_size=1,
                              transforms={field: {"ops": [{"op": "auto"}], "optional": True}})
        with pytest.raises(chute.CorruptDataError) as e:
            list(loader)
        msg = str(e.value)
        assert f"s-{field}" in msg and field in msg, msg
    # Skipped and counted where the policy says so.
    loader = chute.Loader(chute.webdataset(path), batch_size=1, on_error="skip",
                          transforms={"*": [{"op": "auto"}]})
    # Each bad sample is replaced by the next good one in the order.
    assert {b["txt"][0] for b in loader} == {"fine"}
    assert loader.stats()["skipped"] == 3


def test_npz_members_count_against_max_decoded_bytes(tmp_path):
    import tarfile

    buf = io.BytesIO()
    np.savez_compressed(buf, big=np.zeros(4 << 20, dtype=np.uint8))  # 4 MiB, compresses
    path = tmp_path / "shard-000000.tar"
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("s.npz")
        info.size = len(buf.getvalue())
        tar.addfile(info, io.BytesIO(buf.getvalue()))
    old = chute.limits()
    try:
        chute.set_limits(max_decoded_bytes=1 << 20)
        with pytest.raises(chute.CorruptDataError, match="max_decoded_bytes"):
            list(chute.Loader(chute.webdataset(path), batch_size=1,
                              transforms={"npz": [{"op": "npz"}]}))
    finally:
        chute.set_limits(**old)
    (batch,) = list(chute.Loader(chute.webdataset(path), batch_size=1,
                                 transforms={"npz": [{"op": "npz"}]}))
    assert batch["npz"][0]["big"].shape == (4 << 20,)


def test_auto_is_its_fields_only_op_and_star_stands_alone(tmp_path):
    path = tmp_path / "shard-000000.tar"
    write_shard(path, n=1)
    src = chute.webdataset(path)
    with pytest.raises(chute.ConfigError, match="only op"):
        chute.Loader(src, transforms={"mp": [{"op": "auto"}, {"op": "cast", "dtype": "f4"}]})
    with pytest.raises(chute.ConfigError, match="alone"):
        chute.Loader(src, transforms={"*;mp": [{"op": "auto"}]})
