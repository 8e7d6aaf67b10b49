"""The one-screen text ``ragbatch nightly`` prints: what ran, where it went, each metric
against the previous committed run, and the exit code with its meaning."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, cast

from ragbatch.core.exit_codes import EXIT_CODES, EXIT_INPUT_NOT_READY
from ragbatch.ops.nightly_job import NightlyOutcome
from ragbatch.core.redact import redact_text

if TYPE_CHECKING:
    from ragbatch.analysis.runs import CommittedRun
    from ragbatch.config.job import JobConfig
    from ragbatch.pipeline.runner import RunResult


def format_outcome(outcome: NightlyOutcome) -> str:
    """``outcome`` as text: a headline, the paths, one line per metric (cells, ``ok``
    cells, mean; the paired change against the previous run with its interval, marked
    when it regresses beyond the threshold, or when its judge result is degenerate), the
    counts of cells not ``ok`` by status (:func:`not_ok_lines`) and the exit line. URLs
    appear without credentials (:func:`ragbatch.core.redact.redact_text`)."""
    lines = [_headline(outcome)]
    if outcome.config is not None:
        lines.append(f"  input:      {outcome.config.input.uri}")
    run = outcome.run
    if run is not None:
        layout = run.layout
        lines.append(f"  manifest:   {layout.uri(layout.manifest_path)}")
    if outcome.report is not None:
        lines.append(f"  report:     {outcome.report.report}")
    if run is not None:
        lines.append(_baseline_line(outcome))
        judge = run.manifest.judge.total
        if run.manifest.judge.metrics:
            lines.append(
                f"  judge:      {judge.judge_calls} calls, {judge.cache_hits} cache hits, "
                f"{judge.prompt_tokens} prompt + {judge.completion_tokens} completion "
                "tokens"
            )
        lines += ["", *_metric_lines(outcome)]
    committed = outcome.result is not None or outcome.already_committed
    lines += [
        "",
        f"exit {outcome.exit_code}: {EXIT_CODES[outcome.exit_code]}"
        + (f": {outcome.message}" if outcome.message and committed else ""),
    ]
    return redact_text("\n".join(lines))


def _headline(outcome: NightlyOutcome) -> str:
    head = f"night {outcome.night.isoformat()}: run {outcome.run_id}"
    if outcome.exit_code == EXIT_INPUT_NOT_READY:
        return f"{head} not started: its input is not there yet ({outcome.message})"
    if outcome.result is None and not outcome.already_committed:
        return f"{head} not committed: {outcome.message}"
    if outcome.already_committed:
        return f"{head} was already committed; not run again"
    # not already committed, so this call ran it: result and its config are set
    check = cast("RunResult", outcome.result).check
    config = cast("JobConfig", outcome.config)
    return (
        f"{head} committed ({check.n_rows} rows x {len(config.metrics)} metrics = "
        f"{check.n_cells} cells)"
    )


def _baseline_line(outcome: NightlyOutcome) -> str:
    if not outcome.compared:
        return "  compared:   not asked for (--no-report without --fail-on-regression)"
    if outcome.baseline is None:
        return "  compared:   none (the first committed run under this output root)"
    where = ""
    if outcome.report is not None and outcome.report.comparison_text:
        where = f"; {outcome.report.comparison_text}"
    return f"  compared:   with run {outcome.baseline.describe()}{where}"


def _metric_lines(outcome: NightlyOutcome) -> list[str]:
    from ragbatch.analysis.runs import load_summary

    # called only when outcome.run is set (format_outcome)
    summary = load_summary(cast("CommittedRun", outcome.run)).filter(_overall("slice_column"))
    changes: dict[str, dict[str, Any]] = {}
    if outcome.comparison is not None:
        overall = outcome.comparison.metrics.filter(_overall("slice"))
        changes = {r["metric"]: r for r in overall.iter_rows(named=True)}
    regressed = set()
    if outcome.regressions is not None:
        regressed = set(outcome.regressions["metric"].to_list())
    width = max([24, *(len(m) for m in summary["metric"].to_list())])
    vs = f"vs {outcome.baseline.run_id} (paired)" if outcome.baseline is not None else ""
    header = f"{'metric':<{width}} {'n':>6} {'ok':>6} {'mean':>7}   {vs}".rstrip()
    lines = [header, "-" * max(len(header), width + 40)]
    for r in summary.iter_rows(named=True):
        mean = "-" if r["mean"] is None else f"{r['mean']:.3f}"
        text = f"{r['metric']:<{width}} {r['n_total']:>6} {r['n_ok']:>6} {mean:>7}"
        change = changes.get(r["metric"])
        if change is not None:
            text += "   " + _change_text(change)
            if r["metric"] in regressed:
                text += f"  REGRESSED (> {outcome.threshold:g})"
        if r["metric"] in outcome.degenerate:
            text += f"  DEGENERATE: {outcome.degenerate[r['metric']]}"
        lines.append(text.rstrip())
    return lines + not_ok_lines(summary.iter_rows(named=True))


def not_ok_lines(rows: Iterable[dict[str, Any]]) -> list[str]:
    """Lines under the metric table naming, per metric, the cells that are not ``ok``
    (``parse_failure=2, error=1``; :func:`ragbatch.core.status.other_statuses`), so that
    a night whose judge failed on some rows says so on its screen; no lines when every
    cell of every metric in ``rows`` (overall summary rows) is ``ok``."""
    from ragbatch.core.status import other_statuses

    found = [(r["metric"], other_statuses(r)) for r in rows]
    found = [(metric, text) for metric, text in found if text]
    if not found:
        return []
    width = max(len(metric) for metric, _ in found)
    return ["", "cells not ok (statuses: docs/output-schema.md):"] + [
        f"  {metric + ':':<{width + 1}} {text}" for metric, text in found
    ]


def _change_text(change: dict[str, Any]) -> str:
    if not change["n_pairs"] or change["mean_diff"] is None:
        return f"no pairs ok in both runs (status changed: {change['n_status_changed']})"
    return (
        f"{change['mean_diff']:+.3f} [{change['ci_low']:+.3f}, {change['ci_high']:+.3f}] "
        f"over {change['n_pairs']} pairs{' ' + change['change'] if change['change'] else ''}"
    )


def _overall(column: str) -> Any:
    import polars as pl

    return pl.col(column).is_null()
