"""``faithfulness``: the share of the answer's statements that the contexts support."""

from __future__ import annotations

from typing import ClassVar


from ragbatch.core.columns import ANSWER, CONTEXTS, QUESTION
from ragbatch.judge.verdicts import VERDICTS_INSTRUCTIONS_REPLY, VERDICTS_TASK_REPLY
from ragbatch.judge.policy import failure_policy
from ragbatch.judge.health import HealthFields
from ragbatch.judge.metric import JudgeExample
from ragbatch.judge.parse import STATEMENTS_MAX_TOKENS, VERDICT_MAX_TOKENS
from ragbatch.judge.prompt import StepPrompt
from ragbatch.judge.statement_verdicts import STATEMENT_VERDICTS_ASK, StatementVerdictMetric
from ragbatch.scoring.registry import register
from ragbatch.core.status import MISSING_INPUT, NOT_APPLICABLE

STATEMENTS_TASK = """\
Break the answer into its individual factual statements. Each statement must make one
claim, be understandable without the other statements (replace pronouns with what they
refer to), and stay faithful to the answer's wording. Leave out greetings, hedges and
text that makes no claim. If the answer makes no factual claim (a refusal, "I don't
know"), return an empty list.

Reply with JSON: {"statements": ["...", ...]}"""

#: The ``instructions_first`` layout's instruction set of this step (plain text).
STATEMENTS_INSTRUCTIONS = (
    STATEMENTS_TASK  # the same text: this step's task needs no row-specific part
)

#: The ``instructions_first`` layout's ask of this step.
STATEMENTS_ASK = ""

STATEMENTS = StepPrompt(
    "faithfulness/statements", STATEMENTS_TASK, STATEMENTS_INSTRUCTIONS, STATEMENTS_ASK
)

VERDICTS_TASK = (
    """\
For each statement below, decide whether it can be inferred from the retrieved contexts
alone. Verdict 1: the contexts state it or it follows directly from them. Verdict 0: the
contexts do not support it, or contradict it. Give one verdict per statement, in the same
order, each with a one-sentence reason.

Statements:
{statements}

"""
    + VERDICTS_TASK_REPLY
    + "."
)

#: The ``instructions_first`` layout's instruction set of this step (plain text).
VERDICTS_INSTRUCTIONS = (
    """\
For each statement the task lists, decide whether it can be inferred from the retrieved
contexts alone. Verdict 1: the contexts state it or it follows directly from them.
Verdict 0: the contexts do not support it, or contradict it. Give one verdict per
statement, in the same order, each with a one-sentence reason.

"""
    + VERDICTS_INSTRUCTIONS_REPLY
    + " statement."
)

#: The ``instructions_first`` layout's ask of this step.
VERDICTS_ASK = STATEMENT_VERDICTS_ASK

VERDICTS = StepPrompt("faithfulness/verdicts", VERDICTS_TASK, VERDICTS_INSTRUCTIONS, VERDICTS_ASK)


