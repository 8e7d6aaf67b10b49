"""Base of the judge metrics that give one 0/1 verdict per retrieved context
(``augmentation_accuracy``, ``retrieval_precision``, ``context_precision``): one judge
call per row asks for exactly ``len(contexts)`` verdicts, the contexts referred to by
their numbers in the shared prompt block; ``details`` lists the verdicts."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

from ragbatch.core.columns import CONTEXTS
from ragbatch.judge.policy import failure_policy
from ragbatch.judge.health import HealthFields
from ragbatch.judge.metric import Program
from ragbatch.judge.verdicts import (
    REASONED_VERDICT_MAX_TOKENS,
    VERDICTS_INSTRUCTIONS_REPLY,
    VERDICTS_TASK_REPLY,
    VerdictMetric,
)
from ragbatch.scoring.cells import Guard, PyCell, context_guards

#: The ``instructions_first`` layout's ask of a per-context verdict step.
ASK = "Items in the reply: {n}."

#: The reply format that ends the task of every such step (a ``str.format`` template
#: taking ``{n}``, after a blank line).
TASK_REPLY = VERDICTS_TASK_REPLY + ", the first for context [1]."

#: The reply format that ends the ``instructions_first`` layout's instructions of every
#: such step (plain text).
INSTRUCTIONS_REPLY = VERDICTS_INSTRUCTIONS_REPLY + "\ncontext, the first for context [1]."

#: The last rows of every such metric's ``policy``: the failures its one step can meet.
FAILURE_POLICY: tuple[tuple[str, str], ...] = failure_policy(
    "verdict count differs from the number of contexts, or a reply cut at max_tokens"
)


class ContextVerdictMetric(VerdictMetric):
    """A judge metric asking one reasoned 0/1 verdict per retrieved context.

    Subclasses set :attr:`prompts` (the one verdict step's prompt, whose task template
    takes ``{n}``, the number of contexts, and any fields :meth:`step_fields` gives),
    :attr:`nonblank` and :meth:`score_verdicts`. The step is also the metric's
    ``verdict_prompts`` (checked for the bare-verdict rewording when the class is
    defined). Guards (:func:`~ragbatch.scoring.cells.context_guards`): a null value in
    any of :attr:`inputs`, a blank :attr:`nonblank`, an empty context list or one of
    blank chunks only are ``missing_input``.
    """

    health: ClassVar[HealthFields] = HealthFields(verdicts="verdicts")
    #: The input whose empty or whitespace-only text is ``missing_input``.
    nonblank: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        if "prompts" in cls.__dict__ and "verdict_prompts" not in cls.__dict__:
            cls.verdict_prompts = cls.prompts
        super().__init_subclass__(**kwargs)

    def guards(self) -> tuple[Guard, ...]:
        return context_guards(self.inputs, self.nonblank)

    def step_fields(self, row: dict[str, Any]) -> dict[str, str]:
        """The verdict step's template fields besides ``n`` (default: none)."""
        return {}

    @abstractmethod
    def score_verdicts(self, verdicts: list[int]) -> PyCell:
        """The row's cell from its verdicts, one 0/1 int per context in context order."""

    def program(self, row: dict[str, Any]) -> Program:
        [verdicts] = yield [
            self.verdicts_ask(
                row,
                self.prompts[0],
                len(row[CONTEXTS]),
                max_tokens_per_verdict=REASONED_VERDICT_MAX_TOKENS,
                **self.step_fields(row),
            )
        ]
        return self.score_verdicts(verdicts)
