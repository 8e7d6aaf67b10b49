"""The wide-to-long stage: its Arrow assembly and its Polars path give the same rows."""

from __future__ import annotations

import pyarrow as pa

from ragbatch.core.columns import CELL_TYPE, JUDGE_FIELDS, SCORES_COLUMNS, cell_column
from udfs.scores import _to_long_arrow, to_long


def _cells(scores, statuses, reasons, details=None) -> pa.StructArray:
    n = len(scores)
    return pa.array(
        [
            {"score": s, "status": st, "reason": r, "details": d, "model": None}
            for s, st, r, d in zip(scores, statuses, reasons, details or [None] * n)
        ],
        CELL_TYPE,
    )


def _batch(app_type=pa.string()) -> pa.Table:
    return pa.table(
        {
            "row_id": pa.array(["a", "b", "c"]),
            "answer": pa.array(["x", "y", None]),
            "app": pa.array(["bot", None, "docs"]).cast(app_type),
            cell_column("m1"): _cells(
                [1.0, 0.0, None], ["ok", "ok", "missing_input"], [None, "no", "no answer"]
            ),
            cell_column("m2"): _cells(
                [0.5, 0.25, 1.0], ["ok"] * 3, [None] * 3, ['{"k": 1}', None, None]
            ),
        }
    )


def test_long_rows_metric_major_with_null_judge_fields():
    out = to_long(_batch(), ["m1", "m2"], ["app"])
    assert out.column_names == [*SCORES_COLUMNS, "app"]
    assert out.column("row_id").to_pylist() == ["a", "b", "c", "a", "b", "c"]
    assert out.column("metric").to_pylist() == ["m1"] * 3 + ["m2"] * 3
    assert out.column("score").to_pylist() == [1.0, 0.0, None, 0.5, 0.25, 1.0]
    assert out.column("status").to_pylist() == ["ok", "ok", "missing_input", "ok", "ok", "ok"]
    assert out.column("reason").to_pylist() == [None, "no", "no answer", None, None, None]
    assert out.column("details").to_pylist() == [None] * 3 + ['{"k": 1}', None, None]
    assert out.column("app").to_pylist() == ["bot", None, "docs"] * 2
    for name, dtype in JUDGE_FIELDS:
        assert out.schema.field(name).type == dtype
        assert out.column(name).null_count == 6


def test_arrow_assembly_equals_the_polars_path(monkeypatch):
    import udfs.scores

    batch = _batch(pa.large_string())
    arrow = to_long(batch, ["m1", "m2"], ["app"])
    assert _to_long_arrow(batch, ["m1", "m2"], ["app"]) is not None
    monkeypatch.setattr(udfs.scores, "_to_long_arrow", lambda *args: None)
    polars = to_long(batch, ["m1", "m2"], ["app"])
    assert arrow.equals(polars)
    assert arrow.schema.equals(polars.schema, check_metadata=True)
    assert to_long(batch.slice(1, 2), ["m2"], ["app"]).column("score").to_pylist() == [0.25, 1.0]


def test_a_dictionary_slice_takes_the_polars_path():
    batch = _batch(pa.dictionary(pa.int32(), pa.string()))
    assert _to_long_arrow(batch, ["m1"], ["app"]) is None
    assert to_long(batch, ["m1"], ["app"]).column("app").to_pylist() == ["bot", None, "docs"]
