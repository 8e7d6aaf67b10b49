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


def test_a_json_integer_of_more_digits_than_python_parses_is_a_note_not_a_crash():
    # Python refuses to parse integers of more than 4300 digits (a ValueError that is
    # not a JSONDecodeError)
    huge = "1" * 5000
    out = _normalize(
        context_ids=pa.array(["[" + huge + "]", '["d1"]']),
        relevance=pa.array(['{"d1": ' + huge + "}", '[{"id": ' + huge + ', "grade": 1}]']),
    )
    assert out["context_ids"].to_pylist() == [None, ["d1"]]
    assert out["relevance"].to_pylist() == [None, None]
    ids_note = _issues(out, "context_ids")[0]
    assert ids_note.startswith("context_ids: not a JSON list of ids: '[1111")
    assert all(
        note.startswith("relevance: not a JSON object of id -> grade: ")
        for note in _issues(out, "relevance")
    )
