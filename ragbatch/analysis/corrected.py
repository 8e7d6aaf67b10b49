"""Label-corrected means of committed runs, side by side with the metric's own mean.

Reads the overall rows of each run's ``summary.parquet`` (the PPI columns of
:mod:`ragbatch.analysis.summary`); :func:`corrected_means` is what ``compare`` and the
HTML report show. A summary written before label correction existed has no such columns:
its run then has no rows here.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from ragbatch.analysis.runs import CommittedRun, load_summary

#: Columns of :func:`corrected_means`, with their types.
CORRECTED_SCHEMA = {
    "run": pl.String,
    "run_id": pl.String,
    "metric": pl.String,
    "label_column": pl.String,
    "n_ok": pl.Int64,
    "n_labelled": pl.Int64,
    "mean": pl.Float64,
    "mean_ci_low": pl.Float64,
    "mean_ci_high": pl.Float64,
    "labels_mean": pl.Float64,
    "labels_ci_low": pl.Float64,
    "labels_ci_high": pl.Float64,
    "ppi_mean": pl.Float64,
    "ppi_ci_low": pl.Float64,
    "ppi_ci_high": pl.Float64,
    "ppi_lambda": pl.Float64,
    "ppi_reason": pl.String,
}


def corrected_rows(summary: pl.DataFrame, run: str, run_id: str) -> pl.DataFrame:
    """The overall summary rows of metrics with labels, as :data:`CORRECTED_SCHEMA`.

    Parameters
    ----------
    summary
        A run summary (``summary.parquet``), any version.
    run, run_id
        What to put in the ``run`` (e.g. ``baseline``) and ``run_id`` columns.
    """
    if "label_column" not in summary.columns:
        return pl.DataFrame(schema=CORRECTED_SCHEMA)
    rows = summary.filter(pl.col("slice_column").is_null() & pl.col("label_column").is_not_null())
    return rows.select(
        pl.lit(run, pl.String).alias("run"),
        pl.lit(run_id, pl.String).alias("run_id"),
        *(pl.col(c).cast(t) for c, t in CORRECTED_SCHEMA.items() if c not in ("run", "run_id")),
    )


def corrected_means(runs: Sequence[tuple[str, CommittedRun]]) -> pl.DataFrame:
    """:func:`corrected_rows` of each ``(label, run)``, stacked in that order.

    Raises
    ------
    InputError
        A run has no summary file.
    """
    parts = [corrected_rows(load_summary(run), label, run.run_id) for label, run in runs]
    return pl.concat(parts, how="vertical") if parts else pl.DataFrame(schema=CORRECTED_SCHEMA)


def corrected_lines(rows: Sequence[dict], confidence: float) -> list[str]:
    """Text lines for the console after a run: each labelled metric's corrected mean
    beside the labels' mean, from the overall summary rows among ``rows`` (summary rows as
    dicts); no lines when no metric has labels."""
    labelled = [r for r in rows if r["slice_column"] is None and r.get("label_column")]
    if not labelled:
        return []
    level = f"{confidence:.0%}"
    lines = ["", f"corrected by human labels (prediction-powered, {level} intervals; docs/ppi.md):"]
    for r in labelled:
        line = (
            f"  {r['metric']}: {estimate_text(r['ppi_mean'], r['ppi_ci_low'], r['ppi_ci_high'])}"
            f"; labels only {estimate_text(r['labels_mean'], r['labels_ci_low'], r['labels_ci_high'])}"
            f" ({r['n_labelled']} labelled of {r['n_ok']} ok)"
        )
        if r["ppi_reason"]:
            line += f"; {r['ppi_reason']}"
        lines.append(line)
    return lines


def estimate_text(mean: float | None, low: float | None, high: float | None) -> str:
    """``0.412 [0.380, 0.444]``; ``-`` without an estimate; the mean alone without an interval."""
    if mean is None:
        return "-"
    return f"{mean:.3f}" if low is None or high is None else f"{mean:.3f} [{low:.3f}, {high:.3f}]"
