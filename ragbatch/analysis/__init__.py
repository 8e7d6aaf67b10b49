"""Statistics over written runs: confidence intervals and per-slice summaries.

``ragbatch.analysis.intervals`` holds the interval estimators (percentile bootstrap of a
mean, paired bootstrap of a mean difference, Wilson score interval of a proportion). They
depend on numpy and the standard library only. ``ragbatch.analysis.summary`` computes a
run's ``summary.parquet`` with them.
"""

from __future__ import annotations

from ragbatch.analysis.intervals import (
    CONFIDENCE,
    N_RESAMPLES,
    SEED,
    bootstrap_mean_ci,
    mean_ci,
    paired_bootstrap_diff_ci,
    wilson_interval,
)

__all__ = [
    "CONFIDENCE",
    "N_RESAMPLES",
    "SEED",
    "bootstrap_mean_ci",
    "mean_ci",
    "paired_bootstrap_diff_ci",
    "wilson_interval",
]
