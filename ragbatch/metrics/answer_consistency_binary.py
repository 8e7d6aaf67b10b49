"""``answer_consistency_binary``: 1 when the answer holds nothing the contexts do not support."""

from __future__ import annotations

from typing import Any, ClassVar

from ragbatch.core.columns import ANSWER, CONTEXTS, QUESTION
from ragbatch.judge.policy import failure_policy
from ragbatch.judge.health import HealthFields
from ragbatch.judge.metric import JudgeExample, JudgeMetric, Program, ScoreParams
from ragbatch.judge.parse import REASON_MAX_CHARS, parse_json
from ragbatch.judge.prompt import StepPrompt
from ragbatch.judge.protocol import Ask, OutputSpec, VerdictSlots
from ragbatch.scoring.cells import Guard, PyCell, context_guards
from ragbatch.scoring.registry import register
from ragbatch.core.status import NOT_APPLICABLE

#: The reply: a reason first (property names sort into generation order), then whether
#: the answer states anything at all, then the verdict.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "reason": {"type": "string", "maxLength": REASON_MAX_CHARS},
        "states_claims": {"type": "boolean"},
        "unattributable": {"type": "boolean"},
    },
    "required": ["reason", "states_claims", "unattributable"],
    "additionalProperties": False,
}
#: The verdict scored: ``unattributable`` false is worth 1.0. (``states_claims`` only
#: decides whether the row is scored at all.)
SLOTS = VerdictSlots((("false", 1.0), ("true", 0.0)), key="unattributable")
#: Completion budget: a reason of REASON_MAX_CHARS (about 3 characters a token) plus the
#: keys and two booleans.
MAX_TOKENS = REASON_MAX_CHARS // 3 + 32

TASK = """\
Decide whether the answer contains any information that cannot be attributed to the
retrieved contexts: a fact, number, name or claim that the contexts do not state and
that does not follow from them. Restating or summarising what the contexts say is
attributable. Judge against the contexts only, not against your own knowledge.

Give a one-sentence reason first. Set "states_claims" to false when the answer gives no
information at all (a refusal, "I don't know"), true otherwise. Set "unattributable" to
true when at least one piece of information in the answer is not attributable to the
contexts, false when all of it is.

Reply with JSON: {"reason": "...", "states_claims": true or false,
"unattributable": true or false}"""

#: The ``instructions_first`` layout's instruction set of this step (plain text).
INSTRUCTIONS = TASK  # the same text: this step's task needs no row-specific part

#: The ``instructions_first`` layout's ask of this step.
ASK = ""

PROMPT = StepPrompt("answer_consistency_binary", TASK, INSTRUCTIONS, ASK)


def parse_reply(text: str) -> dict[str, Any]:
    """The reply as a dict of :data:`SCHEMA`.

    Raises
    ------
    ParseError
        Not JSON, or not of the schema's shape.
    """
    return parse_json(text, SCHEMA)


@register
class AnswerConsistencyBinary(JudgeMetric):
    """Whether everything in the answer is attributable to the retrieved contexts: 1.0 or 0.0.

    One judge step per row: the judge decides whether the answer contains any
    information that the contexts do not support, and whether the answer states anything
    at all. The score is 1.0 when nothing is unattributable and 0.0 otherwise; the
    judge's reason is kept in ``details`` (and in ``reason`` for a 0).

    Notes
    -----
    Source: Tonic Validate ``AnswerConsistencyBinaryMetric`` (true when the answer
    contains no information that is not attributable to the context). Tonic scores a
    refusal as consistent (it states nothing unsupported); this metric asks the judge
    whether the answer states anything and returns ``not_applicable`` when it does not,
    in line with ``answer_consistency`` and ``faithfulness``. Cost: one judge call per row.
    """

    Params = ScoreParams
    name: ClassVar[str] = "answer_consistency_binary"
    prompts: ClassVar[tuple[StepPrompt, ...]] = (PROMPT,)
    health: ClassVar[HealthFields] = HealthFields(reason="reason", usual_score=1.0)
    version: ClassVar[int] = 1
    inputs: ClassVar[tuple[str, ...]] = (CONTEXTS, ANSWER)
    boolean: ClassVar[bool] = True
    summary: ClassVar[str] = "1 when the answer holds no information the contexts do not support"
    source: ClassVar[str] = (
        "Tonic Validate AnswerConsistencyBinaryMetric (binary answer consistency)"
    )
    policy: ClassVar[tuple[tuple[str, str], ...]] = (
        ("contexts or answer is null", "missing_input"),
        ("question is null", "judged: the question is optional and shown as '(not given)'"),
        ("answer empty or only whitespace", "missing_input; reason 'answer is empty'"),
        ("contexts is an empty list", "missing_input; reason 'contexts is an empty list'"),
        ("every context chunk is blank", "missing_input; reason 'every context is empty'"),
        (
            "answer makes no claim (a refusal)",
            "not_applicable; reason 'the answer makes no "
            "claims' (the judge reports states_claims false; Tonic: 1)",
        ),
        ("reference is null", "not read: the metric does not use the reference"),
        (
            "a context chunk is junk (markup, boilerplate)",
            "judged like any other text: it supports nothing, so it cannot turn a 0 into a 1",
        ),
        *failure_policy("reply not of the schema (prose, a missing key) or cut at max_tokens"),
    )
    judge_examples: ClassVar[tuple[JudgeExample, ...]] = (
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: ["Apollo 11 landed on the Moon on 20 July 1969."],
                ANSWER: "It landed on 20 July 1969.",
            },
            replies=(
                '{"reason": "The date is stated in context 1.", "states_claims": true, '
                '"unattributable": false}',
            ),
            score=1.0,
            note="everything attributable",
        ),
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: ["Apollo 11 landed on the Moon on 20 July 1969."],
                ANSWER: "It landed on 20 July 1969, after a four-day flight.",
            },
            replies=(
                '{"reason": "The flight duration is not in the contexts.", '
                '"states_claims": true, "unattributable": true}',
            ),
            score=0.0,
            note="one detail is not in the contexts",
        ),
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: ["Apollo 11 landed in 1969."],
                ANSWER: "I don't know.",
            },
            replies=(
                '{"reason": "The answer declines to answer.", "states_claims": false, '
                '"unattributable": false}',
            ),
            score=None,
            status=NOT_APPLICABLE,
            note="a refusal states nothing",
        ),
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: ["Apollo 11 landed in 1969."],
                ANSWER: "In 1969.",
            },
            replies=("Yes, everything is supported.", '{"unattributable": false}'),
            score=None,
            status="parse_failure",
            note="prose, then JSON without the reason and states_claims keys",
        ),
    )

    def guards(self) -> tuple[Guard, ...]:
        return context_guards(self.inputs, ANSWER)

    def program(self, row: dict[str, Any]) -> Program:
        [reply] = yield [
            Ask(
                self.messages(row, PROMPT),
                OutputSpec.of_schema(SCHEMA, max_tokens=MAX_TOKENS),
                parse_reply,
                step="attribution",
                verdicts=SLOTS,
            )
        ]
        details = {
            "reason": reply["reason"],
            "states_claims": reply["states_claims"],
            "unattributable": reply["unattributable"],
        }
        if not reply["states_claims"]:
            return PyCell(None, NOT_APPLICABLE, "the answer makes no claims", details=details)
        if reply["unattributable"]:
            why = reply["reason"].strip() or "the answer holds unattributable information"
            return PyCell(0.0, reason=why, details=details)
        return PyCell(1.0, details=details)
