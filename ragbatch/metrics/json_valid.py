"""``json_valid``: the answer parses as JSON, optionally matching a JSON Schema."""

from __future__ import annotations

import json
from typing import Any

import polars as pl
from pydantic import Field, field_validator

from ragbatch.scoring.cells import PyCell, frame_cells, missing
from ragbatch.scoring.base import Example, ExpressionMetric, StrictParams
from ragbatch.core.reasons import cut
from ragbatch.scoring.registry import register
from ragbatch.core.status import OK


class JsonValidParams(StrictParams):
    schema_: dict[str, Any] | None = Field(
        None,
        alias="schema",
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
    against it; else 0.0 with the parser's message, or the JSON path and schema keyword
    that failed (never the value itself), as the reason. In runs with PII metrics
    (``quote_values`` false) the place is the schema's (``#/properties/email``), not the
    value's JSON path, whose object keys come from the answer.

    Follows Vellum's "JSON Validity" and "JSON Schema Match" evaluators. Surrounding
    whitespace is allowed; Markdown code fences are not. Cost: a regex check of each
    answer's start; a Python parse only for answers that could begin a JSON value (the
    others get the parser's "Expecting value" message, computed without parsing).
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
        Example(
            {"answer": '{"a": 1}'}, 0.0, params={"schema": {"type": "object", "required": ["b"]}}
        ),
        Example(
            {"answer": '{"b": "数"}'}, 1.0, params={"schema": {"type": "object", "required": ["b"]}}
        ),
        Example({}, None, "missing_input"),
    )

    def expression(self) -> pl.Expr:
        validator = None
        if self.params.schema_ is not None:
            import jsonschema

            validator = jsonschema.validators.validator_for(self.params.schema_)(
                self.params.schema_
            )

        quote_values = self.quote_values

        def score_frame(frame: pl.DataFrame) -> pl.DataFrame:
            return _score(frame.get_column("answer"), validator, quote_values)

        return frame_cells([missing("answer")], ["answer"], score_frame)


#: What Python's decoder can read a value from, after JSON whitespace (NaN, Infinity and
#: -Infinity included: they reach ``parse_constant``). A text that does not start so is
#: refused with "Expecting value" where its leading whitespace ends.
_VALUE_AHEAD = r'^[ \t\n\r]*(?:["{\[0-9-]|null|true|false|NaN|Infinity)'
#: JSON whitespace at the start of a text.
_SPACE_FIRST = r"^[ \t\n\r]"
_JSON_SPACE = " \t\n\r"
_AT_START = "not JSON: Expecting value: line 1 column 1 (char 0)"


def _score(answer: pl.Series, validator: Any, quote_values: bool = True) -> pl.DataFrame:
    """Score and reason of every answer (null answers are settled by the guard).

    An answer whose first character after JSON whitespace cannot begin a JSON value (an
    answer in prose, an empty one) gets Python's own "Expecting value" message without
    being parsed: the position, line and column are computed with Polars. The other
    answers go through :func:`_check` one by one.
    """
    n = answer.len()
    score = pl.repeat(None, n, dtype=pl.Float64, eager=True)
    reason = pl.repeat(None, n, dtype=pl.String, eager=True)
    prose = _not_a_value(answer) if _FAST_PATH else pl.repeat(False, n, eager=True)
    at = prose.arg_true()
    if at.len():
        score = score.scatter(at, pl.repeat(0.0, at.len(), dtype=pl.Float64, eager=True))
        reason = reason.scatter(at, _expecting_value(answer.gather(at)))
    rest = (answer.is_not_null() & ~prose).arg_true()
    if rest.len():
        cells = [_check(text, validator, quote_values) for text in answer.gather(rest).to_list()]
        score = score.scatter(
            rest,
            pl.Series(
                [float(c.score) if c.status == OK and c.score is not None else None for c in cells],
                dtype=pl.Float64,
            ),
        )
        reason = reason.scatter(rest, pl.Series([c.reason for c in cells], dtype=pl.String))
    return pl.DataFrame(
        {
            "score": score,
            "reason": reason,
            "details": pl.repeat(None, n, dtype=pl.String, eager=True),
        }
    )


