"""The params of the ``rubric`` metric and the checks ``ragbatch validate`` makes of them.

A rubric's text comes from the config and is treated as data: it is checked for size and
for control characters here, and the prompt (:mod:`ragbatch.metrics._rubric_prompt`)
puts it into the judge's messages as it is, never through a template.
"""

from __future__ import annotations

import unicodedata
from typing import Annotated, Union

from pydantic import Field, StrictInt, field_validator

from ragbatch.core.columns import ANSWER, CONTEXTS, QUESTION, REFERENCE
from ragbatch.judge.metric import ScoreParams
from ragbatch.judge.parse import REASON_MAX_CHARS
from ragbatch.scoring.base import StrictParams

#: The canonical columns a rubric may show the judge (the row's text; ``row_id`` and
#: ``latency_s`` are not something a judge reads), in the order the prompt names them.
JUDGED_COLUMNS: tuple[str, ...] = (QUESTION, CONTEXTS, ANSWER, REFERENCE)
#: Longest ``criteria``, in characters (about 1,000 tokens).
CRITERIA_MAX_CHARS = 4000
#: Lowest and highest value a ``scale`` may use: ``score: probability`` reads a rating
#: from one token, so a scale stays within 0 to 10 (and within 0 to 9 for probabilities).
SCALE_BOUNDS = (0, 10)
#: Highest scale value whose rating is one digit (``score: probability``).
ONE_DIGIT_MAX = 9
#: Most and fewest ``choices``, and the longest choice in characters.
CHOICES_MIN, CHOICES_MAX, CHOICE_MAX_CHARS = 2, 10, 40
#: Most ``examples``, and the longest text of one example input or reason.
EXAMPLES_MAX, EXAMPLE_TEXT_MAX_CHARS = 8, 2000


def control_characters(text: str) -> list[str]:
    """The control characters of ``text`` other than newline and tab, as ``U+XXXX``."""
    return sorted(
        {f"U+{ord(c):04X}" for c in text if c not in "\n\t" and unicodedata.category(c) == "Cc"}
    )


def _clean_text(value: str, what: str) -> str:
    bad = control_characters(value)
    if bad:
        raise ValueError(
            f"{what} holds control characters ({', '.join(bad)}); remove them (newlines and "
            "tabs are fine)"
        )
    return value


class RubricScale(StrictParams):
    """An integer rating scale, ``min`` (worst) to ``max`` (best), both included."""

    min: StrictInt = Field(description="lowest rating (an integer, 0 or more)")
    max: StrictInt = Field(description="highest rating (an integer, at most 10)")


class RubricExample(StrictParams):
    """A worked example shown to the judge: the row's inputs, its rating and why."""

    inputs: dict[str, Union[str, list[str]]] = Field(
        description="one value per column of the rubric's `inputs` (contexts: a list of texts)"
    )
    score: Union[StrictInt, str] = Field(
        description="the rating on the scale (an integer), or one of the choices"
    )
    reason: str | None = Field(
        None,
        max_length=REASON_MAX_CHARS,
        description="the one-sentence reason (needed with `reasons: true`)",
    )


