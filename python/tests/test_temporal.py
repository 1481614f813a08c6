"""Timestamps, dates and durations as numpy's datetime64 / timedelta64 (NaT for nulls), with
their unit and zone in ``Source.column_types``, from Parquet, Arrow IPC and Hugging Face
datasets, compared with what pyarrow's ``to_numpy`` and ``datasets``' numpy format give."""

import datetime as dt
import decimal
import json
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

import chute
from conftest import chute_bin


def table(n=40):
    base = dt.datetime(2024, 3, 1, 12, 30)
    return pa.table({
        "ts": pa.array([None if i % 7 == 3 else base + dt.timedelta(hours=i) for i in range(n)],
                       pa.timestamp("us", tz="Europe/Paris")),
        "ts_ns": pa.array([i * 1_000_000_007 for i in range(n)], pa.timestamp("ns")),
        "day": pa.array([None if i % 5 == 0 else dt.date(2000, 1, 1) + dt.timedelta(days=i * 40)
                         for i in range(n)], pa.date32()),
        "d64": pa.array([dt.date(1969, 7, 20) + dt.timedelta(days=i) for i in range(n)],
                        pa.date64()),
        "took": pa.array([None if i % 4 == 1 else i * 250 for i in range(n)], pa.duration("ms")),
        "tod": pa.array([i * 1000 for i in range(n)], pa.time64("us")),
        "price": pa.array([decimal.Decimal(i) / 4 for i in range(n)], pa.decimal128(12, 2)),
        "i": pa.array(range(n), pa.int64()),
    })


def all_rows(loader):
    out = {}
    for batch in loader:
        for k, v in batch.items():
            out.setdefault(k, []).append(v)
    return {k: np.concatenate(v) if isinstance(v[0], np.ndarray) else sum(v, [])
            for k, v in out.items()}


def check(got, t):
    for name in ["ts", "ts_ns", "day", "d64", "took"]:
        want = t.column(name).to_numpy(zero_copy_only=False)
        if name == "d64":
            # date64 counts milliseconds: datetime64[ms] (pyarrow converts to days, [D]);
            # the same dates.
            assert got[name].dtype == np.dtype("datetime64[ms]")
            want = want.astype("datetime64[ms]")
        assert got[name].dtype == want.dtype, (name, got[name].dtype, want.dtype)
        # NaT where null (NaT != NaT, so compare as int64 with both NaT the same).
        assert np.array_equal(got[name].view(np.int64), want.view(np.int64)), name
    # Times of day have no numpy type: int64 counts of their unit.
    assert got["tod"].dtype == np.int64
    assert got["tod"].tolist() == [x.value for x in t.column("tod")]


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_time_columns_are_datetime64_and_timedelta64(tmp_path, kind):
    t = table()
    if kind == "parquet":
        path = tmp_path / "t.parquet"
        pq.write_table(t, path, coerce_timestamps=None)
        t = pq.read_table(path)  # what the file holds (Parquet has no seconds, say)
        src = chute.parquet(str(path))
    else:
        path = tmp_path / "t.arrow"
        feather.write_feather(t, path, compression="uncompressed")
        src = chute.dataset(str(path))
    assert src.column_types["ts"] == "timestamp[us, tz=Europe/Paris]"
    assert src.column_types["day"] == "date32[day]"
    assert src.column_types["took"] == "duration[ms]"
    assert src.column_types["tod"] == "time64[us]"
    assert src.column_types["price"] == "decimal128(12, 2)"
    assert "i" not in src.column_types
    assert src.numpy_types == {"ts": "datetime64[us]", "ts_ns": "datetime64[ns]",
                               "day": "datetime64[D]", "d64": "datetime64[ms]",
                               "took": "timedelta64[ms]"}
    got = all_rows(chute.Loader(src, batch_size=16, shuffle=False))
    check(got, t)
    assert got["ts_valid"].tolist() == [i % 7 != 3 for i in range(40)]


def test_torch_output_keeps_the_int64_counts(tmp_path):
    torch = pytest.importorskip("torch")
    t = table(8)
    path = tmp_path / "t.parquet"
    pq.write_table(t, path)
    batch = next(iter(chute.Loader(chute.parquet(str(path)), batch_size=8, output="torch")))
    assert batch["took"].dtype == torch.int64
    assert batch["d64"].tolist() == [(dt.date(1969, 7, 20) - dt.date(1970, 1, 1)).days * 86400000
                                     + i * 86400000 for i in range(8)]


def test_hugging_face_time_columns_as_datasets_numpy_format_gives_them():
    datasets = pytest.importorskip("datasets")
    t = table(24)
    ds = datasets.Dataset(t.drop_columns(["price"]))
    want = ds.with_format("numpy")[:]
    got = all_rows(chute.Loader(ds, batch_size=10))
    for name in ["ts", "ts_ns", "day", "took"]:
        # datasets gives durations as int64 counts (NaT's bits where null): chute, as numpy's
        # timedelta64, of the same counts.
        want_dtype = np.dtype("timedelta64[ms]") if name == "took" else want[name].dtype
        assert got[name].dtype == want_dtype, name
        assert np.array_equal(got[name].view(np.int64), want[name].view(np.int64)), name


def test_inspect_shows_units_and_zones(tmp_path):
    chute_cli = chute_bin()
    path = tmp_path / "t.parquet"
    pq.write_table(table(4), path)
    out = subprocess.run([chute_cli, "inspect", str(path), "--json"], check=True,
                         capture_output=True, text=True).stdout
    types = json.loads(out)["types"]
    assert types["ts"] == {"name": "ts", "source": "timestamp[us, tz=Europe/Paris]",
                           "numpy": "datetime64[us]"}
    assert types["price"] == {"name": "price", "source": "decimal128(12, 2)"}
    text = subprocess.run([chute_cli, "inspect", str(path)], check=True, capture_output=True,
                          text=True).stdout
    assert "ts: timestamp[us, tz=Europe/Paris] (numpy datetime64[us])" in text
