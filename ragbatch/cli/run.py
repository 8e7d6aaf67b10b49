"""``ragbatch run``: a run end to end, its dry run, its summary table and report."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable, TypeVar

from ragbatch.config.job import JobConfig
from ragbatch.core.errors import ConfigError, RagbatchError
from ragbatch.core.exit_codes import EXIT_DEGENERATE, EXIT_OK
from ragbatch.core.redact import redact_url
from ragbatch.core.run_date import choose_run_date
from ragbatch.cli.common import _load

T = TypeVar("T")


def cmd_run(args: argparse.Namespace) -> int:
    from ragbatch.pipeline.query_hint import query_hint
    from ragbatch.pipeline.runner import run_job

    if args.dry_run:
        if args.report:
            raise ConfigError("--report needs a committed run; leave out --dry-run or --report")
        return cmd_dry_run(args)
    for flag, value in (("--sample-rows", args.sample_rows), ("--pilot-rows", args.pilot_rows)):
        if value is not None:
            raise ConfigError(f"{flag} applies only with --dry-run; add --dry-run or leave it out")
    config = _load(args)
    result = run_job(
        config,
        run_id=args.run_id,
        address=args.address,
        config_dir=Path(args.config).parent,
        allow_uncalibrated=args.allow_uncalibrated,
    )
    layout = result.layout
    judges = sum(len(m.engines) for m in config.metrics if m.engines and len(m.engines) > 1)
    # a panel's judges write a cell each beside the panel's own
    shape = (
        f"({len(config.metrics)} metrics + {judges} panel judges)"
        if judges
        else f"{len(config.metrics)} metrics"
    )
    print(
        f"run {result.run_id} committed ({result.check.n_rows} rows x {shape} = "
        f"{result.check.n_cells} cells)"
    )
    print(f"  scores:   {redact_url(layout.uri(layout.scores_path))}/")
    print(f"  summary:  {redact_url(layout.uri(layout.summary_path))}")
    print(f"  manifest: {redact_url(layout.uri(layout.manifest_path))}")
    print()
    summary = result.summary
    assert summary is not None, "run_job summarizes every run it commits"
    print(_summary_text(summary.table.to_pylist(), summary.settings.confidence))
    if summary.panels:
        from ragbatch.analysis.panel_summary import agreement_text

        print("\n".join(agreement_text(summary.panels)))
    judge = result.manifest.judge
    if judge.metrics:
        t = judge.total
        print(
            f"judge: {t.judge_calls} calls, {t.cache_hits} cache hits, "
            f"{t.prompt_tokens} prompt + {t.completion_tokens} completion tokens"
        )
        if t.refused_too_long:
            print(
                f"  {t.refused_too_long} requests refused as context_too_long (not sent "
                f"to the model; {t.refused_prompt_tokens} prompt tokens)"
            )
        for name, stats in judge.engines.items():
            if stats.get("prefix_cache_hit_rate") is not None:
                print(
                    f"  engine {name}: prefix-cache hit rate {stats['prefix_cache_hit_rate']:.1%}"
                )
    hint = query_hint(layout, (result.config or config).output.storage_options)
    if hint:
        print()
        print("\n".join(hint))
    if args.report:
        _write_run_report(result.config or config, result.run_id)
    if (result.config or config).output.table is not None:
        _write_tables(result.config or config, result.run_id)
    if (result.config or config).output.mlflow is not None:
        _log_to_mlflow(result.config or config, result.run_id)
    gate = args.fail_on_degenerate or config.diagnostics.fail_on_degenerate
    if gate and summary.degenerate():
        names = ", ".join(summary.degenerate())
        print(
            f"ragbatch: run {result.run_id} committed, but these judge metrics are degenerate: "
            f"{names}",
            file=sys.stderr,
        )
        return EXIT_DEGENERATE
    return EXIT_OK


def cmd_dry_run(args: argparse.Namespace) -> int:
    """``run --dry-run``: print the plan and the estimated judge cost; run nothing."""
    from ragbatch.pipeline.dry_run import DEFAULT_SAMPLE_ROWS, dry_run
    from ragbatch.pipeline.dry_run_text import format_dry_run
    from ragbatch.pipeline.runner import prepare_import_paths
    from ragbatch.config.templating import render_config, uri_templates

    config = _load(args)
    templates = uri_templates(config)
    if templates:
        config = render_config(config, choose_run_date(config.run.run_date))
    prepare_import_paths(Path(args.config).parent)
    result = dry_run(
        config,
        sample_rows=args.sample_rows or DEFAULT_SAMPLE_ROWS,
        pilot_rows=args.pilot_rows or 0,
        address=getattr(args, "address", None) or os.environ.get("RAY_ADDRESS") or None,
    )
    print(format_dry_run(result))
    return EXIT_OK


def _after_commit(run_id: str, failed: str, step: Callable[[], T]) -> T:
    """``step()``, run once the run committed; a failure becomes a
    :class:`RagbatchError` saying the run is committed but ``failed``, with the cause."""
    try:
        return step()
    except Exception as exc:  # noqa: BLE001 - the run is committed; say so with the cause
        raise RagbatchError(
            f"run {run_id} committed, but {failed}: {type(exc).__name__}: {exc}"
        ) from exc


def _write_tables(config: JobConfig, run_id: str) -> None:
    """``output.table``: write the committed run to its tables (:mod:`ragbatch.ops.table_output`)."""
    from ragbatch.ops.table_output import write_run_tables

    written = _after_commit(
        run_id,
        "it could not be written to its tables",
        lambda: write_run_tables(config, run_id),
    )
    print()
    print(f"table:      {redact_url(written.scores)} ({written.score_rows} rows)")
    print(f"            {redact_url(written.summary)} ({written.summary_rows} rows)")


def _log_to_mlflow(config: JobConfig, run_id: str) -> None:
    """``output.mlflow``: log the committed run (:mod:`ragbatch.ops.mlflow_log`)."""
    from ragbatch.ops.mlflow_log import log_run

    logged = _after_commit(
        run_id, "it could not be logged to MLflow", lambda: log_run(config, run_id)
    )
    done = "logged as" if logged.logged_now else "already logged as"
    print()
    print(
        f"mlflow:     {done} run {logged.mlflow_run_id} in experiment {logged.experiment!r} "
        f"({redact_url(logged.tracking_uri)})"
    )


def _write_run_report(config: JobConfig, run_id: str) -> None:
    """``run --report``: the report and the comparison with the previous committed run."""
    from ragbatch.analysis.nightly import write_run_report
    from ragbatch.calibrate.report import calibration_section
    from ragbatch.ops.nightly_job import calibration_options

    try:
        written = write_run_report(
            config.output.uri,
            run_id,
            config.output.storage_options,
            calibration_options=calibration_options(config),
            calibration_section=calibration_section,
        )
    except Exception as exc:  # noqa: BLE001 - the run is committed; say so with the cause
        raise RagbatchError(
            f"run {run_id} committed, but its report could not be written: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    print()
    print(f"report:     {written.report}")
    if written.comparison is None or written.baseline is None:  # both or neither
        print("comparison: none (no earlier committed run under this output root)")
        return
    print(f"comparison: {written.comparison_text} (with {written.baseline.describe()})")
    changed = written.comparison.metrics.filter(
        written.comparison.metrics["slice"].is_null() & written.comparison.metrics["significant"]
    )
    for r in changed.iter_rows(named=True):
        print(
            f"  {r['metric']}: {r['change']} by {r['mean_diff']:+.3f} "
            f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]"
        )


def _interval_of(row: dict) -> tuple[float, float]:
    """The interval the console shows beside a summary row's mean: the Wilson interval of
    the pass rate for a boolean metric (its mean is the pass rate, and a bootstrap of 0/1
    scores collapses to a point when every cell agrees), else the mean's own interval."""
    if row.get("pass_rate") is not None and row.get("pass_rate_ci_low") is not None:
        return row["pass_rate_ci_low"], row["pass_rate_ci_high"]
    return row["mean_ci_low"], row["mean_ci_high"]


