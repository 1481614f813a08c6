"""Dictionary-encoded columns: their values by default, ``int64`` codes into one dictionary
for the whole source on request (``dictionaries="codes"``), the dictionary in
``Source.dictionaries``; parts with dictionaries of their own (row groups, record batches, an
IPC stream that replaces a dictionary between batches) agree with pyarrow's values."""

import json
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import chute
from conftest import all_rows, chute_bin

pd = pytest.importorskip("pandas")

CATS = ["low", "mid", "high", "unused"]


def frame(n=50):
    levels = np.array(CATS[:3])[(np.arange(n) * 7) % 3]
    level = pd.Categorical(levels, categories=CATS)
    level[::11] = np.nan  # some nulls
    return pd.DataFrame({"level": level, "x": np.arange(n)})


def test_a_pandas_categorical_keeps_its_codes_across_row_groups(tmp_path):
    df = frame()
    path = tmp_path / "cat.parquet"
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path, row_group_size=8)
    src = chute.parquet(str(path), dictionaries="codes")
    assert src.dictionaries == {"level": CATS}  # every category, unused ones included
    assert src.column_types["level"].endswith("(codes)")
    got = all_rows(chute.Loader(src, batch_size=16, shuffle=True, seed=4))
    order = np.argsort(got["x"])
    codes = np.array(got["level"])[order]
    valid = np.array(got["level_valid"])[order]
    want = df["level"].cat.codes.to_numpy()
    assert np.array_equal(valid, want >= 0)
    assert np.array_equal(codes[valid], want[want >= 0])
    assert codes.dtype == np.int64
    # Values by default, and codes are another fingerprint.
    plain = chute.parquet(str(path))
    assert plain.fingerprint != src.fingerprint and plain.dictionaries == {}
    got = all_rows(chute.Loader(plain, batch_size=50))
    assert [v if ok else None for v, ok in zip(got["level"], got["level_valid"])] == \
        [None if pd.isna(v) else v for v in df["level"]]


def batches_with_own_dictionaries():
    return pa.table({"c": pa.chunked_array([
        pa.array(["a", "b", None, "a"]).dictionary_encode(),
        pa.array(["z", "b"]).dictionary_encode(),
        pa.array([3, 1]).cast(pa.string()).dictionary_encode(),
    ])})


@pytest.mark.parametrize("how", ["table", "stream", "file"])
def test_parts_with_their_own_dictionaries(tmp_path, how):
    t = batches_with_own_dictionaries()
    if how == "table":
        data = t
    elif how == "stream":  # a stream replaces the dictionary between batches
        data = str(tmp_path / "c.arrows")
        with pa.ipc.new_stream(data, t.schema) as w:
            w.write_table(t)
    else:  # a file holds one dictionary
        t = t.unify_dictionaries()
        data = str(tmp_path / "c.arrow")
        with pa.ipc.new_file(data, t.schema) as w:
            w.write_table(t)
    want = t.column("c").to_pylist()
    got = all_rows(chute.Loader(chute.arrow(data), batch_size=8))
    assert [v if ok else None for v, ok in zip(got["c"], got["c_valid"])] == want
    src = chute.arrow(data, dictionaries="codes")
    values = src.dictionaries["c"]
    assert sorted(values) == ["1", "3", "a", "b", "z"]
    got = all_rows(chute.Loader(src, batch_size=8))
    assert [values[v] if ok else None for v, ok in zip(got["c"], got["c_valid"])] == want


def test_codes_need_dictionaries_of_strings_bytes_or_integers(tmp_path):
    t = pa.table({"f": pa.array([1.5, 2.5, 1.5]).dictionary_encode()})
    with pytest.raises(chute.ConfigError, match="codes are made for dictionaries of strings"):
        chute.arrow(t, dictionaries="codes")
    with pytest.raises(chute.ConfigError, match="dictionaries"):
        chute.arrow(t, dictionaries="ids")
    assert all_rows(chute.Loader(chute.arrow(t), batch_size=3))["f"] == [1.5, 2.5, 1.5]


def test_inspect_shows_the_dictionary(tmp_path):
    path = tmp_path / "cat.parquet"
    pq.write_table(pa.Table.from_pandas(frame(), preserve_index=False), path)
    out = subprocess.run([chute_bin(), "inspect", str(path), "--dictionaries", "codes",
                          "--json"], check=True, capture_output=True, text=True).stdout
    level = json.loads(out)["types"]["level"]
    assert level["dictionary"] == CATS and level["source"].endswith("(codes)")
