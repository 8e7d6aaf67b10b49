"""A run with PII metrics quotes no input value in any reason or details, whichever
metric writes it (the normalizer's notes, binary's callback reasons, json_valid's schema
reasons); the same run without PII metrics quotes values cut to QUOTE_MAX_CHARS.

Real local Ray, a real JSONL input with seeded personal data, the written Parquet scores
read back."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from ragbatch.config.job import JobConfig
from ragbatch.core.reasons import NOT_QUOTED
from ragbatch.pipeline.runner import run_job

pytestmark = pytest.mark.slow

EMAIL = "jane.doe@example.com"
PHONE = "+1 415 555 0134"
LONG_LATENCY = f"phone {PHONE} " + "q" * 300
ROWS = [
    # a broken JSON contexts value: the normalizer's note quotes it
    {
        "id": "r0",
        "q": "Zorblat refund?",
        "a": f"Write to {EMAIL} for the refund",
        "ctx": f'["Zorblat policy says call {PHONE}", broken',
        "ref": "Zorblat refund",
        "lat": "7.1",
    },
    # an answer that is an object, a context object keyed by an e-mail address, a long
    # latency that is not a number: three notes quoting input
    {
        "id": "r1",
        "q": "Wibblefrotz?",
        "a": {"text": f"Reach me at {EMAIL}"},
        "ctx": [{EMAIL: "Wibblefrotz"}],
        "ref": "Wibblefrotz answer",
        "lat": LONG_LATENCY,
    },
    # JSON whose failing key is an e-mail address: the JSON path would quote it
    {
        "id": "r2",
        "q": "Quuxly json?",
        "a": json.dumps({"n": 1, EMAIL: "x"}),
        "ctx": ["Plain Quuxly context"],
        "ref": "Quuxly",
        "lat": 1.5,
    },
    {
        "id": "r3",
        "q": "Frobnitz phone?",
        "a": f"Call {PHONE} today",
        "ctx": ["Frobnitz context text"],
        "ref": "Frobnitz",
        "lat": 0.5,
    },
]
SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "additionalProperties": {"type": "integer"},
}
METRICS = [
    {"name": "json_valid", "params": {"schema": SCHEMA}},
    {
        "name": "binary",
        "id": "echo",
        "params": {"callback": "support.quoting_callbacks:echo_or_raise", "mode": "row"},
    },
    {
        "name": "binary",
        "id": "batch_raise",
        "params": {"callback": "support.quoting_callbacks:raise_with_first_answer"},
    },
    {"name": "latency", "params": {"target_s": 2.0}},
    {"name": "response_length", "params": {"min_chars": 1, "max_chars": 5}},
    {"name": "context_length", "params": {"max_chars": 3}},
    {"name": "exact_match"},
]
PII_METRICS = [{"name": "answer_contains_pii"}, {"name": "context_contains_pii"}]


def _run(tmp_path: Path, metrics: list[dict], run_id: str) -> dict[tuple[str, str], dict]:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    config = JobConfig.from_dict(
        {
            "run": {"name": "quotes", "error_budget": 1.0},  # the callbacks fail on purpose
            "input": {
                "uri": str(src),
                "contexts_format": "json",
                "columns": {
                    "row_id": "id",
                    "question": "q",
                    "contexts": "ctx",
                    "answer": "a",
                    "reference": "ref",
                    "latency_s": "lat",
                },
            },
            "output": {"uri": str(tmp_path / run_id)},
            "metrics": metrics,
        }
    )
    result = run_job(config, run_id=run_id)
    scores = pl.read_parquet(f"{result.layout.root}/scores/**/*.parquet", hive_partitioning=True)
    assert scores.height == len(ROWS) * len(metrics)
    return {(r["row_id"], r["metric"]): r for r in scores.iter_rows(named=True)}


def _input_strings(value) -> list[str]:
    """Every string in an input value (keys of objects included)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *_input_strings(v)]]
    if isinstance(value, list):
        return [s for v in value for s in _input_strings(v)]
    return []


def _leaks(text: str) -> list[str]:
    """8-character pieces of any input value (or of its JSON text) found in ``text``."""
    sources = [
        s
        for row in ROWS
        for key in ("q", "a", "ctx", "ref", "lat")
        for s in _input_strings(row[key]) + [json.dumps(row[key])]
    ]
    return sorted(
        {s[i : i + 8] for s in sources for i in range(len(s) - 7) if s[i : i + 8] in text}
    )


def test_a_run_with_pii_metrics_quotes_no_input_anywhere(ray_local, tmp_path):
    cells = _run(tmp_path, METRICS + PII_METRICS, "pii")
    for (row, metric), cell in cells.items():
        for field in ("reason", "details"):
            text = cell[field] or ""
            assert EMAIL not in text and "415" not in text, (row, metric, field, text)
            assert _leaks(text) == [], (row, metric, field, text)
    # the cells that quote in a run without PII metrics (below) say what was wrong
    assert (
        cells["r1", "exact_match"]["reason"]
        == f"answer: expected a string, got object ({NOT_QUOTED})"
    )
    assert cells["r0", "context_length"]["reason"] == (
        f"contexts: not valid JSON (Expecting value): {NOT_QUOTED}"
    )
    assert cells["r1", "context_length"]["reason"] == (
        "contexts: item 0 is an object with none of the fields text, content, page_content, "
        f"excerpt, chunk, document (its keys: {NOT_QUOTED}); set input.contexts_field"
    )
    assert cells["r1", "latency"]["reason"] == f"latency_s: {NOT_QUOTED} is not a number"
    assert cells["r2", "json_valid"]["reason"] == (
        "JSON does not match schema at schema #/additionalProperties: fails 'type' (\"integer\")"
    )
    assert cells["r0", "echo"]["reason"].startswith(
        f"callback raised ValueError: ({NOT_QUOTED}) at "
    )
    assert cells["r2", "echo"]["reason"] == (
        f"callback returned a str ({NOT_QUOTED}); expected True, False or None"
    )
    assert cells["r0", "batch_raise"]["reason"].startswith(
        f"callback raised ValueError: ({NOT_QUOTED}) at "
    )
    assert cells["r0", "answer_contains_pii"]["reason"] == "EMAIL_ADDRESS x1"
    assert cells["r3", "answer_contains_pii"]["reason"] == "PHONE_NUMBER x1"


def test_the_same_run_without_pii_metrics_quotes_cut_values(ray_local, tmp_path):
    cells = _run(tmp_path, METRICS, "plain")
    assert cells["r1", "exact_match"]["reason"] == (
        'answer: expected a string, got object ({"text": "Reach me at jane.doe@example.com"})'
    )
    assert cells["r1", "latency"]["reason"] == (
        "latency_s: 'phone +1 415 555 0134 " + "q" * 34 + "... is not a number"
    )
    assert cells["r1", "context_length"]["reason"].endswith(
        '(its keys: ["jane.doe@example.com"]); set input.contexts_field'
    )
    assert cells["r2", "json_valid"]["reason"] == (
        "JSON does not match schema at $['jane.doe@example.com']: fails 'type' (\"integer\")"
    )
    assert cells["r0", "echo"]["reason"].startswith(
        "callback raised ValueError: cannot score Write to jane.doe@example.com for the refund at "
    )
    assert cells["r2", "echo"]["reason"] == (
        "callback returned '{\"n\": 1, \"jane.doe@example.com\": \"x\"}' (str); "
        "expected True, False or None"
    )
    reason = cells["r0", "batch_raise"]["reason"]
    message = reason.removeprefix("callback raised ValueError: ").split(" at ")[0]
    assert len(message) == 60 and message.endswith("...") and EMAIL in message
