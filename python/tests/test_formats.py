"""WebDataset, TFRecord and Parquet from Python: files written by the peers' own libraries
(webdataset, pyarrow: installed by scripts/test.sh; TensorFlow: its golden files in testdata/)
are read exactly."""

import io
import json
from pathlib import Path

import numpy as np
import pytest

import chute

TESTDATA = Path(__file__).resolve().parents[2] / "testdata"


def all_batches(loader):
    return [b for b in loader]


def test_webdataset_shards_written_by_the_webdataset_package(tmp_path):
    wds = pytest.importorskip("webdataset", reason="webdataset not installed (scripts/test.sh installs it)")
    pattern = str(tmp_path / "shard-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=7) as sink:
        for i in range(20):
            sink.write({"__key__": f"sample{i:03d}", "cls": str(i % 5).encode(),
                        "txt": f"caption {i}", "npy": np.full(3, i, dtype=np.int16)})
    source = chute.webdataset(str(tmp_path / "shard-{000000..000002}.tar"))
    assert len(source) == 20
    assert [n for _, n in source.shards] == [7, 7, 6]
    loader = chute.Loader(source, batch_size=8, shuffle=True, seed=1, num_workers=2)
    seen = {}
    for batch in loader:
        assert set(batch) == {"__key__", "cls", "npy", "txt"}
        for k, c, t, npy in zip(batch["__key__"], batch["cls"], batch["txt"], batch["npy"]):
            i = int(k[len("sample"):])
            seen[k] = True
            assert c == str(i % 5).encode()
            assert t == f"caption {i}".encode()
            assert np.array_equal(np.load(io.BytesIO(npy)), np.full(3, i, dtype=np.int16))
    assert len(seen) == 20


def test_gzip_members_read_as_the_webdataset_package_decodes_them(tmp_path):
    import tarfile

    wds = pytest.importorskip("webdataset", reason="webdataset not installed (scripts/test.sh installs it)")
    path = str(tmp_path / "gz-000000.tar")
    with wds.TarWriter(path) as sink:  # it gzips the .gz fields itself
        for i in range(6):
            sink.write({"__key__": f"s{i}", "txt.gz": f"caption {i} ✓",
                        "json.gz": json.dumps({"i": i}), "cls": str(i).encode()})
    theirs = {s["__key__"]: s for s in wds.WebDataset(path, shardshuffle=False,
                                                       empty_check=False).decode()}
    got = [b for b in chute.Loader(chute.webdataset(path), batch_size=3)]
    assert set(got[0]) == {"__key__", "cls", "json.gz", "txt.gz"}
    for b in got:
        for k, txt, js in zip(b["__key__"], b["txt.gz"], b["json.gz"]):
            assert txt.decode() == theirs[k]["txt.gz"]
            assert json.loads(js) == theirs[k]["json.gz"]
    # A member whose name says gzip and whose bytes are not: named, with the sample.
    with tarfile.open(path, "w") as tar:
        data = b"plain text, not gzip"
        info = tarfile.TarInfo("bad.txt.gz")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(chute.CorruptDataError, match=r'"txt.gz" of sample "bad" is not valid gzip'):
        list(chute.Loader(chute.webdataset(path), batch_size=1))


def test_webdataset_golden_and_brace_lists():
    src = chute.webdataset([str(TESTDATA / "webdataset" / "wds-shard-{000000..000001}.tar")])
    keys = [k for b in chute.Loader(src, batch_size=2) for k in b["__key__"]]
    assert keys == ["s0", "s1", "s2", "s3", "s4"]


def test_tfrecord_written_by_tensorflow():
    src = chute.tfrecord(str(TESTDATA / "tfrecord" / "examples.tfrecord"))
    (batch,) = all_batches(chute.Loader(src, batch_size=5))
    assert batch["label"].tolist() == [-2, -1, 0, 1, 2]
    assert batch["floats"].shape == (5, 8) and batch["floats"].dtype == np.float32
    assert batch["floats"][1, 1] == np.float32(1.125)
    assert batch["bytes"][0] == b"record-0"
    only = chute.tfrecord(str(TESTDATA / "tfrecord" / "examples.tfrecord"), features=["label"])
    assert set(next(iter(chute.Loader(only, batch_size=2)))) == {"label"}


def test_tfrecord_corruption_is_reported_with_shard_and_offset(tmp_path):
    data = bytearray((TESTDATA / "tfrecord" / "examples.tfrecord").read_bytes())
    data[40] ^= 1
    bad = tmp_path / "bad.tfrecord"
    bad.write_bytes(bytes(data))
    loader = chute.Loader(chute.tfrecord(str(bad)), batch_size=5)
    with pytest.raises(chute.CorruptDataError, match="bad.tfrecord at byte 0"):
        next(iter(loader))
    skipping = chute.Loader(chute.tfrecord(str(bad)), batch_size=5, on_error="skip")
    (batch,) = all_batches(skipping)
    assert len(batch["label"]) == 5 and -2 not in batch["label"].tolist()
    assert skipping.stats()["skipped"] == 1


def test_parquet_written_by_pyarrow(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="pyarrow not installed (scripts/test.sh installs it)")
    pq = pytest.importorskip("pyarrow.parquet")
    n = 1000
    table = pa.table({
        "x": pa.array(np.arange(n, dtype=np.float32) / 4),
        "label": pa.array(np.arange(n, dtype=np.int64) * 7),
        "name": pa.array([f"row {i}" for i in range(n)]),
        "emb": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(2 * n, dtype=np.float64)), 2),
    })
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=300)
    src = chute.parquet(str(path), columns=["label", "x", "emb", "name"])
    loader = chute.Loader(src, batch_size=128, shuffle=True, seed=3, num_workers=2)
    rows = 0
    for b in loader:
        assert list(b) == ["label", "x", "emb", "name"]
        ids = b["label"] // 7
        assert np.array_equal(b["x"], ids.astype(np.float32) / 4)
        assert np.array_equal(b["emb"], np.stack([2 * ids, 2 * ids + 1], axis=1).astype(np.float64))
        assert b["name"] == [f"row {i}" for i in ids]
        rows += len(ids)
    assert rows == n
    with pytest.raises(chute.ConfigError, match="nope"):
        chute.parquet(str(path), columns=["nope"])


