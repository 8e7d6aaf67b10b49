"""The pairwise preference judge: which of two answers to one question is better.

Used by ``ragbatch pairwise`` (:mod:`ragbatch.ops.pairwise`), not a metric of job
configs: it is not registered with the metric registry. It runs through the judge
machinery (:class:`~ragbatch.judge.run.JudgeRunner`, the judgment cache, parse retries,
token accounting and cell statuses) on rows whose canonical columns carry one pair in
one order:

- ``question``: the question both answers reply to;
- ``answer``: the answer shown first, as "A";
- ``reference``: the answer shown second, as "B" (the judge machinery carries the
  canonical columns only, so the second answer travels in the reference column; it is
  never read as a reference answer).

One judge call per row. The reply is ``{"reason": ..., "verdict": "A" | "B" | "tie"}``;
the cell's score is 1.0 for "A", 0.0 for "B", 0.5 for a tie, and ``details`` holds the
reason and the verdict.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from ragbatch.core.columns import ANSWER, QUESTION, REFERENCE
from ragbatch.judge.metric import JudgeMetric, Program
from ragbatch.judge.parse import REASON_MAX_CHARS, parse_json
from ragbatch.judge.protocol import Ask, Message, OutputSpec
from ragbatch.scoring.base import StrictParams
from ragbatch.scoring.cells import Guard, PyCell, missing

#: The verdicts a reply may give, and the cell score of each.
VERDICT_SCORES: dict[str, float] = {"A": 1.0, "B": 0.0, "tie": 0.5}

#: The reply: a reason, then the verdict (generated in this order).
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "reason": {"type": "string", "maxLength": REASON_MAX_CHARS},
        "verdict": {"type": "string", "enum": list(VERDICT_SCORES)},
    },
    "required": ["reason", "verdict"],
    "additionalProperties": False,
}

#: Completion budget: a reason of REASON_MAX_CHARS (about 3 characters a token) plus the
#: keys and the verdict.
MAX_TOKENS = REASON_MAX_CHARS // 3 + 24

#: The criteria of the built-in preference prompt.
BUILTIN_CRITERIA = (
    "Prefer the answer that answers the question more correctly, completely and "
    "directly. Do not prefer an answer for being longer, and do not let the order in "
    "which the answers are shown affect your decision."
)

#: The system message of every request; ``{criteria}`` is the built-in criteria or the
#: config's rubric.
SYSTEM = """\
You compare two answers to the same question and decide which one is better.

{criteria}

Give a one-sentence reason first, then the verdict: "A" when answer A is better, "B"
when answer B is better, "tie" when neither is better.

Reply with JSON: {{"reason": "...", "verdict": "A" or "B" or "tie"}}"""

#: The user message: the question and the two answers, each between markers.
USER = """\
[Question]
{question}

[Answer A]
{first}
[End of answer A]

[Answer B]
{second}
[End of answer B]"""


class PairwiseParams(StrictParams):
    """Params of the pairwise preference judge."""

    criteria: str = Field(
        BUILTIN_CRITERIA,
        min_length=1,
        description="what makes one answer better than the other (the built-in criteria, "
        "or the rubric written in the pairwise config)",
    )


def parse_reply(text: str) -> dict[str, Any]:
    """The reply as a dict of :data:`SCHEMA`.

    Raises
    ------
    ParseError
        Not JSON, or not of the schema's shape (a verdict other than A, B or tie).
    """
    return parse_json(text, SCHEMA)


def pair_messages(question: str, first: str, second: str, criteria: str) -> tuple[Message, ...]:
    """The chat of one (pair, order): the system message with ``criteria``, then the
    question with ``first`` shown as answer A and ``second`` as answer B."""
    return (
        Message("system", SYSTEM.format(criteria=criteria.strip())),
        Message("user", USER.format(question=question, first=first, second=second)),
    )


class PairwisePreference(JudgeMetric):
    """Preference between two answers shown as A (``answer``) and B (``reference``).

    Score 1.0 when the judge prefers A, 0.0 when it prefers B, 0.5 for a tie; ``details``
    ``{"reason": str, "verdict": "A" | "B" | "tie"}``. A null question or answer is
    ``missing_input`` (no call). A reply that is not of :data:`SCHEMA` after the parse
    retries is ``parse_failure``, as for every judge metric.
    """

    Params = PairwiseParams
    name: ClassVar[str] = "pairwise_preference"
    version: ClassVar[int] = 1
    inputs: ClassVar[tuple[str, ...]] = (QUESTION, ANSWER, REFERENCE)
    boolean: ClassVar[bool] = False
    summary: ClassVar[str] = "1 when the judge prefers answer A, 0 for B, 0.5 for a tie"
    source: ClassVar[str] = (
        "pairwise comparison with both orders (Zheng et al. 2023, MT-Bench and Chatbot Arena)"
    )

    @property
    def prompt_layout(self) -> Any:
        """``row_first``: the program builds its own chat (:func:`pair_messages`)."""
        return "row_first"

    def guards(self) -> tuple[Guard, ...]:
        return (missing(QUESTION), missing(ANSWER), missing(REFERENCE))

    def program(self, row: dict[str, Any]) -> Program:
        criteria = getattr(self.params, "criteria", BUILTIN_CRITERIA)
        messages = pair_messages(row[QUESTION], row[ANSWER], row[REFERENCE], criteria)
        [reply] = yield [
            Ask(
                messages,
                OutputSpec.of_schema(SCHEMA, max_tokens=MAX_TOKENS),
                parse_reply,
                step=self.name,
            )
        ]
        verdict = reply["verdict"]
        return PyCell(
            VERDICT_SCORES[verdict],
            reason=reply["reason"].strip() or None,
            details={"reason": reply["reason"], "verdict": verdict},
        )
