"""Helpers that build score cells as Polars expressions.

A metric states its input *guards* (conditions that settle a row before scoring: a null
input, an empty answer, ...) in priority order, and a score expression; :func:`cell`
assembles the struct. Metrics whose scoring is Python code (``json_valid``, the Python
``re`` path of ``regex``, ``binary``) use :func:`python_cells`, which evaluates the guards
in Polars and calls Python only for the rows that pass them, in one pass.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import polars as pl
import pyarrow as pa

from ragbatch.core.columns import CELL_FIELDS, ISSUES, internal
from ragbatch.core.reasons import NUMBER_DIGITS
from ragbatch.core.status import MISSING_INPUT, OK

#: Scratch column / struct field names, in the pipeline's own namespace.
_STATUS, _REASON = internal("status"), internal("reason")

#: Polars dtype of a cell, derived from :data:`ragbatch.core.columns.CELL_FIELDS`.
CELL_DTYPE = pl.Struct(dict(pl.from_arrow(pa.schema(list(CELL_FIELDS)).empty_table()).schema))


#: Every character Python's ``str.isspace()`` accepts. Stripping with this set matches
#: Python's ``str.strip()`` exactly (Polars' default strip uses Unicode White_Space, which
#: leaves out U+001C..U+001F).
PY_WHITESPACE = "".join(chr(c) for c in range(0x3100) if chr(c).isspace())


def py_strip(expr: pl.Expr) -> pl.Expr:
    """``expr`` with leading and trailing whitespace removed as Python's ``str.strip()``."""
    return expr.str.strip_chars(PY_WHITESPACE)


@dataclass(frozen=True)
class Guard:
    """A condition (null counts as false) that, when true, gives the cell ``status`` and
    ``reason`` and a null score."""

    when: pl.Expr
    status: str
    reason: pl.Expr


@dataclass(frozen=True)
class PyCell:
    """A cell computed in Python; ``details`` is a JSON-serialisable mapping or None."""

    score: float | None
    status: str = OK
    reason: str | None = None
    details: dict[str, Any] | None = None


def number_text(expr: pl.Expr) -> pl.Expr:
    """A Float64 expression as reason text, as :func:`ragbatch.core.reasons.number_text` writes
    it: rounded to :data:`~ragbatch.core.reasons.NUMBER_DIGITS` significant digits (float noise
    such as ``7.1000000000000005`` becomes ``7.1``) and without a trailing ``.0``."""
    rounded = expr.cast(pl.Float64).round_sig_figs(NUMBER_DIGITS).cast(pl.String)
    return rounded.str.replace(r"\.0$", "")


def missing(column: str) -> Guard:
    """``missing_input`` when ``column`` is null; the reason is the normalizer's note on
    why (for example "contexts: not a JSON list") or "<column> is null"."""
    issue = pl.col(ISSUES).struct.field(column)
    return Guard(
        pl.col(column).is_null(),
        MISSING_INPUT,
        pl.coalesce(issue, pl.lit(f"{column} is null")),
    )


#: A regular expression matching any character that is not Python whitespace
#: (:data:`PY_WHITESPACE`).
_NOT_PY_WHITESPACE = "[^" + "".join(f"\\x{{{ord(c):x}}}" for c in PY_WHITESPACE) + "]"


def blank(column: str) -> Guard:
    """``missing_input`` when the text in ``column`` is empty or only whitespace (as
    Python's ``str.isspace``). The search stops at the first other character, so a long
    text costs no more than a short one."""
    return Guard(
        ~pl.col(column).str.contains(_NOT_PY_WHITESPACE),
        MISSING_INPUT,
        pl.lit(f"{column} is empty"),
    )


def empty_contexts() -> Guard:
    """``missing_input`` when the context list is empty (for metrics that judge contexts:
    nothing was retrieved, so there is nothing to judge)."""
    return Guard(
        pl.col("contexts").list.len() == 0, MISSING_INPUT, pl.lit("contexts is an empty list")
    )


def every_context_blank() -> Guard:
    """``missing_input`` when every context chunk is empty or only whitespace (an empty
    list is not caught here: metrics decide what an empty list means)."""
    blank_chunk = py_strip(pl.element()).str.len_chars().fill_null(0) == 0
    return Guard(
        pl.col("contexts").list.eval(blank_chunk).list.all() & (pl.col("contexts").list.len() > 0),
        MISSING_INPUT,
        pl.lit("every context is empty"),
    )


