"""Human labels as numbers: a mapping table, numeric parsing and a threshold."""

from __future__ import annotations

import polars as pl

from ragbatch.calibrate.config import LabelSpec
from ragbatch.core.errors import InputError


def label_values(column: pl.Series, spec: LabelSpec, row_ids: pl.Series) -> pl.Series:
    """The labels of ``column`` as float64 values (null where the cell is null or empty).

    Parameters
    ----------
    column : polars.Series
        The label column as read (text, integers, floats or booleans).
    spec : LabelSpec
        ``values`` maps the cells' text to numbers; else cells are parsed as numbers.
        For ``binary`` labels, ``threshold`` maps numbers to 1 (``>= threshold``) or 0.
    row_ids : polars.Series
        Row ids, same length, for messages.

    Returns
    -------
    polars.Series
        float64; binary labels are 0.0 or 1.0.

    Raises
    ------
    InputError
        A cell is not in ``values``, is not a number, or (binary, no threshold) is not 0
        or 1; the message names the column, the first such row and the fix.
    """
    if column.dtype == pl.Boolean:
        column = column.cast(pl.Int8)
    text = column.cast(pl.String).str.strip_chars()
    text = pl.Series(column.name, [None if t == "" else t for t in text.to_list()], dtype=pl.String)
    if spec.values is not None:
        lookup = {str(k).strip(): float(v) for k, v in spec.values.items()}
        values = text.replace_strict(lookup, default=None, return_dtype=pl.Float64)
        bad = text.is_not_null() & values.is_null()
        _raise_if(
            bad,
            text,
            row_ids,
            spec.column,
            f"is not a key of labels.<metric>.values ({sorted(lookup)}); add it there",
        )
    else:
        values = text.cast(pl.Float64, strict=False)
        bad = text.is_not_null() & (values.is_null() | values.is_nan())
        _raise_if(
            bad,
            text,
            row_ids,
            spec.column,
            "is not a number; give a `values` table that maps label text to numbers",
        )
    if spec.type == "binary":
        if spec.threshold is not None:
            values = (
                pl.when(values.is_null())
                .then(None)
                .otherwise((values >= spec.threshold).cast(pl.Float64))
                .alias(column.name)
            )
            values = pl.select(values).to_series()
        else:
            bad = values.is_not_null() & ~values.is_in([0.0, 1.0])
            _raise_if(
                bad,
                text,
                row_ids,
                spec.column,
                "is not 0 or 1; set a `threshold` or a `values` table, or type: graded",
            )
    return values.alias(column.name)


def _raise_if(bad: pl.Series, text: pl.Series, row_ids: pl.Series, column: str, what: str) -> None:
    if not bad.any():
        return
    i = int(bad.arg_max())
    raise InputError(
        f"label column {column!r}, row {row_ids[i]!r}: value {text[i]!r} {what} "
        f"({int(bad.sum())} such rows)"
    )
