"""``answer_match``: the answer equals a given string."""

from __future__ import annotations

import polars as pl
from pydantic import Field

from ragbatch.metrics._cells import cell, missing
from ragbatch.metrics.base import Example, ExpressionMetric, StrictParams
from ragbatch.registry import register


class AnswerMatchParams(StrictParams):
    text: str = Field(description="the string the whole answer must equal")
    case_sensitive: bool = Field(
        False, description="compare exactly; when false both sides are lowercased first"
    )


@register
class AnswerMatch(ExpressionMetric):
    """1.0 when the whole answer equals ``text``, else 0.0.

    Follows Tonic Validate's ``AnswerMatchMetric``: plain equality, no whitespace
    stripping; case-insensitive by default, where both sides are lowercased with the
    Unicode lowercase mapping (Python ``str.lower``). Cost: one vectorized comparison.
    """

    name = "answer_match"
    inputs = ("answer",)
    Params = AnswerMatchParams
    summary = "answer equals the given text (case-insensitive unless case_sensitive)"
    source = "Tonic Validate AnswerMatchMetric"
    policy = (
        ("answer null", "missing_input"),
        ("answer empty string", "scored: 1.0 only when text is also empty"),
    )
    examples = (
        Example({"answer": "Paris"}, 1.0, params={"text": "paris"}),
        Example({"answer": "Paris"}, 0.0, params={"text": "paris", "case_sensitive": True}),
        Example({"answer": " Paris"}, 0.0, params={"text": "Paris"}, note="no stripping"),
        Example({"answer": "東京 🚀"}, 1.0, params={"text": "東京 🚀"}),
        Example({}, None, "missing_input", params={"text": "x"}),
    )

    def expression(self) -> pl.Expr:
        answer, text = pl.col("answer"), pl.lit(self.params.text, pl.String)
        if not self.params.case_sensitive:
            answer, text = answer.str.to_lowercase(), text.str.to_lowercase()
        matched = answer == text
        reason = pl.when(~matched).then(pl.lit("answer differs from the expected text"))
        return cell([missing("answer")], matched, reason=reason)
