"""The driver's DuckDB (row-conservation check and summary) runs under a memory cap
(RAGBATCH_DUCKDB_MEMORY_LIMIT, or a default) and spills to a private temporary folder;
above CELLS_PER_BUCKET cells the row-id checks run per hash bucket of row ids."""

from __future__ import annotations

import datetime as dt
import os

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from support.score_cells import write_cells
from ragbatch.config.job import OutputSection
from ragbatch.core.errors import ConservationError
from ragbatch.io import write
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
    threads = int(_setting(duckdb.connect(), "threads"))
    expected = f"{max(512, 128 * threads)}MiB"
    assert _setting(connect(layout), "memory_limit") == _as_duckdb_prints(expected)
    monkeypatch.setenv("RAGBATCH_DUCKDB_MEMORY_LIMIT", "3GB")
    assert _setting(connect(layout), "memory_limit") == _as_duckdb_prints("3GB")
    monkeypatch.setenv("RAGBATCH_DUCKDB_MEMORY_LIMIT", "none")
    assert _setting(connect(layout), "memory_limit") == _setting(duckdb.connect(), "memory_limit")


@pytest.mark.parametrize("per_bucket", [10**9, 7, 1])
def test_row_id_checks_per_bucket(layout, tmp_path, monkeypatch, per_bucket):
    # 40 rows x 2 metrics, in two files. File b repeats row 'r3' for m1 twice more and
    # 'r7' for m2 once more, and lacks nothing: 3 extra cells, 2 duplicated pairs.
    # The same verdicts and examples whether checked in one grouping (10**9 cells per
    # bucket) or over 12 or 83 hash buckets.
    monkeypatch.setattr(write, "CELLS_PER_BUCKET", per_bucket)
    ids = [f"r{i}" for i in range(40)]
    a = write_cells(tmp_path / "a.parquet", ids, ["m1"] * 40)
    b = write_cells(
        tmp_path / "b.parquet", ids + ["r3", "r3", "r7"], ["m2"] * 40 + ["m1", "m1", "m2"]
    )
    with pytest.raises(ConservationError) as err:
        verify_run(layout, [a, b], ["m1", "m2"], 40)
    message = str(err.value)
    assert "metric 'm1': 42 cells, expected 40" in message
    assert "metric 'm2': 41 cells, expected 40" in message
    assert (
        "2 (row_id, metric) pairs appear more than once, e.g. ('r3', 'm1') x3, ('r7', 'm2') x2"
        in message
    )
    # Unique cells, but m2 scores a row id that m1 does not: 41 distinct row ids.
    c = write_cells(tmp_path / "c.parquet", ids[:39] + ["extra"], ["m2"] * 40)
    with pytest.raises(ConservationError, match="41 distinct row ids in the scores, expected 40"):
        verify_run(layout, [a, c], ["m1", "m2"], 40)
    # A null row id repeated: listed after a non-null one repeated as often, as DuckDB
    # orders them in one grouping.
    e = write_cells(tmp_path / "e.parquet", [None, "z", None, "z"], ["m1"] * 4)
    with pytest.raises(ConservationError, match=r"e\.g\. \('z', 'm1'\) x2, \(None, 'm1'\) x2"):
        verify_run(layout, [e], ["m1"], 4)
    # Unicode and empty row ids count like any other.
    d = write_cells(
        tmp_path / "d.parquet", ["", "日本", "e\u0301", "🙂"] * 2, ["m1"] * 4 + ["m2"] * 4
    )
    assert verify_run(layout, [d], ["m1", "m2"], 4).counts == {"m1": {"ok": 4}, "m2": {"ok": 4}}


@pytest.mark.parametrize("per_bucket", [10**9, 7])
def test_row_ids_checked_on_one_metric_when_every_metric_holds_the_same(
    layout, tmp_path, monkeypatch, per_bucket
):
    # When every metric has n_rows cells with equal row-id fingerprints, only the first
    # metric's row ids are grouped (checked here by recording what _bucketed_keys is
    # given); a run where they differ, or where the first metric's row ids repeat, is
    # checked cell by cell, so the message is the one the full check gives.
    monkeypatch.setattr(write, "CELLS_PER_BUCKET", per_bucket)
    seen: list[str] = []
    real = write._bucketed_keys

    def recording(con, relation, n_cells, **options):
        seen.append(relation)
        return real(con, relation, n_cells, **options)

    monkeypatch.setattr(write, "_bucketed_keys", recording)
    ids = ["", "日本", "e\u0301", "🙂"] + [f"r{i}" for i in range(36)]
    good = write_cells(tmp_path / "g.parquet", ids * 3, ["m1"] * 40 + ["m2"] * 40 + ["m3"] * 40)
    assert verify_run(layout, [good], ["m1", "m2", "m3"], 40).n_cells == 120
    assert seen == ["(SELECT row_id, metric FROM s WHERE metric = 'm1')"]
    # the same row id twice in the input: every metric holds it twice, fingerprints agree
    seen.clear()
    twice = ids[:39] + ["r5"]
    dup = write_cells(tmp_path / "d.parquet", twice * 3, ["m1"] * 40 + ["m2"] * 40 + ["m3"] * 40)
    with pytest.raises(ConservationError) as err:
        verify_run(layout, [dup], ["m1", "m2", "m3"], 40)
    assert seen == ["(SELECT row_id, metric FROM s WHERE metric = 'm1')", "s"]
    assert (
        "3 (row_id, metric) pairs appear more than once, e.g. ('r5', 'm1') x2, "
        "('r5', 'm2') x2, ('r5', 'm3') x2" in str(err.value)
    )
    # m3 swaps one row id for another: the counts agree, the fingerprints do not
    seen.clear()
    swapped = write_cells(
        tmp_path / "s.parquet",
        ids * 2 + ids[:39] + ["r99"],
        ["m1"] * 40 + ["m2"] * 40 + ["m3"] * 40,
    )
    with pytest.raises(ConservationError, match="41 distinct row ids in the scores, expected 40"):
        verify_run(layout, [swapped], ["m1", "m2", "m3"], 40)
    assert seen == ["s"]


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
        pq.write_table(
            pa.table(
                {
                    "row_id": ids,
                    "metric": pa.array(np.full(n, metric)),
                    "score": pc.if_else(ok, 1.0, pa.scalar(None, pa.float64())),
                    "status": pc.if_else(ok, "ok", "error"),
                    "model": pa.nulls(n, pa.string()),
                }
            ),
            path,
        )
        files.append(str(path))
    before = set(
        os.listdir(
            os.path.dirname(
                connect(layout).execute("SELECT current_setting('temp_directory')").fetchone()[0]
            )
        )
    )
    check = verify_run(layout, files, ["m1", "m2"], n)
    assert check.counts == {
        "m1": {"error": n // 10, "ok": n - n // 10},
        "m2": {"error": n // 10, "ok": n - n // 10},
    }
    with pytest.raises(ConservationError, match="200000 cells, expected 200001"):
        verify_run(layout, files, ["m1", "m2"], n + 1)
    import gc

    gc.collect()
    spill_root = os.path.dirname(
        connect(layout).execute("SELECT current_setting('temp_directory')").fetchone()[0]
    )
    left = {d for d in set(os.listdir(spill_root)) - before if d.startswith("ragbatch-duckdb-")}
    assert left == set()