def context_guards(required: Sequence[str], nonblank: str) -> tuple[Guard, ...]:
    """The guards of a metric that judges the retrieved contexts, in priority order:
    :func:`missing` for each of ``required`` (in that order), :func:`blank` for
    ``nonblank`` (the text the judgment is about or against), then
    :func:`empty_contexts` and :func:`every_context_blank`."""
    return (
        *(missing(column) for column in required),
        blank(nonblank),
        empty_contexts(),
        every_context_blank(),
    )


def share_cell(hits: int, n: int, missed: str, details: dict[str, Any]) -> PyCell:
    """An ``ok`` cell scoring ``hits / n`` (``n`` at least 1), a share in [0, 1]; below
    1 its reason is ``"<n - hits> of <n> <missed>"`` (``missed`` names the items that
    did not count, e.g. ``"contexts not relevant to the question"``), at 1 it has none."""
    reason = f"{n - hits} of {n} {missed}" if hits < n else None
    return PyCell(hits / n, reason=reason, details=details)


def _chain(guards: Sequence[Guard], pick: Callable[[Guard], pl.Expr]) -> pl.Expr:
    """``when(g1) then pick(g1) when(g2) ... otherwise null``."""
    expr = pl.when(guards[0].when).then(pick(guards[0]))
    for g in guards[1:]:
        expr = expr.when(g.when).then(pick(g))
    return expr.otherwise(None)


def guard_status(guards: Sequence[Guard]) -> tuple[pl.Expr, pl.Expr]:
    """(status, reason) expressions of the first guard that holds, null when none holds."""
    if not guards:
        return pl.lit(None, pl.String), pl.lit(None, pl.String)
    status = _chain(guards, lambda g: pl.lit(g.status, pl.String))
    reason = _chain(guards, lambda g: g.reason.cast(pl.String))
    return status, reason


def cell(
    guards: Sequence[Guard],
    score: pl.Expr,
    reason: pl.Expr | None = None,
    details: pl.Expr | None = None,
    model: str | None = None,
) -> pl.Expr:
    """Assemble a cell struct expression.

    Parameters
    ----------
    guards
        Checked in order; the first that holds sets status and reason, and the score,
        ``reason`` and ``details`` below are not used for that row.
    score
        Numeric or boolean expression (booleans become 0.0/1.0), cast to Float64.
    reason
        Optional String explanation for scored rows (for example why a check failed).
    details
        Optional String expression holding a JSON object.
    """
    g_status, g_reason = guard_status(guards)
    blocked = g_status.is_not_null()
    null_str = pl.lit(None, pl.String)
    return pl.struct(
        score=pl.when(blocked).then(None).otherwise(score.cast(pl.Float64)),
        status=pl.coalesce(g_status, pl.lit(OK, pl.String)),
        reason=pl.when(blocked)
        .then(g_reason)
        .otherwise(reason if reason is not None else null_str),
        details=pl.when(blocked).then(None).otherwise(details if details is not None else null_str),
        model=pl.lit(model, pl.String),
    )


def frame_cells(
    guards: Sequence[Guard],
    columns: Sequence[str],
    score_frame: Callable[[pl.DataFrame], pl.DataFrame],
    *,
    unsettled_only: bool = False,
    model: str | None = None,
) -> pl.Expr:
    """A cell expression whose score, reason and details come from one call per batch of
    a function over Polars frames, for metrics built on costly intermediates.

    A plain :func:`cell` that refers to an intermediate (per-context lengths, the result
    of a search) in its score, reason and details evaluates it once per reference where
    Polars' common-subexpression elimination does not apply (list expressions such as
    ``list.eval``, or expressions the simplifier rewrites). ``score_frame`` gets the
    batch's ``columns`` as a frame and materialises each intermediate once; it returns a
    frame of the same height with ``score`` (numeric or boolean), ``reason`` and
    ``details`` (String or null), and may add ``status`` (String): null where it scored
    the row, otherwise the status of a row it cannot score (its ``reason`` then says
    why, and its score and details are not used). Guards behave as in :func:`cell` and
    come first: the values of rows they settle are not used. Guard reasons must be row-wise expressions: they are
    evaluated only on the rows a guard settles (usually none), so a costly reason (the
    index of the first null item of a list) costs nothing on clean batches.

    With ``unsettled_only``, ``score_frame`` gets only the rows no guard settles (a frame
    of their height, possibly empty), for scoring that must not see the others (a model
    that should not be sent null or blank text), and its frame has that height.
    ``model`` fills every cell's ``model`` field.
    """
    g_status, g_reason = guard_status(guards)
    reason_inputs = [c for c in dict.fromkeys(g_reason.meta.root_names()) if c not in columns]
    packed = pl.struct(g_status.alias(_STATUS), *[pl.col(c) for c in [*columns, *reason_inputs]])

    def run(series: pl.Series) -> pl.Series:
        frame = series.struct.unnest()
        status = frame.get_column(_STATUS).cast(pl.String)
        guarded = status.is_not_null()
        if unsettled_only:
            scored = _scatter_scored(
                score_frame(frame.filter(~guarded).select(columns)), guarded, frame.height
            )
        else:
            scored = score_frame(frame.select(columns))
        if scored.height != frame.height:
            raise RuntimeError(f"scoring returned {scored.height} cells for {frame.height} rows")
        unscored = (
            scored.get_column("status").cast(pl.String)
            if "status" in scored.columns
            else pl.repeat(None, frame.height, dtype=pl.String, eager=True)
        )
        cells = pl.DataFrame(
            {
                "guarded": guarded,
                "g_status": status,
                "g_reason": _settled_reasons(frame, guarded, g_reason),
                "s_status": unscored,
                "s": scored.get_column("score"),
                "r": scored.get_column("reason").cast(pl.String),
                "d": scored.get_column("details").cast(pl.String),
            }
        ).select(
            score=pl.when(pl.col("guarded") | pl.col("s_status").is_not_null())
            .then(None)
            .otherwise(pl.col("s").cast(pl.Float64)),
            status=pl.coalesce("g_status", "s_status", pl.lit(OK, pl.String)),
            reason=pl.when("guarded").then("g_reason").otherwise("r"),
            details=pl.when(pl.col("guarded") | pl.col("s_status").is_not_null())
            .then(None)
            .otherwise("d"),
            model=pl.lit(model, pl.String),
        )
        return cells.to_struct("cell").cast(CELL_DTYPE)

    return packed.map_batches(run, return_dtype=CELL_DTYPE)


