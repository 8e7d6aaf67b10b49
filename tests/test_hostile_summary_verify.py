"""Hostile and degenerate inputs for the run check, the summary and the in-process executor.

The run check (:func:`ragbatch.io.write.verify_run`) groups one metric's row ids when every
metric's row-id fingerprint agrees; the summary counts few-valued scores and all slice
columns in one DuckDB grouping; the executor runs two read tasks at once. Each test feeds
them what a user's data or a buggy metric can produce, with the expected figures worked
out here (by hand or with numpy over the cells) rather than taken from the code.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragbatch.config.job import OutputSection
from ragbatch.core.errors import ConservationError
from ragbatch.io.write import OutputLayout, verify_run

# ------------------------------------------------------------------------- run check


@pytest.fixture
def layout(tmp_path):
    return OutputLayout.for_run(OutputSection(uri=str(tmp_path / "out")), dt.date(2026, 1, 2), "r")


def _cells(path: Path, row_ids: list, metrics: list) -> str:
    n = len(row_ids)
    pq.write_table(
        pa.table(
            {
                "row_id": pa.array(row_ids, pa.string()),
                "metric": pa.array(metrics, pa.string()),
                "score": pa.array(np.ones(n)),
                "status": pa.array(["ok"] * n),
                "model": pa.nulls(n, pa.string()),
            }
        ),
        path,
    )
    return str(path)


def test_a_cell_without_a_metric_id_is_a_conservation_error(layout, tmp_path):
    # Both metrics hold rows a and b; one more cell has a null metric and row id c: the
    # check names the stray cell and counts 3 distinct row ids instead of failing itself.
    f = _cells(tmp_path / "a.parquet", ["a", "b", "a", "b", "c"], ["m1", "m1", "m2", "m2", None])
    with pytest.raises(ConservationError) as err:
        verify_run(layout, [f], ["m1", "m2"], 2)
    assert "metric None is not in the config but has 1 cells" in str(err.value)
    assert "3 distinct row ids in the scores, expected 2" in str(err.value)


#: Two 16-character row ids whose DuckDB ``hash`` is equal: DuckDB hashes a string 8 bytes
#: at a time (state ^= block; state *= odd constant), so the second block can cancel any
#: difference in the first. Found by searching first blocks ``row-NNNN``.
COLLIDING = ("row-000100000000", "row-00030000000^")


def test_row_ids_of_equal_hash_swapped_between_metrics_are_found(layout, tmp_path):
    # m1 scores rows {x, a, b}, m2 rows {y, a, b}: 4 distinct row ids for 3 input rows,
    # though both metrics have 3 cells and x and y hash alike.
    x, y = COLLIDING
    (same,) = duckdb.connect().execute("SELECT hash(?) = hash(?)", [x, y]).fetchone()
    if not same:
        pytest.skip("this DuckDB hashes strings differently; the pair no longer collides")
    f = _cells(tmp_path / "s.parquet", [x, "a", "b", y, "a", "b"], ["m1"] * 3 + ["m2"] * 3)
    with pytest.raises(ConservationError, match="4 distinct row ids in the scores, expected 3"):
        verify_run(layout, [f], ["m1", "m2"], 3)


QUOTED, UNICODE = "it's '; DROP TABLE s; --", "日本\u0301🙂"


@pytest.mark.parametrize(
    ("cells", "n_rows", "problems"),
    [
        # empty-string, backslash and quote row ids, hostile metric ids: all sound
        (["", "a\\b", "'"] * 2, 3, []),
        # one metric repeats a row id in place of another: same counts, other multiset
        (
            ["", "a\\b", "'", "", "", "'"],
            3,
            [
                "1 (row_id, metric) pairs appear more than once, e.g. ('', '日本\u0301🙂') x2; "
                "if input.columns maps row_id, that input column has duplicate values"
            ],
        ),
        # a null row id in one metric
        (["", "a\\b", "'", "", None, "'"], 3, ["4 distinct row ids in the scores, expected 3"]),
        # the first metric's row ids swapped for one the second lacks
        (["", "z", "'", "", "a\\b", "'"], 3, ["4 distinct row ids in the scores, expected 3"]),
    ],
)
def test_hostile_row_and_metric_ids_get_the_full_checks_messages(
    layout, tmp_path, cells, n_rows, problems
):
    metrics = [QUOTED] * 3 + [UNICODE] * 3
    f = _cells(tmp_path / "c.parquet", cells, metrics)
    if not problems:
        assert verify_run(layout, [f], [QUOTED, UNICODE], n_rows).counts == {
            QUOTED: {"ok": 3},
            UNICODE: {"ok": 3},
        }
        return
    with pytest.raises(ConservationError) as err:
        verify_run(layout, [f], [QUOTED, UNICODE], n_rows)
    listed = str(err.value).split("\n  - ")[1:]
    assert listed == problems


def test_degenerate_runs_empty_unscored_metric_and_files_read_twice(layout, tmp_path):
    # No files and no rows: sound. No files for 2 rows, a configured metric without a
    # cell, the same file given twice: each named as the full check names it.
    assert verify_run(layout, [], ["m1"], 0).counts == {}
    with pytest.raises(ConservationError, match="metric 'm1': 0 cells, expected 2"):
        verify_run(layout, [], ["m1"], 2)
    f = _cells(tmp_path / "d.parquet", ["a", "b", "a", "b"], ["m1", "m1", "m2", "m2"])
    with pytest.raises(ConservationError) as err:
        verify_run(layout, [f], ["m1", "m2", "m3"], 2)
    assert str(err.value).split("\n  - ")[1:] == ["metric 'm3': 0 cells, expected 2"]
    with pytest.raises(ConservationError) as err:
        verify_run(layout, [f, f], ["m1", "m2"], 2)
    assert str(err.value).split("\n  - ")[1:] == [
        "metric 'm1': 4 cells, expected 2",
        "metric 'm2': 4 cells, expected 2",
        "4 (row_id, metric) pairs appear more than once, e.g. ('a', 'm1') x2, "
        "('a', 'm2') x2, ('b', 'm1') x2, ('b', 'm2') x2; if input.columns maps row_id, "
        "that input column has duplicate values",
    ]
