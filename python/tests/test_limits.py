"""The limits on sizes read from the data (issue 14): `chute.set_limits` / `chute.limits` and the
CLI's `--limit`. A size over a limit is a data error naming the sample, the size and the limit,
skipped and counted under `on_error="skip"`; raising the limit reads the same data. The bombs
themselves (each decoder's, under a 2 GB address-space limit) are `crates/chute/tests/it/bombs.rs`
and the hostile-file tests below run them from Python too, under `RLIMIT_AS`."""

import io
import subprocess
import textwrap

import numpy as np
import pytest

import chute
from conftest import chute_bin, run_python

wds = pytest.importorskip("webdataset", reason="webdataset not installed (scripts/test.sh installs it)")
Image = pytest.importorskip("PIL.Image", reason="pillow not installed (scripts/test.sh installs it)")

DEFAULTS = {
    "max_image_pixels": 178_956_970,
    "max_record_bytes": 1 << 30,
    "max_decoded_bytes": 1 << 30,
    "max_features": 100_000,
    "max_text_bytes": 16 << 20,
}


@pytest.fixture(autouse=True)
def restore_limits():
    before = chute.limits()
    yield
    chute.set_limits(**before)


def png(w, h):
    buf = io.BytesIO()
    Image.fromarray(np.full((h, w, 3), 90, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def shard(tmp_path, samples):
    path = tmp_path / "s.tar"
    with wds.TarWriter(str(path)) as sink:
        for key, fields in samples:
            sink.write({"__key__": key, **fields})
    return str(path)


def test_limits_are_named_set_and_refused_when_nonsense():
    assert chute.limits() == DEFAULTS
    chute.set_limits(max_features=7, max_text_bytes=1 << 20)
    assert chute.limits() == {**DEFAULTS, "max_features": 7, "max_text_bytes": 1 << 20}
    with pytest.raises(chute.ConfigError, match="max_record_bytes"):
        chute.set_limits(max_record_bytes=0)
    with pytest.raises(TypeError):
        chute.set_limits(max_pixels=5)  # not a limit


def test_an_image_over_max_image_pixels_is_skipped_naming_it_and_read_once_raised(tmp_path):
    urls = shard(tmp_path, [("a", {"png": png(20, 20)}), ("big", {"png": png(300, 200)}),
                            ("c", {"png": png(20, 20)})])
    ops = {"png": [{"op": "decode"}, {"op": "center_crop", "size": 8}]}
    chute.set_limits(max_image_pixels=10_000)
    loader = chute.Loader(chute.webdataset(urls), batch_size=1, transforms=ops, on_error="skip")
    assert sum(len(b["png"]) for b in loader) == 3  # the skipped sample is replaced
    stats = loader.stats()
    assert stats["skipped"] == 1
    why = stats["skipped_recent"][0]
    assert "big" in why and "300 x 200 = 60000 pixels" in why and "max_image_pixels = 10000" in why
    with pytest.raises(chute.CorruptDataError, match="max_image_pixels"):
        list(chute.Loader(chute.webdataset(urls), batch_size=1, transforms=ops))
    chute.set_limits(max_image_pixels=100_000)
    loader = chute.Loader(chute.webdataset(urls), batch_size=1, transforms=ops)
    assert sum(len(b["png"]) for b in loader) == 3 and loader.stats()["skipped"] == 0


def test_a_member_over_max_record_bytes_is_refused_by_the_source_and_the_cli(tmp_path):
    urls = shard(tmp_path, [("a", {"bin": b"x" * 100}), ("b", {"bin": b"y" * 5000})])
    chute.set_limits(max_record_bytes=1000)
    with pytest.raises(chute.CorruptDataError, match=r"declares 5000 bytes, more than max_record_bytes = 1000"):
        list(chute.Loader(chute.webdataset(urls, index="scan"), batch_size=1))
    chute.set_limits(max_record_bytes=10_000)
    assert sum(len(b["bin"]) for b in chute.Loader(chute.webdataset(urls, index="scan"), batch_size=1)) == 2
    binary = chute_bin()
    run = lambda *a: subprocess.run([binary, *a], capture_output=True, text=True, timeout=120)
    bad = run("bench", urls, "--limit", "max_record_bytes=1000", "--epochs", "1")
    assert bad.returncode != 0 and "max_record_bytes = 1000" in bad.stderr, bad.stderr
    assert run("bench", urls, "--limit", "max_record_bytes=1_000_000", "--epochs", "1").returncode == 0
    nonsense = run("bench", urls, "--limit", "max_pixels=3")
    assert nonsense.returncode == 2 and "max_image_pixels" in nonsense.stderr, nonsense.stderr


def test_text_over_max_text_bytes_is_skipped_before_the_tokenizer(tmp_path):
    tk = pytest.importorskip("tokenizers", reason="tokenizers not installed (scripts/test.sh installs it)")
    tok = tk.Tokenizer(tk.models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = tk.pre_tokenizers.Whitespace()
    path = str(tmp_path / "tok.json")
    tok.save(path)
    urls = shard(tmp_path, [("short", {"txt": b"a b a"}), ("long", {"txt": b"a b " * 400}),
                            ("short2", {"txt": b"b b"})])
    chute.set_limits(max_text_bytes=1000)
    ops = {"txt": [{"op": "tokenize", "tokenizer": path}]}
    loader = chute.Loader(chute.webdataset(urls), batch_size=1, transforms=ops, on_error="skip")
    got = [list(b["txt"][0]) for b in loader]
    assert len(got) == 3 and [0, 1, 0] in got
    why = loader.stats()["skipped_recent"][0]
    assert "long" in why and "declares 1600 bytes, more than max_text_bytes = 1000" in why, why


HOSTILE = textwrap.dedent("""
    import resource, sys, chute
    resource.setrlimit(resource.RLIMIT_AS, (2_000_000_000, 2_000_000_000))
    path, fmt = sys.argv[1], sys.argv[2]
    try:
        for batch in chute.Loader(chute.dataset(path, format=fmt), batch_size=1):
            pass
    except chute.ChuteError as e:
        print("refused:", e)
    else:
        print("read")
""")


def test_a_parquet_page_claiming_2gb_is_refused_under_a_2gb_address_space(tmp_path):
    """A Parquet file written by pyarrow, then edited: its page header claims 2^31 - 1 bytes
    uncompressed (arrow-rs reserves that much before decompressing). Refused, not aborted. The
    other hostile Parquet sizes (row counts, chunk ranges) are in the Rust bombs test."""
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow not installed (scripts/test.sh installs it)")
    import pyarrow as pa

    path = tmp_path / "x.parquet"
    # 2^25 int32s in one page: the page's uncompressed size is a 5-byte varint to rewrite.
    import inspect
    if "max_rows_per_page" not in inspect.signature(pq.write_table).parameters:
        pytest.skip("this pyarrow cuts pages at 20,000 rows whatever data_page_size says")
    pq.write_table(pa.table({"x": np.zeros(1 << 25, np.int32)}), path, compression="snappy",
                   use_dictionary=False, data_page_size=1 << 30, row_group_size=1 << 25,
                   max_rows_per_page=1 << 25, write_statistics=False)
    data = bytearray(path.read_bytes())
    at = pq.ParquetFile(path).metadata.row_group(0).column(0).data_page_offset
    # PageHeader: field 1 (type) = 0, then field 2 (uncompressed size) as a zigzag varint.
    assert data[at:at + 3] == b"\x15\x00\x15"
    old = data[at + 3:at + 8]
    assert all(b & 0x80 for b in old[:4]) and not old[4] & 0x80, "a 5-byte varint"
    data[at + 3:at + 8] = bytes([0xFE, 0xFF, 0xFF, 0xFF, 0x0F])  # zigzag(2^31 - 1)
    path.write_bytes(bytes(data))
    out = run_python(HOSTILE, path, "parquet", timeout=300)
    assert out.stdout.startswith("refused:") and "max_decoded_bytes" in out.stdout, out.stdout
