"""``retrieval_precision``: the share of retrieved contexts relevant to the question."""

from __future__ import annotations

from typing import ClassVar


from ragbatch.core.columns import ANSWER, CONTEXTS, QUESTION
from ragbatch.judge.context_verdicts import (
    ASK,
    FAILURE_POLICY,
    INSTRUCTIONS_REPLY,
    TASK_REPLY,
    ContextVerdictMetric,
)
from ragbatch.judge.prompt import StepPrompt
from ragbatch.judge.metric import JudgeExample
from ragbatch.scoring.cells import PyCell, share_cell
from ragbatch.scoring.registry import register
from ragbatch.core.status import MISSING_INPUT

TASK = (
    """\
For each retrieved context above, from [1] to [{n}], decide whether it is relevant to the
question. Verdict 1: the context holds information that helps answer the question.
Verdict 0: it does not (another subject, navigation or markup, text only loosely
related). Judge the contexts against the question only; ignore the answer. Give one
verdict per context, in the order of their numbers, each with a one-sentence reason.

"""
    + TASK_REPLY
)

#: The ``instructions_first`` layout's instruction set of this step (plain text).
INSTRUCTIONS = (
    """\
For each retrieved context, in the order of their numbers, decide whether it is relevant
to the question. Verdict 1: the context holds information that helps answer the
question. Verdict 0: it does not (another subject, navigation or markup, text only
loosely related). Judge the contexts against the question only; ignore the answer. Give
one verdict per context, in the order of their numbers, each with a one-sentence reason.

"""
    + INSTRUCTIONS_REPLY
)


PROMPT = StepPrompt("retrieval_precision", TASK, INSTRUCTIONS, ASK)


@register
class RetrievalPrecision(ContextVerdictMetric):
    """Share of the retrieved contexts that are relevant to the question, in [0, 1].

    One judge step per row: the judge gives a 0/1 relevance verdict per context (by its
    number in the shared prompt block). The score is ``relevant contexts / contexts``;
    ``details`` lists the verdicts.

    Notes
    -----
    Source: Tonic Validate ``RetrievalPrecisionMetric`` (the fraction of retrieved
    contexts relevant to answering the question). Tonic asks once per context; this
    metric asks once per row for exactly ``len(contexts)`` verdicts. The answer is not
    judged (it appears in the shared prompt block only). Cost: one judge call per row.
    """

    name: ClassVar[str] = "retrieval_precision"
    prompts: ClassVar[tuple[StepPrompt, ...]] = (PROMPT,)
    version: ClassVar[int] = 1
    inputs: ClassVar[tuple[str, ...]] = (QUESTION, CONTEXTS)
    nonblank: ClassVar[str] = QUESTION
    boolean: ClassVar[bool] = False
    summary: ClassVar[str] = "Share of the retrieved contexts that are relevant to the question"
    source: ClassVar[str] = "Tonic Validate RetrievalPrecisionMetric (retrieval precision)"
    policy: ClassVar[tuple[tuple[str, str], ...]] = (
        ("question or contexts is null", "missing_input"),
        ("question empty or only whitespace", "missing_input; reason 'question is empty'"),
        (
            "answer null, empty or a refusal (no claims)",
            "not read: relevance is judged against the question only",
        ),
        (
            "contexts is an empty list",
            "missing_input; reason 'contexts is an empty list' "
            "(precision of nothing retrieved is undefined)",
        ),
        ("every context chunk is blank", "missing_input; reason 'every context is empty'"),
        ("reference is null", "not read: the metric does not use the reference"),
        (
            "a context chunk is junk (markup, boilerplate)",
            "judged like any other context: "
            "irrelevant, so it lowers the score (the retrieval fetched it)",
        ),
        *FAILURE_POLICY,
    )
    judge_examples: ClassVar[tuple[JudgeExample, ...]] = (
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: [
                    "Apollo 11 landed on the Moon on 20 July 1969.",
                    "Home | About | Contact",
                    "The Saturn V was a rocket.",
                    "The lunar module touched down at 20:17 UTC on 20 July 1969.",
                ],
                ANSWER: "On 20 July 1969.",
            },
            replies=(
                '{"verdicts": [{"reason": "Gives the date.", "verdict": 1}, {"reason": '
                '"Navigation text.", "verdict": 0}, {"reason": "About the rocket.", '
                '"verdict": 0}, {"reason": "Gives the date and time.", "verdict": 1}]}',
            ),
            score=0.5,
            note="two of four contexts relevant, one of them junk",
        ),
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: ["Apollo 11 landed in 1969."],
                ANSWER: None,
            },
            replies=('{"verdicts": [{"reason": "Gives the year.", "verdict": 1}]}',),
            score=1.0,
            note="the answer is not needed",
        ),
        JudgeExample(
            inputs={QUESTION: "When did Apollo 11 land?", CONTEXTS: [], ANSWER: "In 1969."},
            replies=(),
            score=None,
            status=MISSING_INPUT,
            note="no contexts: no judge call",
        ),
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: ["Apollo 11 landed in 1969.", "The Saturn V was a rocket."],
                ANSWER: "In 1969.",
            },
            replies=(
                '{"verdicts": [{"reason": "Gives the year.", "verdict": 1}]}',
                (
                    "length",
                    '{"verdicts": [{"reason": "Gives the year.", "verdict": 1}, {"reason": "About',
                ),
            ),
            score=None,
            status="parse_failure",
            note="one verdict for two contexts, then a reply cut at max_tokens",
        ),
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: [
                    "Apollo 11 landed on 20 July 1969.",
                    "Home | About | Contact",
                    "The Saturn V was a rocket.",
                ],
                ANSWER: "On 20 July 1969.",
            },
            replies=('{"verdicts": [1, 0, 0]}',),
            score=1 / 3,
            params={"reasons": False},
            note="reasons: false, bare verdicts",
        ),
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: ["Apollo 11 landed on 20 July 1969."],
                ANSWER: "In 1969.",
            },
            replies=(
                '{"verdicts": [{"reason": "Gives the date.", "verdict": 1}]}',
                '{"verdicts": ["1"]}',
            ),
            score=None,
            status="parse_failure",
            params={"reasons": False},
            note="reasons: false: a verdict with a reason, then a string, are the wrong shape",
        ),
    )

    def score_verdicts(self, verdicts: list[int]) -> PyCell:
        """``relevant contexts / contexts``."""
        return share_cell(
            sum(verdicts),
            len(verdicts),
            "contexts not relevant to the question",
            details={"verdicts": verdicts},
        )