def test_parquet_streams_pieces_and_refuses_a_global_shuffle_its_cache_cannot_hold(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="pyarrow not installed (scripts/test.sh installs it)")
    pq = pytest.importorskip("pyarrow.parquet")
    n = 2000
    table = pa.table({"x": np.arange(n, dtype=np.float32), "id": np.arange(n, dtype=np.int64)})
    path = str(tmp_path / "t.parquet")
    pq.write_table(table, path, row_group_size=100)

    def ids(src, shuffle, epochs=1):
        loader = chute.Loader(src, batch_size=64, shuffle=shuffle, seed=2, num_workers=2)
        out = []
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for b in loader:
                assert np.array_equal(np.asarray(b["x"]), np.asarray(b["id"]).astype(np.float32))
                out.extend(np.asarray(b["id"]).tolist())
        return out

    # 20 row groups, a cache of at most 8 of them: streaming in file order and block shuffle
    # read every row; a global shuffle would decode most groups again for each batch.
    small = chute.parquet(path, cache_bytes=1, chunk_rows=50)
    assert sorted(ids(small, False)) == list(range(n))
    assert sorted(ids(small, "block", epochs=2)) == sorted(list(range(n)) * 2)
    with pytest.raises(chute.ConfigError, match="global shuffle.*cache_bytes"):
        ids(small, True)
    # The default (streaming, a 1 GiB bound on what is held at once) and a cache that holds
    # the dataset for later epochs both serve a global shuffle.
    for src in [chute.parquet(path), chute.parquet(path, cache_bytes=1 << 30)]:
        got = ids(src, True, epochs=2)
        assert sorted(got) == sorted(list(range(n)) * 2) and got[:n] != got[n:]


