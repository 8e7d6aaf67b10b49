"""Reply parsing shared by the judge metrics.

Replies are produced under structured outputs, so a well-behaved engine always returns
text of the requested shape; these functions still check everything (engines without
structured outputs, truncated or hand-recorded replies) and raise
:class:`~ragbatch.judge.protocol.ParseError` with what was wrong.
"""

from __future__ import annotations

import json
from typing import Any

from ragbatch.judge.protocol import ParseError

#: Longest reason string a verdict may carry, in characters.
REASON_MAX_CHARS = 300
#: Longest statement a statement-extraction step may return, in characters.
STATEMENT_MAX_CHARS = 400
#: Most statements a statement-extraction step may return.
MAX_STATEMENTS = 20
#: Characters per token assumed when sizing a reply's token budget from its schema's
#: length limits (byte-level BPE tokenizers average 3-4 characters per token on English).
CHARS_PER_TOKEN = 3


def token_budget(chars: int, overhead: int = 16) -> int:
    """``max_tokens`` for a reply of at most ``chars`` characters of content."""
    return overhead + -(-chars // CHARS_PER_TOKEN)


#: ``max_tokens`` for a full :func:`statements_schema` reply.
STATEMENTS_MAX_TOKENS = token_budget(MAX_STATEMENTS * (STATEMENT_MAX_CHARS + 4))
#: ``max_tokens`` per verdict of a :func:`verdicts_schema` reply.
VERDICT_MAX_TOKENS = token_budget(REASON_MAX_CHARS + 30, overhead=0)


def parse_json(text: str, schema: dict[str, Any]) -> Any:
    """``text`` parsed as JSON and validated against ``schema``.

    Raises
    ------
    ParseError
        ``text`` is not JSON, or does not match ``schema`` (the message gives the path
        and the validator's complaint).
    """
    import jsonschema

    try:
        value = json.loads(text, strict=False)  # control characters inside strings are fine
    except ValueError as exc:
        raise ParseError(f"reply is not JSON: {exc}") from None
    error = jsonschema.exceptions.best_match(
        jsonschema.validators.validator_for(schema)(schema).iter_errors(value)
    )
    if error is not None:
        path = "/".join(str(p) for p in error.absolute_path) or "(root)"
        raise ParseError(f"reply does not match the schema at {path}: {error.message}")
    return value


def parse_choice(text: str, choices: tuple[str, ...]) -> str:
    """``text`` stripped, when it is one of ``choices``.

    Raises
    ------
    ParseError
        Any other text.
    """
    value = text.strip()
    if value not in choices:
        raise ParseError(f"reply {value[:80]!r} is not one of {list(choices)}")
    return value


def statements_schema() -> dict[str, Any]:
    """``{"statements": [str, ...]}`` with at most :data:`MAX_STATEMENTS` items."""
    return {
        "type": "object",
        "properties": {
            "statements": {
                "type": "array",
                "items": {"type": "string", "minLength": 1, "maxLength": STATEMENT_MAX_CHARS},
                "maxItems": MAX_STATEMENTS,
            }
        },
        "required": ["statements"],
        "additionalProperties": False,
    }


def verdicts_schema(n: int, reasons: bool = True) -> dict[str, Any]:
    """``{"verdicts": [{"reason": str, "verdict": 0 | 1}, ...]}`` with exactly ``n`` items,
    or, with ``reasons=False``, ``{"verdicts": [0 | 1, ...]}`` (bare verdicts)."""
    if reasons:
        item: dict[str, Any] = {
            "type": "object",
            "properties": {
                "reason": {"type": "string", "maxLength": REASON_MAX_CHARS},
                "verdict": {"type": "integer", "enum": [0, 1]},
            },
            "required": ["reason", "verdict"],
            "additionalProperties": False,
        }
    else:
        item = {"type": "integer", "enum": [0, 1]}
    return {
        "type": "object",
        "properties": {"verdicts": {"type": "array", "items": item, "minItems": n, "maxItems": n}},
        "required": ["verdicts"],
        "additionalProperties": False,
    }


def parse_statements(text: str) -> list[str]:
    """The statements of a :func:`statements_schema` reply, blank ones dropped.

    Raises
    ------
    ParseError
        Not JSON, or not of the schema's shape.
    """
    value = parse_json(text, statements_schema())
    return [s.strip() for s in value["statements"] if s.strip()]


def parse_verdicts(text: str, n: int, reasons: bool = True) -> list[int]:
    """The 0/1 verdicts of a :func:`verdicts_schema` reply (objects with a reason, or
    bare 0/1 items with ``reasons=False``), checked to be exactly ``n``.

    Raises
    ------
    ParseError
        Not JSON, a verdict other than 0 or 1, items of the other shape, or a number of
        verdicts other than ``n`` (the message says "expected n verdicts, got m").
    """
    try:
        value = json.loads(text, strict=False)
    except ValueError as exc:
        raise ParseError(f"reply is not JSON: {exc}") from None
    items = value.get("verdicts") if isinstance(value, dict) else None
    if isinstance(items, list) and len(items) != n:
        raise ParseError(f"expected {n} verdict{'s' if n != 1 else ''}, got {len(items)}")
    value = parse_json(text, verdicts_schema(n, reasons))
    return [int(item["verdict"] if reasons else item) for item in value["verdicts"]]
