"""Expression stage: every deterministic metric in one Polars pass per batch."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from ragbatch.arrow_util import to_arrow
from ragbatch.columns import CELL_TYPE, cell_column
from ragbatch.metrics.base import ExpressionMetric


def expression_stage(batch: pa.Table, metrics: list[ExpressionMetric]) -> pa.Table:
    """Append one ``cell::<id>`` struct column per metric to a batch of canonical rows.

    A Ray Data batch function (run as tasks): rows come back 1:1 in the same order.
    All metric expressions are evaluated together in a single ``with_columns``, so
    Polars runs them in parallel over one materialisation of the batch.

    Parameters
    ----------
    batch
        Canonical columns (``ragbatch.columns.CANONICAL_SCHEMA``) plus slice columns.
    metrics
        Expression metrics with validated params.

    Returns
    -------
    pyarrow.Table
        ``batch`` plus ``len(metrics)`` columns of type ``ragbatch.columns.CELL_TYPE``.
    """
    frame = pl.from_arrow(batch)
    assert isinstance(frame, pl.DataFrame)
    scored = frame.with_columns([m.expression().alias(cell_column(m.id)) for m in metrics])
    out = to_arrow(scored)
    for m in metrics:
        name = cell_column(m.id)
        out = out.set_column(out.schema.get_field_index(name), name, out[name].cast(CELL_TYPE))
    if out.num_rows != batch.num_rows:
        raise RuntimeError(f"expression stage returned {out.num_rows} rows for {batch.num_rows}")
    return out
