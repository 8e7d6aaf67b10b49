"""``context_precision``: rank-aware precision of the contexts useful for the reference answer."""

from __future__ import annotations

from typing import Any, ClassVar, Sequence


from ragbatch.core.columns import ANSWER, CONTEXTS, QUESTION, REFERENCE
from ragbatch.judge.context_verdicts import (
    ASK,
    FAILURE_POLICY,
    INSTRUCTIONS_REPLY,
    TASK_REPLY,
    ContextVerdictMetric,
)
from ragbatch.judge.prompt import StepPrompt
from ragbatch.judge.metric import JudgeExample
from ragbatch.scoring.cells import PyCell
from ragbatch.scoring.registry import register
from ragbatch.core.status import MISSING_INPUT

TASK = (
    """\
Reference answer to the question:
{reference}

For each retrieved context above, from [1] to [{n}], decide whether it was useful for
arriving at the reference answer. Verdict 1: the context holds information that the
reference answer states or that leads to it. Verdict 0: it does not. Judge against the
question and the reference answer; ignore the system's answer. Give one verdict per
context, in the order of their numbers, each with a one-sentence reason.

"""
    + TASK_REPLY
)

#: The ``instructions_first`` layout's instruction set of this step (plain text).
INSTRUCTIONS = (
    """\
For each retrieved context, in the order of their numbers, decide whether it was useful
for arriving at the reference answer. Verdict 1: the context holds
information that the reference answer states or that leads to it. Verdict 0: it does
not. Judge against the question and the reference answer; ignore the system's answer.
Give one verdict per context, in the order of their numbers, each with a one-sentence
reason.

"""
    + INSTRUCTIONS_REPLY
)


PROMPT = StepPrompt("context_precision", TASK, INSTRUCTIONS, ASK)


def average_precision(verdicts: Sequence[float]) -> float:
    """Average precision of a ranked list of 0/1 usefulness verdicts.

    ``sum over k of precision@k * v_k``, divided by the number of useful contexts, where
    ``precision@k`` is the share of useful contexts among the first ``k``. With no useful
    context the result is 0.0 (as in Ragas, whose denominator carries a tiny epsilon).
    With ``score: probability`` the verdicts are each context's p(useful) and the same
    formula weighs them (``useful`` becomes the expected count so far): a plug-in
    score, not the expectation of the average precision.

    Examples
    --------
    >>> round(average_precision([0, 1, 1]), 6)  # (1/2 + 2/3) / 2
    0.583333
    >>> average_precision([1, 1, 0]), average_precision([0, 0])
    (1.0, 0.0)
    """
    useful = 0.0
    total = 0.0
    for k, verdict in enumerate(verdicts, start=1):
        if verdict:
            useful += verdict
            total += useful / k * verdict
    return total / useful if useful else 0.0


@register
class ContextPrecision(ContextVerdictMetric):
    """Rank-aware precision of the retrieved contexts, in [0, 1].

    One judge step per row: the judge gives a 0/1 verdict per context (in retrieval
    order) on whether it was useful for arriving at the reference answer. The score is
    the average precision of the verdicts (:func:`average_precision`): high when the
    useful contexts come first. With no useful context the score is 0.0: the metric
    measures 0 (nothing retrieved helps), as Ragas does. ``details`` lists the verdicts.

    Notes
    -----
    Source: Ragas ``context_precision`` (Ragas docs; Es et al., "RAGAS: Automated
    Evaluation of Retrieval Augmented Generation", 2023), the variant that judges
    usefulness against the reference answer. Cost: one judge call per row.
    """

    name: ClassVar[str] = "context_precision"
    prompts: ClassVar[tuple[StepPrompt, ...]] = (PROMPT,)
    version: ClassVar[int] = 1
    inputs: ClassVar[tuple[str, ...]] = (QUESTION, CONTEXTS, REFERENCE)
    nonblank: ClassVar[str] = REFERENCE
    boolean: ClassVar[bool] = False
    summary: ClassVar[str] = (
        "Average precision of the contexts useful for arriving at the "
        "reference answer (useful ones ranked first score higher)"
    )
    source: ClassVar[str] = "Ragas context_precision (Es et al. 2023, RAGAS; Ragas docs)"
    policy: ClassVar[tuple[tuple[str, str], ...]] = (
        ("question, contexts or reference is null", "missing_input"),
        ("reference empty or only whitespace", "missing_input; reason 'reference is empty'"),
        (
            "answer null, empty or a refusal (no claims)",
            "not read: usefulness is judged against the reference answer",
        ),
        ("contexts is an empty list", "missing_input; reason 'contexts is an empty list'"),
        ("every context chunk is blank", "missing_input; reason 'every context is empty'"),
        ("no context is useful", "score 0.0 with a reason: the metric measures 0, as Ragas does"),
        (
            "a context chunk is junk (markup, boilerplate)",
            "judged like any other context: "
            "not useful; ranked above useful ones, it lowers the score",
        ),
        *FAILURE_POLICY,
    )
    judge_examples: ClassVar[tuple[JudgeExample, ...]] = (
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: [
                    "The Saturn V was a rocket.",
                    "Apollo 11 landed on the Moon on 20 July 1969.",
                    "The landing came at 20:17 UTC on 20 July 1969.",
                ],
                REFERENCE: "Apollo 11 landed on 20 July 1969.",
            },
            replies=(
                '{"verdicts": [{"reason": "About the rocket.", "verdict": 0}, {"reason": '
                '"States the date.", "verdict": 1}, {"reason": "States the date.", '
                '"verdict": 1}]}',
            ),
            score=(1 / 2 + 2 / 3) / 2,
            note="useful at ranks 2 and 3: (1/2 + 2/3) / 2",
        ),
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: ["The Saturn V was a rocket.", "Home | About"],
                REFERENCE: "On 20 July 1969.",
            },
            replies=(
                '{"verdicts": [{"reason": "About the rocket.", "verdict": 0}, '
                '{"reason": "Navigation.", "verdict": 0}]}',
            ),
            score=0.0,
            note="no useful context: a measured 0",
        ),
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: ["Apollo 11 landed in 1969."],
                ANSWER: "1969.",
                REFERENCE: None,
            },
            replies=(),
            score=None,
            status=MISSING_INPUT,
            note="null reference: no judge call",
        ),
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: ["Apollo 11 landed in 1969."],
                REFERENCE: "In 1969.",
            },
            replies=(
                '{"verdicts": []}',
                '{"verdicts": [{"reason": "States it.", "verdict": 1}, '
                '{"reason": "States it.", "verdict": 1}]}',
            ),
            score=None,
            status="parse_failure",
            note="no verdict, then two, for one context",
        ),
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: ["The Saturn V was a rocket.", "Apollo 11 landed on 20 July 1969."],
                ANSWER: "In 1969.",
                REFERENCE: "On 20 July 1969.",
            },
            replies=('{"verdicts": [0, 1]}',),
            score=0.5,
            params={"reasons": False},
            note="reasons: false, bare verdicts; the useful context second: precision@2 = 1/2",
        ),
    )

    def step_fields(self, row: dict[str, Any]) -> dict[str, str]:
        return {"reference": row[REFERENCE]}

    def score_verdicts(self, verdicts: list[int]) -> PyCell:
        """The average precision of the verdicts (:func:`average_precision`)."""
        n = len(verdicts)
        useful = sum(verdicts)
        reason = None
        if useful == 0:
            reason = "no context is useful for arriving at the reference answer"
        elif useful < n:
            reason = f"{n - useful} of {n} contexts not useful for the reference answer"
        return PyCell(average_precision(verdicts), reason=reason, details={"verdicts": verdicts})
