"""Arrow IPC files and streams written by pyarrow, Polars-style tables in memory, and Hugging
Face datasets (written by the real `datasets` package: `save_to_disk` folders, `load_dataset`
caches, `shuffle()` / `select()` indices mappings) read natively by chute."""

import json
import textwrap

import numpy as np
import pytest

import chute
from conftest import all_rows, run_python

pa = pytest.importorskip("pyarrow")
ipc = pytest.importorskip("pyarrow.ipc")
feather = pytest.importorskip("pyarrow.feather")


def table(n=50, start=0):
    rows = range(start, start + n)
    return pa.table(
        {
            "x": pa.array([np.arange(4, dtype=np.float32) + i for i in rows],
                          type=pa.list_(pa.float32(), 4)),
            "label": pa.array(list(rows), type=pa.int64()),
            "ids": pa.array([list(range(i % 5)) for i in rows], type=pa.list_(pa.int32())),
            "flag": pa.array([i % 3 == 0 for i in rows]),
            "text": pa.array([f"row {i}" for i in rows]),
            "big": pa.array([f"L{i}" for i in rows], type=pa.large_string()),
            "half": pa.array(np.arange(start, start + n, dtype=np.float16)),
        }
    )


def check_values(got, start, n):
    assert [int(v) for v in got["label"]] == list(range(start, start + n))
    for i, x in zip(range(start, start + n), got["x"]):
        assert np.array_equal(x, np.arange(4, dtype=np.float32) + i)
    assert [list(v) for v in got["ids"]] == [list(range(i % 5)) for i in range(start, start + n)]
    assert [bool(v) for v in got["flag"]] == [i % 3 == 0 for i in range(start, start + n)]
    assert got["text"] == [f"row {i}" for i in range(start, start + n)]
    assert got["big"] == [f"L{i}" for i in range(start, start + n)]
    assert [float(v) for v in got["half"]] == [float(np.float16(i)) for i in range(start, start + n)]


@pytest.mark.parametrize("kind", ["file", "stream", "feather-lz4", "feather-zstd"])
def test_ipc_files_and_streams_written_by_pyarrow(tmp_path, kind):
    t = table(50)
    if kind == "file":
        path = tmp_path / "data.arrow"
        with ipc.new_file(path, t.schema) as w:
            for b in t.to_batches(max_chunksize=16):
                w.write_batch(b)
    elif kind == "stream":
        path = tmp_path / "data.arrows"
        with ipc.new_stream(path, t.schema) as w:
            for b in t.to_batches(max_chunksize=16):
                w.write_batch(b)
    else:
        path = tmp_path / "data.feather"
        feather.write_feather(t, path, compression=kind.split("-")[1], chunksize=16)
    src = chute.dataset(path)
    assert src.format == "arrow" and len(src) == 50
    assert chute.dataset(path, format="arrow").fingerprint == src.fingerprint
    got = all_rows(chute.Loader(src, batch_size=8, num_workers=2))
    check_values(got, 0, 50)
    x = next(iter(chute.Loader(src, batch_size=8)))["x"]
    assert x.shape == (8, 4) and x.dtype == np.float32
    # Padded variable-length lists, with their mask.
    padded = next(iter(chute.Loader(chute.arrow(path, columns=["ids"]), batch_size=5, pad=True)))
    assert padded["ids"].shape == (5, 4)
    assert padded["ids_mask"].sum() == sum(i % 5 for i in range(5))


def test_a_folder_of_ipc_files_and_in_memory_tables(tmp_path):
    for k in range(3):
        with ipc.new_file(tmp_path / f"part-{k}.arrow", table().schema) as w:
            w.write_table(table(20, start=20 * k))
    (tmp_path / "README.md").write_text("not a shard")
    src = chute.dataset(tmp_path)
    assert src.format == "arrow" and len(src) == 60
    check_values(all_rows(chute.Loader(src, batch_size=7)), 0, 60)
    # Anything with __arrow_c_stream__ is read in place, without a file.
    mem = chute.arrow(table(30, start=5), columns=["label", "text"])
    got = all_rows(chute.Loader(mem, batch_size=4))
    assert set(got) == {"label", "text"}
    assert [int(v) for v in got["label"]] == list(range(5, 35))
    shuffled = chute.Loader(mem, batch_size=4, shuffle=True, seed=3, num_workers=2)
    assert sorted(int(v) for b in shuffled for v in b["label"]) == list(range(5, 35))


