"""``mrr``: reciprocal rank of the first relevant id retrieved."""

from __future__ import annotations

import polars as pl

from ragbatch.scoring.registry import register
from ragbatch.metrics._ranking import SHARED_POLICY, RankingMetric
from ragbatch.scoring.base import Example

_R = {"context_ids": ["d1", "d2", "d3", "d4"], "relevant_ids": ["d2", "d4", "d9"]}


@register
class Mrr(RankingMetric):
    """1 / rank of the first relevant id at rank k or better, 0.0 when there is none.

    Follows trec_eval's ``recip_rank`` (ranx ``mrr@k``); its mean over rows is the mean
    reciprocal rank.
    """

    name = "mrr"
    summary = "reciprocal rank"
    source = "trec_eval recip_rank / ranx mrr@k"
    policy = SHARED_POLICY
    examples = (
        Example(_R, 0.5),
        Example(_R, 0.0, params={"k": 1}),
        Example({"context_ids": ["x", None, "d2"], "relevant_ids": ["d2"]}, 1 / 3),
        Example(
            {"context_ids": ["x", "x", "d2"], "relevant_ids": ["d2"]},
            1 / 3,
            note="a repeated id keeps its slot",
        ),
        Example({"context_ids": ["x"], "relevant_ids": ["d2"]}, 0.0),
        Example({"context_ids": [], "relevant_ids": ["d2"]}, 0.0),
        Example({"relevant_ids": ["d2"]}, None, "missing_input"),
    )

    def score(self) -> pl.Expr:
        return (1.0 / pl.col("first")).fill_null(0.0)
