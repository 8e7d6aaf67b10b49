"""Contract tests of the LLM-judge metrics, replaying recorded judge replies.

No judge model runs here: :class:`~ragbatch.judge.recorded.RecordedReplies` answers each
request with the next reply written down in a worked example, so the prompts, the
parsing, the retries and the scoring of every judge metric are checked against scores
worked out by hand.

* every ``judge_examples`` entry of every registered judge metric;
* the recorded cases under ``tests/data/judge_replies/<metric>.json``: real rows from
  ``examples/data`` (ARES, Tonic Validate Paul Graham runs) with hand-written judge
  replies, covering a normal case, each degenerate input of the metric's policy, a reply
  cut at ``max_tokens``, a value out of range, prose instead of JSON and a wrong number
  of verdicts;
* the prompt layouts (every ask starts with the row's shared block, after the common
  system message or after the metric's instruction sets, so prefix caching applies
  across metrics), the declared policy and source, and the declared range.

A JSON case is ``{"note", "inputs", "params", "replies", "embeddings"?, "max_model_len"?,
"score", "status"}``; a reply written as ``["length", text]`` comes back cut at
``max_tokens``; ``max_model_len`` sets the recorded engine's window (default: unlimited).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ragbatch.core.columns import ANSWER, CONTEXTS, QUESTION, REFERENCE
from ragbatch.judge import recorded
from ragbatch.judge.metric import JudgeExample, JudgeMetric
from ragbatch.judge.prompt import INSTRUCTIONS_PREAMBLE, SYSTEM_PROMPT, shared_block
from ragbatch.judge.recorded import RecordedReplies, run_example
from ragbatch.scoring.registry import all_metrics
from ragbatch.core.status import OK, STATUSES

DATA = Path(__file__).resolve().parent / "data" / "judge_replies"

JUDGE_METRICS = [m for m in all_metrics() if issubclass(m, JudgeMetric)]
JUDGE_IDS = [m.name for m in JUDGE_METRICS]
BY_NAME = {m.name: m for m in JUDGE_METRICS}

_CANONICAL = (QUESTION, CONTEXTS, ANSWER, REFERENCE)


def _example_cases() -> list[tuple[type[JudgeMetric], JudgeExample]]:
    return [(cls, ex) for cls in JUDGE_METRICS for ex in cls.judge_examples]


def _recorded_cases() -> list[Any]:
    out = []
    for path in sorted(DATA.glob("*.json")):
        for k, raw in enumerate(json.loads(path.read_text(encoding="utf-8"))):
            out.append(pytest.param(path.stem, raw, id=f"{path.stem}[{k}]"))
    return out


def _to_example(raw: dict[str, Any]) -> JudgeExample:
    """A JSON case as a :class:`JudgeExample` (``["length", text]`` replies become tuples)."""
    assert set(raw) <= {
        "note",
        "inputs",
        "params",
        "replies",
        "embeddings",
        "max_model_len",
        "score",
        "status",
    }, sorted(raw)
    assert set(raw["inputs"]) <= set(_CANONICAL), sorted(raw["inputs"])
    replies = tuple(tuple(r) if isinstance(r, list) else r for r in raw["replies"])
    return JudgeExample(
        inputs=raw["inputs"],
        replies=replies,
        score=raw["score"],
        status=raw["status"],
        params=raw.get("params") or {},
        note=raw.get("note", ""),
        embeddings=tuple(raw.get("embeddings") or ()),
    )


def _run(
    cls: type[JudgeMetric],
    example: JudgeExample,
    max_model_len: int | None = None,
    monkeypatch: pytest.MonkeyPatch | None = None,
):
    """:func:`run_example`, with the recorded engine's window set when asked."""
    if max_model_len is not None:
        assert monkeypatch is not None
        monkeypatch.setattr(
            recorded,
            "RecordedReplies",
            lambda replies: RecordedReplies(replies, max_model_len=max_model_len),
        )
    return run_example(cls, example)


def _check(
    cls: type[JudgeMetric], example: JudgeExample, cell: dict[str, Any], engine: RecordedReplies
) -> None:
    where = f"{cls.name}: {example.note}"
    assert cell["status"] in STATUSES, where
    assert cell["status"] == example.status, (where, cell)
    if example.score is None:
        assert cell["score"] is None, (where, cell)
    else:
        assert cell["score"] == pytest.approx(example.score), (where, cell)
    assert engine.unused == 0, f"{where}: {engine.unused} recorded replies not consumed"
    if example.status == "missing_input":
        assert engine.requests == [], f"{where}: a guard must settle the row before any judge call"
    if cell["status"] == OK:
        _check_range(cls, cell["score"])


def _check_range(cls: type[JudgeMetric], score: float) -> None:
    low, high = cls.score_range
    assert score is not None and low <= score <= high, (cls.name, score)
    if cls.boolean:
        assert score in (0.0, 1.0), (cls.name, score)


