"""Judge panels: one judge metric asked of several engines, their cells combined.

A panel (config ``metrics[i].engines: [a, b, ...]``, :mod:`ragbatch.config.panel`) runs
its metric once per engine, each as a *member* metric on that engine's actor pool with
the member key ``<id>[<engine>]`` as its id, so its judgment cache keys, token counters
and health measures are its own. :class:`PanelMetric` stands for the panel itself: it
runs in no stage; its cell is combined from the members' cells of the same row by
:func:`combine_cells` (``udfs/panels.py`` applies it to each batch), after every stage.

Combine rules (docs/panels.md), over the *scoring* members (status ``ok``); a member
with another status is left out and named in the reason:

- ``majority`` (0/1 metrics): the score given by more scoring members than the other;
  a tie is ``not_applicable`` ("judges tied 1-1: ...");
- ``unanimous`` (0/1 metrics): 1 when every scoring member gave 1, else 0;
- ``mean``: the mean of the scoring members' scores.

With no scoring member the panel cell takes the failing status most members share
(the first member's among equals) and a reason naming each judge's status.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel

from ragbatch.core.status import NOT_APPLICABLE, OK
from ragbatch.scoring.base import Metric

#: Status of a ``majority`` panel cell whose scoring judges tie.
TIE_STATUS = NOT_APPLICABLE


@dataclass(frozen=True)
class PanelPlan:
    """What combining a panel's cells needs (picklable, handed to the combine step).

    Attributes
    ----------
    id : str
        The panel's metric id (the ``metric`` of its cells in the scores table).
    judges : tuple of str
        The member engines, in config order.
    member_keys : tuple of str
        ``<id>[<engine>]`` of each judge, in the same order: the members' metric ids.
    combine : str
        ``majority``, ``mean`` or ``unanimous``.
    """

    id: str
    judges: tuple[str, ...]
    member_keys: tuple[str, ...]
    combine: str


class PanelMetric(Metric):
    """The panel of a judge metric: runs in no stage (``engine`` None); its cells are
    combined from its members' (:func:`combine_cells`). Build it with
    :func:`panel_metric`, which makes a subclass carrying the judged metric's name,
    range, direction and definition. ``boolean`` is the metric's, except under ``mean``
    (a mean of 0/1 scores is a share)."""

    kind: ClassVar[str] = "panel"
    inputs: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        metric_id: str,
        params: BaseModel,
        members: list[Metric],
        judges: list[str],
        combine: str,
    ):
        super().__init__(metric_id, params, None)
        self.members = list(members)
        self.judges = list(judges)
        self.combine = combine

    def plan(self) -> PanelPlan:
        """The picklable description the combine step works from."""
        return PanelPlan(
            self.id, tuple(self.judges), tuple(m.id for m in self.members), self.combine
        )

    def manifest_info(self) -> dict[str, Any]:
        """The judged metric's entry, with ``engine`` null, ``engines`` (the judges),
        ``combine`` and ``members`` (judge -> member key)."""
        return {
            **super().manifest_info(),
            "engines": list(self.judges),
            "combine": self.combine,
            "members": {j: m.id for j, m in zip(self.judges, self.members)},
        }

    def check_input(self, available: set[str]) -> list[str]:
        """None: each member checks the inputs it reads."""
        return []


def panel_metric(
    metric_id: str, members: list[Metric], judges: list[str], combine: str
) -> PanelMetric:
    """The :class:`PanelMetric` of ``members`` (one built metric per judge, all of one
    class and params), as an instance of a subclass named after the judged metric's
    class whose class attributes (``name``, ``score_range``, ``boolean``,
    ``higher_is_better``, ``summary``, ``source``) are the metric's."""
    first = members[0]
    base = type(first)
    attrs = {
        "name": base.name,
        "score_range": base.score_range,
        "boolean": bool(first.boolean) and combine != "mean",
        "higher_is_better": base.higher_is_better,
        "summary": f"{combine} of a judge panel: {getattr(base, 'summary', base.name)}",
        "source": getattr(base, "source", ""),
        "__module__": __name__,
    }
    cls = type(f"{base.__name__}Panel", (PanelMetric,), attrs)
    return cls(metric_id, first.params, members, judges, combine)


