"""``ndcg_at_k``: normalized discounted cumulative gain of the first k retrieved ids."""

from __future__ import annotations

import polars as pl

from ragbatch.scoring.registry import register
from ragbatch.metrics._ranking import SHARED_POLICY, RankingMetric
from ragbatch.scoring.base import Example

_R = {"context_ids": ["d1", "d2", "d3", "d4"], "relevant_ids": ["d2", "d4", "d9"]}
_GRADED = {
    "context_ids": ["a", "b", "c"],
    "relevance": [
        {"id": "a", "grade": 1.0},
        {"id": "b", "grade": 3.0},
        {"id": "c", "grade": 0.0},
        {"id": "d", "grade": 2.0},
    ],
}


@register
class NdcgAtK(RankingMetric):
    """DCG@k / ideal DCG@k, with linear gain: DCG@k = sum over ranks i = 1..k of
    gain(id at i) / log2(i + 1), gain = the id's grade (0 for ids not judged, grades at
    or below 0, and repeated copies).

    The ideal DCG sorts every judged id's gain in decreasing order (retrieved or not)
    and cuts it at k. The linear gain is trec_eval's ``ndcg_cut_k`` and ranx's ``ndcg@k``
    (Järvelin & Kekäläinen 2002); the exponential gain 2^grade - 1 (Burges et al. 2005,
    ranx ``ndcg_burges``) is not used. Graded when the row has ``relevance``, binary
    (grade 1 per relevant id) from ``relevant_ids`` otherwise. Tied grades give the
    same score in any order.
    """

    name = "ndcg_at_k"
    graded = True
    summary = "nDCG at k, linear gain"
    source = "trec_eval ndcg_cut_k / ranx ndcg@k (Järvelin & Kekäläinen 2002)"
    policy = SHARED_POLICY[:7] + (
        ("relevance given", "its grades are the gains; relevant_ids is not read"),
        ("every grade at or below 0", "not_applicable"),
    )
    examples = (
        Example(_R, 0.498189257, note="(1/log2 3 + 1/log2 5) / (1 + 1/log2 3 + 1/log2 4)"),
        Example(_R, 0.386852807, params={"k": 2}, note="(1/log2 3) / (1 + 1/log2 3)"),
        Example(_GRADED, 0.607491518, note="(1 + 3/log2 3) / (3 + 2/log2 3 + 1/2)"),
        Example(_GRADED, 0.678762229, params={"k": 2}, note="(1 + 3/log2 3) / (3 + 2/log2 3)"),
        Example(
            {
                "context_ids": ["b", "a"],
                "relevance": [{"id": "a", "grade": 2.0}, {"id": "b", "grade": 2.0}],
            },
            1.0,
            note="tied grades: either order is ideal",
        ),
        Example(
            {"context_ids": ["d2", "d2", "d1"], "relevant_ids": ["d2"]},
            1.0,
            note="the repeated copy gains nothing",
        ),
        Example({"context_ids": [], "relevant_ids": ["d1"]}, 0.0),
        Example(
            {"context_ids": ["a"], "relevance": [{"id": "a", "grade": -1.0}]},
            None,
            "not_applicable",
        ),
    )

    def score(self) -> pl.Expr:
        return pl.col("dcg") / pl.col("idcg")
