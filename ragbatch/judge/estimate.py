"""Estimate the judge calls and tokens of a judge stage from a sample, without a judge.

Each metric's own program runs on the sampled rows that pass its guards, exactly as the
judge stage would run it, but no request is sent:

* First step: the asks are the ones the run will send (capped to the engine's
  ``max_tokens``), so their number and prompt tokens are exact for the sample (given
  the judge's tokenizer; see :mod:`ragbatch.judge.tokens`).
* Later steps of a multi-step metric: the prompt holds the judge's earlier reply, which
  does not exist yet. The metric's :meth:`~ragbatch.judge.metric.JudgeMetric.assumed_result`
  stands in for it (for the statement metrics: the text's sentences, see
  :mod:`ragbatch.judge.assumed`), and the program builds the follow-up asks from that.
  Every row is assumed to reach the later step (a refusal with no statements would not),
  so the calls of later steps are an upper bound and their tokens an assumption.
* With a :class:`~ragbatch.judge.pilot.Pilot`, the first rows of each multi-step metric
  get real replies for their earlier steps instead, so their later prompts (and whether
  they reach them) are what a run sees. When the pilot covers every sampled row of the
  metric the later steps are counted (basis ``pilot``). Otherwise each figure of a later
  step is the assumption over all rows times the ratio, on the piloted rows, of the
  figure with real replies to the figure with assumed ones (basis ``pilot-scaled``;
  where the assumption gives 0 on the piloted rows, the piloted figure is scaled by
  rows instead).

Counted like the run counts them (the manifest's ``judge`` section): identical requests
of a metric are answered once (the rest are ``cache_hits``), and so are requests the
judgment cache already holds; a row whose first step is answered that way is assumed to
be answered that way in its later steps too (the cached reply gives the same follow-up
prompt). A prompt whose tokens plus ``max_tokens`` exceed the model's window ends in
``context_too_long`` without reaching the model: it is counted in ``over_window``, not
as a call, its prompt tokens are not counted, and the row takes no later step. Not
included: parse retries (each unparseable reply is
asked again, up to ``parse_retries`` times, at the prompt's cost again) and embedding
requests (``answer_relevancy``), which are not judge calls.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, cast

import polars as pl

from ragbatch.judge.batch import guarded_rows, with_issues
from ragbatch.judge.cache_probe import CacheProbe
from ragbatch.judge.metric import JudgeMetric, bind_instructions
from ragbatch.judge.pilot import Pilot
from ragbatch.judge.protocol import Ask
from ragbatch.judge.run import capped
from ragbatch.judge.tokens import PromptCounter


@dataclass
class StepEstimate:
    """One judge step of one metric over the sample.

    Attributes
    ----------
    number : int
        1 for the first step.
    name : str
        The step's name (:attr:`~ragbatch.judge.protocol.Ask.step`).
    basis : str
        ``exact`` (counted: a first step), ``assumed`` (prompts built from an assumed
        earlier reply), ``pilot`` (built from real replies for every row) or
        ``pilot-scaled`` (the assumption corrected by a pilot on some rows).
    calls : int
        Requests the engine would serve (cache hits and ``over_window`` excluded).
    cache_hits : int
        Requests answered by an identical request of the sample or the judgment cache.
    prompt_tokens : int
        Prompt tokens of ``calls``.
    completion_bound : int
        Sum of the ``max_tokens`` of ``calls``: the most completion tokens they can take.
    over_window : int
        Requests whose prompt plus ``max_tokens`` exceed the window: refused as
        ``context_too_long``, not counted in ``calls`` or ``prompt_tokens``.
    """

    number: int
    name: str
    basis: str
    calls: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_bound: int = 0
    over_window: int = 0

    @property
    def assumed(self) -> bool:
        """Whether the figures rest on assumed judge replies (any basis but ``exact``
        and ``pilot``)."""
        return self.basis not in ("exact", "pilot")


#: The figures of a step, in the order of :class:`StepEstimate`'s fields.
STEP_FIGURES = ("calls", "cache_hits", "prompt_tokens", "completion_bound", "over_window")


@dataclass
class MetricEstimate:
    """The judge steps of one metric over the sample.

    Attributes
    ----------
    metric_id, name : str
    rows_judged : int
        Sampled rows that pass the metric's guards (the others take no judge call).
    steps : list of StepEstimate
        In step order.
    steps_declared : int
        :attr:`~ragbatch.judge.metric.JudgeMetric.judge_steps`; more than
        ``len(steps)`` when a later step could not be estimated.
    """

    metric_id: str
    name: str
    rows_judged: int
    steps: list[StepEstimate] = field(default_factory=list)
    steps_declared: int = 1

    def total(self, key: str) -> int:
        """Sum of ``key`` (``calls``, ``prompt_tokens``, ...) over the steps."""
        return sum(getattr(s, key) for s in self.steps)


@dataclass
class _Row:
    """A row's program while the estimate drives it."""

    row: dict[str, Any]
    program: Any
    asks: list[Ask]
    free: bool = False  # its first step was answered without a call


