"""``context_relevancy``: the share of the contexts' sentences that are relevant to the question."""

from __future__ import annotations

import re
from typing import Any, ClassVar

import polars as pl

from ragbatch.core.columns import ANSWER, CONTEXTS, QUESTION
from ragbatch.judge.policy import failure_policy
from ragbatch.judge.metric import JudgeExample, JudgeMetric, Program
from ragbatch.judge.parse import parse_json
from ragbatch.judge.prompt import StepPrompt
from ragbatch.judge.protocol import Ask, OutputSpec, ParseError
from ragbatch.scoring.cells import Guard, PyCell, context_guards, share_cell
from ragbatch.scoring.registry import register
from ragbatch.core.status import MISSING_INPUT

#: The end of a sentence inside a line: one or more of ``.!?``, any closing quotes or
#: brackets right after them, then whitespace and a character that is not a lowercase
#: ASCII letter (so "e.g. the" stays whole while "ends. Next" splits).
_SENTENCE_END = re.compile(r"[.!?]+[\"'\u2019\u201d)\]]*(?=\s+[^\sa-z])")

TASK = """\
Below, the retrieved contexts are split into numbered sentences. List the numbers of the
sentences that are relevant to the question: sentences holding information that is
needed or useful to answer it. Leave out sentences that are off-topic, boilerplate,
navigation or markup, or only loosely related. Judge against the question only; ignore
the answer. If no sentence is relevant, reply with an empty list.

Sentences:
{sentences}

Reply with JSON: {{"relevant": [sentence numbers]}} using numbers from 1 to {n}, each at
most once."""

#: The ``instructions_first`` layout's instruction set of this step (plain text).
INSTRUCTIONS = """\
The task splits the retrieved contexts into numbered sentences. List the numbers of the
sentences that are relevant to the question: sentences holding information that is
needed or useful to answer it. Leave out sentences that are off-topic, boilerplate,
navigation or markup, or only loosely related. Judge against the question only; ignore
the answer. If no sentence is relevant, reply with an empty list.

Reply with JSON: {"relevant": [sentence numbers]}, each number at most once."""

#: The ``instructions_first`` layout's ask of this step.
ASK = """\
Sentences:
{sentences}

Use numbers from 1 to {n}."""

PROMPT = StepPrompt("context_relevancy", TASK, INSTRUCTIONS, ASK)


def split_sentences(text: str) -> list[str]:
    """Split ``text`` into sentences with a simple, deterministic rule.

    1. Every line break ends a sentence.
    2. Within a line, a sentence ends after a run of ``.``, ``!`` or ``?`` (with any
       closing quotes or brackets that follow it) when whitespace and then a character
       other than a lowercase ASCII letter come next.
    3. Pieces are stripped; pieces with no letter or digit (rules such as ``=====``,
       stray punctuation) are dropped.

    Abbreviations followed by a capital ("Dr. Smith") are split, decimals and versions
    ("1.5.0") are not. The rule needs no model and gives the same sentences on every
    machine, so the sentence count (the score's denominator) is reproducible.

    Examples
    --------
    >>> split_sentences("It rained. Roads, e.g. the A1, closed!\\n=====\\nSee v1.5.0.")
    ['It rained.', 'Roads, e.g. the A1, closed!', 'See v1.5.0.']
    """
    out: list[str] = []
    for line in text.splitlines():
        start = 0
        for match in _SENTENCE_END.finditer(line):
            out.append(line[start : match.end()])
            start = match.end()
        out.append(line[start:])
    return [s.strip() for s in out if any(ch.isalnum() for ch in s)]


def context_sentences(contexts: list[str]) -> list[str]:
    """The sentences of every context, in context order (null chunks count as empty)."""
    return [s for chunk in contexts for s in split_sentences(chunk or "")]


def relevant_schema(n: int) -> dict[str, Any]:
    """``{"relevant": [int, ...]}``: at most ``n`` sentence numbers from 1 to ``n``.

    The numbers must also be distinct, but the schema leaves out ``uniqueItems``: vLLM's
    structured-output backends reject it (xgrammar does not support it and llguidance
    reports it as unimplemented, so the request fails validation). :func:`parse_relevant`
    checks it instead.
    """
    return {
        "type": "object",
        "properties": {
            "relevant": {
                "type": "array",
                "items": {"type": "integer", "minimum": 1, "maximum": n},
                "maxItems": n,
            }
        },
        "required": ["relevant"],
        "additionalProperties": False,
    }


def parse_relevant(text: str, n: int) -> list[int]:
    """The sorted, distinct sentence numbers of a :func:`relevant_schema` reply.

    Raises
    ------
    ParseError
        Not JSON, a number outside 1..``n``, a repeated number, or not of the schema's
        shape.
    """
    numbers = parse_json(text, relevant_schema(n))["relevant"]
    repeated = sorted({k for k in numbers if numbers.count(k) > 1})
    if repeated:
        raise ParseError(f"sentence numbers listed more than once: {repeated}")
    return sorted(numbers)


