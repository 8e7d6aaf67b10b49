"""Base class of the LLM-judge metrics.

A judge metric is a *program* per row: a generator that yields lists of requests
(:class:`~ragbatch.judge.protocol.Ask` for the judge, :class:`Embed` for the embedding
model), receives the parsed results in the same order, and finally returns the row's
:class:`~ragbatch.scoring.cells.PyCell`. Multi-step metrics (extract statements, then
verify each) are two yields. The judge stage (:mod:`ragbatch.judge.run`) runs the
programs of every row of a batch in lockstep, so each step is one batched engine call.

The program sees only successful, parsed results: when a request fails (engine error,
time limit, prompt too long, unparseable reply after the retries) the stage closes the
program and writes the failure's status on the cell itself.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generator, Literal, Sequence

from pydantic import Field, field_validator

from ragbatch.core.engine_registry import engine_names
from ragbatch.judge.aligned import AlignedExamples, load_examples
from ragbatch.judge.confidence import mean
from ragbatch.judge.health import HealthFields
from ragbatch.judge.prompt import (
    DEFAULT_LAYOUT,
    Instructions,
    PromptLayout,
    StepPrompt,
    build_messages,
)
from ragbatch.judge.protocol import Ask, Message
from ragbatch.scoring.cells import Guard, PyCell, missing
from ragbatch.scoring.base import Metric, StrictParams


@dataclass(frozen=True)
class Embed:
    """A request for L2-normalised embeddings of ``texts`` from the embedding engine
    named ``engine`` (a key under ``engines``). The program receives a float32 NumPy
    array of shape ``(len(texts), dim)``."""

    texts: tuple[str, ...]
    engine: str


class JudgeParams(StrictParams):
    """Params every judge metric takes."""

    prompt_layout: PromptLayout = Field(
        DEFAULT_LAYOUT,
        description=(
            "`instructions_first`: the instructions of every judge metric on the engine in "
            "one block ahead of the row, the same in every request, so the prefix cache "
            "computes them once; `row_first`: the row, then this metric's whole task, in "
            "every request (the prompts from before this param; docs/judges.md, \"Prompt "
            "layout and prefix caching\")"
        ),
    )
    examples_file: str | None = Field(
        None,
        description=(
            "path of an examples file (JSON, as `ragbatch calibrate --align` writes it; "
            "docs/calibration.md, \"Aligning a judge\"): worked examples shown to the judge "
            "before the task of the metric's first step; the SHA-256 of the file is part "
            "of the cache key. Unset (the default): no examples, the prompts unchanged"
        ),
    )

    @field_validator("examples_file")
    @classmethod
    def _check_examples_file(cls, value: str | None) -> str | None:
        if value is not None:
            load_examples(value)  # ValueError: pydantic names the field
        return value


class ScoreParams(JudgeParams):
    """Params of the judge metrics whose replies hold verdicts (see
    :mod:`ragbatch.judge.confidence`)."""

    score: Literal["verdict", "probability"] = Field(
        "verdict",
        description=(
            "`verdict` (the default) scores the verdicts the judge generated; `probability` "
            "scores their probabilities from the token logprobs (G-Eval's weighting: p(1) "
            "for a yes/no verdict, the expected rating for a rating), and the cell is "
            "judge_error when the engine returns no logprobs"
        ),
    )


#: What a judge metric's program yields, receives and returns.
Program = Generator[Sequence["Ask | Embed"], list[Any], PyCell]


@dataclass(frozen=True)
class JudgeExample:
    """A worked example of a judge metric: one input row, the judge replies in the order
    the program asks for them (all steps, flattened), and the cell that must result.
    A reply is its text, or ``(finish_reason, text)`` for one that did not stop normally.

    ``status`` may be a failure status the stage itself assigns (``parse_failure`` for a
    reply of the wrong shape, ``context_too_long``); ``embeddings`` gives, for metrics
    that embed, the vectors to return for each :class:`Embed` request in order.
    """

    inputs: dict[str, Any]
    replies: tuple[str | tuple[str, str], ...]
    score: float | None
    status: str = "ok"
    params: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    embeddings: tuple[Any, ...] = ()


class _JudgeEngineTypes:
    """``JudgeMetric.engine_types``: the names of every registered engine type of stage
    ``judge`` (:mod:`ragbatch.core.engine_registry`), read when asked, so a judge engine
    registered later serves every judge metric."""

    def __get__(self, instance: Any, owner: Any) -> tuple[str, ...]:
        return engine_names("judge")


class JudgeMetric(Metric):
    """A metric computed by an LLM judge inside the judge stage's actor pool.

    Subclasses set the :class:`~ragbatch.scoring.base.Metric` class attributes plus
    :attr:`version` (bump it whenever a prompt, schema or scoring rule changes: it is
    part of every cache key) and :attr:`judge_examples`, and implement :meth:`program`.
    """

    Params: ClassVar[type[JudgeParams]] = JudgeParams
    kind: ClassVar[str] = "judge"
    engine_types: ClassVar[tuple[str, ...]] = _JudgeEngineTypes()  # type: ignore[assignment]
    default_engine: ClassVar[dict[str, Any] | None] = None
    version: ClassVar[int] = 1
    boolean: ClassVar[bool] = False
    judge_examples: ClassVar[tuple[JudgeExample, ...]] = ()
    #: Judge steps a row takes when every step succeeds (embedding steps not counted):
    #: 1 for one call per row, 2 for extract-then-verify metrics. A metric with more than
    #: one step implements :meth:`assumed_result` so that a dry run can build the asks
    #: of its later steps.
    judge_steps: ClassVar[int] = 1
    #: The ``details`` keys the judge health diagnostics read (docs/judges.md, "Judge
    #: health"); the default reads none, so only the score and status checks apply.
    health: ClassVar[HealthFields] = HealthFields()
    #: The prompt of each judge step the program may take, in step order.
    prompts: ClassVar[tuple[StepPrompt, ...]] = ()
    #: The stage's instruction sets (:func:`bind_instructions`); None: the metric's own.
    _instructions: Instructions | None = None

    @property
    def prompt_layout(self) -> PromptLayout:
        """The ``prompt_layout`` param (:mod:`ragbatch.judge.prompt`); ``row_first`` for
        a metric whose params lack it (its program builds its prompts its own way)."""
        return getattr(self.params, "prompt_layout", "row_first")

    def step_prompts(self) -> tuple[StepPrompt, ...]:
        """:attr:`prompts` as this metric's params word them (the default: unchanged)."""
        return self.prompts

    def step_prompt(self, step: StepPrompt) -> StepPrompt:
        """``step`` (one of :attr:`prompts`) as this metric's params word it."""
        return step

    def aligned_examples(self) -> AlignedExamples | None:
        """The examples file of the ``examples_file`` param
        (:mod:`ragbatch.judge.aligned`), or None when the param is unset or absent.

        Raises
        ------
        ValueError
            The file cannot be read or is not a valid examples file.
        """
        path = getattr(self.params, "examples_file", None)
        return None if path is None else load_examples(path)

    def step_examples(self, step: StepPrompt) -> AlignedExamples | None:
        """The aligned examples shown with ``step`` (one of :meth:`step_prompts`, by
        name): those of :meth:`aligned_examples` for the first step, None for a later
        one or when none are set."""
        examples = self.aligned_examples()
        if examples is None:
            return None
        steps = self.step_prompts()
        return examples if steps and step.name == steps[0].name else None

    def instruction_sets(self) -> tuple[tuple[str, str], ...]:
        """``(name, instructions)`` of each step, as the ``instructions_first`` layout
        shows them (the first step's preceded by the aligned examples, if any)."""
        sets = []
        for step in self.step_prompts():
            examples = self.step_examples(step)
            text = step.instructions if examples is None else examples.ahead_of(step.instructions)
            sets.append((step.name, text))
        return tuple(sets)

    def instructions(self) -> Instructions:
        """The instruction sets shown ahead of the row: those of the stage's metrics once
        :func:`bind_instructions` has run, else this metric's own."""
        if self._instructions is not None:
            return self._instructions
        return Instructions.of(self.instruction_sets())

    def bind_instructions(self, instructions: Instructions) -> None:
        """Show ``instructions`` (the stage's, :func:`bind_instructions`) ahead of the
        row in every prompt of the ``instructions_first`` layout."""
        self._instructions = instructions

    def messages(self, row: dict[str, Any], step: StepPrompt, **fields: Any) -> tuple[Message, ...]:
        """The chat of one judge step for ``row``, in this metric's layout.

        Parameters
        ----------
        row : dict
            The canonical values of the row.
        step : StepPrompt
            One of :attr:`prompts`; worded by :meth:`step_prompt`, filled with ``fields``.
        **fields
            The step's row-specific template fields (``reference``, ``statements``...).
        """
        task = self.step_prompt(step).fill(**fields)
        examples = self.step_examples(step)
        if examples is not None:
            task = examples.task(task)
        if self.prompt_layout == "instructions_first":
            return build_messages(row, task, "instructions_first", self.instructions())
        return build_messages(row, task, "row_first")

    def guards(self) -> tuple[Guard, ...]:
        """Input guards checked (in Polars) before any judge call; the default is
        ``missing_input`` for a null value in any of :attr:`inputs`. Subclasses add
        their degenerate-input rules (an empty context list, a blank answer)."""
        return tuple(missing(column) for column in self.inputs)

    def embedders(self) -> tuple[str, ...]:
        """Names of the embedding engines the program's :class:`Embed` requests use."""
        return ()

    def cache_identity(self) -> dict[str, Any]:
        """What identifies this metric's judgments in a cache key: name, version and
        params (the metric id is left out, so renaming a metric keeps its cache; so is
        ``score``, which changes how replies are scored, not the requests, and so is
        ``prompt_layout: row_first``, whose prompts are those made before the param
        existed). An ``examples_file`` is keyed by the SHA-256 of its contents
        (``examples_sha256``), not its path; unset, it is left out, so the keys are
        those from before the param."""
        params = {k: v for k, v in self.params.model_dump(mode="json").items() if k != "score"}
        if params.get("prompt_layout") == "row_first":
            del params["prompt_layout"]  # the prompts from before the param: same keys
        if "examples_file" in params:
            path = params.pop("examples_file")
            if path is not None:
                params["examples_sha256"] = load_examples(path).sha256
        return {"metric": self.name, "version": self.version, "params": params}

    #: Params that change how replies are scored but not what is asked: left out of the
    #: cache identity (:meth:`cache_identity`), kept in the calibration identity
    #: (:meth:`calibration_identity`).
    scoring_params: tuple[str, ...] = ("score",)

    def calibration_identity(self) -> dict[str, Any]:
        """What a calibration of this metric is valid for: :meth:`cache_identity` plus
        the :attr:`scoring_params` that differ from their defaults (under ``scoring``),
        since the same replies scored another way agree with people differently. At
        their defaults it equals the cache identity, so calibrations recorded before
        this distinction stay valid."""
        identity = self.cache_identity()
        fields = type(self.params).model_fields
        chosen = self.params.model_dump(mode="json")
        scoring = {
            k: chosen[k]
            for k in self.scoring_params
            if k in chosen and k in fields and chosen[k] != fields[k].default
        }
        if scoring:
            identity = {**identity, "scoring": scoring}
        return identity

    @property
    def probability_score(self) -> bool:
        """Whether the metric's ``score`` param is ``probability`` (G-Eval's
        probability-weighted score) rather than ``verdict`` (the hard verdicts)."""
        return getattr(self.params, "score", "verdict") == "probability"

    def expected_score(self, expected: list[float], cell: PyCell) -> float:
        """The probability-weighted score of an ``ok`` cell (``score: probability``).

        Parameters
        ----------
        expected : list of float
            Each verdict's expected value (sum over verdict values of p(value) times
            the value), in reply order; for 0/1 verdicts, p(1).
        cell : PyCell
            The cell the hard verdicts gave.

        Returns
        -------
        float
            By default the mean of ``expected``: the expectation of the share of
            positive verdicts, or of a single verdict's value. Metrics whose score is
            not a mean of their verdicts override this.
        """
        return mean(expected)

    def assumed_result(self, row: dict[str, Any], ask: Ask) -> Any:
        """The parsed result a dry run assumes for ``ask``, a request of a step that
        another judge step follows (the later prompt holds the judge's earlier reply, so
        it cannot be known before the run).

        Parameters
        ----------
        row : dict
            The canonical values of the row, as given to :meth:`program`.
        ask : Ask
            The request whose reply is assumed.

        Returns
        -------
        object
            A value of the type the ask's ``parse`` returns.

        Raises
        ------
        NotImplementedError
            The metric makes no assumption (the default): a dry run then estimates only
            its first step.
        """
        raise NotImplementedError(
            f"{self.name} makes no assumption about the reply to its {ask.step!r} step"
        )

    @abstractmethod
    def program(self, row: dict[str, Any]) -> Program:
        """The judge program for one row that passed the guards.

        Parameters
        ----------
        row : dict
            The canonical values of the row: ``question``, ``answer``, ``reference``
            (str or None), ``contexts`` (list of str or None), ``row_id``.

        Yields
        ------
        list of Ask or Embed
            The requests of one step.

        Receives
        --------
        list
            The parsed result of each request, in order.

        Returns
        -------
        PyCell
            The row's cell (``ok`` with a score in :attr:`score_range`, or
            ``not_applicable`` with a reason).
        """


def bind_instructions(metrics: Sequence[JudgeMetric]) -> Instructions | None:
    """Give every ``instructions_first`` metric of a stage the same instruction block.

    Parameters
    ----------
    metrics : sequence of JudgeMetric
        All the judge metrics of one stage (one judge engine).

    Returns
    -------
    Instructions or None
        The block: the instruction sets of every ``instructions_first`` metric of
        ``metrics``, sorted by name (:meth:`Instructions.of`), so it is the same whatever
        the order of the metrics in the config; None when no metric uses that layout.
    """
    chosen = [m for m in metrics if m.prompt_layout == "instructions_first"]
    if not chosen:
        return None
    block = Instructions.of(s for m in chosen for s in m.instruction_sets())
    for metric in chosen:
        metric.bind_instructions(block)
    return block
