"""``answer_similarity``: a 0-5 rating of how well the answer matches the reference answer."""

from __future__ import annotations

from typing import Any, ClassVar

from ragbatch.core.columns import ANSWER, CONTEXTS, QUESTION, REFERENCE
from ragbatch.judge.policy import SHARED_BLOCK, failure_policy
from ragbatch.judge.metric import JudgeExample, JudgeMetric, Program, ScoreParams
from ragbatch.judge.parse import parse_choice
from ragbatch.judge.prompt import StepPrompt
from ragbatch.judge.protocol import Ask, OutputSpec, VerdictSlots
from ragbatch.scoring.cells import Guard, PyCell, blank, missing
from ragbatch.scoring.registry import register
from ragbatch.core.status import MISSING_INPUT

#: The replies the judge may give: one digit.
RATINGS = ("0", "1", "2", "3", "4", "5")
#: The rating is the whole reply; each is worth its number.
SLOTS = VerdictSlots(tuple((r, float(r)) for r in RATINGS))

TASK = """\
Rate how well the answer above agrees with the reference answer below, taken as replies
to the question above. Compare meaning, not wording: a paraphrase that conveys the same
information is a full match. Do not use the retrieved contexts for this task.

5: conveys what the reference conveys; nothing important missing or contradicted
4: agrees with the reference, with a minor omission or a small inaccuracy
3: partly agrees; some key points of the reference are missing or wrong
2: mostly differs; only a small part of the reference is there
1: barely related to the reference
0: unrelated to the reference, contradicts it, or gives no answer at all

Reference answer:
{reference}

Reply with one digit from 0 to 5 and nothing else."""

#: The ``instructions_first`` layout's instruction set of this step (plain text).
INSTRUCTIONS = """\
Rate how well the answer agrees with the reference answer, taken as replies to the
question. Compare meaning, not wording: a paraphrase that conveys the same
information is a full match. Do not use the retrieved contexts for this task.

5: conveys what the reference conveys; nothing important missing or contradicted
4: agrees with the reference, with a minor omission or a small inaccuracy
3: partly agrees; some key points of the reference are missing or wrong
2: mostly differs; only a small part of the reference is there
1: barely related to the reference
0: unrelated to the reference, contradicts it, or gives no answer at all

Reply with one digit from 0 to 5 and nothing else."""

#: The ``instructions_first`` layout's ask of this step.
ASK = ""

PROMPT = StepPrompt("answer_similarity", TASK, INSTRUCTIONS, ASK)


def parse_rating(text: str) -> int:
    """The rating of a reply: one of the digits 0-5.

    Raises
    ------
    ParseError
        Any other reply (a number out of range, prose).
    """
    return int(parse_choice(text, RATINGS))


@register
class AnswerSimilarity(JudgeMetric):
    """Similarity of the answer to the reference answer, rated 0 to 5 (higher is closer).

    One judge step per row: the judge reads the question, the answer and the reference
    answer and replies with a single digit, 0 (unrelated or contradicting) to 5 (the
    same meaning). The score is that digit as a float; ``details`` keeps it as
    ``rating``.

    Notes
    -----
    Source: Tonic Validate ``AnswerSimilarityMetric`` (answer similarity score, 0-5,
    judged by an LLM against the reference answer given the question). The rubric per
    rating is this package's own. Tonic raises on a missing reference; this metric
    returns ``missing_input``. Cost: one judge call per row with a one-token reply
    (structured output: a choice of six digits).
    """

    Params = ScoreParams
    name: ClassVar[str] = "answer_similarity"
    prompts: ClassVar[tuple[StepPrompt, ...]] = (PROMPT,)
    version: ClassVar[int] = 1
    inputs: ClassVar[tuple[str, ...]] = (QUESTION, ANSWER, REFERENCE)
    score_range: ClassVar[tuple[float, float]] = (0.0, 5.0)
    boolean: ClassVar[bool] = False
    summary: ClassVar[str] = "0-5 rating of how well the answer matches the reference answer"
    source: ClassVar[str] = "Tonic Validate AnswerSimilarityMetric (answer similarity score, 0-5)"
    policy: ClassVar[tuple[tuple[str, str], ...]] = (
        ("question, answer or reference is null", "missing_input"),
        ("answer empty or only whitespace", "missing_input; reason 'answer is empty'"),
        (
            "reference empty or only whitespace",
            "missing_input; reason 'reference is empty' (Tonic raises)",
        ),
        (
            "contexts null or an empty list",
            "not read: the rating compares answer and reference "
            "only; the shared prompt block shows '(none)' or '(not given)'",
        ),
        (
            "answer is a refusal (no claims)",
            "judged: a refusal does not convey a substantive "
            "reference, so it rates 0 or 1; a measured rating, not a failure",
        ),
        (
            "a context chunk is junk (markup, boilerplate)",
            "no effect: the task tells the judge "
            "not to use the contexts (they stay in the shared prompt block)",
        ),
        *failure_policy(
            "reply not a single digit 0-5 (out of range, prose) or cut at max_tokens",
            SHARED_BLOCK,
        ),
    )
    judge_examples: ClassVar[tuple[JudgeExample, ...]] = (
        JudgeExample(
            inputs={
                QUESTION: "Who wrote Hamlet?",
                CONTEXTS: ["Hamlet is a tragedy by William Shakespeare."],
                ANSWER: "It was written by William Shakespeare.",
                REFERENCE: "William Shakespeare wrote Hamlet.",
            },
            replies=("5",),
            score=5.0,
            note="same meaning, different wording",
        ),
        JudgeExample(
            inputs={
                QUESTION: "Who wrote Hamlet and when?",
                CONTEXTS: [],
                ANSWER: "Shakespeare wrote it.",
                REFERENCE: "William Shakespeare wrote Hamlet around 1600.",
            },
            replies=("3",),
            score=3.0,
            note="the date is missing; contexts are not needed",
        ),
        JudgeExample(
            inputs={
                QUESTION: "Who wrote Hamlet?",
                CONTEXTS: ["Hamlet is a tragedy."],
                ANSWER: "Shakespeare.",
                REFERENCE: "   ",
            },
            replies=(),
            score=None,
            status=MISSING_INPUT,
            note="blank reference: settled before any judge call",
        ),
        JudgeExample(
            inputs={
                QUESTION: "Who wrote Hamlet?",
                CONTEXTS: ["Hamlet is a tragedy."],
                ANSWER: "Shakespeare.",
                REFERENCE: "William Shakespeare.",
            },
            replies=("7", "The answer matches: 5"),
            score=None,
            status="parse_failure",
            note="out-of-range digit, then prose on the retry",
        ),
    )

    def guards(self) -> tuple[Guard, ...]:
        return (
            missing(QUESTION),
            missing(ANSWER),
            missing(REFERENCE),
            blank(ANSWER),
            blank(REFERENCE),
        )

    def program(self, row: dict[str, Any]) -> Program:
        [rating] = yield [
            Ask(
                self.messages(row, PROMPT, reference=row[REFERENCE]),
                OutputSpec.of_choice(RATINGS, max_tokens=4),
                parse_rating,
                step="rating",
                verdicts=SLOTS,
            )
        ]
        return PyCell(float(rating), details={"rating": rating})
