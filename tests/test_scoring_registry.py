"""The metric registry refuses a metric class that lacks a required hook when the class
is registered (so at import), naming what is missing."""

from __future__ import annotations

from typing import Any, ClassVar

import polars as pl
import pytest

from ragbatch.judge.statement_verdicts import StatementVerdictMetric
from ragbatch.scoring.base import ExpressionMetric, ModelMetric
from ragbatch.scoring.registry import all_metrics, missing_hooks, register


def test_an_expression_metric_without_its_expression_fails_at_registration():
    with pytest.raises(TypeError) as caught:

        @register
        class NoExpression(ExpressionMetric):
            name: ClassVar[str] = "test_no_expression"
            inputs: ClassVar[tuple[str, ...]] = ("answer",)
            summary: ClassVar[str] = "nothing"

    assert str(caught.value) == (
        f"metric class {__name__}.test_an_expression_metric_without_its_expression_fails_at_"
        "registration.<locals>.NoExpression cannot be registered: it does not define "
        "expression(), source"
    )


def test_a_class_attribute_declared_without_a_value_is_a_missing_hook():
    class HalfStatements(StatementVerdictMetric):
        name: ClassVar[str] = "test_half_statements"

        def step_fields(self, row: dict[str, Any]) -> dict[str, str]:
            return {}

    missing = missing_hooks(HalfStatements)
    assert {"extracted", "missed", "no_statements", "statements_max_tokens"} <= set(missing)
    assert "statements_of" in missing and "verdict_max_tokens" not in missing
    with pytest.raises(TypeError, match="does not define .*statements_of"):
        register(HalfStatements)


def test_a_complete_metric_registers_and_every_registered_metric_is_complete():
    class Chars(ModelMetric):
        name: ClassVar[str] = "test_chars_complete"
        inputs: ClassVar[tuple[str, ...]] = ("answer",)
        summary: ClassVar[str] = "answer length"
        source: ClassVar[str] = "test"

        def compute(self, model: Any, frame: pl.DataFrame) -> pl.Series:
            return pl.Series([])

    assert missing_hooks(Chars) == []
    assert [m.name for m in all_metrics() if missing_hooks(m)] == []
