"""``latency``: the RAG call finished within a target time."""

from __future__ import annotations

import polars as pl
from pydantic import Field

from ragbatch.scoring.cells import Guard, cell, missing, number_text
from ragbatch.scoring.base import Example, ExpressionMetric, StrictParams
from ragbatch.core.reasons import number_text as number_text_of
from ragbatch.scoring.registry import register
from ragbatch.core.status import MISSING_INPUT


class LatencyParams(StrictParams):
    target_s: float = Field(
        5.0, ge=0, allow_inf_nan=False, description="largest latency that passes, in seconds"
    )


@register
class Latency(ExpressionMetric):
    """1.0 when ``latency_s <= target_s``, else 0.0.

    Follows Tonic Validate's ``LatencyMetric`` (default target 5 s). Latencies are
    seconds (``input.latency_unit: ms`` converts at read time).
    """

    name = "latency"
    inputs = ("latency_s",)
    Params = LatencyParams
    summary = "latency_s <= target_s"
    source = "Tonic Validate LatencyMetric"
    policy = (
        ("latency null or unparseable", "missing_input"),
        ("latency NaN or negative", "missing_input (not a valid duration)"),
    )
    examples = (
        Example({"latency_s": 5.0}, 1.0, params={"target_s": 5.0}),
        Example({"latency_s": 5.01}, 0.0, params={"target_s": 5.0}),
        Example({"latency_s": 0.0}, 1.0, params={"target_s": 0.0}),
        Example({"latency_s": float("nan")}, None, "missing_input"),
        Example({"latency_s": -1.0}, None, "missing_input"),
        Example({}, None, "missing_input"),
    )

    def expression(self) -> pl.Expr:
        latency = pl.col("latency_s")
        target = self.params.target_s
        guards = [
            missing("latency_s"),
            Guard(latency.is_nan(), MISSING_INPUT, pl.lit("latency_s is NaN")),
            Guard(
                latency < 0,
                MISSING_INPUT,
                pl.format(
                    "latency_s is negative ({})", number_text(pl.when(latency < 0).then(latency))
                ),
            ),
        ]
        passed = latency <= target
        # Latencies are formatted only where they are reported (null elsewhere).
        reason = pl.format(
            "{} s > target {} s",
            number_text(pl.when(~passed).then(latency)),
            pl.lit(number_text_of(target)),
        )
        return cell(guards, passed, reason=reason)
