"""The reply an aligned example shows: what a judge metric's first step should reply for
a row that people labelled 0 or 1 (docs/calibration.md, "Aligning a judge").

A reply is built only where a row's one binary label decides the whole reply of the
metric's first step:

- one yes/no verdict about the answer (``hate_speech``, ``duplication``):
  ``{"reason": ..., "verdict": true | false}``;
- one verdict per retrieved context (``retrieval_precision``, ``context_precision``,
  ``augmentation_accuracy``), for a row with exactly one context:
  ``{"verdicts": [{"reason": ..., "verdict": 0 | 1}]}`` (bare ``[0 | 1]`` with
  ``reasons: false``);
- ``answer_consistency_binary``: ``{"reason": ..., "states_claims": true,
  "unattributable": false | true}`` (a labelled answer is taken to state something);
- ``rubric``: the highest-scoring rating or choice for label 1, the lowest-scoring one
  for label 0, as JSON with a reason or bare, as the rubric's ``reasons`` asks.

Every other first step (a list of statements, a rating of similarity, generated
questions) holds more than a label says, and is refused with the reason. Each reply is
checked by the metric itself before it is used: its own parser must accept it and its
program must score the row on the label's side of ``judge_threshold``.
"""

from __future__ import annotations

import json
from typing import Any

from ragbatch.calibrate.align import verdict_reply
from ragbatch.core.columns import CONTEXTS
from ragbatch.judge.answer_verdict import AnswerVerdictMetric
from ragbatch.judge.context_verdicts import ContextVerdictMetric
from ragbatch.judge.metric import JudgeMetric
from ragbatch.judge.protocol import Ask
from ragbatch.judge.statement_verdicts import StatementVerdictMetric
from ragbatch.metrics._rubric_prompt import reply_key, verdict_values
from ragbatch.metrics.answer_consistency_binary import AnswerConsistencyBinary
from ragbatch.metrics.rubric import Rubric

#: The reason of each example reply, by label.
REASONS = {1: "a reviewer judged it so", 0: "a reviewer judged it not so"}


def metric_problem(metric: JudgeMetric) -> str | None:
    """Why ``metric``'s first step has no reply that a row's binary label decides, or
    None when :func:`example_reply` can build one."""
    if isinstance(metric, (AnswerVerdictMetric, ContextVerdictMetric)):
        return None
    if isinstance(metric, (AnswerConsistencyBinary, Rubric)):
        return None
    first = metric.step_prompts()[0].name if metric.step_prompts() else metric.name
    if isinstance(metric, StatementVerdictMetric) or metric.judge_steps > 1:
        return (
            f"its first step ({first!r}) lists the statements of a text, which a row's "
            "label does not give, so no example reply can be built from the labels"
        )
    return (
        f"its first step ({first!r}) does not reply with one verdict for the row (it asks "
        "for a rating, questions or several verdicts), so a row's label does not decide "
        "the reply"
    )


def row_problem(metric: JudgeMetric, row: dict[str, Any]) -> str | None:
    """Why ``row`` (canonical values) cannot be an example of ``metric``: an input the
    metric reads is null or blank, or (one verdict per context) the row has other than
    one context. None when it can."""
    for column in metric.inputs:
        value = row.get(column)
        if value is None:
            return f"{column} is null"
        if isinstance(value, str) and not value.strip():
            return f"{column} is empty"
        if isinstance(value, list) and not [v for v in value if v and v.strip()]:
            return f"{column} holds no text"
    if isinstance(metric, ContextVerdictMetric) and len(row.get(CONTEXTS) or []) != 1:
        n = len(row.get(CONTEXTS) or [])
        return f"it has {n} contexts; a row's label gives one verdict, for one context"
    return None


def _candidate(metric: JudgeMetric, row: dict[str, Any], verdict: int) -> str:
    """The reply of ``metric``'s first step giving ``verdict`` (0 or 1) for ``row``."""
    if isinstance(metric, AnswerVerdictMetric):
        return json.dumps({"reason": REASONS[verdict], "verdict": bool(verdict)})
    if isinstance(metric, ContextVerdictMetric):
        item: Any = json.loads(verdict_reply(verdict)) if metric.reasons else verdict
        return json.dumps({"verdicts": [item] * len(row[CONTEXTS])})
    if isinstance(metric, AnswerConsistencyBinary):
        return json.dumps(
            {"reason": REASONS[verdict], "states_claims": True, "unattributable": not verdict}
        )
    if isinstance(metric, Rubric):
        values = sorted(verdict_values(metric.rubric), key=lambda vs: vs[1])
        value = values[-1][0] if verdict else values[0][0]
        if metric.rubric.reasons:
            reply = {"reason": REASONS[verdict], reply_key(metric.rubric): value}
            return json.dumps(reply, ensure_ascii=False)
        return str(value)
    raise ValueError(f"{metric.name}: {metric_problem(metric)}")


def scored_reply(metric: JudgeMetric, row: dict[str, Any], reply: str) -> float | None:
    """The score ``metric``'s program gives ``row`` when its first step gets ``reply``.

    Raises
    ------
    ValueError
        The first step is not one judge request, the metric's parser rejects the reply
        (the message holds its complaint), or the program asks for another step.
    """
    program = metric.program(row)
    asks = next(program)
    if len(asks) != 1 or not isinstance(asks[0], Ask):
        raise ValueError(f"{metric.name}: its first step is not one judge request")
    try:
        parsed = asks[0].parse(reply)
    except Exception as exc:  # noqa: BLE001 - the parser's ParseError, or a bug shown as such
        raise ValueError(f"{metric.name} does not accept the reply {reply!r}: {exc}") from None
    try:
        program.send([parsed])
    except StopIteration as done:
        return done.value.score
    program.close()
    raise ValueError(f"{metric.name} asks for another step after the reply {reply!r}")


def example_reply(
    metric: JudgeMetric, row: dict[str, Any], label: float, judge_threshold: float = 0.5
) -> str:
    """The reply ``metric``'s first step should give ``row``, a row labelled ``label``.

    Parameters
    ----------
    metric : JudgeMetric
        A metric :func:`metric_problem` accepts.
    row : dict
        The row's canonical values (``question``, ``contexts``, ``answer``,
        ``reference``), one :func:`row_problem` accepts.
    label : float
        The binary label, 0.0 or 1.0, in the metric's direction.
    judge_threshold : float
        The score at or above which the judge's verdict is 1 (the label's
        ``judge_threshold``).

    Returns
    -------
    str
        The reply text, accepted by the metric's own parser; the metric's program scores
        the row at or above ``judge_threshold`` for label 1 and below it for label 0.

    Raises
    ------
    ValueError
        The metric or the row has a problem (:func:`metric_problem`,
        :func:`row_problem`), the label is not 0 or 1, or the reply fails the check above.
    """
    if label not in (0.0, 1.0):
        raise ValueError(f"label must be 0 or 1, got {label!r}")
    why = metric_problem(metric) or row_problem(metric, row)
    if why:
        raise ValueError(f"{metric.name}: {why}")
    verdict = int(label)
    reply = _candidate(metric, row, verdict)
    score = scored_reply(metric, row, reply)
    if score is None or (score >= judge_threshold) != bool(verdict):
        raise ValueError(
            f"{metric.name} scores the reply {reply!r} {score!r}, which is not on the side "
            f"of judge_threshold {judge_threshold} that label {verdict} is"
        )
    return reply


__all__ = ["REASONS", "example_reply", "metric_problem", "row_problem", "scored_reply"]
