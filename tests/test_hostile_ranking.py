"""Hostile values in the ranking columns: each becomes a null value with a note on its
row (the metrics then say ``missing_input``), never an exception that loses the batch."""

from __future__ import annotations

import pyarrow as pa

from ragbatch.config.job import InputSection
from ragbatch.core import columns as C
from ragbatch.io import ReadTask, normalize

TASK = ReadTask("/data/f.csv", "f.csv", "csv")


def _normalize(**columns: pa.Array) -> pa.Table:
    raw = pa.table({f"in_{name}": values for name, values in columns.items()})
    mapping = {name: f"in_{name}" for name in columns}
    return normalize(raw, InputSection(uri="unused", columns=mapping), TASK)


def _issues(table: pa.Table, column: str) -> list:
    return table.column(C.ISSUES).combine_chunks().field(column).to_pylist()


def test_an_integer_grade_past_the_float_range_is_a_grade_that_is_not_finite():
    huge = "9" * 400  # JSON allows it; no float64 holds it
    out = _normalize(relevance=pa.array(['{"d1": ' + huge + "}", '{"d1": 2}']))
    assert out["relevance"].to_pylist() == [None, [{"id": "d1", "grade": 2.0}]]
    note = _issues(out, "relevance")[0]
    assert note.startswith("relevance: a grade is null, NaN or infinite")
