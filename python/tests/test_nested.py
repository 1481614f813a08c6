"""Nested columns (lists of strings, a chat's `messages`, structs, maps, unions, lists of
lists, run-end-encoded and list-view columns) read by chute with the values pyarrow and
`datasets` give: from Parquet and Arrow files written by pyarrow, from in-memory tables and
from Hugging Face datasets built by the real `datasets` package."""

import datetime
import decimal

import numpy as np
import pytest

import chute
from conftest import all_rows

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
ipc = pytest.importorskip("pyarrow.ipc")


def chat_rows(n=60):
    rows = []
    for k in range(n):
        messages = [{"role": "system", "content": f"be brief {k}"}] if k % 3 == 0 else []
        messages += [
            {"role": "user", "content": f"question {k}"},
            {"role": "assistant", "content": "answer " * (k % 4 + 1)},
        ]
        rows.append({
            "messages": messages,
            "tags": [f"t{j}" for j in range(k % 3)] if k % 5 else None,
            "meta": {"source": f"s{k % 2}", "score": k / 4, "inner": {"n": k}},
            "grid": [[k, k + 1], [], [k * 2]],
            "id": k,
        })
    return rows


def nested_table(n=60):
    rows = chat_rows(n)
    base = datetime.datetime(2024, 1, 1)
    t = pa.Table.from_pylist(rows)
    extra = {
        "props": pa.array([[("a", k), ("b", -k)] if k % 4 else None for k in range(n)],
                          pa.map_(pa.string(), pa.int64())),
        "when": pa.array([[base + datetime.timedelta(seconds=k)] for k in range(n)],
                         pa.list_(pa.timestamp("ms"))),
        "prices": pa.array([[decimal.Decimal(k) / 100] for k in range(n)],
                           pa.list_(pa.decimal128(9, 2))),
        "flags": pa.array([[k % 2 == 0, None] for k in range(n)], pa.list_(pa.bool_())),
        "blobs": pa.array([[bytes([k % 256]) * 3] for k in range(n)], pa.list_(pa.binary())),
    }
    for name, col in extra.items():
        t = t.append_column(name, col)
    return t


def reference(tbl):
    """What pyarrow's to_pylist gives per column, with timestamps and decimals as chute's
    documented counts and floats."""
    ref = {}
    for name in tbl.column_names:
        values = tbl.column(name).to_pylist()
        if name == "when":
            values = [[int(x.timestamp() * 1000) - int(datetime.datetime(1970, 1, 1).timestamp() * 1000)
                       for x in v] for v in values]
        if name == "prices":
            values = [[float(x) for x in v] for v in values]
        ref[name] = values
    return ref


def check(got, tbl, order):
    ref = reference(tbl)
    ids = [int(v) for v in got["id"]]
    assert sorted(ids) == list(range(tbl.num_rows))
    assert order is None or ids == order
    for name, want in ref.items():
        if name == "meta":
            for leaf in ("source", "score"):
                assert [got[f"meta.{leaf}"][ids.index(k)] for k in range(len(want))] == [
                    w[leaf] for w in want
                ], leaf
            assert [int(got["meta.inner.n"][ids.index(k)]) for k in range(len(want))] == [
                w["inner"]["n"] for w in want
            ]
            continue
        if name == "id":
            continue
        have = [got[name][ids.index(k)] for k in range(len(want))]
        assert have == want, name


