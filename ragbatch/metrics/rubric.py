"""``rubric``: a judge metric defined in the config by its criteria and a scale or choices."""

from __future__ import annotations

from typing import Any, ClassVar, cast

from pydantic import BaseModel

from ragbatch.core.columns import ANSWER, CONTEXTS, QUESTION, REFERENCE
from ragbatch.core.errors import ConfigError
from ragbatch.scoring.registry import register
from ragbatch.core.status import MISSING_INPUT
from ragbatch.judge.policy import failure_policy
from ragbatch.judge.health import HealthFields
from ragbatch.judge.metric import JudgeExample, JudgeMetric, Program
from ragbatch.judge.prompt import StepPrompt
from ragbatch.judge.protocol import Ask
from ragbatch.metrics import _rubric_prompt as prompt
from ragbatch.metrics._rubric_params import RubricParams, describe_scale, rubric_problems
from ragbatch.scoring.cells import Guard, PyCell, blank, empty_contexts, every_context_blank
from ragbatch.scoring.cells import missing

#: Params of the worked examples below: a 1-5 scale on the question and the answer.
_SCALE = {
    "criteria": "The answer names the year the event happened.",
    "inputs": [QUESTION, ANSWER],
    "scale": {"min": 1, "max": 5},
}
#: Pass/fail choices on the contexts and the answer, without reasons.
_CHOICES = {
    "criteria": "Every number in the answer appears in the retrieved contexts.",
    "inputs": [CONTEXTS, ANSWER],
    "choices": ["pass", "fail"],
    "choice_scores": {"pass": 1.0, "fail": 0.0},
    "reasons": False,
}


