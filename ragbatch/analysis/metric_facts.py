"""What analysis needs to know about each metric of a committed run.

A run's manifest names each metric id's registered metric; the registry gives its range,
direction and whether its scores are 0/1. A metric name the registry no longer knows
(removed since the run) falls back to: range of the observed scores, higher is better,
not boolean, not PII.
"""

from __future__ import annotations

from dataclasses import dataclass

from ragbatch.analysis.runs import CommittedRun
from ragbatch.core.errors import RagbatchError

#: Metric kind of the PII metrics (``ragbatch.metrics.pii_base.PiiMetric.kind``): their cells
#: concern personal data, so reports never show the input texts next to them.
PII_KIND = "pii"


@dataclass(frozen=True)
class MetricFacts:
    """One metric id of a run.

    Attributes
    ----------
    id : str
        The ``metric`` value of the scores table.
    name : str
        Registered metric name (``answer_match``, ``regex``, ...).
    kind : str
        ``expression``, ``model``, ``judge``, ``pii``, ... (from the manifest, else the
        registry).
    boolean : bool
        Every ``ok`` score is 0.0 or 1.0.
    higher_is_better : bool
    score_range : (float, float) or None
        Closed range of ``ok`` scores; None when the metric is not registered.
    known : bool
        The registry knows ``name``.
    """

    id: str
    name: str
    kind: str
    boolean: bool
    higher_is_better: bool
    score_range: tuple[float, float] | None
    known: bool

    @property
    def pii(self) -> bool:
        """The metric looks for personal data: never show input texts beside it."""
        return self.kind == PII_KIND


def metric_facts(*runs: CommittedRun) -> dict[str, MetricFacts]:
    """Metric id -> :class:`MetricFacts` for every metric of ``runs`` (the first run that
    names an id wins), in the runs' config order."""
    from ragbatch.scoring.registry import get_metric

    out: dict[str, MetricFacts] = {}
    for run in runs:
        for entry in run.manifest.metrics:
            mid = entry["id"]
            if mid in out:
                continue
            name = entry.get("name", mid)
            try:
                cls = get_metric(name)
            except RagbatchError:
                out[mid] = MetricFacts(
                    mid, name, str(entry.get("kind") or ""), False, True, None, False
                )
                continue
            out[mid] = MetricFacts(
                mid,
                name,
                str(entry.get("kind") or cls.kind),
                bool(cls.boolean),
                bool(cls.higher_is_better),
                (float(cls.score_range[0]), float(cls.score_range[1])),
                True,
            )
    return out
