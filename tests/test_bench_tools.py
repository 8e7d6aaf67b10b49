"""The small tools of ``benchmarks/``: the instant stand-in judge's replies and the
prompt-token accounting's prefix cache (both feed figures in BENCHMARKS.md)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from ragbatch.judge.parse import parse_statements, parse_verdicts, statements_schema, verdicts_schema

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def instant():
    return _load("instant_judge")


@pytest.fixture(scope="module")
def accounting():
    return _load("prompt_accounting")


@pytest.mark.parametrize("n, reasons", [(1, True), (3, True), (5, False)])
def test_instant_verdicts_parse_as_all_ones(instant, n, reasons):
    body = {"structured_outputs": {"json": verdicts_schema(n, reasons)}}
    assert parse_verdicts(instant.reply_text(body), n, reasons) == [1] * n


def test_instant_replies_follow_each_request_form(instant):
    assert parse_statements(instant.reply_text(
        {"structured_outputs": {"json": statements_schema()}})) == ["ok"]
    assert instant.reply_text({"structured_outputs": {"choice": ["3", "4"]}}) == "3"
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"score": {"type": "number", "minimum": 0.5},
                                         "ok": {"type": "boolean"}},
        "required": ["score", "ok"]}}}
    assert json.loads(instant.reply_text({"response_format": fmt})) == {"score": 0.5, "ok": True}
    # Tonic Validate's free-text prompts: a score for answer similarity, else true
    tonic = lambda text: {"messages": [{"role": "user", "content": text}]}  # noqa: E731
    assert instant.reply_text(tonic("...\nREFERENCE ANSWER: 42\nNEW ANSWER: 42\n")) == "4"
    assert instant.reply_text(tonic("...\nQUESTION: 问题 👍\nCONTEXT: é\n")) == "true"


def test_instance_of_arrays_objects_and_choices(instant):
    schema = {"type": "object", "properties": {
        "items": {"type": "array", "minItems": 2, "items": {"anyOf": [{"type": "integer",
                                                                        "minimum": 3}]}},
        "label": {"enum": ["a", "b"]}, "note": {"type": "string"}}, "required": ["items", "label"]}
    assert instant.instance(schema) == {"items": [3, 3], "label": "b"}


def test_prefix_cache_reuses_whole_blocks_of_the_longest_seen_prefix(accounting):
    cache = accounting.PrefixCache(4)
    assert cache.served(list(range(10))) == 0                       # nothing seen yet
    assert cache.served(list(range(9)) + [99]) == 8                 # 9 shared -> 2 blocks
    assert cache.served(list(range(8))) == 4                        # never its last token
    assert cache.served(list(range(3)) + [7, 7, 7, 7, 7]) == 0      # first block differs
    assert cache.served([0, 1, 2, 7, 7, 7, 7, 7, 1]) == 8           # the line above is cached now


def test_tonic_chats_are_one_plus_two_per_context(accounting):
    templates = {"sim": "SIM", "rel": "REL", "contains": "CON"}
    row = {"question": "q?", "reference": "r", "answer": "a", "contexts": ["c1", "c2", "c3"]}
    chats = accounting.tonic_chats(row, templates)
    assert len(chats) == 1 + 2 * 3
    users = [c[1]["content"] for c in chats]
    assert users[0].startswith("SIM\nQUESTION: q?\nREFERENCE ANSWER: r\nNEW ANSWER: a")
    assert users[1:4] == [f"REL\nQUESTION: q?\nCONTEXT: {c}\n" for c in row["contexts"]]
    assert users[4:] == [f"CON\nANSWER: a\nCONTEXT: {c}\n" for c in row["contexts"]]
    assert all(c[0] == {"role": "system", "content": accounting.TONIC_SYSTEM} for c in chats)


def test_task_tokens_count_what_follows_the_shared_block(accounting):
    def encode(chat):  # one token per character of the messages, in order
        return [ord(ch) for m in chat for ch in m["content"]]

    chat = [{"role": "system", "content": "sys"},
            {"role": "user", "content": "## Question\n问题 é\n\n## Task\nRate it 👍"}]
    assert accounting.task_tokens(chat, encode) == len("\n\n## Task\nRate it 👍")
    tonic = [{"role": "user", "content": "REL\nQUESTION: q\n"}]
    assert accounting.task_tokens(tonic, encode) == 0
