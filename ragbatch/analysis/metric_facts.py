"""What analysis needs to know about each metric of a committed run.

Each metric entry of a run's manifest records the metric's kind, whether its scores are
0/1, its direction and its range (:meth:`ragbatch.scoring.base.Metric.facts`). Manifests
written before those facts were recorded name the registered metric instead, and the
registry gives them; a metric name the registry no longer knows (removed since the run)
falls back to: range of the observed scores, higher is better, not boolean, not PII.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ragbatch.analysis.runs import CommittedRun
from ragbatch.core.errors import RagbatchError

#: Metric kind of the PII metrics (``ragbatch.metrics.pii_base.PiiMetric.kind``): their cells
#: concern personal data, so reports never show the input texts next to them.
PII_KIND = "pii"

#: The keys of a manifest metric entry that :func:`metric_facts` reads when present.
RECORDED_FACTS = frozenset({"boolean", "higher_is_better", "score_range"})


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
        Closed range of ``ok`` scores; None when neither the manifest nor the registry
        gives it.
    known : bool
        The facts come from the manifest or the registry (False: the fallbacks above).
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
    names an id wins), in the runs' config order: from each manifest entry, else (runs
    written before the entries held them) from the metric registry."""
    out: dict[str, MetricFacts] = {}
    for run in runs:
        for entry in run.manifest.metrics:
            mid = entry["id"]
            if mid not in out:
                out[mid] = _recorded(entry) or _registered(entry)
    return out


def _recorded(entry: dict[str, Any]) -> MetricFacts | None:
    """The facts a manifest entry records, or None when it has none of them."""
    if not RECORDED_FACTS <= entry.keys():
        return None
    mid = entry["id"]
    low, high = entry["score_range"]
    return MetricFacts(
        mid,
        entry.get("name", mid),
        str(entry.get("kind") or ""),
        bool(entry["boolean"]),
        bool(entry["higher_is_better"]),
        (float(low), float(high)),
        True,
    )


def _registered(entry: dict[str, Any]) -> MetricFacts:
    """The facts of the registered metric an entry names, or the fallbacks."""
    from ragbatch.scoring.registry import get_metric

    mid = entry["id"]
    name = entry.get("name", mid)
    try:
        cls = get_metric(name)
    except RagbatchError:
        return MetricFacts(mid, name, str(entry.get("kind") or ""), False, True, None, False)
    return MetricFacts(
        mid,
        name,
        str(entry.get("kind") or cls.kind),
        bool(cls.boolean),
        bool(cls.higher_is_better),
        (float(cls.score_range[0]), float(cls.score_range[1])),
        True,
    )
