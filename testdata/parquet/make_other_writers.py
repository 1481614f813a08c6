"""Writes the small Parquet files of other writers than pyarrow that chute's footer and
page-header walk is tested on (`crates/formats/src/parquet/thrift.rs`): DuckDB's and
Polars' own writers, with nested, decimal, UUID, timestamp and categorical columns, V2
pages, statistics and several codecs.

    pip install duckdb polars && python make_other_writers.py
"""

import datetime

import duckdb
import polars as pl

con = duckdb.connect()
con.execute(
    """COPY (SELECT i::INT AS a, i::BIGINT * 3 AS b, 'x' || i AS s, [i, i + 1] AS l,
    {'k': i, 'v': 'z'} AS st, (i / 7.0)::DECIMAL(10, 3) AS d,
    TIMESTAMP '2020-01-01' + INTERVAL (i) SECOND AS t, i % 2 = 0 AS bo,
    ('00000000-0000-0000-0000-' || lpad(i::VARCHAR, 12, '0'))::UUID AS u
    FROM range(300) t(i)) TO 'duckdb.parquet' (FORMAT PARQUET, ROW_GROUP_SIZE 100)"""
)
con.execute(
    """COPY (SELECT i AS a, 'y' || (i % 10) AS s FROM range(300) t(i))
    TO 'duckdb_zstd_v2.parquet' (FORMAT PARQUET, COMPRESSION ZSTD, PARQUET_VERSION V2)"""
)
n = 300
df = pl.DataFrame(
    {
        "a": list(range(n)),
        "f": [i / 3 for i in range(n)],
        "s": [f"s{i % 13}" for i in range(n)],
        "l": [[i, i] for i in range(n)],
        "cat": pl.Series([str(i % 5) for i in range(n)]).cast(pl.Categorical),
        "dt": [datetime.datetime(2021, 1, 1) + datetime.timedelta(seconds=i) for i in range(n)],
        "b": [i % 3 == 0 for i in range(n)],
    }
)
df.write_parquet("polars.parquet", statistics=True, row_group_size=100)
df.write_parquet("polars_lz4.parquet", compression="lz4", data_page_size=512)
