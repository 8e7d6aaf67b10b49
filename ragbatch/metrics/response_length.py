"""``response_length``: the answer's length in characters lies within bounds."""

from __future__ import annotations

import polars as pl

from ragbatch.metrics._bounds import LengthBounds
from ragbatch.scoring.cells import cell, details_json, missing
from ragbatch.scoring.base import Example, ExpressionMetric
from ragbatch.scoring.registry import register


@register
class ResponseLength(ExpressionMetric):
    """1.0 when ``min_chars <= len(answer) <= max_chars``, else 0.0.

    Length counts Unicode code points, as Python ``len(str)`` does (a combining mark is
    one character, an emoji is one). ``details`` holds ``{"length": n}``. Follows Tonic
    Validate's ``ResponseLengthMetric``, except that 0 is a real bound.
    """

    name = "response_length"
    inputs = ("answer",)
    Params = LengthBounds
    summary = "len(answer) in characters within [min_chars, max_chars]"
    source = "Tonic Validate ResponseLengthMetric"
    policy = (("answer null", "missing_input"), ("answer empty", "scored: length 0"))
    examples = (
        Example({"answer": "abc"}, 1.0, params={"min_chars": 1, "max_chars": 3}),
        Example({"answer": "abcd"}, 0.0, params={"min_chars": 1, "max_chars": 3}),
        Example({"answer": ""}, 0.0, params={"min_chars": 1}),
        Example({"answer": ""}, 1.0, params={"max_chars": 0}),
        Example(
            {"answer": "e\u0301🚀数"},
            1.0,
            params={"min_chars": 4, "max_chars": 4},
            note="combining mark, emoji and CJK count one code point each",
        ),
        Example({}, None, "missing_input", params={"max_chars": 3}),
    )

    def expression(self) -> pl.Expr:
        length = pl.col("answer").str.len_chars()
        passed = self.params.admits(length)
        # The length is formatted only where the check fails (null elsewhere).
        reason = pl.format(
            "{} chars outside {}", pl.when(~passed).then(length), pl.lit(self.params.label())
        )
        return cell([missing("answer")], passed, reason=reason, details=details_json(length=length))
