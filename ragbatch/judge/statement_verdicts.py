"""Base of the two-step judge metrics that split a text into statements, then give one
0/1 verdict per statement against the retrieved contexts (``faithfulness``,
``answer_consistency``, ``context_recall``), and the statements request they share with
``factual_correctness``."""

from __future__ import annotations

from typing import Any, ClassVar

from ragbatch.core.status import NOT_APPLICABLE
from ragbatch.judge.assumed import assumed_statements
from ragbatch.judge.metric import Program
from ragbatch.judge.parse import (
    MAX_STATEMENTS,
    STATEMENT_MAX_CHARS,
    parse_statements,
    statements_schema,
)
from ragbatch.judge.prompt import numbered
from ragbatch.judge.protocol import Ask, Message, OutputSpec
from ragbatch.judge.verdicts import REASONED_VERDICT_MAX_TOKENS, VerdictMetric
from ragbatch.scoring.cells import Guard, PyCell, context_guards, share_cell

#: Completion budget of a statements step whose task caps the list at 20 items: the
#: longest reply the schema allows (MAX_STATEMENTS strings of STATEMENT_MAX_CHARS, at
#: about 3 characters a token) plus quotes, commas and the surrounding object.
LISTED_STATEMENTS_MAX_TOKENS = MAX_STATEMENTS * (STATEMENT_MAX_CHARS // 3 + 8) + 16

#: The ``instructions_first`` layout's ask of a verdict step over numbered statements.
STATEMENT_VERDICTS_ASK = """\
Statements:
{statements}

Items in the reply: {n}."""


def statements_ask(messages: tuple[Message, ...], max_tokens: int, step: str) -> Ask:
    """The request of a statements step: structured output
    :func:`~ragbatch.judge.parse.statements_schema`, ``max_tokens`` of reply, parsed
    into the list of statements (:func:`~ragbatch.judge.parse.parse_statements`)."""
    return Ask(
        messages,
        OutputSpec.of_schema(statements_schema(), max_tokens=max_tokens),
        parse_statements,
        step=step,
    )


class StatementVerdictMetric(VerdictMetric):
    """A judge metric that splits :attr:`statements_of`'s text into statements, then asks one
    0/1 verdict per statement; the score is ``statements with verdict 1 / statements``.

    Subclasses set :attr:`prompts` (the statements step, then the verdict step, whose
    task lists the statements under the field :attr:`statements_field` and takes
    ``{n}``), :attr:`statements_of`, :attr:`extracted`, :attr:`statements_max_tokens`,
    :attr:`verdict_max_tokens`, :attr:`no_statements` and :attr:`missed`; both steps
    take the fields of :meth:`step_fields` too. The verdict step is the metric's
    ``verdict_prompts``. Guards (:func:`~ragbatch.scoring.cells.context_guards`): a null
    value in any of :attr:`inputs`, a blank :attr:`statements_of`, an empty context list or one
    of blank chunks only are ``missing_input``. A text with no statement is
    ``not_applicable`` (one judge call).
    """

    judge_steps: ClassVar[int] = 2
    #: The input split into statements (its blank text is ``missing_input``).
    statements_of: ClassVar[str]
    #: The statements step's name, and the ``details`` key of the statements.
    extracted: ClassVar[str]
    #: The verdict step's template field holding the numbered statements.
    statements_field: ClassVar[str] = "statements"
    #: ``max_tokens`` of the statements step.
    statements_max_tokens: ClassVar[int]
    #: The verdict step's ``max_tokens`` per verdict with its reason.
    verdict_max_tokens: ClassVar[int] = REASONED_VERDICT_MAX_TOKENS
    #: The ``not_applicable`` cell's reason when the text has no statement.
    no_statements: ClassVar[str]
    #: What the reason calls the statements with verdict 0 (:func:`share_cell`).
    missed: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        if "prompts" in cls.__dict__ and "verdict_prompts" not in cls.__dict__:
            cls.verdict_prompts = cls.prompts[1:]
        super().__init_subclass__(**kwargs)

    def guards(self) -> tuple[Guard, ...]:
        return context_guards(self.inputs, self.statements_of)

    def assumed_result(self, row: dict[str, Any], ask: Ask) -> Any:
        """Dry runs assume the judge's statements are the sentences of the text split."""
        return assumed_statements(row[self.statements_of])

    def step_fields(self, row: dict[str, Any]) -> dict[str, str]:
        """Template fields of both steps besides the statements and ``n`` (default:
        none)."""
        return {}

    def program(self, row: dict[str, Any]) -> Program:
        fields = self.step_fields(row)
        [statements] = yield [
            statements_ask(
                self.messages(row, self.prompts[0], **fields),
                self.statements_max_tokens,
                step=self.extracted,
            )
        ]
        if not statements:
            return PyCell(None, NOT_APPLICABLE, self.no_statements, details={self.extracted: []})
        n = len(statements)
        [verdicts] = yield [
            self.verdicts_ask(
                row,
                self.prompts[1],
                n,
                max_tokens_per_verdict=self.verdict_max_tokens,
                **fields,
                **{self.statements_field: numbered(statements)},
            )
        ]
        return share_cell(
            sum(verdicts),
            n,
            self.missed,
            details={self.extracted: statements, "verdicts": verdicts},
        )
