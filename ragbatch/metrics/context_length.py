"""``context_length``: every retrieved context's length lies within bounds."""

from __future__ import annotations

import polars as pl

from ragbatch.metrics._bounds import LengthBounds
from ragbatch.metrics._cells import Guard, cell, details_json, missing
from ragbatch.metrics.base import Example, ExpressionMetric
from ragbatch.registry import register
from ragbatch.status import MISSING_INPUT, NOT_APPLICABLE


@register
class ContextLength(ExpressionMetric):
    """1.0 when every context has ``min_chars <= len(context) <= max_chars``, else 0.0.

    Follows Tonic Validate's ``ContextLengthMetric`` (all contexts must pass), with 0 a
    real bound. Lengths count Unicode code points. ``details`` holds
    ``{"lengths": [...]}``; the reason of a 0.0 lists the offending contexts by index.
    """

    name = "context_length"
    inputs = ("contexts",)
    Params = LengthBounds
    summary = "every context's length in characters within [min_chars, max_chars]"
    source = "Tonic Validate ContextLengthMetric"
    policy = (
        ("contexts null or unparseable", "missing_input"),
        ("contexts empty list", "not_applicable (nothing was retrieved; Tonic would pass it)"),
        ("a null item in contexts", "missing_input, naming the index"),
    )
    examples = (
        Example({"contexts": ["ab", "abc"]}, 1.0, params={"min_chars": 2, "max_chars": 3}),
        Example({"contexts": ["ab", "abcd"]}, 0.0, params={"min_chars": 2, "max_chars": 3}),
        Example({"contexts": [""]}, 1.0, params={"max_chars": 0}),
        Example({"contexts": []}, None, "not_applicable", params={"max_chars": 3}),
        Example({"contexts": ["ab", None]}, None, "missing_input", params={"max_chars": 3}),
        Example({}, None, "missing_input", params={"max_chars": 3}),
    )

    def expression(self) -> pl.Expr:
        contexts = pl.col("contexts")
        lengths = contexts.list.eval(pl.element().str.len_chars())
        first_null = contexts.list.eval(pl.element().is_null()).list.arg_max()
        guards = [
            missing("contexts"),
            Guard(contexts.list.len() == 0, NOT_APPLICABLE, pl.lit("contexts is an empty list")),
            Guard(
                contexts.list.eval(pl.element().is_null()).list.any(),
                MISSING_INPUT,
                pl.format("contexts[{}] is null", first_null),
            ),
        ]
        passed = lengths.list.eval(self.params.admits(pl.element())).list.all()
        offenders = lengths.list.eval(
            pl.when(~self.params.admits(pl.element())).then(
                pl.format("#{} ({} chars)", pl.int_range(pl.len()), pl.element())
            )
        ).list.drop_nulls().list.join(", ")
        reason = pl.when(~passed).then(
            pl.format("{} outside {}", offenders, pl.lit(self.params.label()))
        )
        return cell(guards, passed, reason=reason, details=details_json(lengths=lengths))
