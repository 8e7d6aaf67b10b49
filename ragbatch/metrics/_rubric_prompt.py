"""The judge prompt, reply schema and verdict values of a ``rubric`` metric.

Everything here is built by concatenation: the config's text (criteria, choices,
examples) and the row's values are put into the messages as they are and never pass
through ``str.format`` or any other template, so braces, quotes and backslashes in them
are plain text.
"""

from __future__ import annotations

import json
from typing import Any

from ragbatch.core.columns import ANSWER, CONTEXTS, QUESTION, REFERENCE
from ragbatch.judge.parse import REASON_MAX_CHARS, parse_choice, parse_json, token_budget
from ragbatch.judge.prompt import numbered
from ragbatch.judge.protocol import OutputSpec, VerdictSlots
from ragbatch.metrics._rubric_params import RubricExample, RubricParams

#: How the prompt names each column the judge may read.
COLUMN_WORDS = {
    QUESTION: "the question",
    CONTEXTS: "the retrieved contexts",
    ANSWER: "the answer",
    REFERENCE: "the reference answer",
}
#: How an example shows each column.
COLUMN_HEADINGS = {
    QUESTION: "Question",
    CONTEXTS: "Retrieved contexts",
    ANSWER: "Answer",
    REFERENCE: "Reference answer",
}


def reply_key(params: RubricParams) -> str:
    """The reply's JSON member holding the rating (``score``) or the choice (``verdict``)."""
    return "score" if params.scale is not None else "verdict"


def verdict_values(params: RubricParams) -> tuple[tuple[Any, float], ...]:
    """Every value the judge may give, with its score in [0, 1]: a rating ``v`` of the
    scale scores ``(v - min) / (max - min)``; a choice scores its ``choice_scores`` entry."""
    if params.scale is not None:
        low, high = params.scale.min, params.scale.max
        return tuple((v, (v - low) / (high - low)) for v in range(low, high + 1))
    scores = params.choice_scores or {}
    return tuple((c, float(scores[c])) for c in params.choices or ())


def slots(params: RubricParams) -> VerdictSlots:
    """Where the reply holds its verdict, for the verdict probabilities: the whole reply
    without reasons, else the :func:`reply_key` member (a choice is a JSON string there,
    so its literal is quoted)."""
    values = verdict_values(params)
    if not params.reasons:
        return VerdictSlots(tuple((str(v), s) for v, s in values))
    return VerdictSlots(
        tuple((json.dumps(v, ensure_ascii=False), s) for v, s in values), key=reply_key(params)
    )


def schema(params: RubricParams) -> dict[str, Any]:
    """The JSON Schema of a reply with a reason: ``reason`` first (property order is
    generation order), then the rating (an integer of the scale) or the choice."""
    values = [v for v, _ in verdict_values(params)]
    verdict: dict[str, Any] = (
        {"type": "integer", "enum": values}
        if params.scale is not None
        else {"type": "string", "enum": values, "maxLength": max(len(v) for v in values)}
    )
    return {
        "type": "object",
        "properties": {
            "reason": {"type": "string", "maxLength": REASON_MAX_CHARS},
            reply_key(params): verdict,
        },
        "required": ["reason", reply_key(params)],
        "additionalProperties": False,
    }


def output_spec(params: RubricParams) -> OutputSpec:
    """The structured output: the JSON of :func:`schema` with reasons, else a choice of
    the ratings (as digits) or of the choices."""
    if params.reasons:
        return OutputSpec.of_schema(schema(params), max_tokens=token_budget(REASON_MAX_CHARS, 48))
    literals = [str(v) for v, _ in verdict_values(params)]
    longest = max(len(v) for v in literals)
    return OutputSpec.of_choice(literals, max_tokens=token_budget(longest, 4))


def parse(params: RubricParams, text: str) -> tuple[Any, str]:
    """The verdict (an int rating or a choice) and the reason ("" without reasons) of a
    reply.

    Raises
    ------
    ParseError
        Not of :func:`schema`'s shape, or not one of the values.
    """
    if params.reasons:
        value = parse_json(text, schema(params))
        return value[reply_key(params)], value["reason"]
    literals = tuple(str(v) for v, _ in verdict_values(params))
    chosen = parse_choice(text, literals)
    return (int(chosen) if params.scale is not None else chosen), ""


def _scope(params: RubricParams) -> str:
    words = [COLUMN_WORDS[c] for c in params.inputs]
    listed = words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"
    return f"Read only {listed}; ignore every other part of the row."


def _values_text(params: RubricParams) -> str:
    if params.scale is not None:
        low, high = params.scale.min, params.scale.max
        return (
            f"Rate how well the row meets the criteria with an integer from {low} to {high}: "
            f"{low} when it does not meet them at all, {high} when it fully meets them."
        )
    quoted = ", ".join(json.dumps(c, ensure_ascii=False) for c in params.choices or ())
    return f"Pick the one choice that fits the row best: {quoted}."


def _reply_text(params: RubricParams) -> str:
    key = reply_key(params)
    if params.scale is not None:
        what = f"an integer from {params.scale.min} to {params.scale.max}"
        bare = f"Reply with one integer from {params.scale.min} to {params.scale.max}"
    else:
        what = "one of " + ", ".join(
            json.dumps(c, ensure_ascii=False) for c in params.choices or ()
        )
        bare = "Reply with one of " + ", ".join(params.choices or ())
    if params.reasons:
        return (
            "Give a one-sentence reason first, then the "
            f"{'rating' if key == 'score' else 'choice'}.\n\n"
            f'Reply with JSON: {{"reason": "...", "{key}": {what}}}'
        )
    return f"{bare} and nothing else."


def example_reply(params: RubricParams, example: RubricExample) -> str:
    """The reply an example shows: the JSON the judge writes, or the bare verdict."""
    if params.reasons:
        return json.dumps(
            {"reason": example.reason or "", reply_key(params): example.score}, ensure_ascii=False
        )
    return str(example.score)


def _example_text(params: RubricParams, k: int, example: RubricExample) -> str:
    parts = [f"Example {k}"]
    for column in params.inputs:
        value = example.inputs.get(column)
        if isinstance(value, list):
            parts.append(f"{COLUMN_HEADINGS[column]}:\n{numbered(value)}")
        else:
            parts.append(f"{COLUMN_HEADINGS[column]}: {value}")
    parts.append(f"Reply: {example_reply(params, example)}")
    return "\n".join(parts)


def instructions(params: RubricParams) -> str:
    """The rubric's instruction set (the ``instructions_first`` layout's, and the whole
    ``row_first`` task of a rubric that does not read the reference answer): what to
    read, the criteria, the scale or choices, the examples, the reply format last."""
    parts = [
        f"Judge the row against the criteria below. {_scope(params)}",
        f"Criteria:\n{params.criteria.strip()}",
        _values_text(params),
    ]
    if params.examples:
        shown = "\n\n".join(
            _example_text(params, k, ex) for k, ex in enumerate(params.examples, start=1)
        )
        parts.append(f"Examples:\n\n{shown}")
    parts.append(_reply_text(params))
    return "\n\n".join(parts)


def row_task(params: RubricParams, text: str, reference: str | None) -> str:
    """The ``row_first`` task of one row: the reference answer first when the rubric
    reads it (the shared block of that layout does not hold it), then ``text``
    (:func:`instructions`)."""
    if REFERENCE in params.inputs and reference is not None:
        return f"Reference answer:\n{reference}\n\n{text}"
    return text