@register
class Faithfulness(StatementVerdictMetric):
    """Faithfulness of the answer to the retrieved contexts, in [0, 1].

    Two judge steps per row: the judge splits the answer into standalone statements,
    then gives a 0/1 verdict per statement on whether the contexts support it. The score
    is ``supported statements / statements``; ``details`` lists the statements and
    verdicts.

    Notes
    -----
    Source: Ragas ``faithfulness`` (Es et al., "RAGAS: Automated Evaluation of Retrieval
    Augmented Generation", 2023, section 3). Where Ragas returns NaN for an answer with
    no statements, this metric returns ``not_applicable``. Cost: two judge calls per row.
    """

    name: ClassVar[str] = "faithfulness"
    prompts: ClassVar[tuple[StepPrompt, ...]] = (
        STATEMENTS,
        VERDICTS,
    )
    health: ClassVar[HealthFields] = HealthFields(extraction="statements", verdicts="verdicts")
    inputs: ClassVar[tuple[str, ...]] = (QUESTION, CONTEXTS, ANSWER)
    statements_of: ClassVar[str] = ANSWER
    extracted: ClassVar[str] = "statements"
    statements_max_tokens: ClassVar[int] = STATEMENTS_MAX_TOKENS
    verdict_max_tokens: ClassVar[int] = VERDICT_MAX_TOKENS
    no_statements: ClassVar[str] = "the answer makes no statements"
    missed: ClassVar[str] = "statements not supported"
    summary: ClassVar[str] = "Share of the answer's statements that the retrieved contexts support"
    source: ClassVar[str] = "Ragas faithfulness (Es et al. 2023, RAGAS, section 3)"
    policy: ClassVar[tuple[tuple[str, str], ...]] = (
        ("question, contexts or answer is null", "missing_input"),
        ("answer empty or only whitespace", "missing_input; reason 'answer is empty'"),
        (
            "contexts is an empty list",
            "missing_input; reason 'contexts is an empty list' "
            "(nothing can support a statement; Ragas would score 0)",
        ),
        ("every context chunk is blank", "missing_input; reason 'every context is empty'"),
        (
            "answer makes no claim (a refusal)",
            "not_applicable; reason 'the answer makes no statements' (Ragas: NaN; DeepEval: 1)",
        ),
        (
            "a context chunk is junk (markup, boilerplate)",
            "judged like any other text: it supports no statement, so it cannot raise the score",
        ),
        *failure_policy("verdict count differs from the statement count"),
    )
    judge_examples: ClassVar[tuple[JudgeExample, ...]] = (
        JudgeExample(
            inputs={
                QUESTION: "Who wrote Hamlet?",
                CONTEXTS: ["Hamlet is a tragedy by William Shakespeare, written around 1600."],
                ANSWER: "Hamlet was written by Shakespeare in 1750.",
            },
            replies=(
                '{"statements": ["Hamlet was written by Shakespeare.", '
                '"Hamlet was written in 1750."]}',
                '{"verdicts": [{"reason": "The context names Shakespeare.", "verdict": 1}, '
                '{"reason": "The context says around 1600.", "verdict": 0}]}',
            ),
            score=0.5,
            note="one of two statements supported",
        ),
        JudgeExample(
            inputs={
                QUESTION: "Who wrote Hamlet?",
                CONTEXTS: ["Hamlet is a tragedy."],
                ANSWER: "I don't know.",
            },
            replies=('{"statements": []}',),
            score=None,
            status=NOT_APPLICABLE,
            note="a refusal makes no statements",
        ),
        JudgeExample(
            inputs={QUESTION: "Who wrote Hamlet?", CONTEXTS: [], ANSWER: "Shakespeare."},
            replies=(),
            score=None,
            status=MISSING_INPUT,
            note="no contexts: no judge call",
        ),
        JudgeExample(
            inputs={
                QUESTION: "Who wrote Hamlet?",
                CONTEXTS: ["By Shakespeare."],
                ANSWER: "Shakespeare wrote it in 1600.",
            },
            replies=(
                '{"statements": ["Shakespeare wrote Hamlet.", "It was written in 1600."]}',
                '{"verdicts": [{"reason": "stated", "verdict": 1}]}',
                '{"verdicts": [{"reason": "stated", "verdict": 1}]}',
            ),
            score=None,
            status="parse_failure",
            note="one verdict for two statements, twice (first try and the one retry)",
        ),
        JudgeExample(
            inputs={
                QUESTION: "Who wrote Hamlet?",
                CONTEXTS: ["Hamlet is a tragedy by William Shakespeare."],
                ANSWER: "Shakespeare wrote Hamlet in 1600.",
            },
            replies=(
                '{"statements": ["Shakespeare wrote Hamlet.", "Hamlet was written in 1600."]}',
                '{"verdicts": [1, 0]}',
            ),
            score=0.5,
            params={"reasons": False},
            note="reasons: false, bare verdicts; the year is not in the context",
        ),
    )
