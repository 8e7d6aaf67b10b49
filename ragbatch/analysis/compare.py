"""Compare two committed runs cell by cell: paired differences with bootstrap intervals.

For every metric both runs computed, the rows of the two runs are paired
(:mod:`ragbatch.analysis.pairing`) and, over the pairs whose cells are ``ok`` in both
runs, the mean paired difference ``candidate - baseline`` gets a paired bootstrap
interval (Efron & Tibshirani 1993, ch. 16: the pairs are resampled together, i.e. the
differences are bootstrapped), overall and per value of each ``by`` slice column. The
differences are sorted and passed to :func:`ragbatch.analysis.intervals.mean_ci`, the
estimator of the run summaries: the percentile bootstrap (the same as
:func:`~ragbatch.analysis.intervals.paired_bootstrap_diff_ci` on sorted pairs), drawn as
multinomial counts when the differences take few distinct values (0/1 metrics give
-1, 0, 1) and its normal approximation for large samples of many distinct values, so the
cost stays bounded for millions of rows; ``ci_method`` says which.

Each line also gets a p-value from a paired test (McNemar's exact test for 0/1 scores,
a paired t-test otherwise; ``test`` says which), and the p-values of all lines of one
comparison (every metric, the all-rows lines and every slice value) are adjusted
together with Benjamini-Hochberg (:mod:`ragbatch.analysis.multiple_testing`). A change
is *significant* when its adjusted p-value is at most the false discovery rate ``fdr``
(default 0.05) and its interval excludes zero; with ``fdr=None`` (control off) the
interval alone decides, line by line. It is *better* or *worse* according to the
metric's direction (``higher_is_better`` in the registry). Cells whose status
differs between the runs (``ok`` -> ``timeout``, ...) are counted separately: they have
no paired difference.

Regression (for nightly gating): a metric *regresses beyond a threshold* ``t >= 0``
when, over all paired rows, its change is significant, worse, and larger than ``t`` in
the metric's own units (``|mean_diff| > t``). Only the all-rows line gates; slice lines
are reported, not gated.

A slice line is flagged (``significant``, ``change``) only when it has at least
``min_pairs`` pairs (default :data:`MIN_SLICE_PAIRS`, 20). With few pairs the percentile
bootstrap's interval is too narrow (it resamples the few differences there are, so it
cannot see how much they vary; two pairs that both moved by 0.1 give the interval [0.1,
0.1]), and a ``--by`` over many values makes such chance flags likely. The line still
shows its pairs, difference and interval.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import polars as pl

from ragbatch.core import columns as C
from ragbatch.analysis.corrected import CORRECTED_SCHEMA, corrected_means
from ragbatch.analysis.intervals import CONFIDENCE, N_RESAMPLES, SEED, mean_ci
from ragbatch.analysis.metric_facts import metric_facts
from ragbatch.analysis.multiple_testing import DEFAULT_FDR, FDR_METHOD, bh_adjust, paired_test
from ragbatch.analysis.pairing import DEFAULT_MATCH_ON, Pairing, pair_runs
from ragbatch.analysis.runs import CommittedRun, load_scores
from ragbatch.core.errors import InputError
from ragbatch.core.status import OK

#: Rows listed per metric as the ones that moved most (and as status changes).
TOP_ROWS = 10

BETTER, WORSE = "better", "worse"

_CELL_COLUMNS = (C.ROW_ID, "metric", "score", "status", "reason")

#: Fewest pairs a slice line needs to be flagged as a change (see the module notes).
MIN_SLICE_PAIRS = 20

METRIC_SCHEMA = {
    "metric": pl.String,
    "slice": pl.String,
    "slice_value": pl.String,
    "higher_is_better": pl.Boolean,
    "n_pairs": pl.Int64,
    "n_status_changed": pl.Int64,
    "baseline_mean": pl.Float64,
    "candidate_mean": pl.Float64,
    "mean_diff": pl.Float64,
    "ci_low": pl.Float64,
    "ci_high": pl.Float64,
    "ci_method": pl.String,
    "test": pl.String,
    "p_value": pl.Float64,
    "p_adjusted": pl.Float64,
    "significant": pl.Boolean,
    "change": pl.String,
}


@dataclass
class Comparison:
    """What :func:`compare_runs` / :func:`compare_scores` found.

    Attributes
    ----------
    metrics : polars.DataFrame
        One row per metric (``slice`` and ``slice_value`` null: all paired rows) and per
        (metric, slice column, value); columns :data:`METRIC_SCHEMA`. ``n_pairs``: pairs
        ``ok`` in both runs (the differences' sample size); ``n_status_changed``: pairs
        whose status differs; means are over the ``n_pairs`` pairs; ``mean_diff`` is
        ``candidate - baseline`` in the metric's units with its interval ``[ci_low,
        ci_high]`` at ``confidence`` (``ci_method``: ``bootstrap`` or ``normal``, see the
        module notes); ``test`` (``mcnemar_exact`` or ``paired_t``) and its two-sided
        ``p_value`` (null with fewer than two pairs), ``p_adjusted`` the
        Benjamini-Hochberg adjusted p-value over all lines (null when ``fdr`` is None);
        ``significant``: flagged (see the module notes); ``change`` is ``"better"``,
        ``"worse"`` or null (not significant, or a slice line with fewer than
        ``min_pairs`` pairs).
    moved : polars.DataFrame
        Per metric, the ``top`` pairs with the largest ``|diff|`` (ties by baseline row
        id): ``metric``, ``baseline_row_id``, ``candidate_row_id``, ``baseline_score``,
        ``candidate_score``, ``diff``, ``change``, ``baseline_reason``,
        ``candidate_reason``, then the ``by`` slice values.
    status_changes : polars.DataFrame
        ``metric``, ``baseline_status``, ``candidate_status``, ``n``: pairs whose status
        differs.
    status_changed_rows : polars.DataFrame
        Per metric, up to ``top`` of those pairs (by baseline row id) with both statuses
        and reasons.
    pairing : Pairing
    corrected : polars.DataFrame
        Per run and metric with human labels: the label-corrected (PPI) mean and the
        labels-only mean beside the metric's own (:data:`~ragbatch.analysis.corrected.
        CORRECTED_SCHEMA`; not paired: each run's own estimate over its own labels).
    metrics_only_baseline, metrics_only_candidate : list of str
        Metric ids computed by one run only (not compared).
    threshold : float or None
        The regression threshold, when one was given.
    fdr : float or None
        The false discovery rate the lines were flagged at; None: no control.
    """

    metrics: pl.DataFrame
    moved: pl.DataFrame
    status_changes: pl.DataFrame
    status_changed_rows: pl.DataFrame
    pairing: Pairing
    by: list[str] = field(default_factory=list)
    metrics_only_baseline: list[str] = field(default_factory=list)
    metrics_only_candidate: list[str] = field(default_factory=list)
    confidence: float = CONFIDENCE
    threshold: float | None = None
    min_pairs: int = MIN_SLICE_PAIRS
    fdr: float | None = DEFAULT_FDR
    baseline: CommittedRun | None = None
    candidate: CommittedRun | None = None
    #: Per run (``baseline``, ``candidate``), each metric's mean corrected by human labels
    #: beside its own and the labels' means (:mod:`ragbatch.analysis.corrected`); empty
    #: when neither run had labels.
    corrected: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=CORRECTED_SCHEMA))

    def regressions(self, threshold: float | None = None) -> pl.DataFrame:
        """The all-rows lines of metrics that regress beyond ``threshold`` (default: the
        comparison's threshold, else 0): significant, worse, and ``|mean_diff| >
        threshold``."""
        t = threshold if threshold is not None else (self.threshold or 0.0)
        return self.metrics.filter(
            pl.col("slice").is_null()
            & (pl.col("change") == WORSE)
            & (pl.col("mean_diff").abs() > t)
        )

    def to_dict(self) -> dict[str, Any]:
        """Everything as JSON-ready Python objects (dates and ids as strings)."""

        def run(r: CommittedRun | None) -> dict[str, Any] | None:
            return (
                None
                if r is None
                else {
                    "root": r.root,
                    "run_id": r.run_id,
                    "run_date": r.run_date.isoformat(),
                    "name": r.name,
                }
            )

        return {
            "baseline": run(self.baseline),
            "candidate": run(self.candidate),
            "confidence": self.confidence,
            "threshold": self.threshold,
            "by": self.by,
            "min_pairs": self.min_pairs,
            "fdr": self.fdr,
            "fdr_method": FDR_METHOD if self.fdr is not None else None,
            "pairing": {
                **self.pairing.counts(),
                "match_on": list(self.pairing.match_on),
                "note": self.pairing.note,
                "only_baseline_row_ids": self.pairing.only_baseline,
                "only_candidate_row_ids": self.pairing.only_candidate,
            },
            "metrics_only_baseline": self.metrics_only_baseline,
            "metrics_only_candidate": self.metrics_only_candidate,
            "metrics": self.metrics.to_dicts(),
            "corrected": self.corrected.to_dicts(),
            "regressions": self.regressions().get_column("metric").to_list(),
            "status_changes": self.status_changes.to_dicts(),
            "moved": self.moved.to_dicts(),
            "status_changed_rows": self.status_changed_rows.to_dicts(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False, default=str)


def metric_directions(*runs: CommittedRun) -> dict[str, bool]:
    """Metric id -> ``higher_is_better`` of its registered metric
    (:func:`ragbatch.analysis.metric_facts.metric_facts`; an unregistered metric counts
    as higher-is-better)."""
    return {mid: facts.higher_is_better for mid, facts in metric_facts(*runs).items()}


def _cells(scores: pl.DataFrame, by: Sequence[str], prefix: str) -> pl.DataFrame:
    cols = [
        pl.col(C.ROW_ID).cast(pl.String),
        pl.col("metric").cast(pl.String),
        pl.col("score").cast(pl.Float64),
        pl.col("status").cast(pl.String),
        pl.col("reason").cast(pl.String),
    ]
    cols += [
        pl.col(s).cast(pl.String) if s in scores.columns else pl.lit(None, pl.String).alias(s)
        for s in by
    ]
    frame = scores.select(cols)
    return frame.rename({c: f"{prefix}{c}" for c in frame.columns if c != "metric"})


def paired_cells(
    baseline_scores: pl.DataFrame,
    candidate_scores: pl.DataFrame,
    pairs: pl.DataFrame,
    by: Sequence[str] = (),
) -> pl.DataFrame:
    """One row per (pair, metric computed by both runs).

    Returns
    -------
    polars.DataFrame
        ``baseline_row_id``, ``candidate_row_id``, ``metric``, ``baseline_score``,
        ``baseline_status``, ``baseline_reason``, the same for ``candidate_``, and one
        string column per ``by`` slice: the baseline's value, else the candidate's.
    """
    b = _cells(baseline_scores, by, "baseline_")
    c = _cells(candidate_scores, by, "candidate_")
    joined = (
        pairs.select("baseline_row_id", "candidate_row_id")
        .join(b, on="baseline_row_id", how="inner")
        .join(c, on=["candidate_row_id", "metric"], how="inner")
    )
    return joined.with_columns(
        pl.coalesce(f"baseline_{s}", f"candidate_{s}").alias(s) for s in by
    ).drop([f"{side}_{s}" for side in ("baseline", "candidate") for s in by])


def _stats(
    group: pl.DataFrame,
    *,
    confidence: float,
    n_resamples: int,
    seed: int,
    higher_is_better: bool,
    min_pairs: int = 0,
) -> dict[str, Any]:
    both_ok = group.filter((pl.col("baseline_status") == OK) & (pl.col("candidate_status") == OK))
    b = both_ok["baseline_score"].to_numpy().astype(np.float64)
    c = both_ok["candidate_score"].to_numpy().astype(np.float64)
    diff, low, high, method = mean_ci(
        np.sort(c - b), confidence=confidence, n_resamples=n_resamples, seed=seed
    )
    p_value, test = paired_test(b, c)
    # mean_ci gives all of mean, low and high, or none of them: low checked for all three
    significant = (
        low is not None and (low > 0 or cast(float, high) < 0) and len(both_ok) >= min_pairs
    )
    return {
        "higher_is_better": higher_is_better,
        "n_pairs": len(both_ok),
        "n_status_changed": int((group["baseline_status"] != group["candidate_status"]).sum()),
        "baseline_mean": float(b.mean()) if b.size else None,
        "candidate_mean": float(c.mean()) if c.size else None,
        "mean_diff": diff,
        "ci_low": low,
        "ci_high": high,
        "ci_method": method,
        "test": test,
        "p_value": p_value,
        "p_adjusted": None,
        "significant": bool(significant),
        "change": None,
    }


def _flag(lines: list[dict[str, Any]], fdr: float | None) -> None:
    """Set ``p_adjusted``, ``significant`` and ``change`` of every line in place: a line
    whose interval excludes zero (``significant`` as :func:`_stats` left it) stays
    flagged when ``fdr`` is None or its adjusted p-value is at most ``fdr``."""
    if fdr is not None:
        for line, adjusted in zip(lines, bh_adjust([line["p_value"] for line in lines])):
            line["p_adjusted"] = adjusted
            line["significant"] = line["significant"] and adjusted is not None and adjusted <= fdr
    for line in lines:
        if line["significant"]:
            up = cast(float, line["mean_diff"]) > 0
            line["change"] = BETTER if up == line["higher_is_better"] else WORSE


def compare_scores(
    baseline_scores: pl.DataFrame,
    candidate_scores: pl.DataFrame,
    pairing: Pairing,
    higher_is_better: dict[str, bool],
    *,
    by: Sequence[str] = (),
    metrics: Sequence[str] | None = None,
    confidence: float = CONFIDENCE,
    n_resamples: int = N_RESAMPLES,
    seed: int = SEED,
    top: int = TOP_ROWS,
    threshold: float | None = None,
    min_pairs: int = MIN_SLICE_PAIRS,
    fdr: float | None = DEFAULT_FDR,
) -> Comparison:
    """Compare two scores tables over paired rows (see the module notes).

    Parameters
    ----------
    baseline_scores, candidate_scores : polars.DataFrame
        Long scores tables (``row_id``, ``metric``, ``score``, ``status``, ``reason`` and
        the slice columns).
    pairing : Pairing
        Which baseline row goes with which candidate row.
    higher_is_better : dict
        Metric id -> direction; ids missing count as higher-is-better.
    by : sequence of str
        Slice columns to break the comparison down by (string-cast; a null value is its
        own group).
    metrics : sequence of str, optional
        Metric ids in display order (default: the baseline's order of appearance).
    confidence, n_resamples, seed
        Passed to :func:`~ragbatch.analysis.intervals.mean_ci`.
    top : int
        Rows listed per metric in ``moved`` and ``status_changed_rows``.
    threshold : float, optional
        Regression threshold recorded on the result (:meth:`Comparison.regressions`).
    min_pairs : int
        Fewest pairs a slice line needs to be flagged (the all-rows line has no minimum).
    fdr : float or None
        False discovery rate in (0, 1) across all lines (Benjamini-Hochberg); None turns
        the control off (each line flagged by its own interval).

    Raises
    ------
    InputError
        A ``by`` column is in neither scores table, ``threshold`` is negative,
        ``min_pairs`` is below 1, or ``fdr`` is outside (0, 1).
    """
    for s in by:
        if s not in baseline_scores.columns and s not in candidate_scores.columns:
            slices = sorted(
                set(baseline_scores.columns) - set(_CELL_COLUMNS) - set(C.SCORES_COLUMNS)
            )
            raise InputError(
                f"--by {s!r}: no such slice column in either run; slice columns: "
                f"{', '.join(slices) or 'none'}"
            )
    if threshold is not None and threshold < 0:
        raise InputError(
            f"--fail-on-regression {threshold}: the threshold must be >= 0 (in "
            "the metric's units, e.g. 0.02)"
        )
    if min_pairs < 1:
        raise InputError(f"--min-pairs {min_pairs}: must be at least 1")
    if fdr is not None and not 0.0 < fdr < 1.0:
        raise InputError(f"--fdr {fdr}: must be in (0, 1), e.g. 0.05, or 'off'")
    b_metrics = list(dict.fromkeys(baseline_scores["metric"].to_list()))
    c_metrics = set(candidate_scores["metric"].to_list())
    order = list(metrics) if metrics is not None else b_metrics
    common = [m for m in order if m in c_metrics and m in b_metrics]
    cells = paired_cells(baseline_scores, candidate_scores, pairing.pairs, by)
    lines: list[dict[str, Any]] = []
    for metric in common:
        mcells = cells.filter(pl.col("metric") == metric)
        kwargs: dict[str, Any] = dict(
            confidence=confidence,
            n_resamples=n_resamples,
            seed=seed,
            higher_is_better=higher_is_better.get(metric, True),
        )
        lines.append(
            {"metric": metric, "slice": None, "slice_value": None, **_stats(mcells, **kwargs)}
        )
        for s in by:
            for (value,), group in sorted(
                mcells.group_by([s]), key=lambda g: (g[0][0] is None, g[0][0] or "")
            ):
                lines.append(
                    {
                        "metric": metric,
                        "slice": s,
                        "slice_value": value,
                        **_stats(group, **kwargs, min_pairs=min_pairs),
                    }
                )
    _flag(lines, fdr)
    table = (
        pl.DataFrame(lines, schema=METRIC_SCHEMA) if lines else pl.DataFrame(schema=METRIC_SCHEMA)
    )
    moved, status_counts, status_rows = _rows(cells, common, higher_is_better, by, top)
    return Comparison(
        table,
        moved,
        status_counts,
        status_rows,
        pairing,
        list(by),
        [m for m in b_metrics if m not in c_metrics],
        sorted(c_metrics - set(b_metrics)),
        confidence,
        threshold,
        min_pairs,
        fdr,
    )


def _rows(
    cells: pl.DataFrame,
    metrics: list[str],
    higher_is_better: dict[str, bool],
    by: Sequence[str],
    top: int,
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    cells = cells.filter(pl.col("metric").is_in(metrics))
    sign = pl.col("metric").replace_strict(
        {m: (1.0 if higher_is_better.get(m, True) else -1.0) for m in metrics},
        default=1.0,
        return_dtype=pl.Float64,
    )
    both_ok = (pl.col("baseline_status") == OK) & (pl.col("candidate_status") == OK)
    diff = pl.col("candidate_score") - pl.col("baseline_score")
    moved = (
        cells.filter(both_ok & (diff != 0))
        .with_columns(diff.alias("diff"))
        .with_columns(
            pl.when(pl.col("diff") * sign > 0)
            .then(pl.lit(BETTER))
            .otherwise(pl.lit(WORSE))
            .alias("change")
        )
        .sort([pl.col("diff").abs(), "baseline_row_id"], descending=[True, False])
        .group_by("metric", maintain_order=True)
        .head(top)
        .select(
            "metric",
            "baseline_row_id",
            "candidate_row_id",
            "baseline_score",
            "candidate_score",
            "diff",
            "change",
            "baseline_reason",
            "candidate_reason",
            *by,
        )
    )
    order = {m: i for i, m in enumerate(metrics)}
    moved = moved.sort(
        pl.col("metric").replace_strict(order, return_dtype=pl.Int64), maintain_order=True
    )
    changed = cells.filter(pl.col("baseline_status") != pl.col("candidate_status"))
    counts = (
        changed.group_by("metric", "baseline_status", "candidate_status")
        .len("n")
        .with_columns(pl.col("n").cast(pl.Int64))
        .sort(
            pl.col("metric").replace_strict(order, return_dtype=pl.Int64),
            "baseline_status",
            "candidate_status",
        )
    )
    rows = (
        changed.sort("baseline_row_id")
        .group_by("metric", maintain_order=True)
        .head(top)
        .select(
            "metric",
            "baseline_row_id",
            "candidate_row_id",
            "baseline_status",
            "candidate_status",
            "baseline_reason",
            "candidate_reason",
            *by,
        )
        .sort(pl.col("metric").replace_strict(order, return_dtype=pl.Int64), maintain_order=True)
    )
    return moved, counts, rows


def compare_runs(
    baseline: CommittedRun,
    candidate: CommittedRun,
    *,
    by: Sequence[str] = (),
    match_on: Sequence[str] = DEFAULT_MATCH_ON,
    confidence: float = CONFIDENCE,
    n_resamples: int = N_RESAMPLES,
    seed: int = SEED,
    top: int = TOP_ROWS,
    threshold: float | None = None,
    min_pairs: int = MIN_SLICE_PAIRS,
    fdr: float | None = DEFAULT_FDR,
) -> Comparison:
    """Load two committed runs, pair their rows and compare them (:func:`compare_scores`).

    Raises
    ------
    InputError
        A run has no score or summary files, a ``by`` or ``match_on`` column is unknown,
        the threshold is negative, ``min_pairs`` is below 1, or ``fdr`` is outside (0, 1).
    """
    for s in by:
        if s not in baseline.slice_columns and s not in candidate.slice_columns:
            raise InputError(
                f"--by {s!r}: no such slice column in either run; slice columns: "
                f"{', '.join(baseline.slice_columns) or 'none'}"
            )

    def columns(run: CommittedRun) -> list[str]:
        wanted = [c for c in dict.fromkeys([*by, *match_on]) if c in run.slice_columns]
        return [*_CELL_COLUMNS, *wanted]

    b_scores = load_scores(baseline, columns(baseline))
    c_scores = load_scores(candidate, columns(candidate))
    pairing = pair_runs(baseline, candidate, b_scores, c_scores, match_on)
    result = compare_scores(
        b_scores,
        c_scores,
        pairing,
        metric_directions(baseline, candidate),
        by=by,
        metrics=list(baseline.metric_names) or None,
        confidence=confidence,
        n_resamples=n_resamples,
        seed=seed,
        top=top,
        threshold=threshold,
        min_pairs=min_pairs,
        fdr=fdr,
    )
    result.baseline, result.candidate = baseline, candidate
    result.corrected = corrected_means([("baseline", baseline), ("candidate", candidate)])
    return result
