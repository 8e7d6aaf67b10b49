"""``exact_match``: the answer equals the reference answer."""

from __future__ import annotations

import polars as pl
from pydantic import Field

from ragbatch.scoring.cells import cell, missing, py_strip
from ragbatch.scoring.base import Example, ExpressionMetric, StrictParams
from ragbatch.scoring.registry import register


class ExactMatchParams(StrictParams):
    case_sensitive: bool = Field(True, description="when false, lowercase both sides first")
    strip: bool = Field(
        True, description="remove leading/trailing whitespace (Python str.strip) first"
    )


@register
class ExactMatch(ExpressionMetric):
    """1.0 when the answer equals the reference, else 0.0.

    Follows Vellum's "Exact Match" evaluator. Whitespace stripping uses exactly the
    characters Python's ``str.isspace`` accepts; lowercasing uses the Unicode lowercase
    mapping (Python ``str.lower``). Cost: one vectorized comparison.
    """

    name = "exact_match"
    inputs = ("answer", "reference")
    Params = ExactMatchParams
    summary = "answer equals reference (after optional strip / lowercase)"
    source = "Vellum Exact Match"
    policy = (
        ("answer null", "missing_input"),
        ("reference null", "missing_input"),
        ("both empty strings", "scored: 1.0 (equal)"),
    )
    examples = (
        Example(
            {"answer": "\nRich people and nerds. ", "reference": "Rich people and nerds."}, 1.0
        ),
        Example({"answer": " abc", "reference": "abc"}, 0.0, params={"strip": False}),
        Example(
            {"answer": "abc\x1c", "reference": "abc"},
            1.0,
            note="U+001C counts as whitespace, as in Python str.strip",
        ),
        Example({"answer": "ABC", "reference": "abc"}, 0.0),
        Example({"answer": "ABC", "reference": "abc"}, 1.0, params={"case_sensitive": False}),
        Example(
            {"answer": "e\u0301", "reference": "\u00e9"},
            0.0,
            note="no Unicode normalization: combining form differs from precomposed",
        ),
        Example({"answer": "x"}, None, "missing_input"),
    )

    def _prepare(self, expr: pl.Expr) -> pl.Expr:
        if self.params.strip:
            expr = py_strip(expr)
        if not self.params.case_sensitive:
            expr = expr.str.to_lowercase()
        return expr

    def expression(self) -> pl.Expr:
        matched = self._prepare(pl.col("answer")) == self._prepare(pl.col("reference"))
        reason = pl.when(~matched).then(pl.lit("answer differs from reference"))
        return cell([missing("answer"), missing("reference")], matched, reason=reason)
