"""The verdict step with and without reasons (``ragbatch.judge.verdicts``): the prompt
rewrite, the reply schema and parser, the params, and the cache identity. The worked
examples with ``reasons: false`` of each metric run in ``test_judge_metrics.py``; a real
vLLM answers bare-verdict requests in ``test_engine_vllm.py``."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest

from ragbatch.core.errors import ConfigError
from ragbatch.judge.parse import parse_verdicts, verdicts_schema
from ragbatch.judge.prompt import DEFAULT_LAYOUT, StepPrompt
from ragbatch.judge.protocol import VERDICT_TOP_LOGPROBS, ParseError
from ragbatch.judge.recorded import run_example
from ragbatch.judge.verdicts import (
    BARE_VERDICT_MAX_TOKENS,
    REPLY_OVERHEAD_TOKENS,
    VerdictMetric,
    bare_verdicts_template,
    verdicts_ask,
)
from ragbatch.metrics import retrieval_precision
from ragbatch.scoring.registry import all_metrics

VERDICT_METRICS = sorted(
    (cls for cls in all_metrics() if issubclass(cls, VerdictMetric)), key=lambda cls: cls.name
)
ROW = {
    "row_id": "r1",
    "question": "When did Apollo 11 land?",
    "contexts": ["Apollo 11 landed on 20 July 1969.", "月面着陸 🚀", "Cafe\u0301"],
    "answer": "On 20 July 1969.",
    "reference": "20 July 1969.",
}
#: Hand-written: the two reply schemas for two verdicts.
REASONED_2 = {
    "type": "object",
    "required": ["verdicts"],
    "additionalProperties": False,
    "properties": {
        "verdicts": {
            "type": "array",
            "minItems": 2,
            "maxItems": 2,
            "items": {
                "type": "object",
                "required": ["reason", "verdict"],
                "additionalProperties": False,
                "properties": {
                    "reason": {"type": "string", "maxLength": 300},
                    "verdict": {"type": "integer", "enum": [0, 1]},
                },
            },
        }
    },
}
BARE_2 = {
    "type": "object",
    "required": ["verdicts"],
    "additionalProperties": False,
    "properties": {
        "verdicts": {
            "type": "array",
            "minItems": 2,
            "maxItems": 2,
            "items": {"type": "integer", "enum": [0, 1]},
        }
    },
}
#: Digest of every request the default-params worked examples of each metric send
#: (messages and output spec) and of its cache identity, taken before the ``reasons``
#: param existed (commit b3aa7f4) and equal after it: with the default nothing a judge
#: sees or a cache key holds has changed. When a prompt changes on purpose, bump the
#: metric's ``version`` and update the digest here. Since verdict confidence (issue 25)
#: every request that holds verdicts also asks for token logprobs, a field of its output
#: spec and so of its cache key: the digests are taken without that field (prompts and
#: schemas are unchanged), and the field is checked on its own.
DEFAULT_DIGESTS = {
    "answer_consistency": "fed97de74ff718f4",
    "augmentation_accuracy": "d5b6ff4d2cf31941",
    "context_precision": "9ccaee3c2cee0e20",
    "context_recall": "04889f001cb91a88",
    "factual_correctness": "50338e13fdddbf48",  # taken when the metric was added
    "faithfulness": "df4fd0e9eb3407ce",
    "retrieval_precision": "95400292c9fe4005",
}


def test_the_verdict_metrics():
    assert [cls.name for cls in VERDICT_METRICS] == [
        "answer_consistency",
        "augmentation_accuracy",
        "context_precision",
        "context_recall",
        "factual_correctness",
        "faithfulness",
        "retrieval_precision",
    ]


def test_bare_template_of_retrieval_precision_word_for_word():
    # Written out by hand from retrieval_precision.TASK: the reason clause and the
    # reply format change, nothing else.
    expected = """\
For each retrieved context above, from [1] to [{n}], decide whether it is relevant to the
question. Verdict 1: the context holds information that helps answer the question.
Verdict 0: it does not (another subject, navigation or markup, text only loosely
related). Judge the contexts against the question only; ignore the answer. Give one
verdict per context, in the order of their numbers.

