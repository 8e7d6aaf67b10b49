"""Judge panels in the job config: a judge metric that names several engines.

A metric entry may give ``engines: [a, b, c]`` instead of ``engine: a``, and a ``panel``
section saying how the judges' cells combine into the panel cell (docs/panels.md)::

    metrics:
      - name: hate_speech
        engines: [judge_a, judge_b, judge_c]
        panel: {combine: majority}        # majority | mean | unanimous

Each judge is a *member* of the panel. Inside the pipeline, and in the summary and the
manifest, a member is known by its *member key* ``<metric id>[<engine>]``
(:func:`member_key`); in the scores table its cells carry the metric's own id with the
engine's name in the ``judge`` column.

What can be checked without the metric registry is checked here
(:func:`panel_problems`); whether the metric is a judge metric and whether its scores
suit the combine rule is checked when the plan is built (:mod:`ragbatch.pipeline.plan`).
"""

from __future__ import annotations

import difflib
from typing import Literal

from pydantic import BaseModel, ConfigDict

#: How a panel's member cells combine into the panel cell.
COMBINE_RULES: tuple[str, ...] = ("majority", "mean", "unanimous")


class PanelSection(BaseModel):
    """``metrics[i].panel``: how the judges of ``metrics[i].engines`` combine.

    ``combine`` is ``majority`` (the score most of the scoring judges gave; 0/1 metrics),
    ``unanimous`` (1 only when every scoring judge gave 1; 0/1 metrics) or ``mean`` (the
    mean of the scoring judges' scores). Left out: ``majority`` for a 0/1 metric,
    ``mean`` for any other."""

    model_config = ConfigDict(extra="forbid")

    combine: Literal["majority", "mean", "unanimous"] | None = None


def member_key(metric_id: str, engine: str) -> str:
    """The key of one judge of a panel: ``<metric id>[<engine>]``, e.g.
    ``hate_speech[judge_a]``. It names the member's cells inside the pipeline, its token
    counters in the manifest and its rows in ``summary.parquet``."""
    return f"{metric_id}[{engine}]"


def panel_problems(
    index: int,
    engine: str | None,
    engines: list[str] | None,
    panel: PanelSection | None,
    defined: list[str],
) -> list[str]:
    """Problems of one metric entry's ``engine`` / ``engines`` / ``panel`` fields.

    Parameters
    ----------
    index : int
        The entry's place in ``metrics`` (messages name ``metrics[index]...``).
    engine, engines, panel
        The entry's fields as validated.
    defined : list of str
        The names under ``engines``.

    Returns
    -------
    list of str
        One ``<field path>: <what is wrong>; <what to do>`` per problem: ``engine`` and
        ``engines`` both given, an empty ``engines``, an engine named twice, a name not
        under ``engines``, or ``panel`` without ``engines`` or with one engine.
    """
    where = f"metrics[{index}]"
    problems: list[str] = []
    if engines is None:
        if panel is not None:
            problems.append(
                f"{where}.panel: a panel needs `engines: [...]` naming its judges; "
                "remove `panel:` or list the engines"
            )
        return problems
    if engine is not None:
        problems.append(
            f"{where}: give either `engine:` (one judge) or `engines:` (a panel of judges), "
            "not both"
        )
    if not engines:
        problems.append(f"{where}.engines: the list is empty; name one engine or more")
    elif len(engines) == 1 and panel is not None:
        problems.append(
            f"{where}.panel: a panel needs two judges or more, and `engines` names one; "
            "add judges to `engines`, or remove `panel:` to run one judge"
        )
    first: dict[str, int] = {}
    for j, name in enumerate(engines):
        if name in first:
            problems.append(
                f"{where}.engines[{j}]: {name!r} is already metrics[{index}].engines"
                f"[{first[name]}]; each judge of a panel is named once"
            )
            continue
        first[name] = j
        if name not in defined:
            close = difflib.get_close_matches(name, defined, n=3, cutoff=0.6)
            hint = " (did you mean " + " or ".join(map(repr, close)) + "?)" if close else ""
            problems.append(f"{where}.engines[{j}]: {name!r} is not defined under `engines`{hint}")
    return problems
