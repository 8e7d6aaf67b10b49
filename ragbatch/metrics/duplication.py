"""``duplication``: 1 when the answer repeats the same information."""

from __future__ import annotations

from typing import ClassVar

from ragbatch.core.columns import ANSWER, CONTEXTS, QUESTION
from ragbatch.judge.health import HealthFields
from ragbatch.judge.answer_verdict import (
    FAILURE_POLICY,
    INPUT_POLICY,
    REPLY_FORMAT,
    AnswerVerdictMetric,
)
from ragbatch.judge.metric import JudgeExample
from ragbatch.judge.prompt import StepPrompt
from ragbatch.scoring.registry import register
from ragbatch.core.status import MISSING_INPUT

TASK = (
    """\
Decide whether the answer repeats itself: whether it gives the same piece of information
more than once, in the same words or in different ones. A closing summary that restates
points already made counts as repetition. Naming the same thing in two statements that
say different things about it does not. Judge the answer's text only; ignore the
contexts and the question.

Give a one-sentence reason first (quote the repeated information when there is some),
then the verdict: true when the answer repeats information, false when it does not.

"""
    + REPLY_FORMAT
)

#: The ``instructions_first`` layout's instruction set of this step (plain text).
INSTRUCTIONS = TASK  # the same text: this step's task needs no row-specific part

#: The ``instructions_first`` layout's ask of this step.
ASK = ""

PROMPT = StepPrompt("duplication", TASK, INSTRUCTIONS, ASK)


@register
class Duplication(AnswerVerdictMetric):
    """Whether the answer contains duplicated information: 1.0 (it does) or 0.0.

    One judge step per row: the judge reads the answer alone and decides whether it
    states the same information more than once. Lower is better. The judge's reason is
    kept in ``details`` (and in ``reason`` for a 1).

    Notes
    -----
    Source: Tonic Validate ``DuplicationMetric`` (true when the answer contains
    duplicate information). Cost: one judge call per row.
    """

    name: ClassVar[str] = "duplication"
    health: ClassVar[HealthFields] = HealthFields(reason="reason", usual_score=0.0)
    version: ClassVar[int] = 1
    prompts: ClassVar[tuple[StepPrompt, ...]] = (PROMPT,)
    positive_reason: ClassVar[str] = "the answer repeats information"
    higher_is_better: ClassVar[bool] = False
    summary: ClassVar[str] = "1 when the answer repeats the same information"
    source: ClassVar[str] = "Tonic Validate DuplicationMetric (duplicate information in the answer)"
    policy: ClassVar[tuple[tuple[str, str], ...]] = (
        *INPUT_POLICY,
        (
            "answer makes no claim (a refusal)",
            "judged like any other text: a short refusal repeats nothing and scores 0.0",
        ),
        ("reference is null", "not read: the metric does not use the reference"),
        (
            "a context chunk is junk (markup, boilerplate)",
            "no effect: the task tells the judge "
            "to ignore the contexts (they stay in the shared prompt block)",
        ),
        *FAILURE_POLICY,
    )
    judge_examples: ClassVar[tuple[JudgeExample, ...]] = (
        JudgeExample(
            inputs={
                QUESTION: "How do I restart the service?",
                CONTEXTS: ["Run systemctl restart app."],
                ANSWER: "Run systemctl restart app. To restart the service, use "
                "systemctl restart app.",
            },
            replies=('{"reason": "The restart command is given twice.", "verdict": true}',),
            score=1.0,
            note="the same instruction twice",
        ),
        JudgeExample(
            inputs={
                QUESTION: "How do I restart the service?",
                CONTEXTS: [],
                ANSWER: "Run systemctl restart app, then check its status with systemctl "
                "status app.",
            },
            replies=('{"reason": "Two different commands, nothing repeated.", "verdict": false}',),
            score=0.0,
            note="no repetition; contexts are not needed",
        ),
        JudgeExample(
            inputs={
                QUESTION: "How do I restart the service?",
                CONTEXTS: ["Run systemctl."],
                ANSWER: "\n\t ",
            },
            replies=(),
            score=None,
            status=MISSING_INPUT,
            note="blank answer: no judge call",
        ),
        JudgeExample(
            inputs={
                QUESTION: "How do I restart the service?",
                CONTEXTS: ["Run systemctl."],
                ANSWER: "Run systemctl restart app.",
            },
            replies=(
                '{"reason": "Nothing repeated.", "verdict": "no"}',
                "No, the answer does not repeat itself.",
            ),
            score=None,
            status="parse_failure",
            note="a string verdict, then prose",
        ),
    )
