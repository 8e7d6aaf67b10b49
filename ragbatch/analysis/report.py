"""The HTML report of one committed run, optionally compared with a baseline run.

:func:`build_report` returns one self-contained HTML document (styles inline, charts as
``data:`` SVG images drawn by :mod:`ragbatch.analysis.plots`, no script, no external
resource; see :mod:`ragbatch.analysis.report_template`). Sections:

- run facts (id, date, name, input, rows, metrics, times, versions);
- per metric: cells, ``ok`` cells, mean with its interval and, for boolean metrics, the
  pass rate with its Wilson interval (all from the run's ``summary.parquet``), and a
  histogram of the ``ok`` scores; for metrics with human labels, a table of the
  label-corrected mean beside the metric's own and the labels' mean (:mod:`ragbatch.
  analysis.ppi`);
- judge health: a warning naming each judge metric whose result is degenerate, and per
  metric in the metric table its health (``degenerate`` with the reasons, from the
  summary's health columns; docs/judges.md, "Judge health");
- per slice column: each value's mean and interval per metric, from the summary;
- statuses: cells per metric and status (parse failures, timeouts, missing inputs, ...);
- with a baseline: the paired comparison of :func:`ragbatch.analysis.compare.compare_runs`
  (this run is the candidate) and the rows that moved most;
- worst rows per metric with their inputs (read again from the run's input, see
  :mod:`ragbatch.analysis.inputs`), reasons and judge replies.

Every text from the data is HTML-escaped (Jinja2 autoescaping). Input texts are never
shown next to a PII metric (kind ``pii``): its rows list ids, scores, statuses and
reasons only (the PII metrics' reasons name entity types and counts, never values).
"""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any, Callable, Sequence

import jinja2
import polars as pl

from ragbatch import __version__
from ragbatch.core import columns as C
from ragbatch.analysis import plots, trends
from ragbatch.analysis.compare import Comparison, compare_runs
from ragbatch.analysis.compare_text import pairing_line
from ragbatch.analysis.corrected import corrected_rows
from ragbatch.analysis.inputs import load_inputs
from ragbatch.analysis.metric_facts import MetricFacts, metric_facts
from ragbatch.analysis.report_template import TEMPLATE
from ragbatch.analysis.panel_summary import agreement_rows
from ragbatch.analysis.runs import CommittedRun, load_scores, load_summary
from ragbatch.core.redact import redact_text, redact_url
from ragbatch.core.status import NOT_APPLICABLE, OK, STATUSES, other_statuses

#: Rows listed per metric in the worst-rows and moved-rows tables.
TOP_ROWS = 10
#: Characters of a question, answer, context, reason or judge reply shown before cutting.
CLIP = 600
#: Contexts shown per row.
MAX_CONTEXTS = 3
#: Slice columns with at most this many summary rows get a chart (the rest: a table).
MAX_CHART_VALUES = 15

_FAILED = [s for s in STATUSES if s not in (OK, NOT_APPLICABLE)]


