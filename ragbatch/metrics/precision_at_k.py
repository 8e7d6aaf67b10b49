"""``precision_at_k``: the share of the first k retrieved ids that are relevant."""

from __future__ import annotations

import polars as pl

from ragbatch.scoring.registry import register
from ragbatch.metrics._ranking import SHARED_POLICY, RankingMetric
from ragbatch.scoring.base import Example

_R = {"context_ids": ["d1", "d2", "d3", "d4"], "relevant_ids": ["d2", "d4", "d9"]}


@register
class PrecisionAtK(RankingMetric):
    """Relevant ids at ranks 1..k, divided by k.

    Follows trec_eval's ``P_k`` (ranx ``precision@k``): the divisor is k even when
    fewer than k ids were retrieved, so a ranking of 2 ids with both relevant scores
    0.2 at k = 10. With ``k`` unset the divisor is the number of ids retrieved (trec_eval's
    ``set_P``), and an empty ranking scores 0.0. A repeated id counts once, at its first
    rank, but its later copies still take slots, so they lower precision.
    """

    name = "precision_at_k"
    summary = "precision at k"
    source = "trec_eval P_k / ranx precision@k"
    policy = SHARED_POLICY + (
        ("fewer than k ids retrieved", "still divided by k (trec_eval P_k)"),
        ("k unset", "divided by the number of ids retrieved (trec_eval set_P)"),
    )
    examples = (
        Example(_R, 0.5, note="2 of 4 retrieved are relevant"),
        Example(_R, 0.5, params={"k": 2}),
        Example(_R, 0.2, params={"k": 10}, note="4 retrieved, k = 10: 2 / 10"),
        Example(
            {"context_ids": ["d2", "d2", "d1"], "relevant_ids": ["d2"]},
            1 / 3,
            note="the repeated d2 counts once and its copy takes a slot",
        ),
        Example({"context_ids": [], "relevant_ids": ["d1"]}, 0.0),
        Example({"context_ids": [], "relevant_ids": ["d1"]}, 0.0, params={"k": 3}),
        Example(
            {
                "context_ids": ["a", "b", "c"],
                "relevance": [{"id": "a", "grade": 1.0}, {"id": "c", "grade": 0.0}],
            },
            1 / 3,
            note="no relevant_ids: relevant means a grade above 0",
        ),
        Example({"context_ids": ["d1"], "relevant_ids": []}, None, "not_applicable"),
    )

    def score(self) -> pl.Expr:
        if self.k is not None:
            return pl.col("hits") / self.k
        retrieved = pl.col("retrieved")
        return pl.when(retrieved > 0).then(pl.col("hits") / retrieved).otherwise(0.0)
