"""Expression stage: every deterministic metric over one Polars copy of each batch."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from ragbatch.core.columns import CELL_TYPE, cell_column
from ragbatch.scoring.base import ExpressionMetric


def expression_stage(batch: pa.Table, metrics: list[ExpressionMetric]) -> pa.Table:
    """Append one ``__ragbatch_cell::<id>`` struct column per metric to a batch of canonical rows.

    A Ray Data batch function (run as tasks): rows come back 1:1 in the same order.
    The batch is converted to Polars once; the intermediates the metrics declare
    (:meth:`ragbatch.scoring.base.ExpressionMetric.intermediates`, e.g. the ranking
    metrics' matched ids) are computed once each over it, and every metric's expression
    is then evaluated over it in its own lazy ``select``, concurrently on Polars' thread
    count.

    Parameters
    ----------
    batch
        Canonical columns (``ragbatch.core.columns.CANONICAL_SCHEMA``) plus slice columns.
    metrics
        Expression metrics with validated params.

    Returns
    -------
    pyarrow.Table
        ``batch`` plus ``len(metrics)`` columns of type ``ragbatch.core.columns.CELL_TYPE``
        (a cell column already in ``batch`` is replaced where it stands).

    Notes
    -----
    Only the columns the expressions read are converted to Polars, and only the cell
    columns come back to Arrow; every other column of ``batch`` passes through as the
    same Arrow data, without a copy. List columns that are a small slice of a larger
    array (as Ray Data hands out batches of a block) are re-based first, because Polars
    would otherwise convert the whole underlying array for every batch.
    """
    names = [cell_column(m.id) for m in metrics]
    shared = list(dict.fromkeys(i for m in metrics for i in m.intermediates()))
    plain = [m.expression() for m in metrics]
    frame = polars_frame(batch, input_columns(batch, _reads(plain, shared)))
    values = {i: i.compute(frame) for i in shared}
    exprs = [
        (m.expression_with(values) if m.intermediates() else expr).alias(name)
        for m, expr, name in zip(metrics, plain, names)
    ]
    cells = _evaluate(frame, exprs, names)
    out = batch
    for name, column in zip(names, cells):
        if name in out.column_names:
            out = out.set_column(out.schema.get_field_index(name), name, column)
        else:
            out = out.append_column(name, column)
    lengths = {len(c) for c in cells}
    if out.num_rows != batch.num_rows or lengths - {batch.num_rows}:
        raise RuntimeError(f"expression stage returned {sorted(lengths)} rows for {batch.num_rows}")
    return out


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()

#: Polars engine of the stage's queries (see :func:`_evaluate`).
_ENGINE = "in-memory"

#: Seconds the last evaluation of each cell column took in this process, to start the
#: slowest metrics first.
_LAST_SECONDS: dict[str, float] = {}


def _evaluate(frame: pl.DataFrame, exprs: list[pl.Expr], names: list[str]) -> list[pa.Array]:
    """One Arrow cell column (``CELL_TYPE``) per expression, each metric in its own lazy
    ``select`` and its own conversion to Arrow, run concurrently on as many threads as
    Polars has, the metrics that took longest last time first.

    Measured with Polars 2.1: in a single ``select``, metrics whose expression calls
    Python (``map_batches``: the ``frame_cells`` and ``python_cells`` metrics) did not
    overlap with the others; separate ``collect`` calls release the GIL and do.

    Each ``collect`` asks for Polars' in-memory engine. The default (``"auto"``) ran these
    single ``select`` queries on the streaming engine, which cuts the batch into morsels
    and runs them on its own executor threads; for a batch already in memory that was
    overhead: on 1,000,000 benchmark rows (10 batches, two cores) the six Tonic metrics
    took 1.01 s on the default engine and 0.82 s in memory
    (``docs/benchmarks/expression-stage.md``, "Where the time went in runs 9-11").
    """
    lazy = frame.lazy()

    def one(i: int) -> pa.Array:
        start = time.perf_counter()
        column = (
            lazy.select(exprs[i]).collect(engine=_ENGINE).to_series().to_arrow().cast(CELL_TYPE)
        )
        _LAST_SECONDS[names[i]] = time.perf_counter() - start
        return column

    if len(exprs) <= 1 or pl.thread_pool_size() <= 1:
        return [one(i) for i in range(len(exprs))]
    order = sorted(range(len(exprs)), key=lambda i: -_LAST_SECONDS.get(names[i], 0.0))
    futures = {i: _pool().submit(one, i) for i in order}
    return [futures[i].result() for i in range(len(exprs))]


def _pool() -> ThreadPoolExecutor:
    """The stage's thread pool (one per process), as many threads as Polars has; created
    under a lock, since the in-process executor runs the stage on several threads at once."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(
                max_workers=pl.thread_pool_size(), thread_name_prefix="ragbatch-expr"
            )
        return _POOL


