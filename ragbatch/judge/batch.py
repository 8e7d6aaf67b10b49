"""Judge a batch of canonical rows: guards in Polars, programs through a runner, and
the cell and judge columns assembled in row order."""

from __future__ import annotations

from typing import Any, Sequence

import polars as pl
import pyarrow as pa

from ragbatch.core.columns import (
    ANSWER,
    CONTEXTS,
    ISSUES,
    JUDGE_FIELDS,
    NULLABLE_INPUTS,
    QUESTION,
    REFERENCE,
    ROW_ID,
)
from ragbatch.judge.metric import JudgeMetric
from ragbatch.judge.run import JudgeCell, JudgeRunner
from ragbatch.scoring.cells import guard_status

#: Polars dtype of the per-cell judge record (:data:`ragbatch.core.columns.JUDGE_FIELDS`).
JUDGE_DTYPE = pl.Struct(dict(pl.from_arrow(pa.schema(list(JUDGE_FIELDS)).empty_table()).schema))
JUDGE_NAMES = tuple(name for name, _ in JUDGE_FIELDS)

_ROW_KEYS = (ROW_ID, QUESTION, CONTEXTS, ANSWER, REFERENCE)


def with_issues(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with an all-null ``_issues`` column when it has none, and every
    canonical text column the guards may read (null when absent)."""
    if ISSUES not in frame.columns:
        issues = pl.struct([pl.lit(None, pl.String).alias(c) for c in NULLABLE_INPUTS])
        frame = frame.with_columns(issues.alias(ISSUES))
    for column in (QUESTION, ANSWER, REFERENCE):
        if column not in frame.columns:
            frame = frame.with_columns(pl.lit(None, pl.String).alias(column))
    if CONTEXTS not in frame.columns:
        frame = frame.with_columns(pl.lit(None, pl.List(pl.String)).alias(CONTEXTS))
    return frame


def guarded_rows(
    metrics: Sequence[JudgeMetric], frame: pl.DataFrame
) -> tuple[
    dict[str, tuple[list[str | None], list[str | None]]],
    dict[str, list[tuple[int, dict[str, Any]]]],
]:
    """Split the rows of ``frame`` per metric into those a guard settles and those to judge.

    Parameters
    ----------
    metrics : sequence of JudgeMetric
    frame : polars.DataFrame
        ``n`` canonical rows, as returned by :func:`with_issues`.

    Returns
    -------
    settled : dict
        Metric id -> ``(statuses, reasons)``, two lists of ``n`` (null where no guard
        holds, so the row is judged).
    todo : dict
        Metric id -> ``[(row position, row dict), ...]`` of the rows to judge, the row
        dict holding the canonical keys a program reads.
    """
    settled: dict[str, tuple[list[str | None], list[str | None]]] = {}
    todo: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    rows = frame.select([c for c in _ROW_KEYS if c in frame.columns]).to_dicts()
    for metric in metrics:
        status, reason = guard_status(metric.guards())
        guarded = frame.select(status.alias("s"), reason.alias("r"))
        statuses, reasons = guarded["s"].to_list(), guarded["r"].to_list()
        settled[metric.id] = (statuses, reasons)
        todo[metric.id] = [(i, rows[i]) for i, s in enumerate(statuses) if s is None]
    return settled, todo


async def judge_frame(
    runner: JudgeRunner, frame: pl.DataFrame
) -> dict[str, tuple[list[dict], list[dict]]]:
    """Cells and judge records of every row of ``frame`` for each of the runner's metrics.

    A coroutine (the runner's engine calls are awaited, :meth:`JudgeRunner.run`); code
    outside an event loop calls it through :func:`ragbatch.judge.protocol.run_sync`.

    Parameters
    ----------
    runner : JudgeRunner
        A runner of this batch alone (:meth:`JudgeRunner.fork`) when several batches
        are judged at once, so that its totals are the batch's.
    frame : polars.DataFrame
        ``n`` canonical rows (any of row_id, question, contexts, answer, reference,
        _issues).

    Returns
    -------
    dict
        Metric id -> ``(cells, judge)``: two lists of ``n`` dicts in row order, the cell
        fields (:data:`~ragbatch.core.columns.CELL_FIELDS`) and :data:`JUDGE_FIELDS`. Rows
        settled by a guard have null judge fields (no request was made).
    """
    frame = with_issues(frame)
    settled, todo = guarded_rows(runner.metrics, frame)
    return _assembled(runner, frame, settled, await runner.run(todo))


def _assembled(
    runner: JudgeRunner,
    frame: pl.DataFrame,
    settled: dict[str, tuple[list[str | None], list[str | None]]],
    judged: dict[str, dict[int, JudgeCell]],
) -> dict[str, tuple[list[dict], list[dict]]]:
    """The cells and records of :func:`judge_frame` from the guards' and the runner's."""
    out = {}
    for metric in runner.metrics:
        statuses, reasons = settled[metric.id]
        cells, records = [], []
        for i in range(frame.height):
            done = judged[metric.id].get(i)
            cells.append(_cell(done, statuses[i], reasons[i], runner.engine.model_id))
            records.append(_record(done))
        out[metric.id] = (cells, records)
    return out


def _cell(
    done: JudgeCell | None, status: str | None, reason: str | None, model_id: str
) -> dict[str, Any]:
    if done is None:
        return {"score": None, "status": status, "reason": reason, "details": None, "model": None}
    import json

    cell = done.cell
    return {
        "score": float(cell.score) if cell.status == "ok" and cell.score is not None else None,
        "status": cell.status,
        "reason": cell.reason,
        "details": json.dumps(cell.details, ensure_ascii=False)
        if cell.details is not None
        else None,
        "model": model_id,
    }


def _record(done: JudgeCell | None) -> dict[str, Any]:
    if done is None:
        return dict.fromkeys(JUDGE_NAMES)
    t = done.trace
    return {
        "judge_reply": t.judge_reply(),
        "prompt_hash": t.prompt_hash(),
        "prompt_tokens": t.prompt_tokens,
        "completion_tokens": t.completion_tokens,
        "judge_calls": t.judge_calls,
        "cache_hits": t.cache_hits,
        "confidence": t.confidence.value if done.cell.status == "ok" else None,
    }
