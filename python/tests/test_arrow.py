"""Arrow IPC files and streams written by pyarrow, Polars-style tables in memory, and Hugging
Face datasets (written by the real `datasets` package: `save_to_disk` folders, `load_dataset`
caches, `shuffle()` / `select()` indices mappings) read natively by chute."""

import json
import textwrap

import numpy as np
import pytest

import chute
from conftest import run_python

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


def all_rows(loader):
    out = {}
    for batch in loader:
        for k, v in batch.items():
            out.setdefault(k, []).extend(list(v))
    return out


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
        list(chute.Loader(chute.dataset(nulls), batch_size=3))
    with pytest.raises(chute.ConfigError, match="has no column"):
        chute.dataset(nulls, columns=["w"])


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