@pytest.mark.parametrize("how", ["parquet", "arrow-file", "table"])
def test_nested_columns_read_with_pyarrow_values(tmp_path, how):
    tbl = nested_table()
    if how == "parquet":
        path = tmp_path / "nested.parquet"
        pq.write_table(tbl, path, row_group_size=16)
        src = chute.parquet(path)
    elif how == "arrow-file":
        path = tmp_path / "nested.arrow"
        with ipc.new_file(path, tbl.schema) as w:
            w.write_table(tbl, max_chunksize=25)
        src = chute.dataset(path)
    else:
        src = chute.arrow(tbl)
    got = all_rows(chute.Loader(src, batch_size=7, shuffle=True, seed=1, num_workers=2))
    # Structs are read as their leaves, named by path; the rest are nested values.
    assert "meta.inner.n" in got and "meta" not in got and "messages" in got
    # `tags` holds nulls (a mask says where); `props` too.
    assert got["tags_valid"] == [v is not None for v in got["tags"]] or all(
        bool(a) == (b is not None) for a, b in zip(got["tags_valid"], got["tags"])
    )
    check(got, tbl, None)
    # Messages are lists of dicts, as datasets gives them.
    m = got["messages"][0]
    assert isinstance(m, list) and set(m[0]) == {"role", "content"}
    # A leaf is selected by its path, a struct by its name (all its leaves).
    one = chute.Loader(chute.arrow(tbl, columns=["meta.inner.n", "messages"]), batch_size=60)
    b = next(iter(one))
    assert list(b) == ["meta.inner.n", "messages"]
    assert b["meta.inner.n"].tolist() == list(range(60))
    meta = chute.Loader(chute.arrow(tbl, columns=["meta"]), batch_size=4)
    assert list(next(iter(meta))) == ["meta.source", "meta.score", "meta.inner.n"]
    with pytest.raises(chute.ConfigError, match=r"meta\.nope.*meta\.inner\.n"):
        chute.arrow(tbl, columns=["meta.nope"])
    # Whole records on request, as datasets gives them; a leaf by its path still alone.
    rec = next(iter(chute.Loader(chute.arrow(tbl, structs="record"), batch_size=60)))
    assert rec["meta"] == tbl.column("meta").to_pylist() and "meta.source" not in rec
    rec = next(iter(chute.Loader(chute.arrow(tbl, structs="record", columns=["meta.inner"]),
                                 batch_size=60)))
    assert rec["meta.inner"] == [{"n": k} for k in range(60)]
    with pytest.raises(chute.ConfigError, match="structs"):
        chute.arrow(tbl, structs="flat")


def test_every_order_and_resume_give_the_same_nested_values(tmp_path):
    tbl = nested_table()
    path = tmp_path / "nested.parquet"
    pq.write_table(tbl, path, row_group_size=10)
    whole = all_rows(chute.Loader(chute.parquet(path), batch_size=8, shuffle=True, seed=5))
    loader = chute.Loader(chute.parquet(path), batch_size=8, shuffle=True, seed=5)
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    state = loader.state_dict()
    again = chute.Loader(chute.parquet(path), batch_size=8, shuffle=True, seed=5)
    again.load_state_dict(state)
    rest = list(again)
    got = {}
    for b in first + rest:
        for k, v in b.items():
            got.setdefault(k, []).extend(list(v))
    assert got["messages"] == whole["messages"]
    assert [int(x) for x in got["id"]] == [int(x) for x in whole["id"]]