@register
class ContextRelevancy(JudgeMetric):
    """Share of the retrieved contexts' sentences that are relevant to the question, in [0, 1].

    The contexts are split into sentences by :func:`split_sentences` (deterministic, no
    model) and numbered across all contexts. One judge step per row: the judge lists the
    numbers of the sentences relevant to the question. The score is ``relevant sentences
    / sentences``; ``details`` holds the sentence count and the relevant numbers.

    Notes
    -----
    Source: Ragas ``context_relevancy`` as in Ragas v0.1 (Es et al., "RAGAS: Automated
    Evaluation of Retrieval Augmented Generation", 2023, section 3: relevant sentences
    extracted from the context over the context's sentences). Ragas asks the judge to
    copy the sentences out and counts them; this metric asks for their numbers, which
    costs fewer tokens and cannot miscount. The numbered sentences repeat the contexts in
    the task, so the prompt holds the contexts twice. Cost: one judge call per row.
    """

    name: ClassVar[str] = "context_relevancy"
    prompts: ClassVar[tuple[StepPrompt, ...]] = (PROMPT,)
    version: ClassVar[int] = 1
    inputs: ClassVar[tuple[str, ...]] = (QUESTION, CONTEXTS)
    boolean: ClassVar[bool] = False
    summary: ClassVar[str] = "Share of the contexts' sentences that are relevant to the question"
    source: ClassVar[str] = "Ragas context_relevancy, v0.1 (Es et al. 2023, RAGAS, section 3)"
    policy: ClassVar[tuple[tuple[str, str], ...]] = (
        ("question or contexts is null", "missing_input"),
        ("question empty or only whitespace", "missing_input; reason 'question is empty'"),
        (
            "answer null, empty or a refusal (no claims)",
            "not read: relevance is judged against the question only",
        ),
        ("contexts is an empty list", "missing_input; reason 'contexts is an empty list'"),
        (
            "every context chunk is blank, or the contexts hold no sentence",
            "missing_input; reason 'every context is empty' or 'the contexts have no sentences'",
        ),
        ("reference is null", "not read: the metric does not use the reference"),
        (
            "a context chunk is junk (markup, boilerplate)",
            "split and judged like any other "
            "text: its sentences are irrelevant and lower the score; lines with no letter or "
            "digit are not sentences",
        ),
        *failure_policy(
            "a sentence number outside 1..N or repeated, prose, or a reply cut at max_tokens",
            "the sentences repeat the contexts",
        ),
    )
    judge_examples: ClassVar[tuple[JudgeExample, ...]] = (
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: [
                    "Apollo 11 landed on 20 July 1969. It carried three crew.",
                    "Home | About\nThe Saturn V was a rocket. It first flew in 1967.",
                ],
            },
            replies=('{"relevant": [1]}',),
            score=0.2,
            note="five sentences, one relevant",
        ),
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: ["=====", "---"],
                ANSWER: "In 1969.",
            },
            replies=(),
            score=None,
            status=MISSING_INPUT,
            note="no sentence in the contexts: no judge call",
        ),
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: ["Apollo 11 landed in 1969. The crew was three."],
            },
            replies=('{"relevant": [1, 3]}', '{"relevant": [0]}'),
            score=None,
            status="parse_failure",
            note="sentence 3 of 2, then sentence 0: out of range twice",
        ),
    )

    def guards(self) -> tuple[Guard, ...]:
        return (
            *context_guards(self.inputs, QUESTION),
            Guard(
                pl.col(CONTEXTS)
                .list.eval(pl.element().str.contains(r"[\p{L}\p{N}]").fill_null(False))
                .list.any()
                .not_(),
                MISSING_INPUT,
                pl.lit("the contexts have no sentences"),
            ),
        )

    def program(self, row: dict[str, Any]) -> Program:
        sentences = context_sentences(row[CONTEXTS])
        n = len(sentences)
        if n == 0:  # the guards settle this; kept for rows judged without them
            return PyCell(None, MISSING_INPUT, "the contexts have no sentences")
        listing = "\n".join(f"({i}) {s}" for i, s in enumerate(sentences, start=1))
        [relevant] = yield [
            Ask(
                self.messages(row, PROMPT, sentences=listing, n=n),
                OutputSpec.of_schema(relevant_schema(n), max_tokens=4 * n + 16),
                lambda text: parse_relevant(text, n),
                step="sentences",
            )
        ]
        return share_cell(
            len(relevant),
            n,
            "context sentences not relevant to the question",
            details={"sentences": n, "relevant": relevant},
        )
