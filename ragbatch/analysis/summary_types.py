"""What a run summary is made of: the schema of ``summary.parquet``, the facts of a metric
the summary reads (:class:`MetricInfo`), the settings it is computed with and the computed
result (:class:`RunSummary`). :mod:`ragbatch.analysis.summary` computes it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

from ragbatch.analysis.diagnostics import MEASURES
from ragbatch.analysis.intervals import (
    BOOTSTRAP_MAX_N,
    CONFIDENCE,
    MAX_DISTINCT,
    N_RESAMPLES,
    SEED,
)
from ragbatch.analysis.ppi import DEFAULT_ESTIMATOR
from ragbatch.config.job import DiagnosticsSection
from ragbatch.core.status import STATUSES
from ragbatch.judge.health import HealthFields

#: Default cap on the slice values of one slice column that get their own summary rows.
MAX_SLICE_VALUES: int = 50

#: Schema of ``summary.parquet``, in column order.
SUMMARY_SCHEMA = pa.schema(
    [
        ("metric", pa.string()),
        ("metric_name", pa.string()),
        ("judge", pa.string()),
        ("slice_column", pa.string()),
        ("slice_value", pa.string()),
        ("slice_other", pa.bool_()),
        ("n_total", pa.int64()),
    ]
    + [(f"n_{s}", pa.int64()) for s in STATUSES]
    + [
        ("mean", pa.float64()),
        ("mean_ci_low", pa.float64()),
        ("mean_ci_high", pa.float64()),
        ("mean_ci_method", pa.string()),
        ("pass_rate", pa.float64()),
        ("pass_rate_ci_low", pa.float64()),
        ("pass_rate_ci_high", pa.float64()),
        ("label_column", pa.string()),
        ("n_labelled", pa.int64()),
        ("labels_mean", pa.float64()),
        ("labels_ci_low", pa.float64()),
        ("labels_ci_high", pa.float64()),
        ("ppi_mean", pa.float64()),
        ("ppi_ci_low", pa.float64()),
        ("ppi_ci_high", pa.float64()),
        ("ppi_lambda", pa.float64()),
        ("ppi_reason", pa.string()),
    ]
    + [(m, pa.float64()) for m in MEASURES]
    + [
        ("degenerate", pa.bool_()),
        ("degenerate_reasons", pa.string()),
    ]
)

#: The summary columns of the label-corrected estimates (null for a metric without labels).
PPI_COLUMNS: tuple[str, ...] = tuple(
    SUMMARY_SCHEMA.names[SUMMARY_SCHEMA.names.index("label_column") :]
)


@dataclass(frozen=True)
class MetricInfo:
    """What the summary needs to know of a metric: its id, registry name, whether its
    ``ok`` scores are 0/1 (``Metric.boolean``), their range (None: unbounded), and for a
    judge metric where its cells record what the health diagnostics read
    (``JudgeMetric.health``; None for other metrics, which get no diagnostics)."""

    id: str
    name: str
    boolean: bool
    score_range: tuple[float, float] | None = None
    health: HealthFields | None = None

    @classmethod
    def of(cls, metric: Any) -> "MetricInfo":
        """From a :class:`ragbatch.scoring.base.Metric` instance."""
        health = metric.health if getattr(metric, "kind", None) == "judge" else None
        low, high = metric.score_range
        return cls(metric.id, metric.name, bool(metric.boolean), (float(low), float(high)), health)


@dataclass(frozen=True)
class SummarySettings:
    """The settings a summary was computed with (recorded in the manifest).

    Attributes
    ----------
    confidence : float
        Two-sided level of every interval, in (0, 1).
    n_resamples : int
        Bootstrap resamples per interval.
    seed : int
        Seed of every bootstrap (the same for every group).
    max_slice_values : int
        Slice values per slice column with their own rows; the rest are pooled.
    max_resample_n, max_distinct : int
        Thresholds of :func:`ragbatch.analysis.intervals.mean_ci`.
    ppi_estimator : str
        ``ppi`` or ``ppi++``: the estimator of label-corrected means
        (:func:`ragbatch.analysis.ppi.ppi_from_moments`).
    """

    confidence: float = CONFIDENCE
    n_resamples: int = N_RESAMPLES
    seed: int = SEED
    max_slice_values: int = MAX_SLICE_VALUES
    max_resample_n: int = BOOTSTRAP_MAX_N
    max_distinct: int = MAX_DISTINCT
    ppi_estimator: str = DEFAULT_ESTIMATOR

    def __post_init__(self) -> None:
        if self.max_slice_values < 1:
            raise ValueError(f"max_slice_values must be at least 1, got {self.max_slice_values}")


@dataclass
class RunSummary:
    """A computed summary.

    Attributes
    ----------
    table : pyarrow.Table
        The rows of ``summary.parquet`` (schema :data:`SUMMARY_SCHEMA`).
    settings : SummarySettings
    slice_columns : dict
        Slice column -> ``{"values": distinct values (null counted as one),
        "pooled_values": values pooled into the ``slice_other`` row (0 if none)}``.
    labels : dict
        Metric id -> scores-table column of its human labels.
    labelled_runs : dict
        Metric id -> the labels taken from another run.
    """

    table: pa.Table
    settings: SummarySettings
    slice_columns: dict[str, dict[str, int]] = field(default_factory=dict)
    diagnostics: DiagnosticsSection = field(default_factory=DiagnosticsSection)
    #: Metric id -> scores-table column of its human labels.
    labels: dict[str, str] = field(default_factory=dict)
    #: Metric id -> the labels taken from another run (``<column> of run <id>``).
    labelled_runs: dict[str, str] = field(default_factory=dict)
    #: Judge panel metric id -> its inter-judge agreement
    #: (:meth:`ragbatch.analysis.panel_agreement.PanelAgreement.to_dict`).
    panels: dict[str, dict[str, Any]] = field(default_factory=dict)

    def manifest_info(self) -> dict[str, Any]:
        """The manifest's ``summary`` section: the settings, the interval methods and the
        slice columns' value counts."""
        return {
            **asdict(self.settings),
            "mean_interval": "percentile bootstrap of the mean (normal approximation for "
            "groups over max_resample_n values with over max_distinct "
            "distinct values; see mean_ci_method)",
            "pass_rate_interval": "Wilson score interval",
            "slice_columns": self.slice_columns,
            "labels": self.labels,
            "labelled_runs": self.labelled_runs,
            "ppi_interval": "central-limit interval of the prediction-powered mean "
            "(docs/ppi.md); labels_ci_*: of the labels' mean",
            "panels": self.panels,
        }

    def overall(self) -> list[dict[str, Any]]:
        """The overall row of each metric, in metric order."""
        return [r for r in self.table.to_pylist() if r["slice_column"] is None]

    def degenerate(self) -> dict[str, str]:
        """Metric id -> the reasons its all-rows result is degenerate (only such
        metrics), in metric order."""
        return {r["metric"]: r["degenerate_reasons"] for r in self.overall() if r["degenerate"]}

    def diagnostics_info(self) -> dict[str, Any]:
        """The manifest's ``diagnostics`` section: the thresholds, and per judge metric
        its all-rows ``degenerate`` flag, ``reasons`` (a list) and measures."""
        metrics = {}
        for r in self.overall():
            if r["degenerate"] is None:
                continue
            reasons = r["degenerate_reasons"]
            metrics[r["metric"]] = {
                "degenerate": r["degenerate"],
                "reasons": reasons.split("; ") if reasons else [],
                **{m: r[m] for m in MEASURES},
            }
        return {"thresholds": self.diagnostics.model_dump(mode="json"), "metrics": metrics}
