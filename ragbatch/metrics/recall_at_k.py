"""``recall_at_k``: the share of the relevant ids found among the first k retrieved."""

from __future__ import annotations

import polars as pl

from ragbatch.scoring.registry import register
from ragbatch.metrics._ranking import SHARED_POLICY, RankingMetric
from ragbatch.scoring.base import Example

_R = {"context_ids": ["d1", "d2", "d3", "d4"], "relevant_ids": ["d2", "d4", "d9"]}


@register
class RecallAtK(RankingMetric):
    """Relevant ids at ranks 1..k, divided by the number of relevant ids.

    Follows trec_eval's ``recall_k`` (ranx ``recall@k``, Databricks' ``document_recall``
    with k unset). A relevant id retrieved twice counts once.
    """

    name = "recall_at_k"
    summary = "recall at k"
    source = "trec_eval recall_k / ranx recall@k"
    policy = SHARED_POLICY
    examples = (
        Example(_R, 2 / 3, note="d2 and d4 of d2, d4, d9"),
        Example(_R, 1 / 3, params={"k": 2}),
        Example(_R, 2 / 3, params={"k": 100}, note="k beyond the list"),
        Example({"context_ids": ["d2", "d2"], "relevant_ids": ["d2", "d3"]}, 0.5),
        Example(
            {"context_ids": ["d1", "d2"], "relevant_ids": ["d2", "d2", None]},
            1.0,
            note="relevant_ids: repeats and nulls ignored",
        ),
        Example(
            {"context_ids": ["\u00e9", "x"], "relevant_ids": ["e\u0301"]},
            0.0,
            note="ids are compared as written: no Unicode normalization",
        ),
        Example({"context_ids": [], "relevant_ids": ["d1"]}, 0.0),
        Example({"context_ids": ["d1"], "relevant_ids": []}, None, "not_applicable"),
    )

    def score(self) -> pl.Expr:
        return pl.col("hits") / pl.col("relevant")
