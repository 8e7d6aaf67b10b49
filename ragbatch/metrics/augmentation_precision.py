"""``augmentation_precision``: the share of relevant contexts that the answer uses."""

from __future__ import annotations

import json
from typing import Any, ClassVar


from ragbatch.core.columns import ANSWER, CONTEXTS, QUESTION
from ragbatch.judge.policy import failure_policy
from ragbatch.judge.health import HealthFields
from ragbatch.judge.metric import JudgeExample, JudgeMetric, Program
from ragbatch.judge.parse import REASON_MAX_CHARS, parse_json
from ragbatch.judge.prompt import StepPrompt
from ragbatch.judge.protocol import Ask, OutputSpec, ParseError
from ragbatch.scoring.cells import (
    Guard,
    PyCell,
    blank,
    empty_contexts,
    every_context_blank,
    missing,
)
from ragbatch.scoring.registry import register
from ragbatch.core.status import MISSING_INPUT, NOT_APPLICABLE

#: Completion budget per context: a reason of REASON_MAX_CHARS (about 3 characters a
#: token) plus the item's keys and two 0/1 values.
ITEM_MAX_TOKENS = REASON_MAX_CHARS // 3 + 36

TASK = """\
For each retrieved context above, from [1] to [{n}], make two separate 0/1 judgments:
- "relevant": 1 when the context holds information that helps answer the question,
  0 when it does not;
- "used": 1 when the answer takes information from this context (stated there, quoted
  or paraphrased), 0 when it does not.
The two are independent: a context can be relevant but unused, or used but irrelevant.
Give one item per context, in the order of their numbers, each starting with a
one-sentence reason.

Reply with JSON: {{"verdicts": [{{"reason": "...", "relevant": 0 or 1, "used": 0 or 1}}, ...]}}
with exactly {n} items, the first for context [1]."""

#: The ``instructions_first`` layout's instruction set of this step (plain text).
INSTRUCTIONS = """\
For each retrieved context, in the order of their numbers, make two separate 0/1
judgments:
- "relevant": 1 when the context holds information that helps answer the question,
  0 when it does not;
- "used": 1 when the answer takes information from this context (stated there, quoted
  or paraphrased), 0 when it does not.
The two are independent: a context can be relevant but unused, or used but irrelevant.
Give one item per context, in the order of their numbers, each starting with a
one-sentence reason.

Reply with JSON: {"verdicts": [{"reason": "...", "relevant": 0 or 1, "used": 0 or 1},
...]}, one item per context, the first for context [1]."""

#: The ``instructions_first`` layout's ask of this step.
ASK = """\
Items in the reply: {n}."""

PROMPT = StepPrompt("augmentation_precision", TASK, INSTRUCTIONS, ASK)


def judgments_schema(n: int) -> dict[str, Any]:
    """``{"verdicts": [{"reason": str, "relevant": 0 | 1, "used": 0 | 1}, ...]}`` with
    exactly ``n`` items."""
    flag = {"type": "integer", "enum": [0, 1]}
    return {
        "type": "object",
        "properties": {
            "verdicts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "reason": {"type": "string", "maxLength": REASON_MAX_CHARS},
                        "relevant": flag,
                        "used": flag,
                    },
                    "required": ["reason", "relevant", "used"],
                    "additionalProperties": False,
                },
                "minItems": n,
                "maxItems": n,
            }
        },
        "required": ["verdicts"],
        "additionalProperties": False,
    }


def parse_judgments(text: str, n: int) -> list[tuple[int, int]]:
    """``(relevant, used)`` per context from a :func:`judgments_schema` reply.

    Raises
    ------
    ParseError
        Not JSON, a value other than 0 or 1, a missing key, or a number of items other
        than ``n`` (the message says "expected n verdicts, got m").
    """
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ParseError(f"reply is not JSON: {exc}") from None
    items = value.get("verdicts") if isinstance(value, dict) else None
    if isinstance(items, list) and len(items) != n:
        raise ParseError(f"expected {n} verdicts, got {len(items)}")
    value = parse_json(text, judgments_schema(n))
    return [(int(item["relevant"]), int(item["used"])) for item in value["verdicts"]]