Reply with JSON: {{"verdicts": [0 or 1, ...]}} with exactly
{n} items, the first for context [1]."""
    assert bare_verdicts_template(retrieval_precision.TASK) == expected


@pytest.mark.parametrize("cls", VERDICT_METRICS, ids=lambda cls: cls.name)
def test_every_bare_task_asks_for_bare_verdicts_only(cls):
    """Run the metric's worked examples with reasons off: every verdict prompt asks for
    ``[0 or 1, ...]`` and never for a reason; the other steps are the same as with
    reasons on."""
    examples = [ex for ex in cls.judge_examples if ex.params == {"reasons": False}]
    assert examples, f"{cls.name}: no worked example with reasons: false"
    for example in examples:
        _, _, engine = run_example(cls, replace(example, params={**example.params, **ROW_FIRST}))
        verdict_prompts = [
            r.messages[-1].content
            for r in engine.requests
            if '"verdicts"' in r.messages[-1].content
        ]
        assert verdict_prompts
        for prompt in verdict_prompts:
            task = prompt.split("## Task\n", 1)[1]
            assert '{"verdicts": [0 or 1, ...]}' in task
            assert "reason" not in task
        # instructions_first: the verdict step's instruction set (in every request's
        # system message) holds the bare format, and no set asks for a reason per verdict
        example = replace(example, params={**example.params, **INSTRUCTIONS_FIRST})
        metric = cls.from_params(example.params)
        sets = dict(metric.instruction_sets())
        verdict_sets = [text for text in sets.values() if '"verdicts"' in text]
        assert verdict_sets
        for text in verdict_sets:
            assert '{"verdicts": [0 or 1, ...]}' in text
            assert "reason" not in text
        _, _, engine = run_example(cls, example)
        for request in engine.requests:
            assert all(text in request.messages[0].content for text in verdict_sets)


def test_row_text_that_looks_like_the_template_is_left_alone():
    # A statement holding the very words that are rewritten: only the template's own
    # occurrences change, so the statement reaches the judge as it is.
    from ragbatch.metrics.faithfulness import VERDICTS_TASK

    odd = (
        'Give one verdict, each with a one-sentence reason. Reply with JSON: '
        '{"verdicts": [{"reason": "...", "verdict": 0 or 1}, ...]}'
    )
    ask = verdicts_ask(
        ROW, VERDICTS_TASK, 1, reasons=False, max_tokens_per_verdict=100, statements=f"[1] {odd}"
    )
    task = ask.messages[-1].content.split("## Task\n", 1)[1]
    assert f"[1] {odd}" in task
    assert task.count('{"verdicts": [0 or 1, ...]}') == 1


def test_a_template_without_the_parts_is_refused():
    with pytest.raises(ValueError, match="found 0 and 0"):
        bare_verdicts_template("Give a verdict.\n\nReply with JSON: {{\"verdict\": 0}}")
    twice = retrieval_precision.TASK + "\n" + retrieval_precision.TASK
    with pytest.raises(ValueError, match="found 2 and 2"):
        bare_verdicts_template(twice)


@pytest.mark.parametrize("n", [1, 3, 7])
def test_reply_budget(n):
    bare = verdicts_ask(ROW, retrieval_precision.TASK, n, reasons=False, max_tokens_per_verdict=128)
    reasoned = verdicts_ask(
        ROW, retrieval_precision.TASK, n, reasons=True, max_tokens_per_verdict=128
    )
    assert (
        bare.output.max_tokens == 16 + 4 * n == REPLY_OVERHEAD_TOKENS + BARE_VERDICT_MAX_TOKENS * n
    )
    assert reasoned.output.max_tokens == 16 + 128 * n


def test_reply_schemas():
    assert verdicts_schema(2) == REASONED_2
    assert verdicts_schema(2, reasons=False) == BARE_2
    ask = verdicts_ask(ROW, retrieval_precision.TASK, 2, reasons=False, max_tokens_per_verdict=9)
    assert ask.output.schema == BARE_2


#: The layout the requests below were recorded with (the only one before the param).
ROW_FIRST = {"prompt_layout": "row_first"}
INSTRUCTIONS_FIRST = {"prompt_layout": "instructions_first"}


def _default_requests(cls) -> list:
    requests = []
    for example in cls.judge_examples:
        if example.params:
            continue
        _, _, engine = run_example(cls, replace(example, params=ROW_FIRST))
        requests += engine.requests
    return requests


def _digest(cls) -> str:
    digest = hashlib.sha256()
    for request in _default_requests(cls):
        digest.update(json.dumps([[m.role, m.content] for m in request.messages]).encode())
        key = {k: v for k, v in request.output.key().items() if k != "logprobs"}
        digest.update(json.dumps(key, sort_keys=True).encode())
    digest.update(json.dumps(cls.from_params(ROW_FIRST).cache_identity(), sort_keys=True).encode())
    return digest.hexdigest()[:16]


@pytest.mark.parametrize("cls", VERDICT_METRICS, ids=lambda cls: cls.name)
def test_default_requests_are_those_from_before_the_param(cls):
    assert _digest(cls) == DEFAULT_DIGESTS[cls.name]


@pytest.mark.parametrize("cls", VERDICT_METRICS, ids=lambda cls: cls.name)
def test_verdict_requests_ask_for_token_logprobs(cls):
    # The verdict step (the last request of each worked example's program) asks for the
    # top VERDICT_TOP_LOGPROBS alternatives per token, and its cache key says so.
    requests = _default_requests(cls)
    verdict_steps = [r for r in requests if r.output.logprobs]
    assert verdict_steps and all(r.output.logprobs == VERDICT_TOP_LOGPROBS for r in verdict_steps)
    assert all(r.output.key()["logprobs"] == VERDICT_TOP_LOGPROBS for r in verdict_steps)


@pytest.mark.parametrize(
    "cls", [c for c in VERDICT_METRICS if c.judge_steps == 2], ids=lambda cls: cls.name
)
def test_reasons_change_only_the_verdict_step(cls):
    """Two-step metrics, row_first layout: with reasons on and off the first step's
    request is the same; the verdict step differs in its task and schema only after the
    shared block. (instructions_first shows every step's instructions in each request,
    so there the first step's system message changes too.)"""
    example = next(ex for ex in cls.judge_examples if ex.params == {"reasons": False})
    _, _, bare = run_example(cls, replace(example, params={**example.params, **ROW_FIRST}))
    on = type(example)(
        inputs=example.inputs,
        replies=example.replies[:1],
        score=None,
        status="parse_failure",
        params=ROW_FIRST,
    )
    _, _, reasoned = run_example(cls, on, parse_retries=0)
    assert bare.requests[0] == reasoned.requests[0]
    assert len(bare.requests) == len(example.replies)


def test_a_verdict_metric_with_a_template_that_cannot_be_rewritten_fails_at_definition():
    with pytest.raises(ValueError, match="found 1 and 0"):
        type(
            "Broken",
            (VerdictMetric,),
            {
                "verdict_prompts": (
                    StepPrompt(
                        "broken",
                        "Judge each item, each with a one-sentence reason.",
                        "Judge each item, each with a one-sentence reason.",
                        "Reply.",
                    ),
                ),
                "program": lambda self, row: iter(()),
            },
        )


@pytest.mark.parametrize(
    ("text", "n", "expected"),
    [
        ('{"verdicts": [1, 0, 1]}', 3, [1, 0, 1]),
        ('{"verdicts":[0]}', 1, [0]),
        ('{"verdicts": [1, 1]}', 2, [1, 1]),
    ],
)
def test_parse_bare_verdicts(text, n, expected):
    assert parse_verdicts(text, n, reasons=False) == expected


@pytest.mark.parametrize(
    ("text", "n", "message"),
    [
        ('{"verdicts": [1, 0]}', 3, "expected 3 verdicts, got 2"),
        ('{"verdicts": [2]}', 1, "is not one of"),
        ('{"verdicts": ["1"]}', 1, "not of type 'integer'"),
        ('{"verdicts": [true]}', 1, "not of type 'integer'"),
        ('{"verdicts": [{"reason": "x", "verdict": 1}]}', 1, "not of type 'integer'"),
        ('{"verdicts": [1], "reason": "x"}', 1, "Additional properties"),
        ('{"verdicts": [1', 1, "not JSON"),
    ],
)
def test_bad_bare_replies_are_parse_errors(text, n, message):
    with pytest.raises(ParseError, match=message):
        parse_verdicts(text, n, reasons=False)


def test_reasoned_replies_still_parse_and_bare_ones_do_not():
    assert parse_verdicts('{"verdicts": [{"reason": "só 🚀", "verdict": 1}]}', 1) == [1]
    with pytest.raises(ParseError):
        parse_verdicts('{"verdicts": [1]}', 1)


@pytest.mark.parametrize("cls", VERDICT_METRICS, ids=lambda cls: cls.name)
def test_params_and_cache_identity(cls):
    default = cls.from_params({})
    assert default.reasons is True
    assert default.prompt_layout == DEFAULT_LAYOUT
    params = default.manifest_info()["params"]  # with the metric's own params, if any
    assert {k: params[k] for k in ("prompt_layout", "reasons", "score")} == {
        "prompt_layout": DEFAULT_LAYOUT,
        "reasons": True,
        "score": "verdict",
    }
    old = cls.from_params(ROW_FIRST)
    assert old.cache_identity()["params"] == {}  # as before either param existed
    new = cls.from_params(INSTRUCTIONS_FIRST)
    assert new.cache_identity()["params"] == INSTRUCTIONS_FIRST
    assert default.cache_identity() in (old.cache_identity(), new.cache_identity())
    bare = cls.from_params({"reasons": False, **INSTRUCTIONS_FIRST})
    assert bare.reasons is False
    assert bare.cache_identity()["params"] == {**INSTRUCTIONS_FIRST, "reasons": False}
    assert bare.cache_identity() != new.cache_identity()
    bare_old = cls.from_params({"reasons": False, **ROW_FIRST})
    assert bare_old.cache_identity()["params"] == {"reasons": False}
    assert cls.describe()["params"]["reasons"]["default"] is True


def test_bad_reasons_param_names_the_param():
    with pytest.raises(ConfigError, match=r"metrics\[2\]\.params\.reasons"):
        retrieval_precision.RetrievalPrecision.from_params(
            {"reasons": "sometimes"}, where="metrics[2].params"
        )
    with pytest.raises(ConfigError, match="known: examples_file, prompt_layout, reasons, score"):
        retrieval_precision.RetrievalPrecision.from_params({"reason": False})