def default_combine(boolean: bool) -> str:
    """``majority`` for a metric scored 0/1, ``mean`` for any other."""
    return "majority" if boolean else "mean"


def combine_cells(
    plan: PanelPlan, cells: list[tuple[float | None, str, str | None]]
) -> tuple[float | None, str, str | None, str]:
    """The panel cell of one row.

    Parameters
    ----------
    plan : PanelPlan
    cells : list of (score, status, reason)
        Each member's cell, in :attr:`PanelPlan.judges` order (score float64 or None,
        status one word of the status vocabulary).

    Returns
    -------
    (score, status, reason, details)
        ``score`` non-null exactly when ``status`` is ``ok``; ``reason`` names the split
        when the scoring judges disagree, and the judges left out, else None;
        ``details`` a JSON object ``{"combine", "scores": {judge: score or null},
        "statuses": {judge: status}}``.
    """
    details = json.dumps(
        {
            "combine": plan.combine,
            "scores": {j: c[0] for j, c in zip(plan.judges, cells)},
            "statuses": {j: c[1] for j, c in zip(plan.judges, cells)},
        },
        separators=(",", ":"),
    )
    scoring = [
        (j, float(c[0])) for j, c in zip(plan.judges, cells) if c[1] == OK and c[0] is not None
    ]
    left_out = [(j, c[1]) for j, c in zip(plan.judges, cells) if c[1] != OK or c[0] is None]
    if not scoring:
        status, why = _no_score(plan, cells)
        return None, status, why, details
    values = [s for _, s in scoring]
    notes = [_split_reason(scoring)] if len(set(values)) > 1 else []
    notes += [f"{j} {failed}, not counted" for j, failed in left_out]
    reason = "; ".join(notes) or None
    if plan.combine == "mean":
        return sum(values) / len(values), OK, reason, details
    if plan.combine == "unanimous":
        return (1.0 if all(v == 1.0 for v in values) else 0.0), OK, reason, details
    ones = sum(1 for v in values if v == 1.0)
    zeros = len(values) - ones
    if ones == zeros:
        tie = f"judges tied {ones}-{zeros}: " + ", ".join(
            f"{j}={format_score(s)}" for j, s in scoring
        )
        return (
            None,
            TIE_STATUS,
            "; ".join([tie, *notes[1:]]) + "; a majority needs an odd count",
            details,
        )
    return (1.0 if ones > zeros else 0.0), OK, reason, details


def _split_reason(scoring: list[tuple[str, float]]) -> str:
    """``judges split 2-1: a=1, b=1, c=0`` (counts of each score given, most first;
    for more than two distinct scores, ``judges split: a=0.5, ...``)."""
    counts = Counter(s for _, s in scoring)
    listed = ", ".join(f"{j}={format_score(s)}" for j, s in scoring)
    if len(counts) == 2:
        tally = "-".join(str(n) for n in sorted(counts.values(), reverse=True))
        return f"judges split {tally}: {listed}"
    return f"judges split: {listed}"


def _no_score(
    plan: PanelPlan, cells: list[tuple[float | None, str, str | None]]
) -> tuple[str, str]:
    """Status and reason of a panel cell no member scored: the status most members
    share (the earliest among equals); the reason is the members' own when they all
    gave the same one, else each judge's status and reason."""
    statuses = [c[1] if c[1] != OK else "error" for c in cells]
    counts = Counter(statuses)
    status = max(statuses, key=lambda s: (counts[s], -statuses.index(s)))
    reasons = {c[2] for c in cells}
    if len(set(statuses)) == 1 and len(reasons) == 1:
        return status, next(iter(reasons)) or f"every judge: {status}"
    listed = "; ".join(
        f"{j} {s}" + (f" ({r})" if r else "")
        for j, s, r in zip(plan.judges, statuses, (c[2] for c in cells))
    )
    return status, f"no judge scored the row: {listed}"


def format_score(score: float) -> str:
    """A score as the reasons print it: ``1``, ``0``, ``0.75`` (an integral score as an
    integer, any other with 4 significant digits, ``.4g``)."""
    return str(int(score)) if float(score).is_integer() else f"{score:.4g}"
