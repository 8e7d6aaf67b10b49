"""``context_recall``: the share of the reference answer's statements the contexts support."""

from __future__ import annotations

from typing import Any, ClassVar


from ragbatch.core.columns import ANSWER, CONTEXTS, QUESTION, REFERENCE
from ragbatch.judge.verdicts import VERDICTS_INSTRUCTIONS_REPLY, VERDICTS_TASK_REPLY
from ragbatch.judge.policy import failure_policy
from ragbatch.judge.health import HealthFields
from ragbatch.judge.metric import JudgeExample
from ragbatch.judge.prompt import StepPrompt
from ragbatch.judge.statement_verdicts import (
    LISTED_STATEMENTS_MAX_TOKENS,
    STATEMENT_VERDICTS_ASK,
    StatementVerdictMetric,
)
from ragbatch.scoring.registry import register
from ragbatch.core.status import MISSING_INPUT, NOT_APPLICABLE

#: Completion budget of the statements step (at most 20 statements).
STATEMENTS_MAX_TOKENS = LISTED_STATEMENTS_MAX_TOKENS
STATEMENTS_TASK = """\
Reference answer to the question:
{reference}

Split the reference answer (not the system's answer above) into its individual
statements. Each statement makes one claim, can be read on its own (name things instead
of using pronouns) and keeps the reference's meaning. Leave out text that makes no
claim. If the reference makes no claim, return an empty list.

Reply with JSON: {{"statements": ["...", ...]}} with at most 20 statements."""

#: The ``instructions_first`` layout's instruction set of this step (plain text).
STATEMENTS_INSTRUCTIONS = """\
Split the reference answer (not the system's answer) into its individual
statements. Each statement makes one claim, can be read on its own (name things instead
of using pronouns) and keeps the reference's meaning. Leave out text that makes no
claim. If the reference makes no claim, return an empty list.

Reply with JSON: {"statements": ["...", ...]} with at most 20 statements."""

#: The ``instructions_first`` layout's ask of this step.
STATEMENTS_ASK = ""

STATEMENTS = StepPrompt(
    "context_recall/statements", STATEMENTS_TASK, STATEMENTS_INSTRUCTIONS, STATEMENTS_ASK
)

ATTRIBUTION_TASK = (
    """\
Reference answer to the question:
{reference}

Below are the statements of the reference answer. For each one, decide whether it can be
attributed to the retrieved contexts. Verdict 1: the contexts state it or it follows
from what they state. Verdict 0: the contexts do not give it, or contradict it. Your own
knowledge does not count. Give one verdict per statement, in the same order, each with a
one-sentence reason.

Statements:
{statements}

"""
    + VERDICTS_TASK_REPLY
    + "."
)

#: The ``instructions_first`` layout's instruction set of this step (plain text).
ATTRIBUTION_INSTRUCTIONS = (
    """\
The task lists the statements of the reference answer. For each statement,
decide whether it can be attributed to the retrieved contexts. Verdict 1: the contexts
state it or it follows from what they state. Verdict 0: the contexts do not give it, or
contradict it. Your own knowledge does not count. Give one verdict per statement, in the
same order, each with a one-sentence reason.

"""
    + VERDICTS_INSTRUCTIONS_REPLY
    + " statement."
)

#: The ``instructions_first`` layout's ask of this step.
ATTRIBUTION_ASK = STATEMENT_VERDICTS_ASK

ATTRIBUTION = StepPrompt(
    "context_recall/verdicts", ATTRIBUTION_TASK, ATTRIBUTION_INSTRUCTIONS, ATTRIBUTION_ASK
)