def estimate_stage(
    metrics: list[JudgeMetric],
    spec: Any,
    sample: pl.DataFrame,
    counter: PromptCounter,
    probe: CacheProbe,
    window: int | None,
    pilot: Pilot | None = None,
) -> list[MetricEstimate]:
    """Estimate the judge steps of every metric of one judge stage on ``sample``.

    Parameters
    ----------
    metrics : list of JudgeMetric
        The stage's metrics.
    spec : ragbatch.engines.vllm.VllmEngine or ragbatch.engines.openai.OpenAIEngine
        ``max_tokens`` caps each ask; ``batch_size`` bounds which identical requests
        share a call when the cache is disabled.
    sample : polars.DataFrame
        Canonical rows (:func:`ragbatch.io.sample.sample_input`).
    counter : PromptCounter
    probe : CacheProbe
    window : int or None
        The model's window in tokens (prompt plus completion); None when unknown (no
        request is then counted as too long).
    pilot : Pilot, optional
        Real replies for the earlier steps of the first ``pilot.rows`` rows of each
        multi-step metric (see the module notes); None assumes every reply.

    Returns
    -------
    list of MetricEstimate
        One per metric, in order; counts are for the sample (not scaled).
    """
    bind_instructions(metrics)  # the prompts the stage will send
    frame = with_issues(sample)
    _, todo = guarded_rows(metrics, frame)
    out = []
    for metric in metrics:
        rows = [row for _, row in todo[metric.id]]
        assumed = _drive(metric, rows, spec, counter, probe, window, None)
        if pilot is None or metric.judge_steps == 1 or not rows:
            out.append(assumed)
            continue
        head = rows[: pilot.rows]
        real = _drive(metric, head, spec, counter, probe, window, pilot)
        if len(head) == len(rows):
            out.append(_relabel(real, "pilot"))
            continue
        head_assumed = _drive(metric, head, spec, counter, probe, window, None)
        out.append(combine_pilot(assumed, head_assumed, real, len(rows), len(head)))
    return out


def _drive(
    metric: JudgeMetric,
    rows: list[dict[str, Any]],
    spec: Any,
    counter: PromptCounter,
    probe: CacheProbe,
    window: int | None,
    pilot: Pilot | None,
) -> MetricEstimate:
    """Count ``metric``'s steps on ``rows``, feeding later steps assumed replies, or the
    pilot's real ones when ``pilot`` is given."""
    states = [_start(metric, row) for row in rows]
    estimate = MetricEstimate(
        metric.id, metric.name, len(states), steps_declared=metric.judge_steps
    )
    live = [r for r in states if r.asks]
    number = 1
    while live and number <= metric.judge_steps:
        basis = "exact" if number == 1 else ("pilot" if pilot else "assumed")
        step = StepEstimate(number, live[0].asks[0].step, basis)
        _count_step(metric, live, step, spec, counter, probe, window)
        estimate.steps.append(step)
        if number == metric.judge_steps:
            break
        live = _next_step(metric, live, pilot)
        number += 1
    return estimate


def _next_step(metric: JudgeMetric, live: list[_Row], pilot: Pilot | None) -> list[_Row]:
    """The rows that take a further judge step, their asks advanced. Rows answered from
    the cache (``free``) are advanced on the assumption: they cost nothing either way."""
    sent = [r for r in live if r.asks and not r.free] if pilot is not None else []
    # sent is empty when pilot is None
    replies = cast(Pilot, pilot).replies([r.asks for r in sent]) if sent else []
    real = {id(r): values for r, values in zip(sent, replies)}
    kept = []
    for state in live:
        if id(state) in real:
            # the same entry, just checked not None
            going = real[id(state)] is not None and _send(state, cast(list, real[id(state)]))
        else:
            going = _advance(metric, state)
        if going:
            kept.append(state)
    return kept


