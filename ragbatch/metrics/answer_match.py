"""``answer_match``: the answer equals a given string."""

from __future__ import annotations

import polars as pl
from pydantic import Field

from ragbatch.scoring.cells import cell, missing
from ragbatch.scoring.base import Example, ExpressionMetric, StrictParams
from ragbatch.scoring.registry import register


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
    Unicode lowercase mapping (Python ``str.lower``). Cost: a byte-length check per answer;
    only answers short enough to match are lowercased and compared.
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
        answer = pl.col("answer")
        if self.params.case_sensitive:
            matched = answer == pl.lit(self.params.text, pl.String)
        else:
            # Lowercasing never shortens a string (every character maps to one or more),
            # so only answers with at most as many characters as the lowercased text can
            # match, and a character takes at most 4 bytes in UTF-8. Only answers within
            # 4x the text's length in bytes are lowercased; the others become "" first
            # (a null would still be lowercased from the data behind it) and do not match.
            text = pl.Series([self.params.text], dtype=pl.String).str.to_lowercase()[0]
            candidate = answer.str.len_bytes() <= 4 * len(text)
            lowered = pl.when(candidate).then(answer).otherwise(pl.lit("")).str.to_lowercase()
            matched = (
                pl.when(answer.is_null())
                .then(None)
                .otherwise(candidate & (lowered == pl.lit(text, pl.String)))
            )
        reason = pl.when(~matched).then(pl.lit("answer differs from the expected text"))
        return cell([missing("answer")], matched, reason=reason)