def test_bad_arrow_files_are_named(tmp_path):
    bad = tmp_path / "bad.arrow"
    bad.write_bytes(b"definitely not arrow")
    with pytest.raises(chute.CorruptDataError, match="bad.arrow") as e:
        chute.dataset(bad)
    assert e.value.path.endswith("bad.arrow")
    nulls = tmp_path / "nulls.arrow"
    with ipc.new_file(nulls, pa.schema([("v", pa.int32())])) as w:
        w.write_table(pa.table({"v": pa.array([1, None, 3], type=pa.int32())}))
    with pytest.raises(chute.CorruptDataError, match=r'"v" is null in row 1'):
        list(chute.Loader(chute.dataset(nulls, nulls="raise"), batch_size=3))
    with pytest.raises(chute.ConfigError, match="nulls"):
        chute.dataset(nulls, nulls="drop")
    with pytest.raises(chute.ConfigError, match="has no column"):
        chute.dataset(nulls, columns=["w"])


def typed_table(n=300):
    """Columns of many Arrow types, most with nulls, as pyarrow builds them."""
    import datetime
    import decimal

    rng = np.random.default_rng(7)
    hole = rng.random(n) < 0.2

    def some(values):
        return [None if h else v for h, v in zip(hole, values)]

    base = datetime.datetime(2024, 3, 1, tzinfo=datetime.timezone.utc)
    return pa.table({
        "f": pa.array(some(rng.standard_normal(n).astype(np.float32)), pa.float32()),
        "i": pa.array(some(range(n)), pa.int64()),
        "b": pa.array(some([k % 3 == 0 for k in range(n)]), pa.bool_()),
        "s": pa.array(some([f"row {k}" for k in range(n)]), pa.string()),
        "ts": pa.array(some([base + datetime.timedelta(seconds=k) for k in range(n)]),
                       pa.timestamp("us", tz="UTC")),
        "day": pa.array(some([datetime.date(2020, 1, 1) + datetime.timedelta(days=k)
                              for k in range(n)]), pa.date32()),
        "clock": pa.array(some([k * 1_000_000 for k in range(n)]), pa.time64("ns")),
        "wait": pa.array(some([datetime.timedelta(milliseconds=k) for k in range(n)]),
                         pa.duration("ms")),
        "price": pa.array(some([decimal.Decimal(k * 7) / 1000 for k in range(n)]),
                          pa.decimal128(12, 3)),
        "uuid": pa.array(some([bytes([k % 256]) * 16 for k in range(n)]), pa.binary(16)),
        "cat": pa.array(some([["red", "green", "blue"][k % 3] for k in range(n)])).dictionary_encode(),
        "ids": pa.array(some([[k, None, -k][: k % 4] for k in range(n)]), pa.list_(pa.int32())),
        "nothing": pa.nulls(n),
        "dense": pa.array(np.arange(n, dtype=np.int32)),
    })


def pyarrow_values(tbl, name):
    """pyarrow's values of column `name` as chute gives them: (values, present)."""
    col = tbl.column(name).combine_chunks()
    present = [v is not None for v in col.to_pylist()]
    t = col.type
    if pa.types.is_dictionary(t):
        col = col.dictionary_decode()
        t = col.type
    if pa.types.is_timestamp(t) or pa.types.is_time64(t) or pa.types.is_duration(t):
        values = col.cast(pa.int64()).to_pylist()
    elif pa.types.is_date32(t):
        values = col.cast(pa.int32()).to_pylist()
    elif pa.types.is_decimal(t):
        values = [None if v is None else float(v) for v in col.to_pylist()]
    elif pa.types.is_null(t):
        values = [None] * len(col)
    else:
        values = col.to_pylist()
    return values, present


