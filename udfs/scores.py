"""Final stage: wide cell columns -> the long scores table."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from ragbatch.core.arrow_util import to_arrow
from ragbatch.core.columns import CELL_FIELDS, JUDGE_FIELDS, ROW_ID, cell_column, judge_column
from udfs.expressions import polars_frame


def to_long(batch: pa.Table, metric_ids: list[str], slices: list[str]) -> pa.Table:
    """Turn a batch of rows with ``__ragbatch_cell::<id>`` columns into scores-table rows.

    Parameters
    ----------
    batch
        ``n`` rows holding ``row_id``, the slice columns and one cell column per metric.
    metric_ids
        Metric ids in config order.
    slices
        Slice column names (after renaming), appended after the cell fields.

    Returns
    -------
    pyarrow.Table
        ``n * len(metric_ids)`` rows: ``row_id, metric``, the cell fields, the judge
        fields (:data:`ragbatch.core.columns.JUDGE_FIELDS`; null for metrics without a
        judge), then the slice columns, metric-major.

    Raises
    ------
    RuntimeError
        A cell column is missing, or the row count is not ``n * len(metric_ids)``.

    Notes
    -----
    Only ``row_id``, the slice columns and the cell columns are converted to Polars; the
    input text columns the batch still carries are not read.
    """
    if metric_ids:
        wanted = {
            ROW_ID,
            *slices,
            *(cell_column(m) for m in metric_ids),
            *(judge_column(m) for m in metric_ids),
        }
        frame = polars_frame(batch, [c for c in batch.column_names if c in wanted])
    else:
        frame = polars_frame(batch, batch.column_names)
    absent = [m for m in metric_ids if cell_column(m) not in frame.columns]
    if absent:
        raise RuntimeError(f"no cells were computed for metrics {absent}")
    fields = [name for name, _ in CELL_FIELDS]
    parts = [
        frame.select(
            pl.col(ROW_ID),
            pl.lit(mid, pl.String).alias("metric"),
            *[pl.col(cell_column(mid)).struct.field(f).alias(f) for f in fields],
            *_judge_fields(frame, mid),
            *[pl.col(s) for s in slices],
        )
        for mid in metric_ids
    ]
    long = pl.concat(parts, how="vertical") if parts else frame.clear()
    if long.height != frame.height * len(metric_ids):
        raise RuntimeError(
            f"{long.height} score rows for {frame.height} rows x {len(metric_ids)} metrics"
        )
    return to_arrow(long)


_JUDGE_DTYPES = dict(pl.from_arrow(pa.schema(list(JUDGE_FIELDS)).empty_table()).schema)


def _judge_fields(frame: pl.DataFrame, metric_id: str) -> list[pl.Expr]:
    """The judge fields of ``metric_id``: from its ``__ragbatch_judge::`` column, else nulls."""
    if judge_column(metric_id) in frame.columns:
        record = pl.col(judge_column(metric_id))
        return [record.struct.field(n).cast(t).alias(n) for n, t in _JUDGE_DTYPES.items()]
    return [pl.lit(None, t).alias(n) for n, t in _JUDGE_DTYPES.items()]