def _scatter_scored(scored: pl.DataFrame, guarded: pl.Series, height: int) -> pl.DataFrame:
    """``scored`` (one row per unguarded row, in order) spread over ``height`` rows:
    its rows where ``guarded`` is false, nulls elsewhere."""
    if scored.height != height - int(guarded.sum()):
        raise RuntimeError(
            f"scoring returned {scored.height} cells for {height - int(guarded.sum())} rows"
        )
    if not guarded.any():
        return scored
    at = (~guarded).arg_true()
    return pl.DataFrame(
        [
            pl.repeat(None, height, dtype=scored.schema[name], eager=True)
            .alias(name)
            .scatter(at, scored.get_column(name))
            for name in scored.columns
        ]
    )


def batch_cells(
    frame: pl.DataFrame,
    guards: Sequence[Guard],
    columns: Sequence[str],
    score_frame: Callable[[pl.DataFrame], pl.DataFrame],
    model: str | None = None,
) -> pl.Series:
    """The cells of a batch, built eagerly: the guards settle what they hold for, and one
    call of ``score_frame`` scores the rest (a model's batch).

    Parameters
    ----------
    frame : polars.DataFrame
        The batch: at least ``columns`` and what the guards read.
    guards : sequence of Guard
        In priority order, as :func:`cell`.
    columns : sequence of str
        The columns ``score_frame`` gets.
    score_frame : callable
        Gets ``columns`` of the rows no guard settles (a frame of their height, possibly
        empty); returns a frame of that height with ``score`` (Float64), ``status``
        (String: null where it scored the row, else the row's status), ``reason`` and
        ``details`` (String).
    model : str, optional
        Every cell's ``model``.

    Returns
    -------
    polars.Series
        ``frame.height`` cells of :data:`CELL_DTYPE` in row order; status ``ok`` where
        ``score_frame`` scored a row and said nothing else.

    Raises
    ------
    RuntimeError
        ``score_frame`` returned another number of rows.

    Notes
    -----
    What :func:`frame_cells` with ``unsettled_only`` computes, without going through an
    expression: a model stage's batch makes a handful of Polars calls instead of a dozen,
    which is most of its cost when the model itself is fast (a GPU).
    """
    g_status, g_reason = guard_status(guards)
    settled = frame.select(g_status.alias("status"), g_reason.alias("reason"))
    guarded = settled.get_column("status").is_not_null()
    n_settled = int(guarded.sum())
    rows = frame.select(columns) if n_settled == 0 else frame.filter(~guarded).select(columns)
    scored = score_frame(rows)
    if scored.height != rows.height:
        raise RuntimeError(f"scoring returned {scored.height} cells for {rows.height} rows")
    scored = scored.select(
        pl.col("score").cast(pl.Float64),
        pl.coalesce(pl.col("status").cast(pl.String), pl.lit(OK)).alias("status"),
        pl.col("reason").cast(pl.String),
        pl.when(pl.col("status").is_null()).then(pl.col("details").cast(pl.String)),
    )
    if n_settled:
        scored = _scatter_scored(scored, guarded, frame.height).with_columns(
            pl.when(guarded).then(settled.get_column("status")).otherwise(pl.col("status")),
            pl.when(guarded).then(settled.get_column("reason")).otherwise(pl.col("reason")),
        )
    return scored.with_columns(
        pl.when(pl.col("status") == OK).then(pl.col("score")),
        pl.lit(model, pl.String).alias("model"),
    ).to_struct("cell")