def _reads(plain: Sequence[pl.Expr], shared: Sequence) -> list[pl.Expr]:
    """The expressions whose input columns a stage converts: every metric's own, and one
    ``pl.col`` per column of each shared intermediate."""
    return [*plain, *(pl.col(c) for i in shared for c in i.columns)]


def stage_columns(metrics: Sequence[ExpressionMetric]) -> frozenset[str] | None:
    """The columns of a canonical batch that :func:`expression_stage` reads for
    ``metrics`` (canonical names such as ``answer``, ``contexts``, ``_issues``, or slice
    columns); None when that cannot be told from the expressions (a wildcard or regex
    selector, an expression Polars cannot inspect), and every column may be read.

    The same columns the stage converts to Polars (:func:`input_columns`): a metric's
    expression that read any other column would fail there. Builds each metric's
    expression once (a ``binary`` metric imports its callback).
    """
    shared = list(dict.fromkeys(i for m in metrics for i in m.intermediates()))
    return _root_names(_reads([m.expression() for m in metrics], shared))


def _root_names(exprs: Sequence[pl.Expr]) -> frozenset[str] | None:
    """The columns ``exprs`` read, or None when that cannot be told."""
    names: set[str] = set()
    try:
        for expr in exprs:
            if expr.meta.has_multiple_outputs():
                return None
            names.update(expr.meta.root_names())
    except Exception:  # an expression Polars cannot inspect
        return None
    return frozenset(names)


def input_columns(batch: pa.Table, exprs: Sequence[pl.Expr]) -> list[str]:
    """The columns of ``batch`` that ``exprs`` read, in batch order; all of them when that
    cannot be told (wildcards, regex selectors, names the batch lacks)."""
    names = _root_names(exprs)
    if names is None or not names <= set(batch.column_names):
        return batch.column_names
    return [c for c in batch.column_names if c in names]


def polars_frame(batch: pa.Table, columns: Sequence[str]) -> pl.DataFrame:
    """``batch.select(columns)`` as a Polars frame: list columns re-based first (see
    :func:`expression_stage`), strings passed as Arrow string views."""
    table = batch.select(list(columns))
    if table.num_columns > 1 and table.num_rows >= _PARALLEL_ROWS and pl.thread_pool_size() > 1:
        # Columns convert independently (Arrow casts release the GIL): overlap them.
        parts = list(_pool().map(lambda i: _polars_column(table, i), range(table.num_columns)))
        frame = pl.DataFrame(parts)
    else:
        frame = pl.DataFrame([_polars_column(table, i) for i in range(table.num_columns)])
    return frame


#: Batches from this many rows up convert their columns on the thread pool.
_PARALLEL_ROWS = 10_000


def _polars_column(table: pa.Table, i: int) -> pl.Series:
    field = table.schema.field(i)
    column = table.column(i)
    if pa.types.is_list(field.type) or pa.types.is_large_list(field.type):
        chunks = [_rebase_list(chunk) for chunk in column.chunks]
        if any(new is not old for new, old in zip(chunks, column.chunks)):
            column = pa.chunked_array(chunks, field.type)
    view = _as_views(field.type)
    if view is not None:
        column = column.cast(view)
    series = pl.from_arrow(pa.table({field.name: column}))
    assert isinstance(series, pl.DataFrame)
    return series.to_series()


def _as_views(t: pa.DataType) -> pa.DataType | None:
    """The string-view form of a string or list-of-string type, else None.

    Polars keeps strings as views; handing it views built by Arrow is cheaper than letting
    it convert (and re-check) offset-based strings.
    """
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pa.string_view()
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and (
        pa.types.is_string(t.value_type) or pa.types.is_large_string(t.value_type)
    ):
        field = pa.field(t.value_field.name, pa.string_view(), t.value_field.nullable)
        return pa.large_list(field) if pa.types.is_large_list(t) else pa.list_(field)
    return None


def _rebase_list(chunk: pa.Array) -> pa.Array:
    """The same list values with offsets starting at 0 and the child cut to what the
    slice references (zero-copy for the child); ``chunk`` itself when it is already so."""
    if len(chunk) == 0:
        return chunk
    offsets = chunk.offsets
    start, end = offsets[0].as_py(), offsets[-1].as_py()
    if start == 0 and end == len(chunk.values):
        return chunk
    cls = pa.LargeListArray if pa.types.is_large_list(chunk.type) else pa.ListArray
    rebased = cls.from_arrays(
        pc.subtract(offsets, pa.scalar(start, offsets.type)),
        chunk.values.slice(start, end - start),
        type=chunk.type,
        mask=chunk.is_null() if chunk.null_count else None,
    )
    return rebased
