"""Decimals: float64 by default (the nearest double), exact on request (``decimals="exact"``:
``decimal.Decimal`` values, as pyarrow's ``to_pylist`` and ``datasets`` give them), from
Parquet, Arrow IPC and tables in memory, flat and inside lists."""

import decimal
import json
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import chute
from conftest import chute_bin

D = decimal.Decimal


def table():
    n = 30
    return pa.table({
        "price": pa.array([None if i % 6 == 2 else D(i * 37 - 400) / 100 for i in range(n)],
                          pa.decimal128(12, 2)),
        "huge": pa.array([D("123456789012345678901234567890.123456789") * (i - 15)
                          for i in range(n)], pa.decimal256(60, 9)),
        "small": pa.array([D(i) / 1000 for i in range(n)], pa.decimal32(6, 3)),
        "mid": pa.array([D(-i) for i in range(n)], pa.decimal64(15, 0)),
        "lists": pa.array([[D(i) / 10, None][: i % 3] if i % 5 else None for i in range(n)],
                          pa.list_(pa.decimal128(8, 1))),
        "i": pa.array(range(n)),
    })


def rows(loader):
    out = {}
    for batch in loader:
        for k, v in batch.items():
            out.setdefault(k, []).extend(list(v))
    return out


@pytest.mark.parametrize("how", ["parquet", "arrow-file", "table"])
def test_exact_decimals_are_pyarrows_values(tmp_path, how):
    t = table()
    if how == "parquet":
        pq.write_table(t, tmp_path / "t.parquet", row_group_size=7)
        src = chute.parquet(str(tmp_path / "t.parquet"), decimals="exact")
    elif how == "arrow-file":
        with pa.ipc.new_file(tmp_path / "t.arrow", t.schema) as w:
            w.write_table(t, max_chunksize=11)
        src = chute.dataset(str(tmp_path / "t.arrow"), decimals="exact")
    else:
        src = chute.arrow(t, decimals="exact")
    got = rows(chute.Loader(src, batch_size=8, shuffle=False))
    for name in ["price", "huge", "small", "mid", "lists"]:
        want = t.column(name).to_pylist()
        assert got[name] == want, name
        # The same text too (scale kept: Decimal("1.00") is not Decimal("1")).
        assert [repr(x) for x in got[name]] == [repr(x) for x in want], name
    assert got["price_valid"] == [v is not None for v in t.column("price").to_pylist()]
    # Float by default: the nearest doubles, a different fingerprint.
    default = chute.arrow(t) if how == "table" else None
    if default is not None:
        assert default.fingerprint != src.fingerprint
        got = rows(chute.Loader(default, batch_size=8))
        assert [float(x) for x in got["small"]] == [float(D(i) / 1000) for i in range(30)]


def test_exact_decimals_from_the_cli_and_a_bad_choice(tmp_path):
    t = table()
    pq.write_table(t, tmp_path / "t.parquet")
    out = subprocess.run([chute_bin(), "inspect", str(tmp_path / "t.parquet"), "--decimals",
                          "exact", "--json"], check=True, capture_output=True, text=True).stdout
    first = json.loads(out)["first"][0]["fields"]
    # Rust and the CLI give an exact decimal as its text.
    assert first["price"] == "-4.00" and first["huge"] == str(t.column("huge")[0].as_py())
    with pytest.raises(chute.ConfigError, match="decimals"):
        chute.parquet(str(tmp_path / "t.parquet"), decimals="double")


def test_a_hugging_face_dataset_with_exact_decimals():
    datasets = pytest.importorskip("datasets")
    t = pa.table({
        "price": pa.array([D(i * 37 - 400) / 100 for i in range(12)], pa.decimal128(12, 2)),
        "i": pa.array(range(12)),
    })
    ds = datasets.Dataset(t).shuffle(seed=3)  # an indices mapping
    got = rows(chute.Loader(chute.arrow(ds, decimals="exact"), batch_size=5))
    assert got["price"] == ds["price"]  # datasets gives decimal.Decimal values
    assert [repr(x) for x in got["price"]] == [repr(x) for x in ds["price"]]
    # The Loader takes the dataset itself with the default reading (float64).
    got = rows(chute.Loader(ds, batch_size=5))
    assert got["price"] == [float(p) for p in ds["price"]]
