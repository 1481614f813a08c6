"""``chute.dataset``: one opener for every format, folders, globs and manifests included; the
per-format functions are the same opener with the format fixed. Shards are written by the
peers' own writers (webdataset, pyarrow) and by ``chute convert`` (TFRecord, whose bytes
TensorFlow reads: testdata/tfrecord/README.md)."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

import chute
from conftest import chute_bin

TESTDATA = Path(__file__).resolve().parents[2] / "testdata"


def ids(loader, column):
    return [v for b in loader for v in np.asarray(b[column]).tolist()]


@pytest.fixture
def wds_dir(tmp_path):
    wds = pytest.importorskip("webdataset", reason="webdataset not installed (scripts/test.sh installs it)")
    d = tmp_path / "wds"
    d.mkdir()
    with wds.ShardWriter(str(d / "part-%04d.tar"), maxcount=6) as sink:
        for i in range(15):
            sink.write({"__key__": f"k{i:03d}", "cls": str(i).encode()})
    (d / "README.md").write_text("not a shard")
    return d


@pytest.fixture
def parquet_dir(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="pyarrow not installed (scripts/test.sh installs it)")
    pq = pytest.importorskip("pyarrow.parquet")
    d = tmp_path / "pq"
    d.mkdir()
    for f, n in [(1, 7), (0, 5)]:
        start = f * 100
        pq.write_table(pa.table({"x": pa.array(np.arange(start, start + n, dtype=np.int64))}),
                       d / f"part-{f}.parquet", row_group_size=3)
    return d


@pytest.fixture
def tfrecord_dir(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(9)))
    d = tmp_path / "tf"
    subprocess.run([chute_bin(), "convert", str(rows), "--to", "tfrecord", "-o", str(d),
                    "--shard-size", "4"], check=True, capture_output=True)
    return d


def test_folders_of_each_format(wds_dir, parquet_dir, tfrecord_dir):
    src = chute.dataset(wds_dir)
    assert src.format == "webdataset" and len(src) == 15
    assert [Path(p).name for p, _ in src.shards] == ["part-0000.tar", "part-0001.tar", "part-0002.tar"]
    assert sorted(int(c) for c in ids(chute.Loader(src, batch_size=4, shuffle=True), "cls")) == list(range(15))

    src = chute.dataset(parquet_dir)
    assert src.format == "parquet"
    # Files in name order: part-0 (rows 0..4) before part-1 (rows 100..106).
    assert ids(chute.Loader(src, batch_size=4), "x") == list(range(5)) + list(range(100, 107))

    src = chute.dataset(tfrecord_dir)
    assert src.format == "tfrecord"
    assert ids(chute.Loader(src, batch_size=4), "id") == list(range(9))
    # The per-format function takes a folder too.
    assert len(chute.tfrecord(tfrecord_dir)) == 9


def test_manifests_and_globs(wds_dir):
    subprocess.run([chute_bin(), "index", str(wds_dir)], check=True, capture_output=True)
    manifest = wds_dir / "manifest.json"
    assert manifest.exists()
    by_manifest = chute.dataset(manifest)
    by_folder = chute.dataset(wds_dir)   # the folder's manifest.json
    by_glob = chute.dataset(str(wds_dir / "part-*.tar"))
    by_braces = chute.webdataset(str(wds_dir / "part-{0000..0002}.tar"))
    fingerprints = {s.fingerprint for s in (by_manifest, by_folder, by_glob, by_braces)}
    assert len(fingerprints) == 1
    # A shard that changed after indexing: the manifest no longer matches.
    with open(wds_dir / "part-0002.tar", "ab") as f:
        f.write(b"\0" * 1024)
    with pytest.raises(chute.CorruptDataError, match="run `chute index` again") as e:
        chute.dataset(manifest)
    assert e.value.kind == "stale_index" and e.value.path == str(manifest)


def test_format_errors_are_config_errors(tmp_path, wds_dir):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(chute.ConfigError, match="holds no shards"):
        chute.dataset(empty)
    with pytest.raises(chute.ConfigError, match=r"extension \.txt"):
        chute.dataset(tmp_path / "x.txt")
    with pytest.raises(chute.ConfigError, match="not a format chute reads"):
        chute.dataset(wds_dir, format="csv")
    with pytest.raises(chute.ConfigError, match="no files match"):
        chute.dataset(str(tmp_path / "*.parquet"))
    with pytest.raises(chute.ConfigError, match="index"):
        chute.dataset(wds_dir, index="sometimes")


def test_a_missing_index_under_require_is_the_same_error_for_both_indexed_formats(wds_dir, tfrecord_dir):
    for folder in (wds_dir, tfrecord_dir):
        with pytest.raises(FileNotFoundError, match=r"\.idx"):
            chute.dataset(folder, index="require")
    subprocess.run([chute_bin(), "index", str(tfrecord_dir)], check=True, capture_output=True)
    assert len(chute.dataset(tfrecord_dir, index="require")) == 9


def test_corrupt_data_errors_carry_their_kind(tmp_path):
    good = (TESTDATA / "tfrecord" / "examples.tfrecord").read_bytes()
    cut = tmp_path / "cut.tfrecord"
    cut.write_bytes(good[: len(good) - 7])
    with pytest.raises(chute.CorruptDataError) as e:
        chute.dataset(cut)
    assert e.value.kind == "truncated" and e.value.path == str(cut)
    assert isinstance(e.value.offset, int)
    flipped = bytearray(good)
    flipped[20] ^= 0x01
    bad = tmp_path / "bad.tfrecord"
    bad.write_bytes(bytes(flipped))
    with pytest.raises(chute.CorruptDataError) as e:
        list(chute.Loader(chute.dataset(bad), batch_size=5))
    assert e.value.kind == "checksum"
