"""Judge health: measures that tell a degenerate judge from a working one.

For every judge metric, over the same groups as the run summary (all rows, and each
slice value; :mod:`ragbatch.analysis.summary`), :func:`health_measures` computes from the
scores table (docs/judges.md, "Judge health", defines each one):

- ``modal_score``, ``modal_share``: the most common score among ``ok`` cells and the
  share of ``ok`` cells holding it (a constant judge);
- ``empty_extraction_share``: of the cells whose extraction step succeeded, the share
  that extracted an empty list or whose extraction was voided (``answer_relevancy``'s
  noncommittal flag);
- ``junk_reason_share``: of the ``ok`` cells with a judge reason, the share whose reason
  is empty or only a verdict word (:data:`VERDICT_WORDS`);
- ``reason_modal_share``: of the same cells, the share whose reason is the most common;
- ``parse_failure_share``, ``context_too_long_share``: of the judged cells (all but
  ``missing_input``);
- ``position_gap``: over ``ok`` cells with verdict lists of two or more items, the share
  of 1 verdicts in the first half of the lists minus that in the second half.

:func:`degenerate_reasons` turns a group's measures into the reasons it is degenerate
under a :class:`~ragbatch.config.job.DiagnosticsSection`'s thresholds. Which ``details``
keys a metric records these in is its :attr:`JudgeMetric.health
<ragbatch.judge.metric.JudgeMetric.health>`. Everything is DuckDB aggregates, so memory
does not grow with the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import duckdb

from ragbatch.judge.health import HealthFields
from ragbatch.core.status import CONTEXT_TOO_LONG, MISSING_INPUT, OK, PARSE_FAILURE

#: A reason that, lower-cased and stripped of spaces, quotes and end punctuation, is one
#: of these says nothing beyond the verdict.
VERDICT_WORDS: tuple[str, ...] = (
    "",
    "true",
    "false",
    "yes",
    "no",
    "1",
    "0",
    "1.0",
    "0.0",
    "none",
    "null",
    "n/a",
    "verdict",
    "reason",
)

#: The measure columns :func:`health_measures` adds to each summary row, in order.
MEASURES: tuple[str, ...] = (
    "modal_score",
    "modal_share",
    "empty_extraction_share",
    "junk_reason_share",
    "reason_modal_share",
    "parse_failure_share",
    "context_too_long_share",
    "position_gap",
)


@dataclass(frozen=True)
class _Check:
    """One threshold check: the measure, its threshold field, the count it is a share
    of (the ``min_cells`` denominator) and how the reason reads."""

    measure: str
    threshold: str
    denominator: str
    text: str


#: The checks, in the order their reasons are listed.
CHECKS: tuple[_Check, ...] = (
    _Check(
        "modal_share",
        "modal_share_max",
        "n_ok",
        "constant score {modal_score:g} on {share:.0%} of ok cells",
    ),
    _Check(
        "empty_extraction_share",
        "empty_extraction_max",
        "n_extracted",
        "empty extraction on {share:.0%} of cells",
    ),
    _Check(
        "junk_reason_share",
        "junk_reason_max",
        "n_reasons",
        "empty or verdict-only reasons on {share:.0%} of ok cells",
    ),
    _Check(
        "reason_modal_share",
        "reason_modal_share_max",
        "n_reasons",
        "one reason repeated on {share:.0%} of ok cells",
    ),
    _Check(
        "parse_failure_share",
        "parse_failure_max",
        "n_judged",
        "parse failures on {share:.0%} of judged cells",
    ),
    _Check(
        "context_too_long_share",
        "context_too_long_max",
        "n_judged",
        "context_too_long on {share:.0%} of judged cells",
    ),
    _Check(
        "position_gap",
        "position_gap_max",
        "n_lists",
        "verdicts depend on list position (first half minus second half {share:+.2f})",
    ),
)


def _path(key: str) -> str:
    return f"'$.{key}'"


def _cell_facts(health: HealthFields) -> str:
    """SQL expressions over one cell (``status``, ``score``, ``details``) for the
    facts the measures count; NULL where the metric records no such field."""
    extraction = "NULL::BOOLEAN"
    if health.extraction:
        empty = f"json_array_length(details, {_path(health.extraction)}) = 0"
        if health.extraction_void:
            void = (
                f"coalesce(TRY_CAST(json_extract(details, {_path(health.extraction_void)}) "
                "AS BOOLEAN), false)"
            )
            empty = f"({empty} OR {void})"
        extraction = (
            f"CASE WHEN json_extract(details, {_path(health.extraction)}) IS NOT NULL "
            f"THEN {empty} END"
        )
    reason = "NULL::VARCHAR"
    if health.reason:
        reason = (
            f"CASE WHEN status = '{OK}' THEN trim(lower(json_extract_string(details, "
            f"{_path(health.reason)})), ' \t\n\r\"''.!,;:') END"
        )
    verdicts = "NULL::INTEGER[]"
    if health.verdicts:
        verdicts = (
            f"CASE WHEN status = '{OK}' THEN TRY_CAST(json_extract(details, "
            f"{_path(health.verdicts)}) AS INTEGER[]) END"
        )
    return f"{extraction} AS extraction_empty, {reason} AS reason, {verdicts} AS verdicts"


def health_measures(
    con: duckdb.DuckDBPyConnection,
    table: str,
    metric_id: str,
    health: HealthFields,
    groupings: Sequence[tuple[Any, str]],
) -> dict[tuple, dict[str, Any]]:
    """The health measures of one judge metric per group.

    Parameters
    ----------
    con : duckdb.DuckDBPyConnection
    table : str
        A table or view with columns ``metric``, ``status``, ``score`` (DOUBLE),
        ``details`` (JSON text or NULL) and the group code columns.
    metric_id : str
    health : HealthFields
        Where the metric's cells record extractions, reasons and verdicts.
    groupings : sequence of (key, SQL expression)
        Each grouping's key (``None`` for all rows, the slice index otherwise) and the
        expression giving a cell's group code in it (``NULL::INTEGER`` for all rows).

    Returns
    -------
    dict
        ``(key, code)`` -> the :data:`MEASURES` (float, or None where the group has no
        cell the measure counts) and the denominators ``n_ok``, ``n_extracted``,
        ``n_reasons``, ``n_judged``, ``n_lists`` (int).
    """
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE health_cells AS SELECT *, "
        f"{_cell_facts(health)} FROM {table} WHERE metric = ?",
        [metric_id],
    ).fetchall()
    con.execute(
        "CREATE OR REPLACE TEMP TABLE health_lists AS SELECT *, len(verdicts) // 2 AS half, "
        "CASE WHEN len(verdicts) >= 2 THEN list_sum(list_slice(verdicts, 1, len(verdicts) // 2)) "
        "END AS first_ones, CASE WHEN len(verdicts) >= 2 THEN list_sum(list_slice(verdicts, "
        "len(verdicts) - len(verdicts) // 2 + 1, len(verdicts))) END AS second_ones "
        "FROM health_cells"
    ).fetchall()
    junk = ", ".join(f"'{w}'" for w in VERDICT_WORDS)
    out: dict[tuple, dict[str, Any]] = {}
    for key, code in groupings:
        counts = _fetch(
            con,
            f"""
            SELECT {code} AS code,
              count(*) FILTER (WHERE status = '{OK}') AS n_ok,
              count(extraction_empty) AS n_extracted,
              count(*) FILTER (WHERE extraction_empty) AS n_empty,
              count(reason) AS n_reasons,
              count(*) FILTER (WHERE reason IN ({junk})) AS n_junk,
              count(*) FILTER (WHERE status <> '{MISSING_INPUT}') AS n_judged,
              count(*) FILTER (WHERE status = '{PARSE_FAILURE}') AS n_parse_failure,
              count(*) FILTER (WHERE status = '{CONTEXT_TOO_LONG}') AS n_context_too_long,
              count(first_ones) AS n_lists,
              sum(first_ones) AS first_ones, sum(half) FILTER (WHERE first_ones IS NOT NULL)
                AS half_items, sum(second_ones) AS second_ones
            FROM health_lists GROUP BY ALL""",
        )
        modal = _modal(con, code, "score", f"status = '{OK}'")
        reasons = _modal(con, code, "reason", "reason IS NOT NULL")
        for c, row in counts.items():
            out[(key, c)] = _measures(row, modal.get(c), reasons.get(c))
    return out


def _fetch(con: duckdb.DuckDBPyConnection, sql: str) -> dict[Any, dict[str, Any]]:
    cursor = con.execute(sql)
    names = [d[0] for d in cursor.description]
    return {row[0]: dict(zip(names, row)) for row in cursor.fetchall()}


def _modal(
    con: duckdb.DuckDBPyConnection, code: str, column: str, where: str
) -> dict[Any, tuple[Any, int]]:
    """Per group code: the most common value of ``column`` among the rows matching
    ``where`` (ties: the smallest value) and its count."""
    rows = con.execute(f"""
        SELECT code, v, c FROM (
          SELECT code, v, c, row_number() OVER (PARTITION BY code ORDER BY c DESC, v ASC) AS k
          FROM (SELECT {code} AS code, {column} AS v, count(*) AS c FROM health_lists
                WHERE {where} GROUP BY ALL))
        WHERE k = 1""").fetchall()
    return {c: (v, int(n)) for c, v, n in rows}


def _share(part: Any, whole: Any) -> float | None:
    return float(part) / float(whole) if whole else None


def _measures(
    row: dict[str, Any], modal: tuple[Any, int] | None, reason: tuple[Any, int] | None
) -> dict[str, Any]:
    half = row["half_items"]
    gap = None
    if half:
        gap = float(row["first_ones"]) / float(half) - float(row["second_ones"]) / float(half)
    return {
        "modal_score": None if modal is None else float(modal[0]),
        "modal_share": None if modal is None else _share(modal[1], row["n_ok"]),
        "empty_extraction_share": _share(row["n_empty"], row["n_extracted"]),
        "junk_reason_share": _share(row["n_junk"], row["n_reasons"]),
        "reason_modal_share": None if reason is None else _share(reason[1], row["n_reasons"]),
        "parse_failure_share": _share(row["n_parse_failure"], row["n_judged"]),
        "context_too_long_share": _share(row["n_context_too_long"], row["n_judged"]),
        "position_gap": gap,
        **{
            k: int(row[k] or 0) for k in ("n_ok", "n_extracted", "n_reasons", "n_judged", "n_lists")
        },
    }


def degenerate_reasons(
    measures: dict[str, Any], health: HealthFields, thresholds: Any
) -> list[str]:
    """Why a group's result is degenerate under ``thresholds``; empty when it is not.

    Parameters
    ----------
    measures : dict
        A group's entry of :func:`health_measures`.
    health : HealthFields
        The metric's fields (its ``usual_score`` is exempt from the constant check).
    thresholds : DiagnosticsSection
        ``min_cells`` and the ``*_max`` shares; a check flags when its measure (its
        absolute value for ``position_gap``) is above the threshold and its denominator
        holds at least ``min_cells`` cells.

    Returns
    -------
    list of str
        One sentence per failed check, in :data:`CHECKS` order.
    """
    out = []
    for check in CHECKS:
        value = measures.get(check.measure)
        if value is None or measures.get(check.denominator, 0) < thresholds.min_cells:
            continue
        if (
            check.measure == "modal_share"
            and health.usual_score is not None
            and measures["modal_score"] == health.usual_score
        ):
            continue
        limit = getattr(thresholds, check.threshold)
        if abs(value) > limit:
            text = check.text.format(share=value, modal_score=measures.get("modal_score") or 0.0)
            out.append(f"{text} (> {check.threshold} {limit:g})")
    return out


def degenerate_metrics(summary: Any) -> dict[str, str]:
    """Metric id -> reasons (``"; "``-joined) of each metric whose all-rows summary row is
    marked ``degenerate``, in summary order.

    Parameters
    ----------
    summary : polars.DataFrame
        A run's ``summary.parquet``; one written before the health columns existed
        gives an empty dict.
    """
    if "degenerate" not in summary.columns:
        return {}
    rows = summary.filter(
        summary["slice_column"].is_null() & summary["degenerate"].fill_null(False)
    )
    return {r["metric"]: r["degenerate_reasons"] or "" for r in rows.iter_rows(named=True)}
