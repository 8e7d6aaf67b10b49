"""The judge panels' combine step: each panel's cell from its judges' cells of the row.

Runs after every metric stage and before the wide-to-long stage
(:func:`ragbatch.pipeline.stage_builders.chain_stages`), as Ray Data tasks: every row of
the batch gets one cell per panel, so no row is lost or added.

The cells are combined column-wise, with Polars expressions over the judges' score,
status and reason columns (a panel has a handful of judges, so the expressions are built
per judge, never per row). They hold exactly what
:func:`ragbatch.judge.panel.combine_cells` gives row by row (docs/panels.md, "Combine
and status rules"); the scores are written in the reasons and in ``details`` as that
function writes them, by formatting each *distinct* score of the batch once in Python
(a judge metric gives few distinct scores) and looking the texts up per row in Arrow.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from ragbatch.core.columns import CELL_TYPE, ROW_ID, cell_column
from ragbatch.core.errors import StageBugError
from ragbatch.core.status import OK
from ragbatch.judge.panel import TIE_STATUS, PanelPlan, format_score


def combine_panels(batch: pa.Table, panels: list[PanelPlan]) -> pa.Table:
    """``batch`` with a cell column ``__ragbatch_cell::<panel id>`` appended per panel.

    Parameters
    ----------
    batch : pyarrow.Table
        ``n`` rows holding each panel member's cell column (:data:`CELL_TYPE` structs)
        and, for messages, ``row_id`` (string).
    panels : list of PanelPlan

    Returns
    -------
    pyarrow.Table
        ``batch``'s columns unchanged, then one :data:`CELL_TYPE` column per panel, ``n``
        rows, each cell the one :func:`ragbatch.judge.panel.combine_cells` gives for the
        row's member cells (``model`` null).

    Raises
    ------
    StageBugError
        A member's cell column is missing (the message names the panel and the judge),
        or holds a null cell or a cell with a null status (it names the panel, the judge
        and the row id): a judge stage broke its contract of one cell per row.
    """
    out = batch
    for panel in panels:
        out = out.append_column(cell_column(panel.id), panel_cells(batch, panel))
    return out


def panel_cells(batch: pa.Table, panel: PanelPlan) -> pa.StructArray:
    """The panel cells of ``batch``'s rows (:data:`CELL_TYPE`, ``batch.num_rows`` long).

    Raises
    ------
    StageBugError
        As :func:`combine_panels`.
    """
    members = [_member_cells(batch, panel, j) for j in range(len(panel.judges))]
    columns: dict[str, pa.Array] = {}
    for i, cells in enumerate(members):
        score = pc.struct_field(cells, "score")
        status = pc.struct_field(cells, "status")
        columns[f"s{i}"] = score
        columns[f"t{i}"] = status
        columns[f"r{i}"] = pc.struct_field(cells, "reason")
        # the texts of each score: in reasons (format_score) and in details (JSON)
        columns[f"f{i}"] = _texts(score, format_score, None)
        columns[f"js{i}"] = _texts(score, json.dumps, "null")
        columns[f"jt{i}"] = _texts(status, json.dumps, "null")
    frame = pl.DataFrame(pa.table(columns))
    result = frame.select(_cell_exprs(panel)).to_arrow()
    return pa.StructArray.from_arrays(
        [
            _array(result, "score", pa.float64()),
            _array(result, "status", pa.string()),
            _array(result, "reason", pa.string()),
            _array(result, "details", pa.string()),
            pa.nulls(batch.num_rows, pa.string()),
        ],
        fields=list(CELL_TYPE),
    )


def _member_cells(batch: pa.Table, panel: PanelPlan, i: int) -> pa.StructArray:
    """Judge ``i``'s cells as one struct array, refusing a missing column, a null cell
    or a null status (:class:`StageBugError`)."""
    judge, key = panel.judges[i], panel.member_keys[i]
    name = cell_column(key)
    if name not in batch.column_names:
        raise StageBugError(
            f"panel {panel.id!r}: judge {judge!r} computed no cells (no column for "
            f"{key!r}); every judge of a panel gives one cell per row"
        )
    column = batch.column(name)
    cells = column.combine_chunks() if column.num_chunks else pa.array([], CELL_TYPE)
    bad = pc.or_kleene(pc.is_null(cells), pc.is_null(pc.struct_field(cells, "status")))
    if pc.any(bad).as_py():
        row = pc.index(bad, True).as_py()
        if ROW_ID in batch.column_names:
            where = f"row_id {batch.column(ROW_ID)[row].as_py()!r}"
        else:
            where = f"row {row} of the batch (it has no {ROW_ID} column)"
        what = "no cell" if not cells[row].is_valid else "a cell without a status"
        raise StageBugError(
            f"panel {panel.id!r}: judge {judge!r} gave {what} for {where}; "
            "every judge of a panel gives one cell with a status per row"
        )
    return cells


def _texts(values: pa.Array, text: Callable[[Any], str], null: str | None) -> pa.Array:
    """``text(v)`` of each value of ``values`` (``null`` for a null), computed once per
    distinct value and looked up per row; NaNs are one value, 0.0 and -0.0 two."""
    distinct = pc.drop_null(pc.unique(values))
    texts = pa.array([text(v) for v in distinct.to_pylist()], pa.string())
    found = pc.take(texts, pc.index_in(values, value_set=distinct))
    return pc.fill_null(found, null) if null is not None else found


def _array(table: pa.Table, name: str, dtype: pa.DataType) -> pa.Array:
    column = table.column(name)
    if column.num_chunks == 0:
        return pa.array([], dtype)
    return column.combine_chunks().cast(dtype)


def _cell_exprs(panel: PanelPlan) -> list[pl.Expr]:
    """The ``score``, ``status``, ``reason`` and ``details`` expressions of the panel
    cell over the frame of :func:`panel_cells` (per judge ``i``: ``s{i}`` score, ``t{i}``
    status, ``r{i}`` reason, ``f{i}`` the score as reasons write it, ``js{i}``/``jt{i}``
    the score and status as JSON), following :func:`ragbatch.judge.panel.combine_cells`."""
    k = range(len(panel.judges))
    s = [pl.col(f"s{i}") for i in k]
    t = [pl.col(f"t{i}") for i in k]
    r = [pl.col(f"r{i}") for i in k]
    # a scoring judge: status ok and a score
    scoring = [(t[i] == OK) & s[i].is_not_null() for i in k]
    n = pl.sum_horizontal([x.cast(pl.Int64) for x in scoring])

    def same(i: int, j: int) -> pl.Expr:
        """Judges i and j both scoring with equal scores (a NaN equals nothing, as two
        NaN floats are two values of a Python set)."""
        return scoring[i] & scoring[j] & (s[i] == s[j]) & s[i].is_not_nan()

    # distinct scores among the scoring judges, and how many gave the first one
    distinct = pl.sum_horizontal(
        [
            (
                scoring[i] & ~pl.any_horizontal([pl.lit(False), *(same(j, i) for j in range(i))])
            ).cast(pl.Int64)
            for i in k
        ]
    )
    counts = [
        pl.sum_horizontal([(same(i, j) if j != i else scoring[i]).cast(pl.Int64) for j in k])
        for i in k
    ]
    first_count = pl.coalesce([pl.when(scoring[i]).then(counts[i]) for i in k])
    other_count = n - first_count
    listed = pl.concat_str(
        [pl.when(scoring[i]).then(pl.lit(f"{panel.judges[i]}=") + pl.col(f"f{i}")) for i in k],
        separator=", ",
        ignore_nulls=True,
    )
    split = (
        pl.when(distinct == 2)
        .then(
            pl.concat_str(
                [
                    pl.lit("judges split "),
                    pl.max_horizontal(first_count, other_count).cast(pl.String),
                    pl.lit("-"),
                    pl.min_horizontal(first_count, other_count).cast(pl.String),
                    pl.lit(": "),
                ]
            )
        )
        .when(distinct > 2)
        .then(pl.lit("judges split: "))
        + listed
    )
    left_out_notes = [
        pl.when(~scoring[i]).then(pl.lit(f"{panel.judges[i]} ") + t[i] + pl.lit(", not counted"))
        for i in k
    ]
    left_out = pl.concat_str(left_out_notes, separator="; ", ignore_nulls=True)
    any_left_out = pl.any_horizontal([~x for x in scoring])
    notes = pl.concat_str(
        [split, pl.when(any_left_out).then(left_out)], separator="; ", ignore_nulls=True
    )
    reason_scored = pl.when(notes != "").then(notes)

    ones = pl.sum_horizontal([(scoring[i] & (s[i] == 1.0)).cast(pl.Int64) for i in k])
    zeros = n - ones
    if panel.combine == "mean":
        terms = [pl.when(scoring[i]).then(s[i]).otherwise(0.0) for i in k]
        total = terms[0]
        for term in terms[1:]:  # judge by judge, as Python's sum adds them
            total = total + term
        # Python's sum starts from 0, so a sum of zeros is 0.0, never -0.0
        total = pl.when(total == 0.0).then(0.0).otherwise(total)
        score_scored = total / n.cast(pl.Float64)
        tie = pl.lit(False)
    elif panel.combine == "unanimous":
        score_scored = pl.when(ones == n).then(1.0).otherwise(0.0)
        tie = pl.lit(False)
    else:
        score_scored = pl.when(ones > zeros).then(1.0).when(ones < zeros).then(0.0)
        tie = ones == zeros
    tie_reason = pl.concat_str(
        [
            pl.concat_str(
                [
                    pl.lit("judges tied "),
                    ones.cast(pl.String),
                    pl.lit("-"),
                    zeros.cast(pl.String),
                    pl.lit(": "),
                    listed,
                ]
            ),
            pl.when(any_left_out).then(left_out),
            pl.lit("a majority needs an odd count"),
        ],
        separator="; ",
        ignore_nulls=True,
    )

    # no scoring judge: the status most judges share (the earliest among equals)
    failed = [pl.when(t[i] == OK).then(pl.lit("error")).otherwise(t[i]) for i in k]
    shares = [pl.sum_horizontal([(failed[j] == failed[i]).cast(pl.Int64) for j in k]) for i in k]
    most = pl.max_horizontal(shares)
    status_none = pl.coalesce([pl.when(shares[i] == most).then(failed[i]) for i in k])
    all_same = pl.all_horizontal(
        [pl.lit(True), *((failed[i] == failed[0]) & r[i].eq_missing(r[0]) for i in k)]
    )

    def given(reason: pl.Expr) -> pl.Expr:
        """A reason that is neither null nor empty."""
        return reason.is_not_null() & (reason != "")

    each = pl.concat_str(
        [
            pl.concat_str(
                [
                    pl.lit(f"{panel.judges[i]} "),
                    failed[i],
                    pl.when(given(r[i]))
                    .then(pl.lit(" (") + r[i] + pl.lit(")"))
                    .otherwise(pl.lit("")),
                ]
            )
            for i in k
        ],
        separator="; ",
    )
    reason_none = (
        pl.when(all_same & given(r[0]))
        .then(r[0])
        .when(all_same)
        .then(pl.lit("every judge: ") + status_none)
        .otherwise(pl.lit("no judge scored the row: ") + each)
    )

    none = n == 0
    score = pl.when(none).then(None).when(tie).then(None).otherwise(score_scored)
    status = (
        pl.when(none).then(status_none).when(tie).then(pl.lit(TIE_STATUS)).otherwise(pl.lit(OK))
    )
    reason = pl.when(none).then(reason_none).when(tie).then(tie_reason).otherwise(reason_scored)
    details = pl.concat_str(
        [
            pl.lit('{"combine":' + json.dumps(panel.combine) + ',"scores":{'),
            pl.concat_str(
                [pl.lit(json.dumps(panel.judges[i]) + ":") + pl.col(f"js{i}") for i in k],
                separator=",",
            ),
            pl.lit('},"statuses":{'),
            pl.concat_str(
                [pl.lit(json.dumps(panel.judges[i]) + ":") + pl.col(f"jt{i}") for i in k],
                separator=",",
            ),
            pl.lit("}}"),
        ]
    )
    return [
        score.cast(pl.Float64).alias("score"),
        status.cast(pl.String).alias("status"),
        reason.cast(pl.String).alias("reason"),
        details.alias("details"),
    ]