def _settled_reasons(frame: pl.DataFrame, blocked: pl.Series, reason: pl.Expr) -> pl.Series:
    """``reason`` evaluated on the rows of ``frame`` where ``blocked`` holds, null on the
    others (String, ``frame.height`` long)."""
    out = pl.repeat(None, frame.height, dtype=pl.String, eager=True)
    if not blocked.any():
        return out
    at = blocked.arg_true()
    # with_columns, not select: a reason that is a literal still gets one value per row
    values = frame.filter(blocked).with_columns(reason.cast(pl.String).alias(_REASON))
    return out.scatter(at, values.get_column(_REASON))


def python_cells(
    guards: Sequence[Guard],
    columns: Sequence[str],
    score_rows: Callable[[list[dict[str, Any]]], list[PyCell]],
    model: str | None = None,
) -> pl.Expr:
    """A cell expression whose scoring runs in Python on the rows no guard settles.

    ``score_rows`` receives those rows as dicts of ``columns`` and returns one
    :class:`PyCell` per row, in order. Guards are evaluated by Polars; Python is called
    once per batch, and only the unsettled rows' values are converted to Python objects.
    """
    g_status, g_reason = guard_status(guards)
    packed = pl.struct(
        g_status.alias(_STATUS), g_reason.alias(_REASON), *[pl.col(c) for c in columns]
    )

    def run(series: pl.Series) -> pl.Series:
        status = series.struct.field(_STATUS)
        reason = series.struct.field(_REASON)
        todo = status.is_null()
        rows: list[dict[str, Any]] = []
        if todo.any():
            picked = series.filter(todo)
            values = [picked.struct.field(c).to_list() for c in columns]
            rows = [dict(zip(columns, row)) for row in zip(*values)]
        scored = score_rows(rows) if rows else []
        if len(scored) != len(rows):
            raise RuntimeError(f"scoring returned {len(scored)} cells for {len(rows)} rows")
        return _assemble(
            series.len(), status, reason, todo, [to_cell_dict(pc, model) for pc in scored], model
        )

    return packed.map_batches(run, return_dtype=CELL_DTYPE)


def _assemble(
    n: int,
    status: pl.Series,
    reason: pl.Series,
    todo: pl.Series,
    cells: list[dict[str, Any]],
    model: str | None,
) -> pl.Series:
    """Cells of a batch: the guards' status and reason where a guard settled the row (null
    score and details), and ``cells`` (one dict per unsettled row, in order) elsewhere."""
    score = pl.repeat(None, n, dtype=pl.Float64, eager=True).alias("score")
    details = pl.repeat(None, n, dtype=pl.String, eager=True).alias("details")
    status, reason = status.cast(pl.String).alias("status"), reason.cast(pl.String).alias("reason")
    if cells:
        at = todo.arg_true()
        score = score.scatter(at, pl.Series([c["score"] for c in cells], dtype=pl.Float64))
        status = status.scatter(at, pl.Series([c["status"] for c in cells], dtype=pl.String))
        reason = reason.scatter(at, pl.Series([c["reason"] for c in cells], dtype=pl.String))
        details = details.scatter(at, pl.Series([c["details"] for c in cells], dtype=pl.String))
    frame = pl.DataFrame(
        [
            score,
            status,
            reason,
            details,
            pl.repeat(model, n, dtype=pl.String, eager=True).alias("model"),
        ]
    )
    return frame.to_struct("cell").cast(CELL_DTYPE)


def to_cell_dict(pc: PyCell, model: str | None = None) -> dict[str, Any]:
    """A :class:`PyCell` as a dict with the cell fields (score null unless ``ok``)."""
    return {
        "score": float(pc.score) if pc.status == OK and pc.score is not None else None,
        "status": pc.status,
        "reason": pc.reason,
        "details": (
            json.dumps(pc.details, ensure_ascii=False, separators=(",", ":"))
            if pc.details is not None
            else None
        ),
        "model": model,
    }


def details_json(**fields: pl.Expr) -> pl.Expr:
    """A JSON object string built from named expressions (Polars ``struct.json_encode``)."""
    return pl.struct(**fields).struct.json_encode()