def combine_pilot(
    assumed: MetricEstimate,
    head_assumed: MetricEstimate,
    real: MetricEstimate,
    rows: int,
    head_rows: int,
) -> MetricEstimate:
    """Correct the assumed later steps by a pilot on the first rows.

    Parameters
    ----------
    assumed : MetricEstimate
        Every row, with assumed replies.
    head_assumed, real : MetricEstimate
        The piloted rows, with assumed replies and with the pilot's real ones.
    rows, head_rows : int
        Rows in ``assumed`` and in the pilot (``0 < head_rows < rows``).

    Returns
    -------
    MetricEstimate
        Step 1 as ``assumed`` (counted); each later step ``k`` with every figure
        ``round(A * R / H)``, where ``A``, ``H`` and ``R`` are that figure of step ``k``
        in ``assumed``, ``head_assumed`` and ``real`` (0 for a step a pilot row never
        reached), or ``round(R * rows / head_rows)`` where ``H`` is 0. Basis
        ``pilot-scaled``.
    """
    out = MetricEstimate(
        assumed.metric_id, assumed.name, assumed.rows_judged, steps_declared=assumed.steps_declared
    )
    for k, step in enumerate(assumed.steps):
        if k == 0:
            out.steps.append(step)
            continue
        h = _step_or_zero(head_assumed, k, step)
        r = _step_or_zero(real, k, step)
        scaled = StepEstimate(step.number, step.name, "pilot-scaled")
        for key in STEP_FIGURES:
            a, hv, rv = getattr(step, key), getattr(h, key), getattr(r, key)
            setattr(scaled, key, round(a * rv / hv) if hv else round(rv * rows / head_rows))
        out.steps.append(scaled)
    return out


def _step_or_zero(estimate: MetricEstimate, k: int, like: StepEstimate) -> StepEstimate:
    return (
        estimate.steps[k]
        if k < len(estimate.steps)
        else StepEstimate(like.number, like.name, "pilot")
    )


def _relabel(estimate: MetricEstimate, basis: str) -> MetricEstimate:
    for step in estimate.steps[1:]:
        step.basis = basis
    return estimate


def _start(metric: JudgeMetric, row: dict[str, Any]) -> _Row:
    program = metric.program(row)
    try:
        requests = next(program)
    except Exception:  # the run gives such a row status error, without a call
        return _Row(row, program, [])
    return _Row(row, program, [r for r in requests if isinstance(r, Ask)])


def _advance(metric: JudgeMetric, state: _Row) -> bool:
    """Feed the assumed results of ``state``'s asks; keep the next judge asks. False when
    the row takes no further judge step (or the metric makes no assumption)."""
    if not state.asks:
        return False
    try:
        values = [metric.assumed_result(state.row, ask) for ask in state.asks]
    except Exception:  # NotImplementedError (no assumption), or the metric's code fails
        return False
    return _send(state, values)


def _send(state: _Row, values: list[Any]) -> bool:
    """Send ``values`` (one per ask) to the row's program; keep its next judge asks."""
    try:
        requests = state.program.send(values)
    except StopIteration:
        return False
    except Exception:  # the metric's code fails on the reply: no further step
        return False
    state.asks = [r for r in requests if isinstance(r, Ask)]
    return bool(state.asks)


def _count_step(
    metric: JudgeMetric,
    live: list[_Row],
    step: StepEstimate,
    spec: Any,
    counter: PromptCounter,
    probe: CacheProbe,
    window: int | None,
) -> None:
    """Count the asks of ``live`` for one step into ``step``; drop asks of rows whose
    prompt is too long (those rows stop)."""
    asks = [(r, capped(a, spec.max_tokens)) for r in live for a in r.asks]
    tokens = counter.count([a.messages for _, a in asks])
    seen: set[tuple[int, str]] = set()
    for position, ((state, ask), n_tokens) in enumerate(zip(asks, tokens)):
        # With the cache on, a request made once is found again by later batches of the
        # run; without it, identical requests share a call only within a batch.
        scope = 0 if probe.enabled else position // spec.batch_size
        key = (scope, json.dumps([ask.prompt_text(), ask.output.key()]))
        duplicate = key in seen
        seen.add(key)
        if step.number == 1:
            state.free = duplicate or probe.cached(metric, ask, state.row)
        if duplicate or state.free:
            step.cache_hits += 1
            continue
        if window is not None and n_tokens + ask.output.max_tokens > window:
            step.over_window += 1  # refused unserved: not a call (see Completion.refused)
            state.asks = []
            continue
        step.calls += 1
        step.prompt_tokens += n_tokens
        step.completion_bound += ask.output.max_tokens


def judge_window(spec: Any) -> tuple[int | None, str]:
    """The judge's window in tokens, and where it comes from.

    Returns
    -------
    (int or None, str)
        ``max_model_len`` from the config when set; otherwise the engine type's
        ``context_window`` hook (for a ``vllm`` engine the model's
        ``max_position_embeddings`` in its ``config.json``, which vLLM uses unless told
        otherwise); else None with "unknown".
    """
    from ragbatch.core.engine_registry import engine_of

    if spec.max_model_len is not None:
        return spec.max_model_len, "max_model_len"
    found = engine_of(spec).window(spec)
    if found is not None:
        return found
    return None, "unknown (set max_model_len to check prompt lengths)"