def _not_a_value(answer: pl.Series) -> pl.Series:
    """True where no JSON value can be read after the leading JSON whitespace (prose,
    empty text); False for null answers and for a leading BOM (``json.loads`` has its
    own message for that)."""
    return (~answer.str.contains(_VALUE_AHEAD) & ~answer.str.starts_with("\ufeff")).fill_null(False)


def _expecting_value(answer: pl.Series) -> pl.Series:
    """``"not JSON: Expecting value: line L column C (char P)"`` as Python's decoder words
    it, P being where the leading JSON whitespace ends (0 for most texts)."""
    out = pl.repeat(_AT_START, answer.len(), dtype=pl.String, eager=True)
    spaced = answer.str.contains(_SPACE_FIRST).fill_null(False).arg_true()
    if not spaced.len():
        return out
    text = pl.col("a")
    frame = (
        pl.DataFrame({"a": answer.gather(spaced)})
        .with_columns(
            pos=text.str.len_chars() - text.str.strip_chars_start(_JSON_SPACE).str.len_chars()
        )
        .with_columns(prefix=text.str.head(pl.col("pos")))
    )
    return out.scatter(
        spaced,
        frame.select(
            pl.format(
                "not JSON: Expecting value: line {} column {} (char {})",
                pl.col("prefix").str.count_matches("\n", literal=True) + 1,
                pl.col("prefix").str.split("\n").list.last().str.len_chars() + 1,
                pl.col("pos"),
            )
        ).to_series(),
    )


def _fast_path_agrees() -> bool:
    """Whether :func:`_expecting_value` words errors exactly as this Python's ``json``."""
    probes = [
        "x",
        "",
        "   ",
        "\n",
        " \n\t\r x",
        "\r\n\r\nabc",
        "é",
        "  \n  \n  z🚀",
        " \ufeff{}",
        "nul",
        "Nope",
        "Inf",
        "tru",
        " fals",
        "\u00a0{}",
        "}",
    ]
    series = pl.Series(probes, dtype=pl.String)
    if not _not_a_value(series).all():
        return False
    return _expecting_value(series).to_list() == [_check(p, None).reason for p in probes]


#: ``json.loads(text, parse_constant=_reject_constant)`` builds this decoder on every call;
#: one shared instance gives the same results without that cost.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _loads(text: str) -> Any:
    """``json.loads(text, parse_constant=_reject_constant)`` for a ``str``."""
    if text.startswith("\ufeff"):  # json.loads refuses a BOM before decoding
        return json.loads(text, parse_constant=_reject_constant)
    return _DECODER.decode(text)


def _check(text: str, validator: Any, quote_values: bool = True) -> PyCell:
    try:
        value = _loads(text)
    except ValueError as exc:
        return PyCell(0.0, reason=f"not JSON: {exc}")
    if validator is None:
        return PyCell(1.0)
    error = next(iter(validator.iter_errors(value)), None)
    if error is None:
        return PyCell(1.0)
    return PyCell(0.0, reason=_schema_reason(error, quote_values))


def _schema_reason(error: Any, quote_values: bool = True) -> str:
    """Where and which schema keyword failed, e.g. ``JSON does not match schema at
    $.email: fails 'format' ("email")``. The validator's own message is not used: it
    quotes the failing value in full (any size, and possibly personal data); the schema's
    side is cut to :data:`ragbatch.core.reasons.QUOTE_MAX_CHARS`. Without ``quote_values`` the
    place is the keyword's location in the schema (``schema #/properties/email``): the
    JSON path can hold object keys of the answer (``$['jane@example.org']``)."""
    expected = cut(json.dumps(error.validator_value, ensure_ascii=False, default=str))
    where = cut(error.json_path) if quote_values else f"schema {_schema_pointer(error)}"
    return f"JSON does not match schema at {where}: fails {error.validator!r} ({expected})"


def _schema_pointer(error: Any) -> str:
    """JSON pointer (RFC 6901) of the schema object holding the failed keyword, e.g.
    ``#/properties/email``; made of the schema's keys and indices only."""
    parts = [str(p).replace("~", "~0").replace("/", "~1") for p in list(error.schema_path)[:-1]]
    return "#" + "".join(f"/{p}" for p in parts)


#: The vectorized "Expecting value" path is used only where it was checked to match.
_FAST_PATH = _fast_path_agrees()
