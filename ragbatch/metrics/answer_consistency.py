"""``answer_consistency``: the share of the answer's main points derivable from the contexts."""

from __future__ import annotations

from typing import ClassVar


from ragbatch.core.columns import ANSWER, CONTEXTS, QUESTION
from ragbatch.judge.verdicts import VERDICTS_INSTRUCTIONS_REPLY, VERDICTS_TASK_REPLY
from ragbatch.judge.policy import failure_policy
from ragbatch.judge.health import HealthFields
from ragbatch.judge.metric import JudgeExample
from ragbatch.judge.prompt import StepPrompt
from ragbatch.judge.statement_verdicts import LISTED_STATEMENTS_MAX_TOKENS, StatementVerdictMetric
from ragbatch.scoring.registry import register
from ragbatch.core.status import MISSING_INPUT, NOT_APPLICABLE

#: Completion budget of the main-points step (at most 20 points).
POINTS_MAX_TOKENS = LISTED_STATEMENTS_MAX_TOKENS
POINTS_TASK = """\
List the main points of the answer: the distinct pieces of information it gives in reply
to the question. Write each point as one sentence that can be read on its own (name
things instead of using pronouns), keeping the answer's meaning. Leave out filler such as
greetings, a restated question or an offer of more help. An answer that gives no
information (a refusal, "I cannot tell from the documents") has no main points: return
an empty list.

Reply with JSON: {"statements": ["...", ...]} with at most 20 points."""

#: The ``instructions_first`` layout's instruction set of this step (plain text).
POINTS_INSTRUCTIONS = POINTS_TASK  # the same text: this step's task needs no row-specific part

#: The ``instructions_first`` layout's ask of this step.
POINTS_ASK = ""

POINTS = StepPrompt("answer_consistency/main points", POINTS_TASK, POINTS_INSTRUCTIONS, POINTS_ASK)

DERIVABLE_TASK = (
    """\
Below are the main points of the answer. For each point, decide whether it can be
derived from the retrieved contexts alone. Verdict 1: the contexts state the point or it
follows from what they state. Verdict 0: the point needs information the contexts do not
give, or the contexts contradict it. Your own knowledge does not count. Give one verdict
per point, in the same order, each with a one-sentence reason.

Main points:
{points}

"""
    + VERDICTS_TASK_REPLY
    + "."
)

#: The ``instructions_first`` layout's instruction set of this step (plain text).
DERIVABLE_INSTRUCTIONS = (
    """\
The task lists main points of the answer. For each point, decide whether it can be
derived from the retrieved contexts alone. Verdict 1: the contexts state the point or it
follows from what they state. Verdict 0: the point needs information the contexts do not
give, or the contexts contradict it. Your own knowledge does not count. Give one verdict
per point, in the same order, each with a one-sentence reason.

"""
    + VERDICTS_INSTRUCTIONS_REPLY
    + " point."
)

#: The ``instructions_first`` layout's ask of this step.
DERIVABLE_ASK = """\
Main points:
{points}

Items in the reply: {n}."""

DERIVABLE = StepPrompt(
    "answer_consistency/verdicts", DERIVABLE_TASK, DERIVABLE_INSTRUCTIONS, DERIVABLE_ASK
)