@pytest.mark.parametrize("compression", ["none", "snappy", "zstd", "lz4", "gzip", "brotli"])
@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_parquet_numeric_columns_read_as_pyarrow_writes_them(tmp_path, compression, version):
    # chute decodes flat numeric columns itself (PLAIN and dictionary pages, v1 and v2, in the
    # codecs pyarrow writes): every value as pyarrow reads it, in file order and from pieces
    # in random order, and a null still named.
    pa = pytest.importorskip("pyarrow", reason="pyarrow not installed (scripts/test.sh installs it)")
    pq = pytest.importorskip("pyarrow.parquet")
    n = 20_000
    rng = np.random.default_rng(3)
    cols = {
        "i32": rng.integers(-50, 50, n, dtype=np.int32),
        "u32": rng.integers(0, 2**32, n, dtype=np.uint32),
        "f32": rng.standard_normal(n, dtype=np.float32),
        "i64": rng.integers(-2**62, 2**62, n, dtype=np.int64),
        "u64": np.arange(n, dtype=np.uint64) * 3,
        "f64": np.round(rng.standard_normal(n), 1),
    }
    path = str(tmp_path / "t.parquet")
    # Small pages and dictionaries: many pages a chunk, and dictionaries that fall back to
    # PLAIN part of the way through a chunk.
    pq.write_table(pa.table(cols), path, row_group_size=7_000, compression=compression,
                   data_page_version=version, data_page_size=4096,
                   dictionary_pagesize_limit=2048)
    want = pq.read_table(path)
    for shuffle in [False, "block"]:
        src = chute.parquet(path, chunk_rows=512)
        loader = chute.Loader(src, batch_size=1000, shuffle=shuffle, seed=1, num_workers=2)
        got = {k: [] for k in cols}
        for b in loader:
            for k in cols:
                got[k].append(np.asarray(b[k]))
        order = np.argsort(np.concatenate(got["u64"]), kind="stable")
        for k in cols:
            v = np.concatenate(got[k])[order]
            assert v.dtype == cols[k].dtype, k
            assert np.array_equal(v, want.column(k).to_numpy()), (k, shuffle)
    holes = pa.table({"x": pa.array([1.5, None, 2.5] * 1000, pa.float32())})
    pq.write_table(holes, path, compression=compression, data_page_version=version)
    with pytest.raises(chute.CorruptDataError, match=r"\"x\" is null in row 1"):
        list(chute.Loader(chute.parquet(path, nulls="raise"), batch_size=100))
    # By default the nulls are NaN, their places in x_valid.
    got = next(iter(chute.Loader(chute.parquet(path), batch_size=3)))
    assert got["x_valid"].tolist() == [True, False, True]
    assert got["x"][0] == 1.5 and np.isnan(got["x"][1])


@pytest.mark.parametrize("shuffle", [False, "block", True])
def test_parquet_and_arrow_stack_columns_on_the_workers(tmp_path, shuffle):
    pa = pytest.importorskip("pyarrow", reason="pyarrow not installed (scripts/test.sh installs it)")
    pq = pytest.importorskip("pyarrow.parquet")
    feather = pytest.importorskip("pyarrow.feather")
    n = 3000
    rng = np.random.default_rng(0)
    feats = rng.standard_normal((n, 6), dtype=np.float32)
    cols = {f"f{j}": feats[:, j] for j in range(6)}
    cols["id"] = np.arange(n, dtype=np.int64)
    table = pa.table(cols)
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=700)
    feather.write_feather(table, tmp_path / "t.arrow", chunksize=500)
    sources = [
        chute.parquet(str(tmp_path / "t.parquet"), stack={"x": "f{0..5}"}, chunk_rows=256),
        chute.dataset(str(tmp_path / "t.arrow"), stack={"x": [f"f{j}" for j in range(6)]}),
        chute.arrow(table, stack={"x": "f5,f{0..4}"}),
    ]
    for k, src in enumerate(sources):
        seen = []
        for b in chute.Loader(src, batch_size=128, shuffle=shuffle, seed=1, num_workers=2):
            assert list(b) == ["x", "id"]
            x, ids = np.asarray(b["x"]), np.asarray(b["id"])
            assert x.shape == (len(ids), 6) and x.dtype == np.float32
            want = feats[ids] if k < 2 else feats[ids][:, [5, 0, 1, 2, 3, 4]]
            assert np.array_equal(x, want)
            seen.extend(ids.tolist())
        assert sorted(seen) == list(range(n))
    with pytest.raises(chute.ConfigError, match="share one dtype"):
        chute.parquet(str(tmp_path / "t.parquet"), stack={"x": ["f0", "id"]})
    with pytest.raises(chute.ConfigError, match="stack"):
        chute.parquet(str(tmp_path / "t.parquet"), stack=["f0"])