def test_other_nested_kinds_as_pyarrow_gives_them():
    n = 12
    union = pa.UnionArray.from_sparse(
        pa.array([0, 1] * (n // 2), pa.int8()),
        [pa.array(list(range(n)), pa.int64()), pa.array([f"u{k}" for k in range(n)])],
    )
    ree = pa.RunEndEncodedArray.from_arrays(pa.array([4, n], pa.int32()), pa.array(["p", "q"]))
    views = pa.array([[k, k + 1] for k in range(n)], pa.list_view(pa.int32()))
    strviews = pa.array([[f"s{k}"] for k in range(n)], pa.list_view(pa.string()))
    dict_list = pa.array([["x", "y"][k % 2] for k in range(n)]).dictionary_encode()
    fsl = pa.array([[f"a{k}", f"b{k}"] for k in range(n)], pa.list_(pa.string(), 2))
    tbl = pa.table({"u": union, "r": ree, "v": views, "sv": strviews, "d": dict_list,
                    "f": fsl, "n": pa.array(list(range(n)))})
    b = next(iter(chute.Loader(chute.arrow(tbl), batch_size=n)))
    assert b["u"] == union.to_pylist()
    assert b["r"] == ree.to_pylist()
    assert [list(map(int, x)) for x in b["v"]] == views.to_pylist()  # numbers: arrays
    assert b["sv"] == strviews.to_pylist()
    assert b["d"] == dict_list.to_pylist()
    assert b["f"] == fsl.to_pylist()


def test_a_transform_sees_and_returns_nested_values():
    tbl = nested_table(10)

    def count(s):
        s["turns"] = len(s["messages"])
        s["roles"] = [m["role"] for m in s["messages"]]
        s["first"] = s["messages"][0]
        return s

    src = chute.arrow(tbl, columns=["id", "messages"])
    b = next(iter(chute.Loader(src, batch_size=10, transforms=[count])))
    rows = tbl.to_pylist()
    assert [int(x) for x in b["turns"]] == [len(r["messages"]) for r in rows]
    assert b["roles"] == [[m["role"] for m in r["messages"]] for r in rows]
    assert b["first"] == [r["messages"][0] for r in rows]


datasets = pytest.importorskip("datasets")


def test_a_hugging_face_dataset_of_nested_columns_reads_with_datasets_values(tmp_path):
    rows = chat_rows(40)
    ds = datasets.Dataset.from_list(rows)
    ds = ds.add_column("score", [None if k % 7 == 0 else k / 3 for k in range(40)])
    assert chute.Loader(ds)._source.format == "arrow"
    got = all_rows(chute.Loader(ds, batch_size=6))
    want = [ds[i] for i in range(len(ds))]
    assert got["messages"] == [w["messages"] for w in want]
    assert got["tags"] == [w["tags"] for w in want]
    assert got["grid"] == [w["grid"] for w in want]
    assert got["meta.source"] == [w["meta"]["source"] for w in want]
    assert [int(x) for x in got["meta.inner.n"]] == [w["meta"]["inner"]["n"] for w in want]
    score = [None if not v else float(x) for x, v in zip(got["score"], got["score_valid"])]
    assert score == [w["score"] for w in want]
    # Saved and loaded as datasets does: the same values, and through a shuffle's indices.
    ds.save_to_disk(str(tmp_path / "chat"))
    loaded = datasets.load_from_disk(str(tmp_path / "chat")).shuffle(seed=3)
    got = all_rows(chute.Loader(loaded, batch_size=5))
    assert got["messages"] == [loaded[i]["messages"] for i in range(len(loaded))]


def write_jsonl(path, rows, opener=open):
    import json

    with opener(path, "wt") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def test_json_lines_read_with_the_values_datasets_gives(tmp_path):
    rows = chat_rows(50)
    for k, r in enumerate(rows):
        if k % 4 == 0:
            r["extra"] = {"note": f"n{k}"}  # a field only some lines have
        r["ratio"] = k if k % 2 else k + 0.5  # integers beside floats: floats
    path = tmp_path / "chat.jsonl"
    write_jsonl(path, rows)
    ds = datasets.load_dataset("json", data_files=str(path), split="train")
    want = [ds[i] for i in range(len(ds))]
    src = chute.dataset(path)
    assert src.format == "json" and len(src) == 50
    got = all_rows(chute.Loader(src, batch_size=8, shuffle=True, seed=2, num_workers=2))
    order = [int(i) for i in got["id"]]
    by_id = {w["id"]: w for w in want}
    for col in ("messages", "tags", "grid"):
        assert got[col] == [by_id[i][col] for i in order], col
    assert [float(x) for x in got["ratio"]] == [by_id[i]["ratio"] for i in order]
    assert got["meta.source"] == [by_id[i]["meta"]["source"] for i in order]
    note = [x if v else None for x, v in zip(got["extra.note"], got["extra.note_valid"])]
    assert note == [(by_id[i]["extra"] or {}).get("note") for i in order]
    # Compressed (gzip by Python, zstd by pyarrow) and a .json array read the same.
    import gzip
    import json

    write_jsonl(tmp_path / "chat.jsonl.gz", rows, gzip.open)
    with pa.CompressedOutputStream(str(tmp_path / "chat.jsonl.zst"), "zstd") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows).encode())
    (tmp_path / "chat.json").write_text(json.dumps(rows))
    for name, kw in (("chat.jsonl.gz", {}), ("chat.jsonl.zst", {}), ("chat.json", {"format": "json"})):
        again = all_rows(chute.Loader(chute.dataset(tmp_path / name, **kw), batch_size=50))
        assert again["messages"] == [w["messages"] for w in want], name


