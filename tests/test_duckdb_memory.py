"""With RAGBATCH_DUCKDB_MEMORY_LIMIT set, the driver's DuckDB (row-conservation check
and summary) runs under that memory cap and spills to a private temporary folder."""

from __future__ import annotations

import datetime as dt
import os

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from ragbatch.config import OutputSection
from ragbatch.errors import ConservationError
from ragbatch.io.write import OutputLayout, connect, verify_run


def _setting(con, name: str) -> str:
    return con.execute(f"SELECT current_setting('{name}')").fetchone()[0]


def _as_duckdb_prints(size: str) -> str:
    """How a fresh DuckDB spells ``size`` once set (DuckDB's own conversion)."""
    con = duckdb.connect()
    con.execute(f"SET memory_limit = '{size}'")
    return _setting(con, "memory_limit")


@pytest.fixture
def layout(tmp_path):
    return OutputLayout.for_run(OutputSection(uri=str(tmp_path / "out")), dt.date(2026, 1, 2), "r1")


def test_default_and_cap(layout, monkeypatch):
    monkeypatch.delenv("RAGBATCH_DUCKDB_MEMORY_LIMIT", raising=False)
    con = connect(layout)
    assert _setting(con, "memory_limit") == _setting(duckdb.connect(), "memory_limit")
    monkeypatch.setenv("RAGBATCH_DUCKDB_MEMORY_LIMIT", "3GB")
    assert _setting(connect(layout), "memory_limit") == _as_duckdb_prints("3GB")


def test_check_spills_and_still_counts(layout, tmp_path, monkeypatch):
    # 200,000 rows x 2 metrics under a 64 MB cap: the counts must still be exact, and
    # the spill folder must be gone once the connection is closed.
    monkeypatch.setenv("RAGBATCH_DUCKDB_MEMORY_LIMIT", "64MB")
    n = 200_000
    ids = pc.binary_join_element_wise("file.parquet:", pa.array(np.arange(n).astype(str)), "")
    ok = pa.array(np.arange(n) % 10 != 0)
    files = []
    for k, metric in enumerate(("m1", "m2")):
        path = tmp_path / f"part-{k}.parquet"
        pq.write_table(pa.table({
            "row_id": ids, "metric": pa.array(np.full(n, metric)),
            "score": pc.if_else(ok, 1.0, pa.scalar(None, pa.float64())),
            "status": pc.if_else(ok, "ok", "error"),
            "model": pa.nulls(n, pa.string()),
        }), path)
        files.append(str(path))
    before = set(os.listdir(os.path.dirname(connect(layout).execute(
        "SELECT current_setting('temp_directory')").fetchone()[0])))
    check = verify_run(layout, files, ["m1", "m2"], n)
    assert check.counts == {"m1": {"error": n // 10, "ok": n - n // 10},
                            "m2": {"error": n // 10, "ok": n - n // 10}}
    with pytest.raises(ConservationError, match="200000 cells, expected 200001"):
        verify_run(layout, files, ["m1", "m2"], n + 1)
    import gc

    gc.collect()
    spill_root = os.path.dirname(connect(layout).execute(
        "SELECT current_setting('temp_directory')").fetchone()[0])
    left = {d for d in set(os.listdir(spill_root)) - before if d.startswith("ragbatch-duckdb-")}
    assert left == set()
