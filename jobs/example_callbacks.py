"""Example callbacks for the ``binary`` metric, used by the shipped job configs.

A batch-mode callback receives a ``polars.DataFrame`` with the canonical columns
(row_id, question, contexts, answer, reference, latency_s) and returns a boolean
``polars.Series`` of the same length; null means "does not apply to this row".
"""

from __future__ import annotations

import polars as pl

_REFUSAL_OPENINGS = (
    r"(?i)^\s*(i'?m sorry|i am sorry|i (do not|don'?t) know|i cannot|i can'?t|as an ai)"
)


def not_a_refusal(batch: pl.DataFrame) -> pl.Series:
    """True when the answer does not open with a refusal phrase; null for a null answer."""
    return ~batch["answer"].str.contains(_REFUSAL_OPENINGS)