def _summary_text(rows: list[dict], confidence: float) -> str:
    """The overall summary rows (``slice_column`` null) as a text table: cells, ok cells,
    mean over ok cells with its confidence interval (for boolean metrics the Wilson
    interval of the pass rate, :func:`_interval_of`), and the non-zero other statuses; a
    judge metric whose result is degenerate is marked ``DEGENERATE`` and its reasons are
    listed under the table."""
    from ragbatch.core.status import other_statuses

    width = max([28, *(len(r["metric"]) for r in rows)])
    ci = f"{confidence:.0%} CI"
    header = f"{'metric':<{width}} {'n':>7} {'ok':>7} {'mean':>7}  {ci:<16}  other statuses"
    lines = [header, "-" * len(header)]
    for r in rows:
        if r["slice_column"] is not None:
            continue
        other = other_statuses(r)
        if r["mean"] is None:
            mean, interval = "-", "-"
        else:
            mean = f"{r['mean']:.3f}"
            low, high = _interval_of(r)
            interval = f"[{low:.3f}, {high:.3f}]"
        flag = "  DEGENERATE" if r.get("degenerate") else ""
        lines.append(
            f"{r['metric']:<{width}} {r['n_total']:>7} {r['n_ok']:>7} {mean:>7}  "
            f"{interval:<16}  {other}".rstrip()
            + flag
        )
    flagged = [r for r in rows if r["slice_column"] is None and r.get("degenerate")]
    if flagged:
        lines += [
            "",
            "degenerate judge results: the means above say little about the data "
            "(docs/judges.md, \"Judge health\"):",
        ]
        lines += [f"  {r['metric']}: {r['degenerate_reasons']}" for r in flagged]
    from ragbatch.analysis.corrected import corrected_lines

    return "\n".join(lines + corrected_lines(rows, confidence))
