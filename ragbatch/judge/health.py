"""Where a judge metric's cells record what the health diagnostics read.

Each :class:`~ragbatch.judge.metric.JudgeMetric` sets :attr:`JudgeMetric.health`, a
:class:`HealthFields` naming keys of its cells' ``details`` JSON. The run summary
(:mod:`ragbatch.analysis.diagnostics`) reads those keys to tell a degenerate judge from a
working one; docs/judges.md ("Judge health") defines every measure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class HealthFields:
    """The ``details`` keys a metric's diagnostics read; None where it has no such field.

    Attributes
    ----------
    extraction : str or None
        Key of the list an extraction step produced (statements, main points,
        questions). An empty list there is an *empty extraction*.
    extraction_void : str or None
        Key of a flag that discards the extraction when true (``answer_relevancy``'s
        ``noncommittal``: its questions are then not used): also an empty extraction.
    reason : str or None
        Key of the judge's own one-sentence reason for the cell's verdict.
    verdicts : str or None
        Key of a list of 0/1 verdicts in the order of the items judged (statements or
        contexts), for the position check.
    usual_score : float or None
        A score a working judge can give to nearly every row of ordinary data (0.0 for
        ``hate_speech``: most answers hold none). A constant at this score is not taken
        for a constant judge; a constant at any other score is.

    Raises
    ------
    ValueError
        A key is not a plain identifier (keys become JSON paths).
    """

    extraction: str | None = None
    extraction_void: str | None = None
    reason: str | None = None
    verdicts: str | None = None
    usual_score: float | None = None

    def __post_init__(self) -> None:
        for key in (self.extraction, self.extraction_void, self.reason, self.verdicts):
            if key is not None and not _KEY.fullmatch(key):
                raise ValueError(f"details key {key!r} must be a plain identifier")
