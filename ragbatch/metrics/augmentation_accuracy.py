"""``augmentation_accuracy``: the share of retrieved contexts whose information the answer uses."""

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
For each retrieved context above, from [1] to [{n}], decide whether the answer uses
information from it. Verdict 1: some information in the answer comes from that context
(stated there, quoted or paraphrased); using part of a context counts. Verdict 0: the
answer takes nothing from that context. Give one verdict per context, in the order of
their numbers, each with a one-sentence reason.

"""
    + TASK_REPLY
)

#: The ``instructions_first`` layout's instruction set of this step (plain text).
INSTRUCTIONS = (
    """\
For each retrieved context, in the order of their numbers, decide whether the answer
uses information from it. Verdict 1: some information in the answer comes from that
context (stated there, quoted or paraphrased); using part of a context counts. Verdict 0:
the answer takes nothing from that context. Give one verdict per context, in the order
of their numbers, each with a one-sentence reason.

"""
    + INSTRUCTIONS_REPLY
)


PROMPT = StepPrompt("augmentation_accuracy", TASK, INSTRUCTIONS, ASK)


@register
class AugmentationAccuracy(ContextVerdictMetric):
    """Share of the retrieved contexts whose information appears in the answer, in [0, 1].

    One judge step per row: the judge gives a 0/1 verdict per context (referred to by
    its number in the shared prompt block) on whether the answer uses information from
    it. The score is ``contexts used / contexts``; ``details`` lists the verdicts.

    Notes
    -----
    Source: Tonic Validate ``AugmentationAccuracyMetric`` (the fraction of the retrieved
    contexts whose information is contained in the answer). Tonic asks once per context;
    this metric asks once per row for a verdict list of exactly ``len(contexts)`` items
    (a list of the wrong length is a ``parse_failure``). Cost: one judge call per row.
    """

    name: ClassVar[str] = "augmentation_accuracy"
    prompts: ClassVar[tuple[StepPrompt, ...]] = (PROMPT,)
    version: ClassVar[int] = 1
    inputs: ClassVar[tuple[str, ...]] = (CONTEXTS, ANSWER)
    nonblank: ClassVar[str] = ANSWER
    boolean: ClassVar[bool] = False
    summary: ClassVar[str] = (
        "Share of the retrieved contexts whose information appears in the answer"
    )
    source: ClassVar[str] = "Tonic Validate AugmentationAccuracyMetric (augmentation accuracy)"
    policy: ClassVar[tuple[tuple[str, str], ...]] = (
        ("contexts or answer is null", "missing_input"),
        ("question is null", "judged: the question is not needed and shown as '(not given)'"),
        ("answer empty or only whitespace", "missing_input; reason 'answer is empty'"),
        (
            "contexts is an empty list",
            "missing_input; reason 'contexts is an empty list' "
            "(the share of no contexts is undefined)",
        ),
        ("every context chunk is blank", "missing_input; reason 'every context is empty'"),
        (
            "answer makes no claim (a refusal)",
            "judged: a refusal uses no context, so it scores 0.0 with a reason; a measured 0",
        ),
        ("reference is null", "not read: the metric does not use the reference"),
        (
            "a context chunk is junk (markup, boilerplate)",
            "judged like any other context: the "
            "answer rarely uses it, so it lowers the score (the retrieval fetched it)",
        ),
        *FAILURE_POLICY,
    )
    judge_examples: ClassVar[tuple[JudgeExample, ...]] = (
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land, and who flew it?",
                CONTEXTS: [
                    "Apollo 11 landed on the Moon on 20 July 1969.",
                    "The Saturn V was the rocket of the Apollo programme.",
                    "Neil Armstrong commanded Apollo 11.",
                ],
                ANSWER: "Apollo 11 landed on 20 July 1969 under the command of Neil Armstrong.",
            },
            replies=(
                '{"verdicts": [{"reason": "The date comes from it.", "verdict": 1}, '
                '{"reason": "The rocket is not mentioned.", "verdict": 0}, '
                '{"reason": "The commander comes from it.", "verdict": 1}]}',
            ),
            score=2 / 3,
            note="two of three contexts used",
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
                CONTEXTS: ["Apollo 11 landed in 1969.", "The Moon has no air."],
                ANSWER: "In 1969.",
            },
            replies=(
                '{"verdicts": [{"reason": "The year comes from it.", "verdict": 1}]}',
                '{"verdicts": [{"reason": "The year comes from it.", "verdict": 1}, '
                '{"reason": "Not used.", "verdict": 0}, {"reason": "Not used.", '
                '"verdict": 0}]}',
            ),
            score=None,
            status="parse_failure",
            note="one verdict, then three, for two contexts",
        ),
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: ["Apollo 11 landed on 20 July 1969.", "The Saturn V was a rocket."],
                ANSWER: "It landed on 20 July 1969.",
            },
            replies=('{"verdicts": [1, 0]}',),
            score=0.5,
            params={"reasons": False},
            note="reasons: false, bare verdicts",
        ),
    )

    def score_verdicts(self, verdicts: list[int]) -> PyCell:
        """``contexts used / contexts``."""
        return share_cell(
            sum(verdicts),
            len(verdicts),
            "contexts not reflected in the answer",
            details={"verdicts": verdicts},
        )