def fill_of(name, v):
    """What a null of column `name` reads as."""
    if name in ("f", "price"):  # floats (a decimal is a float64)
        return "nan"
    if name in ("s", "cat"):  # text (a dictionary of strings is its strings)
        return ""
    if name == "uuid":
        return [0] * 16
    if name == "ids":
        return []
    if name in ("b", "nothing"):
        return False
    if name in ("ts", "day", "wait"):  # datetime64 / timedelta64: NaT
        return "nat"
    return 0


def plain_value(v):
    if isinstance(v, (np.datetime64, np.timedelta64)):
        # Timestamps, dates and durations come as numpy's types: their counts, NaT a null.
        return "nat" if np.isnat(v) else int(v.astype(np.int64))
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.generic):
        return v.item()
    return v


@pytest.mark.parametrize("how", ["parquet", "arrow-file", "arrow-stream", "table", "hf"])
def test_arrow_types_and_nulls_read_with_pyarrow_values(tmp_path, how):
    pq = pytest.importorskip("pyarrow.parquet")
    tbl = typed_table()
    if how == "parquet":
        path = tmp_path / "typed.parquet"
        pq.write_table(tbl, path, row_group_size=128)
        src = chute.parquet(path)
    elif how == "arrow-file":
        path = tmp_path / "typed.arrow"
        with ipc.new_file(path, tbl.schema) as w:
            w.write_table(tbl, max_chunksize=100)
        src = chute.dataset(path)
    elif how == "arrow-stream":
        path = tmp_path / "typed.arrows"
        with ipc.new_stream(path, tbl.schema) as w:
            w.write_table(tbl, max_chunksize=100)
        src = chute.arrow(path)
    elif how == "table":
        src = chute.arrow(tbl)
    else:  # a Hugging Face dataset over the table, saved and loaded as datasets does
        hf = pytest.importorskip("datasets")
        hf.Dataset(hf.table.InMemoryTable(tbl)).save_to_disk(str(tmp_path / "hf"))
        src = hf.load_from_disk(str(tmp_path / "hf"))
    got = all_rows(chute.Loader(src, batch_size=64, shuffle=True, seed=3))
    n = tbl.num_rows
    masked = [c for c in tbl.column_names if c != "dense"]
    assert list(got) == tbl.column_names + [f"{c}_valid" for c in masked]
    order = np.argsort([int(v) for v in got["dense"]])
    for name in tbl.column_names:
        values, present = pyarrow_values(tbl, name)
        rows = [plain_value(got[name][k]) for k in order]
        if name != "dense":
            assert [bool(got[f"{name}_valid"][k]) for k in order] == present, name
        for r in range(n):
            want = values[r] if present[r] else fill_of(name, None)
            have = rows[r]
            if want == "nan":
                assert np.isnan(have), (name, r, have)
            elif name == "f":
                assert have == pytest.approx(want, rel=1e-6), (name, r)
            elif name == "price":
                assert have == pytest.approx(want, rel=1e-15), (name, r)
            elif name == "uuid":
                assert list(have) == (list(want) if present[r] else want), (name, r)
            elif name == "ids":
                assert list(have) == [0 if x is None else x for x in want], (name, r)
            else:
                assert have == want, (name, r, have, want)