class RubricParams(ScoreParams):
    """Params of the ``rubric`` metric; :func:`rubric_problems` checks how they fit
    together."""

    criteria: str = Field(
        min_length=1,
        max_length=CRITERIA_MAX_CHARS,
        description=(
            "what the judge checks, in plain words (at most 4,000 characters; shown to the "
            "judge as written: braces and quotes are plain text)"
        ),
    )
    inputs: list[str] = Field(
        default_factory=lambda: [QUESTION, CONTEXTS, ANSWER],
        description=(
            "the row's columns the judge reads: any of question, contexts, answer, "
            "reference (each must be mapped under input.columns; a null one is missing_input)"
        ),
    )
    scale: RubricScale | None = Field(
        None,
        description=(
            "an integer rating scale `{min: 1, max: 5}` (0 <= min < max <= 10); the score "
            "is (rating - min) / (max - min). Give `scale` or `choices`"
        ),
    )
    choices: list[str] | None = Field(
        None,
        description=(
            "the labels the judge picks one of (2 to 10, unique), e.g. `[pass, fail]`; "
            "needs `choice_scores`. Give `scale` or `choices`"
        ),
    )
    choice_scores: dict[str, Annotated[float, Field(ge=0.0, le=1.0, strict=True)]] | None = Field(
        None,
        description="the score in [0, 1] of every choice, e.g. `{pass: 1, fail: 0}`",
    )
    examples: list[RubricExample] = Field(
        default_factory=list,
        max_length=EXAMPLES_MAX,
        description=(
            "up to 8 worked examples shown to the judge: `{inputs: {...}, score: 4, "
            "reason: ...}` with every column of `inputs` and a score on the scale or a choice"
        ),
    )
    reasons: bool = Field(
        True,
        description=(
            "ask for a one-sentence reason before the rating (true, the default) or for the "
            "rating alone (false: a one-token reply)"
        ),
    )

    @field_validator("criteria")
    @classmethod
    def _criteria(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("criteria is blank; say in plain words what the judge checks")
        return _clean_text(value, "criteria")

    @field_validator("inputs")
    @classmethod
    def _inputs(cls, value: list[str]) -> list[str]:
        unknown = [c for c in value if c not in JUDGED_COLUMNS]
        if unknown:
            raise ValueError(
                f"{', '.join(repr(c) for c in unknown)} cannot be judged; list columns among "
                f"{', '.join(JUDGED_COLUMNS)}"
            )
        if not value:
            raise ValueError("no input; list the columns the judge reads, e.g. [question, answer]")
        if len(set(value)) != len(value):
            raise ValueError("a column is listed twice; list each once")
        return value

    @field_validator("choices")
    @classmethod
    def _choices(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if not CHOICES_MIN <= len(value) <= CHOICES_MAX:
            raise ValueError(
                f"{len(value)} choice(s); give {CHOICES_MIN} to {CHOICES_MAX}, e.g. [pass, fail]"
            )
        for choice in value:
            if not choice.strip() or choice != choice.strip() or len(choice) > CHOICE_MAX_CHARS:
                raise ValueError(
                    f"choice {choice!r} must be 1 to {CHOICE_MAX_CHARS} characters without "
                    "leading or trailing spaces"
                )
            if control_characters(choice) or "\n" in choice or "\t" in choice:
                raise ValueError(f"choice {choice!r} holds a control character; remove it")
        folded = [c.casefold() for c in value]
        twice = sorted({c for c in value if folded.count(c.casefold()) > 1})
        if twice:
            raise ValueError(
                f"{', '.join(repr(c) for c in twice)} listed more than once (ignoring case); "
                "make the choices unique"
            )
        return value


def _example_problems(params: RubricParams) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    declared = set(params.inputs)
    for k, example in enumerate(params.examples):
        where = f"examples[{k}]"
        missing = [c for c in params.inputs if c not in example.inputs]
        extra = sorted(set(example.inputs) - declared)
        if missing:
            problems.append(
                (
                    f"{where}.inputs",
                    f"lacks {', '.join(missing)}; give a value for every "
                    f"column of `inputs` ({', '.join(params.inputs)})",
                )
            )
        if extra:
            problems.append(
                (
                    f"{where}.inputs",
                    f"{', '.join(extra)} not among `inputs` "
                    f"({', '.join(params.inputs)}); remove it or add it to `inputs`",
                )
            )
        for column, value in example.inputs.items():
            texts = value if isinstance(value, list) else [value]
            if column != CONTEXTS and isinstance(value, list):
                problems.append((f"{where}.inputs.{column}", "give one text, not a list"))
            elif column == CONTEXTS and not isinstance(value, list):
                problems.append((f"{where}.inputs.contexts", "give a list of texts, e.g. [...]"))
            elif column == CONTEXTS and not value:
                problems.append(
                    (
                        f"{where}.inputs.contexts",
                        "give at least one text (a row without contexts is never judged)",
                    )
                )
            for text in texts:
                if len(text) > EXAMPLE_TEXT_MAX_CHARS or control_characters(text):
                    problems.append(
                        (
                            f"{where}.inputs.{column}",
                            f"texts are at most "
                            f"{EXAMPLE_TEXT_MAX_CHARS} characters without control characters",
                        )
                    )
                    break
        if example.reason is not None and control_characters(example.reason):
            problems.append((f"{where}.reason", "holds control characters; remove them"))
        if params.reasons and not (example.reason or "").strip():
            problems.append(
                (
                    f"{where}.reason",
                    "missing; with `reasons: true` every example gives the "
                    "one-sentence reason the judge should write",
                )
            )
        problems += _example_score_problem(params, example, f"{where}.score")
    return problems


def _example_score_problem(
    params: RubricParams, example: RubricExample, where: str
) -> list[tuple[str, str]]:
    score = example.score
    if params.scale is not None:
        low, high = params.scale.min, params.scale.max
        if not _sound_scale(params.scale):
            return []  # the scale's own problem is reported; no score can be checked on it
        if not isinstance(score, int) or not low <= score <= high:
            return [(where, f"{score!r} is not on the scale; give an integer from {low} to {high}")]
    elif params.choices is not None and score not in params.choices:
        return [(where, f"{score!r} is not a choice; give one of {params.choices}")]
    return []


def _sound_scale(scale: RubricScale) -> bool:
    """Whether ``scale``'s bounds are integers with min < max, both within
    :data:`SCALE_BOUNDS`."""
    low, high = SCALE_BOUNDS
    return bool(low <= scale.min < scale.max <= high)


def rubric_problems(params: RubricParams) -> list[tuple[str, str]]:
    """What is wrong with how ``params`` fit together.

    Returns
    -------
    list of (str, str)
        ``(path under params, problem and fix)`` pairs, e.g. ``("scale", "min 5 is not
        below max 5; ...")``; empty when the params are sound.
    """
    problems: list[tuple[str, str]] = []
    scale, choices, scores = params.scale, params.choices, params.choice_scores
    probability = params.score == "probability"
    if (scale is None) == (choices is None):
        what = "both" if scale is not None else "neither"
        problems.append(
            (
                "scale",
                f"{what} of `scale` and `choices` given; give one: `scale: {{min: 1, "
                "max: 5}` or `choices: [pass, fail]` with `choice_scores: {pass: 1, fail: 0}`",
            )
        )
    if scale is not None:
        low, high = SCALE_BOUNDS
        if not _sound_scale(scale):
            problems.append(
                (
                    "scale",
                    f"min {scale.min}, max {scale.max}: need {low} <= min < max <= {high} "
                    "(integers), e.g. {min: 1, max: 5}",
                )
            )
        elif probability and scale.max > ONE_DIGIT_MAX:
            problems.append(
                (
                    "scale",
                    f"max {scale.max} has two digits, and `score: probability` reads the "
                    f"rating from one token; use a scale within 0 to {ONE_DIGIT_MAX} or "
                    "`score: verdict`",
                )
            )
        if scores is not None:
            problems.append(("choice_scores", "only with `choices`; remove it"))
    if choices is not None:
        if scores is None:
            problems.append(
                (
                    "choice_scores",
                    f"missing; give the score in [0, 1] of every choice, e.g. "
                    f"{{{', '.join(f'{c}: ...' for c in choices)}}}",
                )
            )
        else:
            missing = [c for c in choices if c not in scores]
            extra = [c for c in scores if c not in choices]
            if missing:
                listed = ", ".join(f"`{c}`" for c in missing)
                add = ", ".join(f"{c}: <score in [0, 1]>" for c in missing)
                problems.append(("choice_scores", f"no score for {listed}; add {{{add}}}"))
            if extra:
                listed = ", ".join(f"`{c}`" for c in extra)
                problems.append(
                    ("choice_scores", f"{listed} not among `choices`; remove or rename them")
                )
        if probability and params.reasons:
            problems.append(
                (
                    "score",
                    "`score: probability` with `choices` reads the choice from the "
                    "first reply token, so it needs `reasons: false`; set it, or use `score: "
                    "verdict`",
                )
            )
        if probability:
            prefixed = sorted({a for a in choices for b in choices if a != b and b.startswith(a)})
            if prefixed:
                problems.append(
                    (
                        "choices",
                        f"{', '.join(prefixed)} begin(s) another choice, so its first "
                        "token may not tell them apart under `score: probability`; reword them",
                    )
                )
    if scale is not None or choices is not None:
        problems += _example_problems(params)
    return problems


def describe_scale(params: RubricParams) -> str:
    """The scale or choices in a few words (``scale 1-5``, ``choices pass=1, fail=0``)."""
    if params.scale is not None:
        return f"scale {params.scale.min}-{params.scale.max}"
    scores = params.choice_scores or {}
    return "choices " + ", ".join(f"{c}={scores[c]:g}" for c in params.choices or ())
