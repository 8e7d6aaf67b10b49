"""Build one-batch canonical frames for metric tests and run expression metrics on them."""

from __future__ import annotations

from typing import Any

import polars as pl
import pyarrow as pa

from ragbatch.core.columns import (
    CANONICAL_SCHEMA,
    ISSUES,
    RANKING,
    RANKING_ISSUES_TYPE,
    RANKING_SCHEMA,
)


def canonical_frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """Rows given as partial dicts of canonical columns -> a canonical Polars frame.

    Missing columns are null; ``row_id`` defaults to ``"r<i>"``; ``_issues`` defaults to
    all-null unless a row gives it. When a row gives a ranking column, the frame has the
    ranking columns and ``_issues`` fields too, as a job that maps one has.
    """
    schema = CANONICAL_SCHEMA
    if any(name in row for row in rows for name in RANKING):
        fields = [f if f.name != ISSUES else pa.field(ISSUES, RANKING_ISSUES_TYPE) for f in schema]
        schema = pa.schema(fields + list(RANKING_SCHEMA))
    full = []
    for i, row in enumerate(rows):
        rec = {f.name: row.get(f.name) for f in schema}
        rec["row_id"] = row.get("row_id", f"r{i}")
        rec[ISSUES] = row.get(ISSUES)
        full.append(rec)
    frame = pl.from_arrow(pa.Table.from_pylist(full, schema=schema))
    assert isinstance(frame, pl.DataFrame)
    return frame


def run_metric(metric, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Evaluate one expression metric on ``rows``; return the cells as dicts."""
    frame = canonical_frame(rows)
    return frame.select(metric.expression().alias("c")).unnest("c").to_dicts()