@register
class AugmentationPrecision(JudgeMetric):
    """Share of the question-relevant contexts that the answer uses, in [0, 1].

    One judge step per row: for each context (by its number in the shared prompt block)
    the judge gives two 0/1 judgments, relevant to the question and used in the answer.
    The score is ``contexts relevant and used / relevant contexts``; ``details`` lists
    both judgments per context.

    Notes
    -----
    Source: Tonic Validate ``AugmentationPrecisionMetric`` (of the contexts relevant to
    the question, the fraction whose information the answer contains; Tonic combines its
    retrieval-precision and augmentation-accuracy judgments). Where no context is
    relevant Tonic scores 0.0; this metric returns ``not_applicable``, since the ratio
    has no denominator. Cost: one judge call per row (both judgments in one reply).
    """

    name: ClassVar[str] = "augmentation_precision"
    prompts: ClassVar[tuple[StepPrompt, ...]] = (PROMPT,)
    health: ClassVar[HealthFields] = HealthFields(verdicts="relevant")
    version: ClassVar[int] = 1
    inputs: ClassVar[tuple[str, ...]] = (QUESTION, CONTEXTS, ANSWER)
    boolean: ClassVar[bool] = False
    summary: ClassVar[str] = "Share of the question-relevant contexts that the answer uses"
    source: ClassVar[str] = "Tonic Validate AugmentationPrecisionMetric (augmentation precision)"
    policy: ClassVar[tuple[tuple[str, str], ...]] = (
        ("question, contexts or answer is null", "missing_input"),
        (
            "question empty or only whitespace",
            "missing_input; reason 'question is empty' (relevance needs a question)",
        ),
        ("answer empty or only whitespace", "missing_input; reason 'answer is empty'"),
        ("contexts is an empty list", "missing_input; reason 'contexts is an empty list'"),
        ("every context chunk is blank", "missing_input; reason 'every context is empty'"),
        (
            "no context is relevant to the question",
            "not_applicable; reason 'no context is relevant to the question' (Tonic: 0)",
        ),
        (
            "answer makes no claim (a refusal)",
            "judged: a refusal uses no context, so it "
            "scores 0.0 when some context is relevant; a measured 0",
        ),
        ("reference is null", "not read: the metric does not use the reference"),
        (
            "a context chunk is junk (markup, boilerplate)",
            "judged like any other context: irrelevant, so it leaves the ratio unchanged",
        ),
        *failure_policy(
            "item count differs from the number of contexts, a value other than 0/1, or a reply "
            "cut at max_tokens",
        ),
    )
    judge_examples: ClassVar[tuple[JudgeExample, ...]] = (
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land, and who commanded it?",
                CONTEXTS: [
                    "Apollo 11 landed on the Moon on 20 July 1969.",
                    "The Saturn V was the rocket of the Apollo programme.",
                    "Neil Armstrong commanded Apollo 11.",
                ],
                ANSWER: "Apollo 11 landed on 20 July 1969.",
            },
            replies=(
                '{"verdicts": [{"reason": "Gives the date; the answer uses it.", '
                '"relevant": 1, "used": 1}, {"reason": "About the rocket; unused.", '
                '"relevant": 0, "used": 0}, {"reason": "Names the commander; the answer '
                'leaves it out.", "relevant": 1, "used": 0}]}',
            ),
            score=0.5,
            note="two relevant contexts, one of them used",
        ),
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: ["The Saturn V was a rocket.", "Home | About | Contact"],
                ANSWER: "I could not find that.",
            },
            replies=(
                '{"verdicts": [{"reason": "About a rocket, not the landing.", '
                '"relevant": 0, "used": 0}, {"reason": "Navigation text.", '
                '"relevant": 0, "used": 0}]}',
            ),
            score=None,
            status=NOT_APPLICABLE,
            note="no relevant context: no denominator",
        ),
        JudgeExample(
            inputs={QUESTION: "   ", CONTEXTS: ["Apollo 11 landed in 1969."], ANSWER: "1969."},
            replies=(),
            score=None,
            status=MISSING_INPUT,
            note="blank question: no judge call",
        ),
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: ["Apollo 11 landed in 1969."],
                ANSWER: "In 1969.",
            },
            replies=(
                '{"verdicts": [{"reason": "Gives the year.", "relevant": 2, "used": 1}]}',
                '{"verdicts": [{"reason": "Gives the year.", "relevant": 1, "used": 1}, '
                '{"reason": "extra", "relevant": 0, "used": 0}]}',
            ),
            score=None,
            status="parse_failure",
            note="a value out of range, then two items for one context",
        ),
    )

    def guards(self) -> tuple[Guard, ...]:
        return (
            missing(QUESTION),
            missing(CONTEXTS),
            missing(ANSWER),
            blank(QUESTION),
            blank(ANSWER),
            empty_contexts(),
            every_context_blank(),
        )

    def program(self, row: dict[str, Any]) -> Program:
        n = len(row[CONTEXTS])
        [judgments] = yield [
            Ask(
                self.messages(row, PROMPT, n=n),
                OutputSpec.of_schema(judgments_schema(n), max_tokens=ITEM_MAX_TOKENS * n + 16),
                lambda text: parse_judgments(text, n),
                step="judgments",
            )
        ]
        relevant = [r for r, _ in judgments]
        used = [u for _, u in judgments]
        details = {"relevant": relevant, "used": used}
        n_relevant = sum(relevant)
        if n_relevant == 0:
            return PyCell(
                None, NOT_APPLICABLE, "no context is relevant to the question", details=details
            )
        n_used = sum(r and u for r, u in judgments)
        reason = None
        if n_used < n_relevant:
            reason = (
                f"{n_relevant - n_used} of {n_relevant} relevant contexts not used in the answer"
            )
        return PyCell(n_used / n_relevant, reason=reason, details=details)