def _row(example: JudgeExample) -> dict[str, Any]:
    return {c: example.inputs.get(c) for c in _CANONICAL}


# (a) worked examples declared on the classes ------------------------------------------


@pytest.mark.parametrize(
    ("cls", "example"),
    _example_cases(),
    ids=[f"{c.name}[{i}]" for c in JUDGE_METRICS for i in range(len(c.judge_examples))],
)
def test_judge_examples_hold(cls, example):
    cell, _, engine = run_example(cls, example)
    _check(cls, example, cell, engine)


@pytest.mark.parametrize("cls", JUDGE_METRICS, ids=JUDGE_IDS)
def test_judge_examples_cover_ok_degenerate_and_failure(cls):
    statuses = [ex.status for ex in cls.judge_examples]
    assert len(statuses) >= 3, cls.name
    assert OK in statuses, f"{cls.name}: no scored example"
    assert {"missing_input", "not_applicable"} & set(statuses), f"{cls.name}: no degenerate example"
    assert "parse_failure" in statuses, f"{cls.name}: no failure example"


# (b) recorded replies on real rows -----------------------------------------------------


def test_every_judge_metric_has_recorded_replies():
    files = {p.stem for p in DATA.glob("*.json")}
    assert set(JUDGE_IDS) <= files, sorted(set(JUDGE_IDS) - files)
    assert files <= set(JUDGE_IDS), sorted(files - set(JUDGE_IDS))


@pytest.mark.parametrize(("name", "raw"), _recorded_cases())
def test_recorded_replies(name, raw, monkeypatch):
    cls = BY_NAME[name]
    example = _to_example(raw)
    cell, record, engine = _run(cls, example, raw.get("max_model_len"), monkeypatch)
    _check(cls, example, cell, engine)
    if example.status == "missing_input":
        assert record["judge_calls"] is None, "a guard, not the program, settles the row"


@pytest.mark.parametrize("cls", JUDGE_METRICS, ids=JUDGE_IDS)
def test_recorded_replies_cover_the_failure_modes(cls):
    cases = json.loads((DATA / f"{cls.name}.json").read_text(encoding="utf-8"))
    statuses = {c["status"] for c in cases}
    assert {"ok", "missing_input", "context_too_long", "parse_failure"} <= statuses, statuses
    cut = [c for c in cases if any(isinstance(r, list) and r[0] == "length" for r in c["replies"])]
    assert cut, f"{cls.name}: no reply cut at max_tokens"


# (c) prompt layout ----------------------------------------------------------------------


def _judged_examples(cls: type[JudgeMetric]) -> list[JudgeExample]:
    examples = list(cls.judge_examples)
    path = DATA / f"{cls.name}.json"
    if path.exists():
        examples += [
            _to_example(raw)
            for raw in json.loads(path.read_text(encoding="utf-8"))
            if not raw.get("max_model_len")
        ]
    return [ex for ex in examples if ex.replies]


@pytest.mark.parametrize("cls", JUDGE_METRICS, ids=JUDGE_IDS)
def test_every_ask_starts_with_the_shared_block(cls):
    """row_first: the common system message, then the row's block, then the task."""
    asked = 0
    for example in _judged_examples(cls):
        pinned = replace(example, params={**example.params, "prompt_layout": "row_first"})
        _, _, engine = run_example(cls, pinned)
        block = shared_block(_row(example))
        for request in engine.requests:
            system, user = request.messages
            assert system.role == "system" and system.content == SYSTEM_PROMPT
            assert user.role == "user"
            assert user.content.startswith(block + "\n\n## Task\n"), (cls.name, example.note)
            asked += 1
    assert asked, f"{cls.name}: no example reached the judge"


@pytest.mark.parametrize("cls", JUDGE_METRICS, ids=JUDGE_IDS)
def test_instructions_first_asks_share_one_system_message(cls):
    """instructions_first: every request of the metric has the same system
    message, holding each step's instructions, and a user message that is the row's
    block (with its reference answer), then a task naming one of those sets."""
    asked = 0
    for example in _judged_examples(cls):
        example = replace(example, params={**example.params, "prompt_layout": "instructions_first"})
        _, _, engine = run_example(cls, example)
        metric = cls.from_params(example.params)
        system_text = INSTRUCTIONS_PREAMBLE + "".join(
            f"\n\n## Instructions: {name}\n{text}"
            for name, text in sorted(metric.instruction_sets())
        )
        block = shared_block(_row(example), reference=True)
        names = {name for name, _ in metric.instruction_sets()}
        for request in engine.requests:
            system, user = request.messages
            assert system.content == system_text, (cls.name, example.note)
            head = block + '\n\n## Task\nFollow the instructions "'
            assert user.content.startswith(head), (cls.name, example.note)
            assert user.content[len(head) :].split('"', 1)[0] in names
            asked += 1
    assert asked, f"{cls.name}: no example reached the judge"


