"""Final stage: wide cell columns -> the long scores table."""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from ragbatch.core.arrow_util import to_arrow
from ragbatch.core.columns import (
    CELL_FIELDS,
    CELL_TYPE,
    JUDGE,
    JUDGE_FIELDS,
    ROW_ID,
    cell_column,
    judge_column,
)
from udfs.expressions import polars_frame


def to_long(
    batch: pa.Table,
    metric_ids: list[str],
    slices: list[str],
    judges: dict[str, tuple[str, str]] | None = None,
) -> pa.Table:
    """Turn a batch of rows with ``__ragbatch_cell::<id>`` columns into scores-table rows.

    Parameters
    ----------
    batch
        ``n`` rows holding ``row_id``, the slice columns and one cell column per metric.
    metric_ids
        Metric ids in config order.
    slices
        Slice column names (after renaming), appended after the cell fields.
    judges
        Member key -> (panel metric id, engine) of each judge of a judge panel
        (:attr:`ragbatch.pipeline.plan.Plan.member_judges`): such a metric id's cells are
        written with ``metric`` the panel's id and ``judge`` the engine.

    Returns
    -------
    pyarrow.Table
        ``n * len(metric_ids)`` rows: ``row_id, metric``, the cell fields, the judge
        fields (:data:`ragbatch.core.columns.JUDGE_FIELDS`; null for metrics without a
        judge), ``judge`` (string; null but for panel members), then the slice columns,
        metric-major.

    Raises
    ------
    RuntimeError
        A cell column is missing, or the row count is not ``n * len(metric_ids)``.

    Notes
    -----
    When no metric has judge fields and every slice column is a string, integer, float or
    boolean column, the table is assembled in Arrow (:func:`_to_long_arrow`): the cell
    fields, ``row_id`` and the slices are the batch's own buffers, repeated per metric
    without a copy. Otherwise only ``row_id``, the slice columns and the cell columns are
    converted to Polars; the input text columns the batch still carries are not read.
    Both give the same table.
    """
    judges = judges or {}
    arrow = None if judges else _to_long_arrow(batch, metric_ids, slices)
    if arrow is not None:
        return arrow
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
            pl.lit(judges.get(mid, (mid,))[0], pl.String).alias("metric"),
            *[pl.col(cell_column(mid)).struct.field(f).alias(f) for f in fields],
            *_judge_fields(frame, mid),
            pl.lit(judges[mid][1] if mid in judges else None, pl.String).alias(JUDGE),
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


#: Slice column types :func:`_to_long_arrow` passes through, each with the type the
#: Polars path gives it (:func:`ragbatch.core.arrow_util.to_arrow`).
_ARROW_SLICE_TYPES = {
    pa.string(): pa.string(),
    pa.large_string(): pa.string(),
    pa.int32(): pa.int32(),
    pa.int64(): pa.int64(),
    pa.float64(): pa.float64(),
    pa.bool_(): pa.bool_(),
}


def _to_long_arrow(batch: pa.Table, metric_ids: list[str], slices: list[str]) -> pa.Table | None:
    """The scores rows of :func:`to_long` assembled in Arrow, or None when the batch needs
    the Polars path: no metrics, a judge column, a missing or null cell, a ``row_id`` that
    is not a string column, a cell column not of :data:`~ragbatch.core.columns.CELL_TYPE`,
    or a slice column of a type not in :data:`_ARROW_SLICE_TYPES`.

    Each metric contributes ``row_id``, a ``metric`` column of its id, the fields of its
    cell struct (of type :data:`ragbatch.core.columns.CELL_TYPE`), null judge
    fields, a null ``judge`` and the slices; the metrics' parts are joined as chunks, not copied.
    """
    names = set(batch.column_names)
    if not metric_ids or any(judge_column(m) in names for m in metric_ids):
        return None
    if any(cell_column(m) not in names for m in metric_ids):
        return None  # the Polars path names the missing metrics
    if ROW_ID not in names or batch.schema.field(ROW_ID).type != pa.string():
        return None
    slice_types = []
    for s in slices:
        if s not in names or batch.schema.field(s).type not in _ARROW_SLICE_TYPES:
            return None
        slice_types.append(_ARROW_SLICE_TYPES[batch.schema.field(s).type])
    cells = [batch.column(cell_column(m)) for m in metric_ids]
    if any(c.null_count or c.type != CELL_TYPE for c in cells):
        return None
    n = batch.num_rows
    fields = [(ROW_ID, pa.string()), ("metric", pa.string()), *CELL_FIELDS, *JUDGE_FIELDS]
    fields += [(JUDGE, pa.string()), *zip(slices, slice_types)]
    columns: list[list[pa.Array]] = [[] for _ in fields]
    row_id = batch.column(ROW_ID).chunks
    sliced = [batch.column(s).cast(t).chunks for s, t in zip(slices, slice_types)]
    nulls = [pa.nulls(n, t) for _, t in [*JUDGE_FIELDS, (JUDGE, pa.string())]]
    for mid, cell in zip(metric_ids, cells):
        values = [row_id, [pa.repeat(pa.scalar(mid, pa.string()), n)]]
        values += [pc.struct_field(cell, name).chunks for name, _ in CELL_FIELDS]
        values += [[null] for null in nulls]
        values += sliced
        for column, chunks in zip(columns, values):
            column.extend(chunks)
    schema = pa.schema([pa.field(name, dtype) for name, dtype in fields])
    arrays = [pa.chunked_array(chunks, f.type) for chunks, f in zip(columns, schema)]
    return pa.Table.from_arrays(arrays, schema=schema)


_JUDGE_DTYPES = dict(pl.from_arrow(pa.schema(list(JUDGE_FIELDS)).empty_table()).schema)


def _judge_fields(frame: pl.DataFrame, metric_id: str) -> list[pl.Expr]:
    """The judge fields of ``metric_id``: from its ``__ragbatch_judge::`` column, else nulls."""
    if judge_column(metric_id) in frame.columns:
        record = pl.col(judge_column(metric_id))
        return [record.struct.field(n).cast(t).alias(n) for n, t in _JUDGE_DTYPES.items()]
    return [pl.lit(None, t).alias(n) for n, t in _JUDGE_DTYPES.items()]
