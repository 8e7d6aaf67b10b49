"""``json_valid``: the answer parses as JSON, optionally matching a JSON Schema."""

from __future__ import annotations

import json
from typing import Any

import polars as pl
from pydantic import Field, field_validator

from ragbatch.metrics._cells import PyCell, missing, python_cells
from ragbatch.metrics.base import Example, ExpressionMetric, StrictParams
from ragbatch.registry import register


class JsonValidParams(StrictParams):
    schema_: dict[str, Any] | None = Field(
        None, alias="schema",
        description="optional JSON Schema (draft from its $schema, else 2020-12) the value must match",
    )

    @field_validator("schema_")
    @classmethod
    def _schema_is_valid(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            import jsonschema

            validator = jsonschema.validators.validator_for(value)
            try:
                validator.check_schema(value)
            except jsonschema.SchemaError as exc:
                path = "/".join(str(p) for p in exc.path) or "(root)"
                raise ValueError(f"not a valid JSON Schema at {path}: {exc.message}") from None
        return value

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:  # keep the user-facing name
        return super().model_dump(by_alias=True, **kwargs)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (RFC 8259)")


@register
class JsonValid(ExpressionMetric):
    """1.0 when the whole answer is one JSON value (RFC 8259; Python ``json.loads`` with
    ``NaN``/``Infinity`` rejected) and, when ``schema`` is given, the value validates
    against it; else 0.0 with the parser's or validator's message as the reason.

    Follows Vellum's "JSON Validity" and "JSON Schema Match" evaluators. Surrounding
    whitespace is allowed; Markdown code fences are not. Cost: one Python parse per row.
    """

    name = "json_valid"
    inputs = ("answer",)
    Params = JsonValidParams
    summary = "answer parses as JSON; with `schema`, it also validates against it"
    source = "Vellum JSON Validity / JSON Schema Match"
    policy = (("answer null", "missing_input"), ("answer empty", "scored: 0.0 (not JSON)"))
    examples = (
        Example({"answer": ' {"a": [1, 2]} '}, 1.0),
        Example({"answer": "[1, 2"}, 0.0),
        Example({"answer": "NaN"}, 0.0, note="NaN is not JSON"),
        Example({"answer": ""}, 0.0),
        Example({"answer": '{"a": 1}'}, 0.0,
                params={"schema": {"type": "object", "required": ["b"]}}),
        Example({"answer": '{"b": "数"}'}, 1.0,
                params={"schema": {"type": "object", "required": ["b"]}}),
        Example({}, None, "missing_input"),
    )

    def expression(self) -> pl.Expr:
        validator = None
        if self.params.schema_ is not None:
            import jsonschema

            validator = jsonschema.validators.validator_for(self.params.schema_)(self.params.schema_)

        def score_rows(rows: list[dict[str, Any]]) -> list[PyCell]:
            return [_check(row["answer"], validator) for row in rows]

        return python_cells([missing("answer")], ["answer"], score_rows)


def _check(text: str, validator: Any) -> PyCell:
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        return PyCell(0.0, reason=f"not JSON: {exc}")
    if validator is None:
        return PyCell(1.0)
    error = next(iter(validator.iter_errors(value)), None)
    if error is None:
        return PyCell(1.0)
    path = "/".join(str(p) for p in error.absolute_path) or "(root)"
    return PyCell(0.0, reason=f"JSON does not match schema at {path}: {error.message}")