#: JSON Schema keywords vLLM's structured-output backends cannot enforce: xgrammar rejects
#: them (vLLM's ``has_xgrammar_unsupported_json_features``) and the fallback, llguidance,
#: fails validation on several (``uniqueItems``), so a request using them never runs.
UNENFORCEABLE = {
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
    "multipleOf",
    "format",
    "patternProperties",
    "minProperties",
    "maxProperties",
    "propertyNames",
}


def _schemas(cls: type[JudgeMetric]) -> list[dict[str, Any]]:
    out = []
    for example in _judged_examples(cls):
        _, _, engine = run_example(cls, example)
        out += [r.output.schema for r in engine.requests if r.output.schema is not None]
    return out


@pytest.mark.parametrize("cls", JUDGE_METRICS, ids=JUDGE_IDS)
def test_output_specs_are_bounded_and_enforceable(cls):
    for example in _judged_examples(cls):
        _, _, engine = run_example(cls, example)
        for request in engine.requests:
            spec = request.output
            assert 1 <= spec.max_tokens <= 8192, (cls.name, spec.max_tokens)
            if spec.schema is not None:
                _assert_schema_ok(spec.schema, cls.name)


def _assert_schema_ok(schema: Any, where: str) -> None:
    """Every string in a reply schema has a maxLength and every array a maxItems (so
    ``max_tokens`` can be sized to the longest valid reply), and no keyword is one the
    structured-output backends cannot enforce."""
    if isinstance(schema, dict):
        assert not UNENFORCEABLE & set(schema), (where, sorted(UNENFORCEABLE & set(schema)))
        if schema.get("type") == "string":
            assert "maxLength" in schema, (where, schema)
        if schema.get("type") == "array":
            assert "maxItems" in schema, (where, schema)
        for value in schema.values():
            _assert_schema_ok(value, where)
    elif isinstance(schema, list):
        for value in schema:
            _assert_schema_ok(value, where)


@pytest.mark.parametrize("cls", JUDGE_METRICS, ids=JUDGE_IDS)
def test_schemas_compile_in_llguidance(cls):
    llguidance = pytest.importorskip("llguidance", reason="llguidance comes with vLLM")
    for schema in _schemas(cls):
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
        assert not is_error and not messages, (cls.name, messages)


# (d) declarations --------------------------------------------------------------------------


def _policy_has(cls, case_words: tuple[str, ...], outcome_word: str | None = None) -> bool:
    for case, outcome in cls.policy:
        if all(w in case.lower() for w in case_words) and (
            outcome_word is None or outcome_word in outcome
        ):
            return True
    return False


@pytest.mark.parametrize("cls", JUDGE_METRICS, ids=JUDGE_IDS)
def test_declarations(cls):
    assert cls.kind == "judge"
    assert cls.source and cls.summary and cls.__doc__
    assert "Source" in cls.__doc__ and "Cost" in cls.__doc__, "docstring names source and cost"
    assert isinstance(cls.version, int) and cls.version >= 1
    assert set(cls.inputs) <= set(_CANONICAL)
    low, high = cls.score_range
    assert low < high
    if cls.boolean:
        assert (low, high) == (0.0, 1.0)
    for case, outcome in cls.policy:
        assert case and outcome, cls.name
        assert "|" not in case + outcome, "policy rows go into a Markdown table"
    described = cls.describe()
    assert described["name"] == cls.name and described["kind"] == "judge"


@pytest.mark.parametrize("cls", JUDGE_METRICS, ids=JUDGE_IDS)
def test_policy_covers_the_degenerate_inputs(cls):
    assert _policy_has(cls, ("null",), "missing_input"), "null inputs"
    cases = [c.lower() for c, _ in cls.policy]
    assert any("answer" in c and ("empty" in c or "blank" in c) for c in cases), "blank answer"
    assert any("contexts" in c and "empty" in c for c in cases), "empty contexts"
    assert any(w in c for c in cases for w in ("refusal", "no claim")), "refusal"
    assert _policy_has(cls, ("junk",)), "junk context chunks"
    assert _policy_has(cls, ("window",), "context_too_long"), "prompt too long"
    assert any("parse_failure" in o for _, o in cls.policy), "unparseable replies"
    if REFERENCE in cls.inputs:
        assert _policy_has(cls, ("reference", "null"), "missing_input"), "null reference"


# (e) ranges -----------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", JUDGE_METRICS, ids=JUDGE_IDS)
def test_ok_scores_in_range(cls):
    for example in _judged_examples(cls):
        cell, _, _ = run_example(cls, example)
        if cell["status"] == OK:
            _check_range(cls, cell["score"])
