"""``hit_rate``: some id among the first k retrieved is known relevant."""

from __future__ import annotations

import polars as pl

from ragbatch.scoring.registry import register
from ragbatch.metrics._ranking import SHARED_POLICY, RankingMetric
from ragbatch.scoring.base import Example

_R = {"context_ids": ["d1", "d2", "d3", "d4"], "relevant_ids": ["d2", "d4", "d9"]}


@register
class HitRate(RankingMetric):
    """1.0 when at least one relevant id is at rank k or better, else 0.0.

    Follows ranx's ``hit_rate@k`` (trec_eval's ``success_k``); the mean over rows is the
    share of questions whose retrieval found something relevant. Relevance, ranks,
    repeated ids and degenerate rows follow the rules all ranking metrics share, given
    at the start of the metric reference (docs/metrics.md).
    """

    name = "hit_rate"
    boolean = True
    summary = "hit in top k"
    source = "ranx hit_rate@k (trec_eval success_k)"
    policy = SHARED_POLICY
    examples = (
        Example(_R, 1.0),
        Example(_R, 0.0, params={"k": 1}, note="d1 is not relevant"),
        Example(_R, 1.0, params={"k": 2}),
        Example({"context_ids": [], "relevant_ids": ["d1"]}, 0.0, note="nothing retrieved"),
        Example({"context_ids": ["文書", "📄"], "relevant_ids": ["📄"]}, 1.0, note="unicode ids"),
        Example({"context_ids": ["d1"], "relevant_ids": []}, None, "not_applicable"),
        Example({"context_ids": ["d1"]}, None, "missing_input"),
    )

    def score(self) -> pl.Expr:
        return pl.col("hits") > 0