def test_null_fill_and_raise(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "holes.parquet"
    pq.write_table(pa.table({"x": pa.array([1.5, None, 2.5], pa.float64()),
                             "k": pa.array([None, 4, 5], pa.int16())}), path)
    b = next(iter(chute.Loader(chute.parquet(path, fill_null=-1), batch_size=3)))
    assert b["x"].tolist() == [1.5, -1.0, 2.5] and b["k"].tolist() == [-1, 4, 5]
    assert b["x_valid"].tolist() == [True, False, True]
    assert b["k_valid"].tolist() == [False, True, True]
    with pytest.raises(chute.CorruptDataError, match=r'"x" is null in row 1'):
        list(chute.Loader(chute.parquet(path, nulls="raise"), batch_size=3))
    # A column named like a mask clashes, clearly.
    pq.write_table(pa.table({"x": pa.array([1.0, None]), "x_valid": pa.array([1, 2])}), path)
    with pytest.raises(chute.ConfigError, match="x_valid"):
        chute.parquet(path)
    assert len(chute.parquet(path, nulls="raise")) == 2


def test_nulls_fill_without_masks(tmp_path):
    """nulls="fill": the slots filled as with masks (pyarrow's fill_null gives the same
    numbers), no `_valid` column, in Parquet, Arrow IPC, a table in memory and a Hugging Face
    dataset; and a state saved under one policy is refused under the other (other fields)."""
    pq = pytest.importorskip("pyarrow.parquet")
    tbl = pa.table({"x": pa.array([1.5, None, 2.5, None], pa.float32()),
                    "k": pa.array([None, 4, 5, 6], pa.int64()),
                    "s": pa.array(["a", None, "c", "d"]),
                    "dense": pa.array([1, 2, 3, 4], pa.int32())})
    pq.write_table(tbl, tmp_path / "t.parquet")
    with ipc.new_file(tmp_path / "t.arrow", tbl.schema) as w:
        w.write_table(tbl, max_chunksize=3)
    sources = [chute.parquet(tmp_path / "t.parquet", nulls="fill", fill_null=-7),
               chute.arrow(tmp_path / "t.arrow", nulls="fill", fill_null=-7)]
    sources.append(chute.arrow(tbl, nulls="fill", fill_null=-7))  # a table in memory
    datasets = pytest.importorskip("datasets")
    sources.append(chute.arrow(datasets.Dataset(tbl), nulls="fill", fill_null=-7))
    for src in sources:
        b = next(iter(chute.Loader(src, batch_size=4)))
        assert sorted(b) == ["dense", "k", "s", "x"], src
        assert b["x"].tolist() == tbl["x"].fill_null(-7.0).to_pylist()
        assert b["k"].tolist() == tbl["k"].fill_null(-7).to_pylist()
        assert b["dense"].tolist() == [1, 2, 3, 4]
        assert list(b["s"]) in (["a", "", "c", "d"], [b"a", b"", b"c", b"d"])
    # The reading options apply to a Hugging Face dataset too (they were dropped before).
    hf = chute.arrow(datasets.Dataset(tbl), columns=["x"], fill_null=-1)
    assert sorted(next(iter(chute.Loader(hf, batch_size=4)))) == ["x", "x_valid"]
    masked = chute.Loader(chute.arrow(tmp_path / "t.arrow"), batch_size=2)
    it = iter(masked)
    next(it)
    state = masked.state_dict()
    filled = chute.Loader(sources[1], batch_size=2)
    with pytest.raises(chute.StateError, match="fingerprint"):
        filled.load_state_dict(state)
    with pytest.raises(chute.ConfigError, match="fill"):
        chute.arrow(tmp_path / "t.arrow", nulls="zero")


@pytest.mark.parametrize("kind", ["file", "stream"])
def test_columns_without_buffers_in_ipc(tmp_path, kind):
    """Columns whose record batches hold no buffer a row (the null type, run-end encoding),
    alone in a file, and a run-end-encoded column whose nulls (its values') first appear in a
    later record batch: read whole, with pyarrow's values and masks."""
    n = 25
    ree = pa.RunEndEncodedArray.from_arrays(pa.array([10, 20, n], pa.int32()),
                                            pa.array([1.5, None, 3.0]))
    want = ree.to_pylist()
    for name, tbl in (("nul", pa.table({"z": pa.nulls(n)})),
                      ("ree", pa.table({"r": ree})),
                      ("both", pa.table({"z": pa.nulls(n), "r": ree}))):
        path = tmp_path / f"{name}.arrow"
        with (ipc.new_file if kind == "file" else ipc.new_stream)(path, tbl.schema) as w:
            w.write_table(tbl, max_chunksize=10)
        rows = all_rows(chute.Loader(chute.arrow(path), batch_size=8, num_workers=2))
        if "z" in tbl.column_names:
            assert rows["z_valid"] == [False] * n, name
        if "r" in tbl.column_names:
            assert rows["r_valid"] == [v is not None for v in want], name
            assert [v for v, ok in zip(rows["r"], rows["r_valid"]) if ok] == \
                [v for v in want if v is not None], name


def test_repeated_column_and_field_names(tmp_path):
    """Arrow allows two columns of one name and struct fields without names (pyarrow reads
    them): the second column gets `_1`; a struct whose fields' names repeat is read whole,
    a dict a row (the last of a repeated key wins, as building a dict does)."""
    a = pa.array([1, 2, 3], pa.int8())
    b = pa.array([10, None, 30], pa.int32())
    s = pa.StructArray.from_arrays([pa.array([7, 8, 9]), pa.array(["p", "q", None])],
                                   names=["", ""])
    tbl = pa.Table.from_arrays([a, b, s], names=["x", "x", "s"])
    path = tmp_path / "dupes.arrow"
    with ipc.new_file(path, tbl.schema) as w:
        w.write_table(tbl)
    rows = all_rows(chute.Loader(chute.arrow(path), batch_size=2))
    assert rows["x"] == [1, 2, 3]
    assert [v if ok else None for v, ok in zip(rows["x_1"], rows["x_1_valid"])] == [10, None, 30]
    assert rows["s"] == [{"": "p"}, {"": "q"}, {"": None}]


datasets = pytest.importorskip("datasets")


def hf_dataset(n=40):
    features = datasets.Features(
        {
            "label": datasets.ClassLabel(names=["cat", "dog", "bird"]),
            "score": datasets.Value("float32"),
            "input_ids": datasets.Sequence(datasets.Value("int32")),
            "vec": datasets.Sequence(datasets.Value("float32"), length=3),
            "text": datasets.Value("string"),
        }
    )
    return datasets.Dataset.from_dict(
        {
            "label": [i % 3 for i in range(n)],
            "score": [i / 2 for i in range(n)],
            "input_ids": [list(range(i % 6 + 1)) for i in range(n)],
            "vec": [[i, i + 1, i + 2] for i in range(n)],
            "text": [f"doc {i}" for i in range(n)],
        },
        features=features,
    )


def expected(ds):
    """What `datasets` itself says each row is, in the dataset's order."""
    return [ds[i] for i in range(len(ds))]


def check_hf(loader, rows):
    got = all_rows(loader)
    assert [int(v) for v in got["label"]] == [r["label"] for r in rows]
    assert [float(v) for v in got["score"]] == [r["score"] for r in rows]
    assert [list(map(int, v)) for v in got["input_ids"]] == [r["input_ids"] for r in rows]
    assert [list(map(float, v)) for v in got["vec"]] == [r["vec"] for r in rows]
    assert got["text"] == [r["text"] for r in rows]


def test_hugging_face_datasets_are_read_natively(tmp_path):
    ds = hf_dataset()
    assert chute.Loader(ds)._source.format == "arrow"  # native, not __getitem__
    check_hf(chute.Loader(ds, batch_size=6), expected(ds))
    # save_to_disk's folder is Arrow IPC: chute.dataset opens it, values as datasets reads them.
    ds.save_to_disk(str(tmp_path / "saved"), num_shards=2)
    src = chute.dataset(tmp_path / "saved")
    assert src.format == "arrow" and len(src) == 40
    check_hf(chute.Loader(src, batch_size=6), expected(datasets.load_from_disk(str(tmp_path / "saved"))))
    # A loaded dataset is memory-mapped from its cache files; shuffle() and select() add an
    # indices mapping, which chute follows without calling Python per row.
    loaded = datasets.load_from_disk(str(tmp_path / "saved"))
    assert loaded.cache_files
    mixed = loaded.shuffle(seed=7).select(range(5, 30))
    assert mixed._indices is not None and chute.Loader(mixed)._source.format == "arrow"
    check_hf(chute.Loader(mixed, batch_size=4, num_workers=2), expected(mixed))
    # with_format("torch") gives torch tensors; its columns select.
    torch = pytest.importorskip("torch")
    t = next(iter(chute.Loader(mixed.with_format("torch", columns=["label", "vec"]), batch_size=4)))
    assert set(t) == {"label", "vec"}
    assert isinstance(t["vec"], torch.Tensor) and t["vec"].shape == (4, 3)
    # The source is made once per dataset object, and again after an in-place change.
    assert chute.Loader(mixed)._source is chute.Loader(mixed)._source
    mixed.set_format(columns=["text"])
    assert set(next(iter(chute.Loader(mixed, batch_size=2)))) == {"text"}


def test_load_dataset_caches_and_set_transform(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(f'{{"a": {i}, "b": "t{i}"}}\n' for i in range(25)))
    ds = datasets.load_dataset(
        "json", data_files=str(data), split="train", cache_dir=str(tmp_path / "cache")
    )
    rows = expected(ds)
    got = all_rows(chute.Loader(ds, batch_size=10, shuffle=True, seed=1, num_workers=2))
    assert sorted(zip(map(int, got["a"]), got["b"])) == sorted((r["a"], r["b"]) for r in rows)
    # A Python transform must run per row: chute calls __getitem__ on its threads instead.
    ds.set_transform(lambda batch: {"a2": [a * 2 for a in batch["a"]]})
    assert chute.Loader(ds)._source.format == "python"
    got = all_rows(chute.Loader(ds, batch_size=10))
    assert [int(v) for v in got["a2"]] == [2 * r["a"] for r in rows]


def test_hf_state_dict_resumes_in_a_new_process(tmp_path):
    hf_dataset(60).save_to_disk(str(tmp_path / "saved"))
    script = textwrap.dedent(
        f"""
        import json, sys, datasets, chute
        ds = datasets.load_from_disk({str(tmp_path / "saved")!r}).shuffle(seed=1)
        loader = chute.Loader(ds, batch_size=7, shuffle=True, seed=5, num_workers=2)
        if sys.argv[1] == "first":
            it = iter(loader)
            seen = [int(v) for _ in range(3) for v in next(it)["score"] * 2]
            print(json.dumps({{"state": loader.state_dict(), "seen": seen}}))
        else:
            loader.load_state_dict(json.loads(sys.argv[2]))
            print(json.dumps([int(v) for b in loader for v in b["score"] * 2]))
        """
    )
    run = lambda *a: run_python(script, *a).stdout
    first = json.loads(run("first"))
    rest = json.loads(run("rest", json.dumps(first["state"])))
    whole = [int(v) for b in chute.Loader(
        datasets.load_from_disk(str(tmp_path / "saved")).shuffle(seed=1),
        batch_size=7, shuffle=True, seed=5) for v in b["score"] * 2]
    assert first["seen"] + rest == whole
    assert sorted(whole) == list(range(60))
    # Ranks partition the dataset with equal batch counts.
    ds = datasets.load_from_disk(str(tmp_path / "saved"))
    parts = [
        [int(v) for b in chute.Loader(ds, batch_size=4, rank=r, world_size=3) for v in b["score"] * 2]
        for r in range(3)
    ]
    assert sorted(sum(parts, [])) == list(range(60)) and len({len(p) for p in parts}) == 1


def test_a_parquet_file_of_thousands_of_columns_reads_every_column(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    n = 3000
    cols = {f"c{i}": pa.array(np.arange(6, dtype=np.float32) + i) for i in range(n)}
    cols["meta"] = pa.array([{"a": k, "b": {"c": f"t{k}"}} for k in range(6)])
    path = tmp_path / "wide.parquet"
    pq.write_table(pa.table(cols), path, row_group_size=4)
    got = all_rows(chute.Loader(chute.parquet(path), batch_size=3))
    assert len(got) == n + 2  # meta.a, meta.b.c
    for i in range(0, n, 97):
        assert [float(v) for v in got[f"c{i}"]] == [float(k + i) for k in range(6)]
    assert got["meta.b.c"] == [f"t{k}" for k in range(6)]
    got = all_rows(chute.Loader(chute.parquet(path, columns=["meta.b.c", "c2999"]),
                                batch_size=6))
    assert list(got) == ["meta.b.c", "c2999"] and got["meta.b.c"][5] == "t5"