@register
class ContextRecall(StatementVerdictMetric):
    """Recall of the reference answer by the retrieved contexts, in [0, 1].

    Two judge steps per row: the judge splits the reference answer into statements, then
    gives a 0/1 verdict per statement on whether the contexts support it. The score is
    ``attributable statements / statements``; ``details`` lists the statements and
    verdicts.

    Notes
    -----
    Source: Ragas ``context_recall`` (Es et al., "RAGAS: Automated Evaluation of
    Retrieval Augmented Generation", 2023; Ragas docs: reference sentences attributable to
    the retrieved context over all reference sentences). Where Ragas returns NaN for a
    reference with no statements, this metric returns ``not_applicable``. Cost: two judge
    calls per row (one when the reference has no statements).
    """

    name: ClassVar[str] = "context_recall"
    prompts: ClassVar[tuple[StepPrompt, ...]] = (
        STATEMENTS,
        ATTRIBUTION,
    )
    health: ClassVar[HealthFields] = HealthFields(extraction="statements", verdicts="verdicts")
    version: ClassVar[int] = 1
    inputs: ClassVar[tuple[str, ...]] = (QUESTION, CONTEXTS, REFERENCE)
    statements_of: ClassVar[str] = REFERENCE
    extracted: ClassVar[str] = "statements"
    statements_max_tokens: ClassVar[int] = STATEMENTS_MAX_TOKENS
    no_statements: ClassVar[str] = "the reference makes no statements"
    missed: ClassVar[str] = "reference statements not supported by the contexts"
    boolean: ClassVar[bool] = False
    summary: ClassVar[str] = "Share of the reference answer's statements that the contexts support"
    source: ClassVar[str] = "Ragas context_recall (Es et al. 2023, RAGAS; Ragas docs)"
    policy: ClassVar[tuple[tuple[str, str], ...]] = (
        ("question, contexts or reference is null", "missing_input"),
        ("reference empty or only whitespace", "missing_input; reason 'reference is empty'"),
        (
            "answer null, empty or a refusal (no claims)",
            "not read: recall is judged on the reference answer",
        ),
        (
            "contexts is an empty list",
            "missing_input; reason 'contexts is an empty list' (Ragas would score 0)",
        ),
        ("every context chunk is blank", "missing_input; reason 'every context is empty'"),
        (
            "reference makes no claim",
            "not_applicable; reason 'the reference makes no statements' (Ragas: NaN)",
        ),
        (
            "a context chunk is junk (markup, boilerplate)",
            "judged like any other text: it supports no statement, so it cannot raise the score",
        ),
        *failure_policy(
            "verdict count differs from the statement count, or a reply cut at max_tokens",
        ),
    )
    judge_examples: ClassVar[tuple[JudgeExample, ...]] = (
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land, and who commanded it?",
                CONTEXTS: ["Apollo 11 landed on the Moon on 20 July 1969."],
                REFERENCE: "Apollo 11 landed on 20 July 1969; Neil Armstrong commanded it.",
            },
            replies=(
                '{"statements": ["Apollo 11 landed on 20 July 1969.", '
                '"Neil Armstrong commanded Apollo 11."]}',
                '{"verdicts": [{"reason": "The date is stated.", "verdict": 1}, '
                '{"reason": "No commander is named.", "verdict": 0}]}',
            ),
            score=0.5,
            note="one of two reference statements in the contexts",
        ),
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: ["Apollo 11 landed in 1969."],
                REFERENCE: "n/a",
            },
            replies=('{"statements": []}',),
            score=None,
            status=NOT_APPLICABLE,
            note="the reference makes no statement",
        ),
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: ["Apollo 11 landed in 1969."],
                REFERENCE: " ",
            },
            replies=(),
            score=None,
            status=MISSING_INPUT,
            note="blank reference: no judge call",
        ),
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: ["Apollo 11 landed in 1969."],
                REFERENCE: "Apollo 11 landed in 1969.",
            },
            replies=(
                '{"statements": ["Apollo 11 landed in 1969."]}',
                "Verdict: 1, the context states it.",
                '{"verdicts": [{"reason": "Stated.", "verdict": 1}, '
                '{"reason": "Stated.", "verdict": 1}]}',
            ),
            score=None,
            status="parse_failure",
            note="prose, then two verdicts for one statement",
        ),
        JudgeExample(
            inputs={
                QUESTION: "Who wrote Hamlet?",
                CONTEXTS: ["Hamlet is a tragedy by William Shakespeare."],
                ANSWER: "Shakespeare.",
                REFERENCE: "William Shakespeare wrote Hamlet.",
            },
            replies=('{"statements": ["William Shakespeare wrote Hamlet."]}', '{"verdicts": [1]}'),
            score=1.0,
            params={"reasons": False},
            note="reasons: false, bare verdicts",
        ),
    )

    def step_fields(self, row: dict[str, Any]) -> dict[str, str]:
        return {"reference": row[REFERENCE]}
