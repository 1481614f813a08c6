"""`chute convert` output read back by the peers' own libraries: WebDataset shards by the
`webdataset` package, Parquet files by pyarrow (both installed by scripts/test.sh).

The `chute` command comes from $CHUTE_BIN (scripts/test.sh points it at the debug build that
`cargo test` made), else from the repository's target folder."""

import json
import subprocess

import numpy as np
import pytest

from conftest import chute_bin


def convert(*args):
    subprocess.run([chute_bin(), "convert", "-q", *map(str, args)], check=True)


def write_csv(path, rows=23):
    lines = ["id,label,score,caption"]
    for i in range(rows):
        lines.append(f'k{i:03d},{i % 5},{i * 0.25},"a, {i}"')
    path.write_text("\n".join(lines) + "\n")


def test_csv_to_webdataset_read_by_the_webdataset_package(tmp_path):
    wds = pytest.importorskip("webdataset", reason="webdataset not installed (scripts/test.sh installs it)")
    write_csv(tmp_path / "t.csv")
    convert(tmp_path / "t.csv", "--to", "webdataset", "-o", tmp_path / "out", "--shard-size", "10",
            "--key", "id")
    urls = str(tmp_path / "out" / "data-{000000..000002}.tar")
    samples = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False))
    assert [s["__key__"] for s in samples] == [f"k{i:03d}" for i in range(23)]
    for i, s in enumerate(samples):
        assert s["label"] == str(i % 5).encode()
        assert float(s["score"]) == i * 0.25
        assert s["caption"] == f"a, {i}".encode()


def test_image_folder_and_npy_to_webdataset_decoded_by_the_webdataset_package(tmp_path):
    wds = pytest.importorskip("webdataset", reason="webdataset not installed (scripts/test.sh installs it)")
    for c in ("cat", "dog"):
        (tmp_path / "imgs" / c).mkdir(parents=True)
        for i in range(3):
            (tmp_path / "imgs" / c / f"{i}.jpg").write_bytes(f"{c}-{i}".encode())
    convert(tmp_path / "imgs", "--to", "webdataset", "-o", tmp_path / "wds", "--shard-size", "4")
    samples = list(wds.WebDataset(str(tmp_path / "wds" / "data-{000000..000001}.tar"),
                                  shardshuffle=False, empty_check=False).decode())
    assert [s["__key__"] for s in samples] == [f"{c}/{i}" for c in ("cat", "dog") for i in range(3)]
    assert [s["cls"] for s in samples] == [0, 0, 0, 1, 1, 1]  # webdataset decodes .cls to int
    assert samples[4]["jpg"] == b"dog-1"  # not an image: left as bytes by the decoder

    x = np.arange(5 * 2 * 3, dtype=np.float32).reshape(5, 2, 3)
    y = np.arange(5, dtype=np.int64) * 7
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    convert(tmp_path / "x.npy", tmp_path / "y.npy", "--to", "webdataset", "-o", tmp_path / "npy")
    samples = list(wds.WebDataset(str(tmp_path / "npy" / "data-000000.tar"), shardshuffle=False,
                                  empty_check=False).decode())
    assert len(samples) == 5
    for i, s in enumerate(samples):
        assert s["x.npy"].dtype == np.float32 and np.array_equal(s["x.npy"], x[i])
        assert np.array_equal(s["y.npy"], y[i])


def test_csv_jsonl_and_npy_to_parquet_read_by_pyarrow(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow not installed (scripts/test.sh installs it)")
    import pyarrow as pa

    write_csv(tmp_path / "t.csv")
    convert(tmp_path / "t.csv", "--to", "parquet", "-o", tmp_path / "csv", "--shard-size", "10")
    table = pa.concat_tables(pq.read_table(p) for p in sorted((tmp_path / "csv").glob("*.parquet")))
    assert table.schema.field("label").type == pa.int64()
    assert table.schema.field("score").type == pa.float64()
    assert table.schema.field("caption").type == pa.string()
    assert table.column("id").to_pylist() == [f"k{i:03d}" for i in range(23)]
    assert table.column("score").to_pylist() == [i * 0.25 for i in range(23)]

    with open(tmp_path / "t.jsonl", "w") as f:
        for i in range(9):
            f.write(json.dumps({"v": [i, i + 0.5], "n": i, "tag": {"i": i}}) + "\n")
    convert(tmp_path / "t.jsonl", "--to", "parquet", "-o", tmp_path / "jl")
    table = pq.read_table(tmp_path / "jl" / "data-000000.parquet")
    assert table.schema.field("v").type == pa.list_(pa.field("item", pa.float64(), False), 2)
    assert table.column("v").to_pylist() == [[i, i + 0.5] for i in range(9)]
    assert [json.loads(t) for t in table.column("tag").to_pylist()] == [{"i": i} for i in range(9)]

    x = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    np.save(tmp_path / "feat.npy", x)
    convert(tmp_path / "feat.npy", "--to", "parquet", "-o", tmp_path / "npy")
    got = pq.read_table(tmp_path / "npy" / "data-000000.parquet").column("feat")
    assert np.array_equal(np.array(got.to_pylist(), dtype=np.float32), x)