def _clip(text: Any, limit: int = CLIP) -> str:
    if text is None:
        return "(null)"
    text = str(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _interval(low: float | None, high: float | None) -> str:
    return "-" if low is None or high is None else f"[{low:.3f}, {high:.3f}]"


def _data_uri(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def _summary(run: CommittedRun) -> tuple[pl.DataFrame, list[str]]:
    """The run summary with the columns of the per-slice format; summaries written before
    slices and intervals were added get null columns and a note."""
    summary = load_summary(run)
    notes = []
    wanted = {
        "slice_column": pl.String,
        "slice_value": pl.String,
        "slice_other": pl.Boolean,
        "mean_ci_low": pl.Float64,
        "mean_ci_high": pl.Float64,
        "mean_ci_method": pl.String,
        "pass_rate": pl.Float64,
        "pass_rate_ci_low": pl.Float64,
        "pass_rate_ci_high": pl.Float64,
    }
    missing = [c for c in wanted if c not in summary.columns]
    if missing:
        notes.append(
            "This run's summary predates per-slice rows and intervals; they are not shown."
        )
        summary = summary.with_columns(pl.lit(None, wanted[c]).alias(c) for c in missing)
    return summary, notes


def _facts(run: CommittedRun, baseline: CommittedRun | None) -> list[tuple[str, str]]:
    m = run.manifest
    rows = [
        ("run id", run.run_id),
        ("run date", run.run_date.isoformat()),
        ("name", run.name),
        ("output root", redact_url(run.root)),
        ("input", redact_url(m.input.uri)),
        ("rows", str(m.rows.input)),
        ("metrics", ", ".join(run.metric_names)),
        ("started", m.run.started_at),
        ("finished", m.run.finished_at),
        ("ragbatch", m.ragbatch_version),
    ]
    if baseline is not None:
        rows.append(("baseline", baseline.describe()))
    rows.append(
        ("report generated", dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    )
    return rows


def _metric_rows(
    summary: pl.DataFrame, scores: pl.DataFrame, facts: dict[str, MetricFacts]
) -> list[dict[str, Any]]:
    overall = summary.filter(pl.col("slice_column").is_null())
    out = []
    for r in overall.iter_rows(named=True):
        f = facts.get(r["metric"]) or MetricFacts(
            r["metric"], r.get("metric_name") or r["metric"], "", False, True, None, False
        )
        ok = scores.filter((pl.col("metric") == r["metric"]) & (pl.col("status") == OK))["score"]
        other = other_statuses(r)
        pass_rate = (
            "-"
            if r["pass_rate"] is None
            else (
                f"{r['pass_rate']:.3f} {_interval(r['pass_rate_ci_low'], r['pass_rate_ci_high'])}"
            )
        )
        chart = plots.score_distribution(
            ok.to_list(), title=r["metric"], boolean=f.boolean, value_range=f.score_range
        )
        out.append(
            {
                "id": r["metric"],
                "name": f.name,
                "higher_is_better": f.higher_is_better,
                "n_total": r["n_total"],
                "n_ok": r["n_ok"],
                "mean": _num(r["mean"]),
                "interval": _interval(r["mean_ci_low"], r["mean_ci_high"]),
                "pass_rate": pass_rate,
                "other": other or "-",
                "chart": _data_uri(chart),
                "health": _health_text(r),
                "degenerate": bool(r.get("degenerate")),
            }
        )
    return out


def _health_text(row: dict[str, Any]) -> str:
    """A summary row's judge health: ``-`` for a metric without diagnostics (or a summary
    written before them), ``degenerate: <reasons>``, or ``no problem found``."""
    if row.get("degenerate") is None:
        return "-"
    if row["degenerate"]:
        return f"degenerate: {row.get('degenerate_reasons') or ''}"
    return "no problem found"


def _corrected_section(summary: pl.DataFrame, run: CommittedRun) -> list[dict[str, Any]]:
    """The rows of the report's table of label-corrected means (empty without labels)."""
    return [
        {
            "metric": r["metric"],
            "label_column": r["label_column"],
            "n_ok": r["n_ok"],
            "n_labelled": r["n_labelled"],
            "mean": _num(r["mean"]),
            "mean_interval": _interval(r["mean_ci_low"], r["mean_ci_high"]),
            "labels_mean": _num(r["labels_mean"]),
            "labels_interval": _interval(r["labels_ci_low"], r["labels_ci_high"]),
            "ppi_mean": _num(r["ppi_mean"]),
            "ppi_interval": _interval(r["ppi_ci_low"], r["ppi_ci_high"]),
            "ppi_lambda": _num(r["ppi_lambda"], 2),
            "note": r["ppi_reason"] or "",
        }
        for r in corrected_rows(summary, "run", run.run_id).iter_rows(named=True)
    ]


def _slice_label(row: dict[str, Any]) -> str:
    if row["slice_other"]:
        return "(other values)"
    return "(null)" if row["slice_value"] is None else str(row["slice_value"])


def _slice_sections(
    summary: pl.DataFrame,
    metric_ids: list[str],
    facts: dict[str, MetricFacts],
    counts: dict[str, dict[str, int]],
) -> list[dict[str, Any]]:
    """Per slice column: chart (few values), table, and how many values it has; ``counts``
    is the manifest's ``summary.slice_columns`` (column -> values, pooled_values)."""
    sliced = summary.filter(pl.col("slice_column").is_not_null())
    sections = []
    for (column,), group in sliced.group_by(["slice_column"], maintain_order=True):
        first = group.filter(pl.col("metric") == metric_ids[0]) if metric_ids else group
        labels = [_slice_label(r) for r in first.iter_rows(named=True)]
        by_metric = {
            mid: {
                _slice_label(r): r
                for r in group.filter(pl.col("metric") == mid).iter_rows(named=True)
            }
            for mid in metric_ids
        }
        rows = []
        for label in labels:
            cells = []
            for mid in metric_ids:
                r = by_metric[mid].get(label)
                cells.append(
                    "-"
                    if r is None or r["mean"] is None
                    else f"{r['mean']:.3f} {_interval(r['mean_ci_low'], r['mean_ci_high'])} ({r['n_ok']})"
                )
            rows.append({"label": label, "cells": cells})
        chart = None
        if 0 < len(labels) <= MAX_CHART_VALUES:

            def column_of(key: str) -> dict[str, Sequence[float | None]]:
                return {
                    mid: [(by_metric[mid].get(lab) or {}).get(key) for lab in labels]
                    for mid in metric_ids
                }

            chart = _data_uri(
                plots.slice_panel(
                    labels,
                    column_of("mean"),
                    column_of("mean_ci_low"),
                    column_of("mean_ci_high"),
                    title=f"mean by {column}",
                    ranges={m: f.score_range for m, f in facts.items()},
                )
            )
        known = counts.get(column) or {}
        n_values = int(known.get("values", len([lab for lab in labels if lab != "(other values)"])))
        pooled = int(known.get("pooled_values", 0))
        sections.append(
            {
                "column": column,
                "n_values": n_values,
                "pooled": pooled,
                "chart": chart,
                "rows": rows,
                "metric_ids": metric_ids,
                "open": len(labels) <= MAX_CHART_VALUES,
            }
        )
    return sections


def _status_section(summary: pl.DataFrame) -> dict[str, Any]:
    overall = summary.filter(pl.col("slice_column").is_null())
    counts = {
        r["metric"]: {s: int(r.get(f"n_{s}") or 0) for s in STATUSES}
        for r in overall.iter_rows(named=True)
    }
    totals = {s: sum(c[s] for c in counts.values()) for s in STATUSES}
    line = (
        f"{sum(totals.values())} cells: {totals[OK]} ok; parse failures {totals['parse_failure']}, "
        f"timeouts {totals['timeout']}, missing inputs {totals['missing_input']}, "
        f"judge errors {totals['judge_error']}, context too long {totals['context_too_long']}, "
        f"errors {totals['error']}, not applicable {totals['not_applicable']}."
    )
    return {
        "status_line": line,
        "status_chart": _data_uri(plots.status_breakdown(counts)),
        "statuses": list(STATUSES),
        "status_rows": [
            {"metric": m, "counts": [c[s] for s in STATUSES]} for m, c in counts.items()
        ],
    }


def _contexts_text(contexts: Any) -> str:
    if contexts is None:
        return "(null)"
    items = list(contexts)
    shown = [f"[{i + 1}] {_clip(c, CLIP // 2)}" for i, c in enumerate(items[:MAX_CONTEXTS])]
    if len(items) > MAX_CONTEXTS:
        shown.append(f"(+{len(items) - MAX_CONTEXTS} more)")
    return "\n".join(shown) if shown else "(no contexts)"


def _worst(
    scores: pl.DataFrame, facts: dict[str, MetricFacts], metric_ids: list[str], top: int
) -> list[tuple[str, pl.DataFrame, str]]:
    """Per metric: the rows to list and a one-line summary."""
    out = []
    for mid in metric_ids:
        f = facts.get(mid)
        higher = f.higher_is_better if f else True
        cells = scores.filter(pl.col("metric") == mid)
        ok = cells.filter(pl.col("status") == OK).sort(
            ["score", C.ROW_ID], descending=[not higher, False]
        )
        failed = cells.filter(pl.col("status").is_in(_FAILED)).sort(C.ROW_ID)
        worst_ok = ok.head(top)
        line = f"{ok.height} ok cells"
        if worst_ok.height:
            edge = worst_ok["score"][-1]
            n_edge = ok.filter(pl.col("score") == edge).height if edge is not None else 0
            line += f"; {n_edge} score {edge:g}" if n_edge > top else ""
        line += f"; {failed.height} failed"
        out.append((mid, pl.concat([worst_ok, failed.head(top)], how="vertical_relaxed"), line))
    return out


def _worst_sections(
    run: CommittedRun, scores: pl.DataFrame, facts: dict[str, MetricFacts], top: int
) -> tuple[list[dict[str, Any]], list[str]]:
    listed = _worst(scores, facts, list(dict.fromkeys(scores["metric"].to_list())), top)
    ids = {r for _, rows, _ in listed for r in rows[C.ROW_ID].to_list()}
    inputs = load_inputs(run, ids) if ids else None
    texts = (
        {}
        if inputs is None or inputs.rows is None
        else {r[C.ROW_ID]: r for r in inputs.rows.iter_rows(named=True)}
    )
    notes = (
        [] if inputs is None or inputs.note is None else [f"Inputs are not shown: {inputs.note}."]
    )
    sections = []
    for mid, rows, line in listed:
        pii = bool(facts.get(mid) and facts[mid].pii)
        entries = []
        for r in rows.iter_rows(named=True):
            t = texts.get(r[C.ROW_ID], {})
            entries.append(
                {
                    "row_id": r[C.ROW_ID],
                    "score": _num(r["score"]),
                    "status": r["status"],
                    "question": _clip(t.get(C.QUESTION)) if t else "(not available)",
                    "answer": _clip(t.get(C.ANSWER)) if t else "(not available)",
                    "contexts": _contexts_text(t.get(C.CONTEXTS)) if t else "(not available)",
                    "reason": _clip(r.get("reason")) if r.get("reason") is not None else "",
                    "judge_reply": _clip(r.get("judge_reply"))
                    if r.get("judge_reply") is not None
                    else "",
                }
            )
        sections.append({"metric": mid, "summary": line, "pii": pii, "rows": entries})
    return sections, notes


def _p_value(value: float | None) -> str:
    if value is None:
        return "-"
    return "<0.0001" if value < 1e-4 else f"{value:.4f}"


def _flag_rule(comparison: Comparison) -> str:
    """When a change is marked, in one sentence (the comparison's lines are all of its
    metrics and slice values, adjusted together)."""
    if comparison.fdr is None:
        return (
            "a change is marked when its interval excludes zero (no control for testing "
            "many lines at once)."
        )
    return (
        "a change is marked when its interval excludes zero and its p-value (McNemar's "
        "exact test for 0/1 scores, else a paired t-test), adjusted over all lines of the "
        f"comparison by Benjamini-Hochberg, is at most {comparison.fdr:g}: the expected "
        "share of false alarms among marked lines."
    )


#: Most series a slice column's trend panel draws (values of the latest run); a column
#: with more values is left out of the trend chart (its values are in the Slices section).
MAX_TREND_LINES = 8


def _trend_section(
    run: CommittedRun, metric_ids: list[str], facts: dict[str, MetricFacts], nights: int
) -> dict[str, Any] | None:
    """The trend over the last ``nights`` committed runs (:mod:`ragbatch.analysis.trends`):
    per metric a chart (all rows, then one panel per slice column with few values), the
    all-rows means per run, and the shifts; None for the first run under its root."""
    runs = trends.trend_runs(run, nights)
    if len(runs) < 2:
        return None
    series = trends.trend_series(runs)
    shifts = trends.find_shifts(series)
    ticks = [r.run_date.isoformat() for r in runs]
    latest = series.filter(pl.col("night") == len(runs) - 1)

    def values(rows: pl.DataFrame) -> tuple[list, list, list]:
        by_night = {r["night"]: r for r in rows.iter_rows(named=True)}
        got = [by_night.get(i, {}) for i in range(len(runs))]
        return (
            [g.get("mean") for g in got],
            [g.get("mean_ci_low") for g in got],
            [g.get("mean_ci_high") for g in got],
        )

    charts = []
    for mid in metric_ids:
        mine = series.filter(pl.col("metric") == mid)
        panels = [("all rows", {"all rows": values(mine.filter(pl.col("slice_column").is_null()))})]
        marked = {
            ("all rows", "all rows") for s in shifts if s.metric == mid and s.slice_column is None
        }
        columns = mine["slice_column"].drop_nulls().unique(maintain_order=True).to_list()
        for column in columns:
            shown = (
                latest.filter((pl.col("metric") == mid) & (pl.col("slice_column") == column))[
                    "slice_value"
                ]
                .fill_null("(null)")
                .to_list()
            )
            if not 0 < len(shown) <= MAX_TREND_LINES:
                continue
            in_column = mine.filter(pl.col("slice_column") == column).with_columns(
                pl.col("slice_value").fill_null("(null)")
            )
            name = f"by {column}"
            panels.append(
                (name, {v: values(in_column.filter(pl.col("slice_value") == v)) for v in shown})
            )
            marked |= {
                (name, s.slice_value or "(null)")
                for s in shifts
                if s.metric == mid and s.slice_column == column
            }
        fact = facts.get(mid)
        chart = plots.trend_chart(
            ticks,
            panels,
            title=f"{mid} over the last {len(runs)} runs",
            marked=marked,
            score_range=fact.score_range if fact is not None else None,
        )
        charts.append({"metric": mid, "chart": _data_uri(chart)})
    overall = series.filter(pl.col("slice_column").is_null())
    table = []
    for night, r in enumerate(runs):
        cells = {
            row["metric"]: row
            for row in overall.filter(pl.col("night") == night).iter_rows(named=True)
        }
        table.append(
            {
                "run_date": r.run_date.isoformat(),
                "run_id": r.run_id,
                "cells": [
                    "-"
                    if cells.get(mid, {}).get("mean") is None
                    else f"{cells[mid]['mean']:.3f} "
                    f"{_interval(cells[mid]['mean_ci_low'], cells[mid]['mean_ci_high'])}"
                    for mid in metric_ids
                ],
            }
        )
    return {
        "nights": len(runs),
        "charts": charts,
        "metric_ids": metric_ids,
        "table": table,
        "shift_nights": trends.SHIFT_NIGHTS,
        "shifts": [
            {
                "metric": s.metric,
                "slice": "all rows"
                if s.slice_column is None
                else f"{s.slice_column}={s.slice_value if s.slice_value is not None else '(null)'}",
                "direction": s.direction,
                "change": "better"
                if (s.direction == "up")
                == (facts[s.metric].higher_is_better if s.metric in facts else True)
                else "worse",
                "reference": f"{s.reference:.3f}",
                "latest": ", ".join(f"{m:.3f}" for m in s.latest),
                "nights": s.nights,
            }
            for s in shifts
        ],
    }


def _comparison_section(
    comparison: Comparison, baseline: CommittedRun, run: CommittedRun, facts: dict[str, MetricFacts]
) -> dict[str, Any]:
    overall = comparison.metrics.filter(pl.col("slice").is_null())
    rows = [
        {
            "metric": r["metric"],
            "n_pairs": r["n_pairs"],
            "baseline_mean": _num(r["baseline_mean"]),
            "candidate_mean": _num(r["candidate_mean"]),
            "mean_diff": "-" if r["mean_diff"] is None else f"{r['mean_diff']:+.3f}",
            "interval": _interval(r["ci_low"], r["ci_high"]),
            "p_value": _p_value(r["p_value"]),
            "p_adjusted": _p_value(r["p_adjusted"]),
            "change": r["change"],
            "n_status_changed": r["n_status_changed"],
        }
        for r in overall.iter_rows(named=True)
    ]
    chart = None
    if overall.height:
        chart = _data_uri(
            plots.interval_dots(
                overall["metric"].to_list(),
                overall["mean_diff"].to_list(),
                overall["ci_low"].to_list(),
                overall["ci_high"].to_list(),
                title="this run minus baseline",
                xlabel="mean paired difference",
                zero_line=True,
            )
        )
    moved = comparison.moved
    b_inputs = load_inputs(baseline, moved["baseline_row_id"].to_list()) if moved.height else None
    c_inputs = load_inputs(run, moved["candidate_row_id"].to_list()) if moved.height else None
    b_text = (
        {}
        if b_inputs is None or b_inputs.rows is None
        else {r[C.ROW_ID]: r for r in b_inputs.rows.iter_rows(named=True)}
    )
    c_text = (
        {}
        if c_inputs is None or c_inputs.rows is None
        else {r[C.ROW_ID]: r for r in c_inputs.rows.iter_rows(named=True)}
    )
    notes = [
        f"Inputs of the moved rows are not shown: {i.note}."
        for i in (b_inputs, c_inputs)
        if i is not None and i.note
    ]
    if comparison.pairing.note:
        notes.append(comparison.pairing.note)
    moved_rows = []
    for r in moved.iter_rows(named=True):
        b, c = b_text.get(r["baseline_row_id"], {}), c_text.get(r["candidate_row_id"], {})
        row = (
            r["baseline_row_id"]
            if r["baseline_row_id"] == r["candidate_row_id"]
            else f"{r['baseline_row_id']} / {r['candidate_row_id']}"
        )
        moved_rows.append(
            {
                "metric": r["metric"],
                "row": row,
                "change": r["change"],
                "scores": f"{r['baseline_score']:.3f} → {r['candidate_score']:.3f}",
                "pii": bool(facts.get(r["metric"]) and facts[r["metric"]].pii),
                "question": _clip((c or b).get(C.QUESTION)) if (c or b) else "(not available)",
                "baseline_answer": _clip(b.get(C.ANSWER)) if b else "(not available)",
                "candidate_answer": _clip(c.get(C.ANSWER)) if c else "(not available)",
                "baseline_reason": _clip(r["baseline_reason"])
                if r["baseline_reason"] is not None
                else "-",
                "candidate_reason": _clip(r["candidate_reason"])
                if r["candidate_reason"] is not None
                else "-",
            }
        )
    return {
        "baseline": baseline.describe(),
        "pairing": pairing_line(comparison),
        "flag_rule": _flag_rule(comparison),
        "notes": notes,
        "chart": chart,
        "rows": rows,
        "status_changes": comparison.status_changes.to_dicts(),
        "moved": moved_rows,
    }


#: Builds the report's calibration section from the run and the calibration root's fsspec
#: options: :func:`ragbatch.calibrate.report.calibration_section`, passed in by the caller
#: so that the analysis layer does not import the calibration command's package.
CalibrationSection = Callable[[CommittedRun, "dict[str, Any] | None"], "dict[str, Any] | None"]


def build_report(
    run: CommittedRun,
    baseline: CommittedRun | None = None,
    *,
    top: int = TOP_ROWS,
    comparison: Comparison | None = None,
    calibration_options: dict[str, Any] | None = None,
    calibration_section: CalibrationSection | None = None,
    trend_nights: int = trends.TREND_NIGHTS,
) -> str:
    """Render the HTML report of ``run``.

    Parameters
    ----------
    run : CommittedRun
    baseline : CommittedRun, optional
        Compare ``run`` (as the candidate) with this run.
    top : int
        Rows per metric in the worst-rows and moved-rows tables.
    comparison : Comparison, optional
        A comparison of ``baseline`` and ``run`` already computed (otherwise computed
        with :func:`ragbatch.analysis.compare.compare_runs` and default settings).
    calibration_options : dict, optional
        fsspec options of the calibration root the run's config names
        (:func:`ragbatch.calibrate.report.calibration_section` explains the default).
    calibration_section : callable, optional
        Builds the "Agreement with human labels" section (:data:`CalibrationSection`);
        without it the report has no such section.
    trend_nights : int
        How many committed runs under the run's root (the run and those before it) the
        trend section shows (:mod:`ragbatch.analysis.trends`); 0 leaves it out.

    Returns
    -------
    str
        The HTML document (UTF-8 text), viewable offline.

    Raises
    ------
    InputError
        The run (or baseline) has no score or summary files.
    """
    scores = load_scores(run, [C.ROW_ID, "metric", "score", "status", "reason", "judge_reply"])
    summary, notes = _summary(run)
    facts = metric_facts(run, *([baseline] if baseline is not None else []))
    metric_ids = summary.filter(pl.col("slice_column").is_null())["metric"].to_list()
    worst, worst_notes = _worst_sections(run, scores, facts, top)
    section = None
    if baseline is not None:
        comparison = comparison or compare_runs(baseline, run, top=top)
        section = _comparison_section(comparison, baseline, run, facts)
    confidence = float(run.manifest.summary.get("confidence") or 0.95)
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    metrics = _metric_rows(summary, scores, facts)
    return env.from_string(TEMPLATE).render(
        version=__version__,
        run=run,
        facts=_facts(run, baseline),
        degenerate=[m["id"] for m in metrics if m["degenerate"]],
        notes=[redact_text(n) for n in notes + worst_notes],
        confidence_label=f"{confidence:.0%}",
        metrics=metrics,
        slices=_slice_sections(
            summary, metric_ids, facts, run.manifest.summary.get("slice_columns") or {}
        ),
        corrected=_corrected_section(summary, run),
        panels=agreement_rows(run.manifest.summary.get("panels") or {}),
        **_status_section(summary),
        comparison=section,
        trend=_trend_section(run, metric_ids, facts, trend_nights) if trend_nights > 0 else None,
        worst=worst,
        top=top,
        clip=CLIP,
        calibration=(
            calibration_section(run, calibration_options)
            if calibration_section is not None
            else None
        ),
    )