def test_bad_json_lines_name_the_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": oops}\n')
    with pytest.raises(chute.CorruptDataError, match=r"bad\.jsonl.*line 3: not JSON"):
        chute.dataset(path)
    path.write_text('{"a": 1}\n\n[1, 2]\n')
    with pytest.raises(chute.CorruptDataError, match=r"bad\.jsonl.*line 3: a JSON array, not an object"):
        chute.dataset(path)


MIXED = {  # JSON Lines whose fields `datasets` 5 reads as its Json feature (on_mixed_types)
    "types": [{"a": 1}, {"a": "x"}, {"a": None}, {"a": 2.5}, {"a": [1, {"b": None}]}],
    "keys": [{"m": {"x": 1}}, {"m": {"x": 2, "y": "b"}}, {"m": None}, {"m": {"y": "c"}}],
    "empty": [{"m": {}}, {"m": {}}],
    "tools": [
        {"messages": [{"role": "user", "content": "w\u00e9ather \"here\"?"},
                      {"role": "assistant", "content": None, "tool_calls": [
                          {"id": "c1", "type": "function",
                           "function": {"name": "get", "arguments": "{\"city\": \"Paris\"}"}}]},
                      {"role": "tool", "tool_call_id": "c1", "content": "21"},
                      {"role": "assistant", "content": "21 degrees"}], "id": 0},
        {"messages": [{"role": "user", "content": "hi"},
                      {"role": "assistant", "content": "hello"}], "id": 1},
    ],
    "deep": [{"a": {"b": [{"c": 1}, {"d": 2}], "n": 1}}, {"a": {"b": [], "n": 2}}],
}


@pytest.mark.parametrize("case", sorted(MIXED))
def test_mixed_json_lines_read_as_datasets_json_feature(tmp_path, case):
    """Fields of mixed types, and objects below the top level whose keys differ (a chat's
    tool calls), are the values `datasets.load_dataset("json")` gives (its Json feature):
    each row's own value and keys; in a Hugging Face dataset (the arrow.json extension type)
    and in Parquet and Arrow files of pyarrow's json type, the same."""
    rows = MIXED[case]
    path = tmp_path / f"{case}.jsonl"
    write_jsonl(path, rows)
    ds = datasets.load_dataset("json", data_files=str(path), split="train",
                               cache_dir=str(tmp_path / "cache"))
    assert "Json" in repr(ds.features), ds.features
    want = ds.to_list()

    def records(loader):
        got = all_rows(loader)
        out = []
        for i in range(len(want)):
            r = {}
            for k, v in got.items():
                if k.endswith("_valid"):
                    continue
                ok = got.get(f"{k}_valid")
                val = v[i] if ok is None or ok[i] else None
                val = val.item() if isinstance(val, np.generic) else val
                at = r
                *up, leaf = k.split(".")
                for q in up:
                    at = at.setdefault(q, {})
                at[leaf] = val
            out.append(r)
        return out

    assert records(chute.Loader(chute.dataset(path), batch_size=2, num_workers=2)) == want
    assert records(chute.Loader(ds, batch_size=3)) == want
    # The Hugging Face dataset's table, written by pyarrow: the extension type kept.
    table = ds.data.table
    pq.write_table(table, tmp_path / "t.parquet")
    with ipc.new_file(tmp_path / "t.arrow", table.schema) as w:
        w.write_table(table)
    assert records(chute.Loader(chute.parquet(tmp_path / "t.parquet"), batch_size=2)) == want
    assert records(chute.Loader(chute.arrow(tmp_path / "t.arrow"), batch_size=2)) == want


