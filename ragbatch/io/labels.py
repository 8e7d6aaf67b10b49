"""Human label columns of the input (config ``labels.columns``), checked before a run.

A label column holds, per row, a human's score for one metric on the metric's own scale
(a null: the row is not labelled). It passes through to the scores table like a slice
column, and the summary corrects the metric's mean with it (:mod:`ragbatch.analysis.ppi`).

:func:`label_problems` checks the columns against the input schema (when a plan is
built); :func:`check_label_values` reads only the label columns of the whole input and
checks every value lies in the metric's range (before any metric runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ragbatch.core.errors import InputError
from ragbatch.io.fs import resolve
from ragbatch.io.issues import is_number
from ragbatch.io.read import ReadTask, read_task

if TYPE_CHECKING:
    from ragbatch.config.job import JobConfig
    from ragbatch.io.planned import PlannedInput


def label_problems(config: "JobConfig", schema: pa.Schema) -> list[str]:
    """Problems of ``config.labels.columns`` against the input schema.

    Returns
    -------
    list of str
        One message per problem, ``"labels.columns.<metric id>: ..."``: the column does
        not exist, is mapped as a canonical column, or holds neither numbers nor booleans.
        Empty when there are no labels or all is fine.
    """
    if config.labels is None:
        return []
    mapped = {v: c for c, v in config.input.columns.model_dump().items() if v is not None}
    problems = []
    for metric_id, column in config.labels.columns.items():
        where = f"labels.columns.{metric_id}"
        if column not in schema.names:
            listed = ", ".join(repr(n) for n in schema.names)
            problems.append(
                f"{where}: column {column!r} does not exist in the input; the input has: {listed}"
            )
        elif column in mapped:
            problems.append(
                f"{where}: column {column!r} is mapped as input.columns."
                f"{mapped[column]}; labels need a column of their own"
            )
        elif not _label_type(schema.field(column).type):
            problems.append(
                f"{where}: column {column!r} has type {schema.field(column).type}; "
                "labels need numbers or booleans (null where a row is unlabelled)"
            )
    return problems


def _label_type(t: pa.DataType) -> bool:
    return is_number(t) or pa.types.is_boolean(t) or pa.types.is_null(t)


def check_label_values(plan: "PlannedInput") -> dict[str, int]:
    """Read the label columns of the whole input; check every value is in its metric's
    score range.

    Parameters
    ----------
    plan
        A plan built with the input inspected (``plan.read_tasks`` set).

    Returns
    -------
    dict
        Metric id -> number of labelled rows (non-null labels).

    Raises
    ------
    InputError
        A label is NaN or outside the metric's ``score_range``; the message names the
        column, the metric, how many values are out, the first one and its row.

    Notes
    -----
    Parquet files are read for the label columns alone; text formats are parsed whole.
    """
    config = plan.config
    if config.labels is None or not config.labels.columns:
        return {}
    ranges = {m.id: m.score_range for m in plan.metrics}
    columns = list(dict.fromkeys(config.labels.columns.values()))
    counts = dict.fromkeys(config.labels.columns, 0)
    bad: dict[str, list] = {}
    for task in plan.read_tasks:
        table = _label_table(task, config, columns)
        for metric_id, column in config.labels.columns.items():
            values = label_values(table.column(column))
            present = ~np.isnan(values) | _nan_mask(table.column(column))
            counts[metric_id] += int(present.sum())
            low, high = ranges[metric_id]
            out = present & ~((values >= low) & (values <= high))
            if out.any():
                first = int(np.flatnonzero(out)[0])
                entry = bad.setdefault(
                    metric_id, [0, f"{task.file_key}:{task.row_offset + first}", values[first]]
                )
                entry[0] += int(out.sum())
    if bad:
        raise InputError(
            "\n".join(_out_of_range(config.labels.columns[m], m, ranges[m], *bad[m]) for m in bad)
        )
    return counts


def label_values(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A label column as float64 (booleans as 0/1; null as NaN), shape ``(rows,)``."""
    if pa.types.is_null(column.type):
        return np.full(len(column), np.nan)
    floats = pc.cast(column, pa.float64())
    return np.asarray(floats.to_numpy(zero_copy_only=False), dtype=np.float64)


def _nan_mask(column: pa.ChunkedArray) -> np.ndarray:
    """Where a non-null value is NaN (a label that is not a number)."""
    if not pa.types.is_floating(column.type):
        return np.zeros(len(column), dtype=bool)
    return np.asarray(pc.fill_null(pc.is_nan(column), False).to_numpy(zero_copy_only=False), bool)


def _out_of_range(
    column: str, metric_id: str, bounds: Sequence[float], count: int, row: str, value: float
) -> str:
    low, high = bounds
    return (
        f"labels.columns.{metric_id}: column {column!r} holds {count} label(s) outside "
        f"{metric_id}'s range [{low:g}, {high:g}] (first: {float(value)!r} at row {row}); labels "
        "are on the metric's own scale: rescale them, or leave a row unlabelled with a null"
    )


def _label_table(task: ReadTask, config: "JobConfig", columns: list[str]) -> pa.Table:
    """The label ``columns`` of one read task's rows."""
    if task.format == "parquet":
        fs, _ = resolve(config.input.uri, config.input.storage_options)
        with fs.open(task.path, "rb") as handle:
            parquet = pq.ParquetFile(handle)
            if all(c in parquet.schema_arrow.names for c in columns):
                groups = list(task.row_groups) if task.row_groups is not None else None
                if groups is None:
                    return parquet.read(columns=columns)
                return parquet.read_row_groups(groups, columns=columns)
    return read_task(task, config.input).select(columns)
