"""Base of the judge metrics that read the answer alone and return one reasoned yes/no
verdict (``duplication``, ``hate_speech``): one judge call per row, score 1.0 when the
verdict is true, else 0.0, the judge's reason kept in ``details``."""

from __future__ import annotations

from typing import Any, ClassVar

from ragbatch.core.columns import ANSWER
from ragbatch.judge.metric import JudgeMetric, Program, ScoreParams
from ragbatch.judge.parse import REASON_MAX_CHARS, parse_json
from ragbatch.judge.policy import SHARED_BLOCK, failure_policy
from ragbatch.judge.protocol import Ask, OutputSpec, VerdictSlots
from ragbatch.scoring.cells import Guard, PyCell, blank, missing

#: The reply: a reason, then the verdict (generated in this order).
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "reason": {"type": "string", "maxLength": REASON_MAX_CHARS},
        "verdict": {"type": "boolean"},
    },
    "required": ["reason", "verdict"],
    "additionalProperties": False,
}
#: Where the reply holds its verdict.
SLOTS = VerdictSlots((("true", 1.0), ("false", 0.0)), key="verdict")
#: Completion budget: a reason of REASON_MAX_CHARS (about 3 characters a token) plus the
#: keys and a boolean.
MAX_TOKENS = REASON_MAX_CHARS // 3 + 24

#: The reply format that ends the step's task (after a blank line): the JSON of
#: :data:`SCHEMA`.
REPLY_FORMAT = 'Reply with JSON: {"reason": "...", "verdict": true or false}'

#: The first rows of every such metric's ``policy``: the inputs it guards and those it
#: does not read.
INPUT_POLICY: tuple[tuple[str, str], ...] = (
    ("answer is null", "missing_input"),
    ("answer empty or only whitespace", "missing_input; reason 'answer is empty'"),
    (
        "question or contexts null, or contexts an empty list",
        "not read: only the answer's text is judged",
    ),
)

#: The last rows of every such metric's ``policy``: the failures its one step can meet.
FAILURE_POLICY: tuple[tuple[str, str], ...] = failure_policy(
    "reply not of the schema (prose, a verdict that is not a boolean) or cut at max_tokens",
    SHARED_BLOCK,
)


def parse_reply(text: str) -> dict[str, Any]:
    """The reply as a dict of :data:`SCHEMA`.

    Raises
    ------
    ParseError
        Not JSON, or not of the schema's shape.
    """
    return parse_json(text, SCHEMA)


class AnswerVerdictMetric(JudgeMetric):
    """A judge metric asking one reasoned true/false question about the answer.

    Subclasses set :attr:`prompts` (the one step's prompt, its reply format last) and
    :attr:`positive_reason` (the cell's reason for a true verdict whose reason is blank).
    Guards: a null or blank answer is ``missing_input``.
    """

    Params = ScoreParams
    inputs: ClassVar[tuple[str, ...]] = (ANSWER,)
    boolean: ClassVar[bool] = True
    positive_reason: ClassVar[str]

    def guards(self) -> tuple[Guard, ...]:
        return (missing(ANSWER), blank(ANSWER))

    def program(self, row: dict[str, Any]) -> Program:
        [reply] = yield [
            Ask(
                self.messages(row, self.prompts[0]),
                OutputSpec.of_schema(SCHEMA, max_tokens=MAX_TOKENS),
                parse_reply,
                step=self.name,
                verdicts=SLOTS,
            )
        ]
        details = {"reason": reply["reason"]}
        if reply["verdict"]:
            return PyCell(
                1.0, reason=reply["reason"].strip() or self.positive_reason, details=details
            )
        return PyCell(0.0, details=details)
