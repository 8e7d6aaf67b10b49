"""``average_precision``: mean of the precision at each relevant id's rank."""

from __future__ import annotations

import polars as pl

from ragbatch.scoring.registry import register
from ragbatch.metrics._ranking import SHARED_POLICY, RankingMetric
from ragbatch.scoring.base import Example

_R = {"context_ids": ["d1", "d2", "d3", "d4"], "relevant_ids": ["d2", "d4", "d9"]}


@register
class AveragePrecision(RankingMetric):
    """Sum over the relevant ids at ranks 1..k of precision at their rank, divided by
    the number of relevant ids (retrieved or not).

    Follows trec_eval's ``map`` and ``map_cut_k`` (ranx ``map@k``): the divisor is all
    relevant ids, not min(k, relevant), so a cutoff can only lower the score. Its mean
    over rows is the mean average precision (MAP).
    """

    name = "average_precision"
    summary = "average precision"
    source = "trec_eval map / map_cut_k, ranx map@k"
    policy = SHARED_POLICY
    examples = (
        Example(_R, 1 / 3, note="(1/2 + 2/4) / 3"),
        Example(_R, 1 / 6, params={"k": 2}, note="(1/2) / 3"),
        Example({"context_ids": ["d2", "d2", "d1"], "relevant_ids": ["d2"]}, 1.0),
        Example({"context_ids": ["x", "d2", "d2"], "relevant_ids": ["d2", "d3"]}, 0.25),
        Example({"context_ids": [], "relevant_ids": ["d2"]}, 0.0),
        Example({"context_ids": ["d1"], "relevant_ids": []}, None, "not_applicable"),
    )

    def score(self) -> pl.Expr:
        return pl.col("ap_sum") / pl.col("relevant")