@register
class AnswerConsistency(StatementVerdictMetric):
    """Consistency of the answer with the retrieved contexts, in [0, 1].

    Two judge steps per row: the judge lists the answer's main points, then gives a 0/1
    verdict per point on whether it can be derived from the contexts. The score is
    ``derivable points / main points``; ``details`` lists the points and verdicts.

    Notes
    -----
    Source: Tonic Validate ``AnswerConsistencyMetric`` (main points of the answer that
    can be derived from the context, over all main points). The question is shown to the
    judge when present but is not required. Where the answer has no main points (a
    refusal) the metric returns ``not_applicable`` rather than a number. Cost: two judge
    calls per row (one when the answer has no main points).
    """

    name: ClassVar[str] = "answer_consistency"
    prompts: ClassVar[tuple[StepPrompt, ...]] = (
        POINTS,
        DERIVABLE,
    )
    health: ClassVar[HealthFields] = HealthFields(extraction="main_points", verdicts="verdicts")
    version: ClassVar[int] = 1
    inputs: ClassVar[tuple[str, ...]] = (CONTEXTS, ANSWER)
    statements_of: ClassVar[str] = ANSWER
    extracted: ClassVar[str] = "main_points"
    statements_field: ClassVar[str] = "points"
    statements_max_tokens: ClassVar[int] = POINTS_MAX_TOKENS
    no_statements: ClassVar[str] = "the answer has no main points"
    missed: ClassVar[str] = "main points not derivable from the contexts"
    boolean: ClassVar[bool] = False
    summary: ClassVar[str] = (
        "Share of the answer's main points that can be derived from the contexts"
    )
    source: ClassVar[str] = "Tonic Validate AnswerConsistencyMetric (answer consistency)"
    policy: ClassVar[tuple[tuple[str, str], ...]] = (
        ("contexts or answer is null", "missing_input"),
        ("question is null", "judged: the question is optional and shown as '(not given)'"),
        ("answer empty or only whitespace", "missing_input; reason 'answer is empty'"),
        (
            "contexts is an empty list",
            "missing_input; reason 'contexts is an empty list' (nothing can support a point)",
        ),
        ("every context chunk is blank", "missing_input; reason 'every context is empty'"),
        (
            "answer makes no claim (a refusal)",
            "not_applicable; reason 'the answer has no main points'",
        ),
        ("reference is null", "not read: the metric does not use the reference"),
        (
            "a context chunk is junk (markup, boilerplate)",
            "judged like any other text: it supports no point, so it cannot raise the score",
        ),
        *failure_policy(
            "verdict count differs from the number of points, or a reply cut at max_tokens",
        ),
    )
    judge_examples: ClassVar[tuple[JudgeExample, ...]] = (
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: [
                    "Apollo 11 landed on the "
                    "Moon on 20 July 1969, with Neil Armstrong and Buzz Aldrin aboard the lunar "
                    "module."
                ],
                ANSWER: "Apollo 11 landed on 20 July 1969. Armstrong was the "
                "first to step out, and the crew brought back 22 kg of rock.",
            },
            replies=(
                '{"statements": ["Apollo 11 landed on 20 July 1969.", "Neil Armstrong was '
                'the first to step out of the lunar module.", "The Apollo 11 crew brought '
                'back 22 kg of rock."]}',
                '{"verdicts": [{"reason": "The date is stated.", "verdict": 1}, {"reason": '
                '"The context does not say who stepped out first.", "verdict": 0}, '
                '{"reason": "No sample mass is given.", "verdict": 0}]}',
            ),
            score=1 / 3,
            note="one of three main points derivable",
        ),
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: ["Apollo 11 landed in 1969."],
                ANSWER: "Sorry, I can't answer that.",
            },
            replies=('{"statements": []}',),
            score=None,
            status=NOT_APPLICABLE,
            note="a refusal has no main points",
        ),
        JudgeExample(
            inputs={QUESTION: "When did Apollo 11 land?", CONTEXTS: ["", "  "], ANSWER: "In 1969."},
            replies=(),
            score=None,
            status=MISSING_INPUT,
            note="every context chunk blank: no judge call",
        ),
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: ["Apollo 11 landed in 1969."],
                ANSWER: "It landed in 1969.",
            },
            replies=(
                '{"statements": ["Apollo 11 landed in 1969."]}',
                '{"verdicts": [{"reason": "stated", "verdict": 1}, '
                '{"reason": "stated", "verdict": 1}]}',
                ("length", '{"verdicts": [{"reason": "The context states the ye'),
            ),
            score=None,
            status="parse_failure",
            note="two verdicts for one point, then a reply cut at max_tokens",
        ),
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: ["Apollo 11 landed on the Moon on 20 July 1969."],
                ANSWER: "Apollo 11 landed on the Moon on 20 July 1969.",
            },
            replies=(
                '{"statements": ["Apollo 11 landed on the Moon.", "It landed on 20 July 1969."]}',
                '{"verdicts": [1, 1]}',
            ),
            score=1.0,
            params={"reasons": False},
            note="reasons: false, bare verdicts",
        ),
    )