@register
class Rubric(JudgeMetric):
    """A judge metric written in the config: criteria, the columns to read, and a scale
    or choices, scored in [0, 1].

    One judge step per row: the judge reads the row's ``inputs`` and the criteria (with
    the worked ``examples``, if any), then replies with a one-sentence reason and its
    rating or choice (with ``reasons: true``, the reason first), or with the rating or
    choice alone. Structured outputs allow only the scale's integers or the choices.

    The score is normalized to [0, 1]: a rating ``v`` on ``scale: {min, max}`` scores
    ``(v - min) / (max - min)``; a choice scores its ``choice_scores`` entry. With
    ``score: probability`` the score is the expected score under the judge's
    distribution over the allowed values (read from the token logprobs of the rating or
    choice; the cell is ``judge_error`` when the engine returns none). ``details`` keeps
    the ``verdict`` (the rating or choice) and the ``reason``.

    Several rubrics may run in one job, each under its own ``id``. The criteria, inputs,
    scale or choices, examples and ``reasons`` are part of the judgment cache key and of
    the calibration's prompt version: a changed rubric is judged afresh. ``choice_scores``
    and ``score`` change only how replies are scored: they are left out of the cache key
    and kept in the prompt version. Config text is data: it goes into the prompt as
    written, never through a template.

    Notes
    -----
    Source: G-Eval (Liu et al., 2023, "G-Eval: NLG Evaluation using GPT-4 with Better
    Human Alignment"): criteria in words, a rating on an integer scale, and the score
    weighted by the rating's probabilities; the config shape follows DeepEval ``GEval``,
    MLflow ``make_judge`` and promptfoo ``llm-rubric``. The prompt wording is this
    package's own. Cost: one judge call per row.
    """

    Params = RubricParams
    name: ClassVar[str] = "rubric"
    version: ClassVar[int] = 1
    #: The default ``inputs`` param; each instance reads its own ``inputs``.
    inputs: ClassVar[tuple[str, ...]] = (QUESTION, CONTEXTS, ANSWER)
    boolean: ClassVar[bool] = False
    health: ClassVar[HealthFields] = HealthFields(reason="reason")
    summary: ClassVar[str] = (
        "criteria written in the config, judged on a scale or choices, normalized to 0-1"
    )
    source: ClassVar[str] = (
        "G-Eval (Liu et al., 2023): criteria, an integer rating, probability-weighted score; "
        "config shape as DeepEval GEval, MLflow make_judge, promptfoo llm-rubric"
    )
    policy: ClassVar[tuple[tuple[str, str], ...]] = (
        ("a column of `inputs` is null", "missing_input"),
        (
            "question, answer or reference among `inputs` and empty or only whitespace",
            "missing_input; reason '<column> is empty'",
        ),
        (
            "contexts among `inputs` and an empty list, or every chunk blank",
            "missing_input; reason 'contexts is an empty list' or 'every context is empty'",
        ),
        (
            "a column not among `inputs` is null or empty",
            "not read: the judge is told to ignore it",
        ),
        (
            "answer is a refusal (no claims)",
            "judged by the criteria like any other answer; a measured score, not a failure",
        ),
        (
            "a context chunk is junk (markup, boilerplate)",
            "judged like any other text when contexts are among `inputs`",
        ),
        *failure_policy(
            "reply not of the schema (a value off the scale, not a choice, prose) or cut at "
            "max_tokens",
        ),
    )
    judge_examples: ClassVar[tuple[JudgeExample, ...]] = (
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: ["Apollo 11 landed on the Moon on 20 July 1969."],
                ANSWER: "It landed in July 1969.",
            },
            replies=('{"reason": "The answer gives 1969.", "score": 5}',),
            score=1.0,
            params=_SCALE,
            note="top of a 1-5 scale: (5 - 1) / 4",
        ),
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: ["Apollo 11 landed on the Moon on 20 July 1969."],
                ANSWER: "It landed in the late sixties.",
            },
            replies=('{"reason": "A decade, not a year.", "score": 2}',),
            score=0.25,
            params=_SCALE,
            note="2 on a 1-5 scale: (2 - 1) / 4",
        ),
        JudgeExample(
            inputs={
                QUESTION: "How long did the flight take?",
                CONTEXTS: ["The flight took eight days."],
                ANSWER: "It took 8 days and 3 hours.",
            },
            replies=("fail",),
            score=0.0,
            params=_CHOICES,
            note="a choice without a reason, scored by choice_scores",
        ),
        JudgeExample(
            inputs={QUESTION: "When did Apollo 11 land?", CONTEXTS: [], ANSWER: "  "},
            replies=(),
            score=None,
            status=MISSING_INPUT,
            params=_SCALE,
            note="blank answer: settled before any judge call",
        ),
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: ["Apollo 11 landed in 1969."],
                ANSWER: "In 1969.",
            },
            replies=('{"reason": "It names 1969.", "score": 6}', "5"),
            score=None,
            status="parse_failure",
            params=_SCALE,
            note="a rating off the scale, then a bare digit without the JSON",
        ),
    )

    def __init__(self, metric_id: str, params: BaseModel, engine: str | None = None):
        super().__init__(metric_id, params, engine)
        if not isinstance(params, RubricParams):
            raise TypeError(f"rubric takes RubricParams, not {type(params).__name__}")
        problems = rubric_problems(params)
        if problems:
            raise ConfigError([f"params.{path}: {text}" for path, text in problems])
        self.rubric: RubricParams = params
        self.inputs = tuple(params.inputs)  # type: ignore[misc]
        self._step_name = self.name if metric_id == self.name else f"{self.name}: {metric_id}"
        self._instructions_text = prompt.instructions(params)
        self._slots = prompt.slots(params)
        self._output = prompt.output_spec(params)
        self._scores = dict(prompt.verdict_values(params))

    @classmethod
    def params_problems(cls, params: BaseModel) -> list[tuple[str, str]]:
        """:func:`rubric_problems`: the params do not fit together (no scale or choices, a
        bad scale, incomplete ``choice_scores``, an example off the scale...), which
        :meth:`Metric.from_params` raises as ``<where>.<param>: <problem and fix>``."""
        return rubric_problems(cast(RubricParams, params))

    #: ``choice_scores`` turns a choice into a score and is not shown to the judge: a
    #: change keeps the judgments but not a calibration (:meth:`cache_identity`).
    scoring_params: tuple[str, ...] = ("score", "choice_scores")

    def check_input(self, available: set[str]) -> list[str]:
        """As every metric, plus the rubric's other fix: judge without that column."""
        return [
            f"{problem}, or remove it from params.inputs"
            for problem in super().check_input(available)
        ]

    def cache_identity(self) -> dict[str, Any]:
        """As :meth:`JudgeMetric.cache_identity` (the criteria, inputs, scale or choices,
        examples and ``reasons`` are in it), leaving out ``choice_scores``, which changes
        how a choice is scored, not what is asked; the calibration identity keeps it."""
        identity = super().cache_identity()
        params = {k: v for k, v in identity["params"].items() if k != "choice_scores"}
        return {**identity, "params": params}

    def step_prompts(self) -> tuple[StepPrompt, ...]:
        """The rubric's one step, its text built from the params
        (:func:`ragbatch.metrics._rubric_prompt.instructions`)."""
        text = self._instructions_text
        return (StepPrompt(self._step_name, text, text, ""),)

    def validate_notes(self) -> list[str]:
        """What ``ragbatch validate`` prints: the scale or choices and the inputs read
        (``ragbatch metrics --config`` prints the whole instruction set)."""
        return [
            f"rubric on {', '.join(self.inputs)}; {describe_scale(self.rubric)}; "
            f"{'with' if self.rubric.reasons else 'without'} reasons; score {self.rubric.score}"
        ]

    def guards(self) -> tuple[Guard, ...]:
        out = [missing(column) for column in self.inputs]
        out += [blank(c) for c in (QUESTION, ANSWER, REFERENCE) if c in self.inputs]
        if CONTEXTS in self.inputs:
            out += [empty_contexts(), every_context_blank()]
        return tuple(out)

    def _parse(self, text: str) -> tuple[Any, str]:
        return prompt.parse(self.rubric, text)

    def program(self, row: dict[str, Any]) -> Program:
        text = self._instructions_text
        task = prompt.row_task(self.rubric, text, row.get(REFERENCE))
        step = StepPrompt(self._step_name, task, text, "")
        [(verdict, reason)] = yield [
            Ask(
                self.messages(row, step),
                self._output,
                self._parse,
                step=self.name,
                verdicts=self._slots,
            )
        ]
        details: dict[str, Any] = {"verdict": verdict}
        if self.rubric.reasons:
            details["reason"] = reason
        return PyCell(self._scores[verdict], reason=reason.strip() or None, details=details)
