"""Reasons never copy a large or personal input value: json_valid names the JSON path and
the schema keyword that failed instead of the validator's message (which quotes the
value in full), and other quotes of input are cut to QUOTE_MAX_CHARS."""

from __future__ import annotations

import json

from support.metric_frames import run_metric
from ragbatch.metrics.binary import _judge
from ragbatch.metrics.json_valid import JsonValid
from ragbatch.core.reasons import QUOTE_MAX_CHARS, quote

SCHEMA = {
    "type": "object",
    "properties": {
        "email": {"type": "string", "format": "email"},
        "items": {"type": "array", "items": {"type": "integer"}},
        "note": {"type": "string", "maxLength": 10},
    },
    "required": ["email"],
}


def _reason(answer: dict) -> str:
    metric = JsonValid.from_params({"schema": SCHEMA})
    # jsonschema checks "format" only with a format checker; "maxLength" and "type" always
    [cell] = run_metric(metric, [{"answer": json.dumps(answer)}])
    assert cell["score"] == 0.0
    return cell["reason"]


def test_schema_failure_names_path_and_keyword_not_the_value():
    secret = "jane.doe@example.com"
    reason = _reason({"email": 42, "items": [1], "note": "x", "contact": secret})
    assert reason == "JSON does not match schema at $.email: fails 'type' (\"string\")"
    reason = _reason({"email": secret, "items": [1, "jane.doe@example.com"]})
    assert reason == "JSON does not match schema at $.items[1]: fails 'type' (\"integer\")"
    assert secret not in reason


def test_huge_failing_value_gives_a_short_reason():
    reason = _reason({"email": "a@b.org", "note": "x" * 200_000})
    assert reason == "JSON does not match schema at $.note: fails 'maxLength' (10)"
    reason = _reason({"items": [1]})
    assert reason == "JSON does not match schema at $: fails 'required' ([\"email\"])"


def test_binary_callback_returning_a_long_value_is_cut():
    cell = _judge("y" * 10_000)
    assert cell.reason.startswith("callback returned 'yyy") and len(cell.reason) < 200
    assert "y" * QUOTE_MAX_CHARS not in cell.reason


def test_quote_cuts_to_the_documented_length():
    assert quote("abc") == "'abc'"
    assert quote({"a": [1, 2]}) == '{"a": [1, 2]}'
    long = quote("z" * 1000)
    assert len(long) == QUOTE_MAX_CHARS and long.endswith("...")
