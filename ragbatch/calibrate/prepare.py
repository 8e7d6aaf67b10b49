"""The labelled input of a calibration: read as a job reads it, cut to ``limit`` rows,
answer pairs split into rows, and given row ids; written once as Parquet so that every
judge's run reads the same rows."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl
import pyarrow as pa

from ragbatch.calibrate.config import CalibrationConfig
from ragbatch.core.columns import internal
from ragbatch.core.errors import ConfigError, InputError

#: Column of the generated row id (when ``input.columns.row_id`` is not mapped).
ROW_ID = "calibration_row_id"
#: Column of the pair id of rows split from one input row by ``pairs``.
PAIR_ID = "pair_id"
#: Column naming the input column an answer of a pair came from.
PAIR_MEMBER = "pair_member"
#: Scratch columns of :func:`split_pairs`, in the pipeline's namespace (no input column
#: can use it), so an input column of any other name passes through.
_PAIR_POS, _MEMBER_POS = internal("pair_pos"), internal("member_pos")


@dataclass
class LabelledInput:
    """The prepared rows.

    Attributes
    ----------
    frame : polars.DataFrame
        Every input column (pairs: the answer columns replaced by ``answer_column``,
        ``label_column``, :data:`PAIR_ID` and :data:`PAIR_MEMBER`), plus the row id.
    row_id : str
        Name of the row-id column.
    answer : str or None
        Name of the answer column (for the disagreement list).
    question : str or None
        Name of the question column.
    """

    frame: pl.DataFrame
    row_id: str
    answer: str | None
    question: str | None


def read_labelled(cal: CalibrationConfig) -> LabelledInput:
    """Read ``cal.input`` on the driver with the job's readers, apply ``limit`` and
    ``pairs``, and add a row id.

    Raises
    ------
    InputError
        The input is unreadable or empty, or a ``pairs``/``labels`` column is missing.
    ConfigError
        ``pairs.answer_column`` clashes with an input column.
    """
    from ragbatch.io.read import plan_read, read_task

    tables = []
    rows = 0
    for task in plan_read(cal.input):
        if cal.limit is not None and rows >= cal.limit:
            break
        table = read_task(task, cal.input)
        tables.append(table)
        rows += table.num_rows
    if not tables or rows == 0:
        raise InputError(f"input {cal.input.uri} holds no rows; nothing to calibrate")
    frame = pl.from_arrow(pa.concat_tables(tables, promote_options="permissive"))
    if cal.limit is not None:
        frame = frame.head(cal.limit)
    columns = cal.input.columns
    answer = columns.answer
    if cal.pairs is not None:
        frame = split_pairs(frame, cal)
        answer = cal.pairs.answer_column
    row_id = columns.row_id
    if row_id is None:
        row_id = ROW_ID
        if cal.pairs is not None:
            ids = pl.col(PAIR_ID) + ":" + pl.col(PAIR_MEMBER)
        else:
            ids = pl.int_range(pl.len()).cast(pl.String)
        frame = frame.with_columns(ids.alias(ROW_ID))
    _check_labels(frame, cal)
    return LabelledInput(frame, row_id, answer, columns.question)


def split_pairs(frame: pl.DataFrame, cal: CalibrationConfig) -> pl.DataFrame:
    """One row per answer column of ``cal.pairs.answers``, in input order, pair by pair.

    Parameters
    ----------
    frame : polars.DataFrame
        The input rows, each holding every answer column.
    cal : CalibrationConfig

    Returns
    -------
    polars.DataFrame
        ``frame.height * len(answers)`` rows: the other columns unchanged, then
        ``answer_column`` (str), ``label_column`` (float64), :data:`PAIR_ID` (str: the
        ``id_column`` value, or the input row's position) and :data:`PAIR_MEMBER` (str:
        the answer's input column).
    """
    pairs = cal.pairs
    if pairs is None:
        raise ConfigError("split_pairs needs a calibration config with a `pairs` section")
    missing = [c for c in pairs.answers if c not in frame.columns]
    if missing:
        raise InputError(
            f"pairs.answers names column(s) {missing} that the input does not have; "
            f"its columns: {frame.columns}"
        )
    clash = [
        c
        for c in (pairs.answer_column, pairs.label_column, PAIR_ID, PAIR_MEMBER)
        if c in frame.columns and c not in pairs.answers
    ]
    if clash:
        raise ConfigError(
            f"pairs: column name(s) {clash} already exist in the input; set "
            "pairs.answer_column / pairs.label_column to new names"
        )
    if pairs.id_column is not None:
        if pairs.id_column not in frame.columns:
            raise InputError(
                f"pairs.id_column {pairs.id_column!r} is not an input column; "
                f"its columns: {frame.columns}"
            )
        pair_id = pl.col(pairs.id_column).cast(pl.String)
    else:
        pair_id = pl.int_range(pl.len()).cast(pl.String)
    base = frame.with_columns(pair_id.alias(PAIR_ID), pl.int_range(pl.len()).alias(_PAIR_POS))
    keep = [c for c in base.columns if c not in pairs.answers]
    parts = []
    for order, (column, label) in enumerate(pairs.answers.items()):
        parts.append(
            base.select(
                *keep,
                pl.col(column).cast(pl.String).alias(pairs.answer_column),
                pl.lit(float(label), dtype=pl.Float64).alias(pairs.label_column),
                pl.lit(column).alias(PAIR_MEMBER),
                pl.lit(order).alias(_MEMBER_POS),
            )
        )
    out = pl.concat(parts).sort(_PAIR_POS, _MEMBER_POS)
    return out.drop(_PAIR_POS, _MEMBER_POS)


def _check_labels(frame: pl.DataFrame, cal: CalibrationConfig) -> None:
    for mid, spec in cal.labels.items():
        if spec.column not in frame.columns:
            raise InputError(
                f"labels.{mid}.column: {spec.column!r} is not a column of the "
                f"labelled input; its columns: {frame.columns}"
            )