def test_webdataset_json_members_decode_as_the_webdataset_package_gives_them(tmp_path):
    wds = pytest.importorskip("webdataset")
    import json

    metas = [{"caption": f"c{k}", "size": [k, k + 1], "extra": None, "ok": k % 2 == 0}
             for k in range(12)]
    path = tmp_path / "shard-000000.tar"
    with wds.TarWriter(str(path)) as w:
        for k, m in enumerate(metas):
            # Written as text, key order as given: what a captioning pipeline writes.
            w.write({"__key__": f"s{k:03d}", "json": json.dumps(m).encode(), "cls": str(k)})
    want = [s["json"] for s in wds.WebDataset(str(path), shardshuffle=False).decode()]
    got = all_rows(chute.Loader(chute.webdataset(path), batch_size=5,
                                transforms={"json": [{"op": "json"}]}))
    assert got["json"] == want
    assert [list(d) for d in got["json"]] == [list(m) for m in metas]  # keys in order


def test_gzip_compressed_webdataset_shards_read_as_the_webdataset_package_reads_them(tmp_path):
    wds = pytest.importorskip("webdataset")
    paths = []
    for s in range(2):
        path = tmp_path / f"shard-{s:06d}.tgz"  # TarWriter compresses by the name
        with wds.TarWriter(str(path)) as w:
            for k in range(s * 7, s * 7 + 7):
                w.write({"__key__": f"k{k:03d}", "txt": f"text {k}", "cls": k % 3})
        paths.append(str(path))
    want = list(wds.WebDataset(paths, shardshuffle=False).decode())
    src = chute.dataset(paths)
    assert src.format == "webdataset" and len(src) == 14
    got = all_rows(chute.Loader(src, batch_size=4, shuffle="block", seed=1,
                                transforms={"cls": [{"op": "label"}], "txt": [{"op": "text"}]}))
    by_key = dict(zip(got["__key__"], zip(got["txt"], got["cls"])))
    assert sorted(by_key) == sorted(w["__key__"] for w in want)
    for w in want:
        assert by_key[w["__key__"]] == (w["txt"], w["cls"])
    # A global shuffle fits here (the shards are small), and reads the same samples.
    got = all_rows(chute.Loader(src, batch_size=4, shuffle=True, seed=1))
    assert sorted(got["__key__"]) == sorted(by_key)


def test_the_collector_is_paused_only_while_nested_values_are_made():
    import gc

    tbl = pa.table({"tags": pa.array([[f"t{k}", "x"] for k in range(40)])})
    loader = chute.Loader(chute.arrow(tbl), batch_size=16)
    assert gc.isenabled()
    assert sum(len(b["tags"]) for b in loader) == 40
    assert gc.isenabled()  # resumed after each batch
    gc.disable()
    try:
        assert sum(len(b["tags"]) for b in loader) == 40
        assert not gc.isenabled()  # a collector the user paused stays paused
    finally:
        gc.enable()


def test_json_text_that_is_not_json_is_named_or_skipped(tmp_path):
    """A value of a JSON column (pa.json_()) that is not JSON: an error naming the file, the
    column and the row; with on_error="skip" the row is replaced, as any failed sample."""
    xs = pa.ExtensionArray.from_storage(pa.json_(), pa.array(['{"a": 1}', "{oops", "[1]"]))
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"x": xs, "i": pa.array([0, 1, 2])}), path)
    with pytest.raises(chute.CorruptDataError, match=r'bad\.parquet.*column "x", row 1.* not JSON'):
        list(chute.Loader(chute.parquet(path), batch_size=3))
    loader = chute.Loader(chute.parquet(path), batch_size=3, on_error="skip")
    (batch,) = list(loader)
    assert batch["x"] == [{"a": 1}, [1], [1]] and list(batch["i"]) == [0, 2, 2]
    assert loader.stats()["skipped"] == 1
