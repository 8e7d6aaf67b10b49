"""The text ``ragbatch run --dry-run`` prints (:func:`format_dry_run`)."""

from __future__ import annotations

import textwrap

from ragbatch.pipeline.dry_run import DryRun, JudgeStageEstimate, StagePlan
from ragbatch.judge.estimate import MetricEstimate, StepEstimate
from ragbatch.core.redact import redact_text

_COLUMNS = ("rows", "calls", "cache hits", "prompt tokens", "completion <=", "too long")
#: Width the stage lines are wrapped at.
_WIDTH = 100
_KEYS = ("calls", "cache_hits", "prompt_tokens", "completion_bound", "over_window")


def format_dry_run(result: DryRun) -> str:
    """The dry run as text: input, stages, and one judge table per judge engine.

    Parameters
    ----------
    result : DryRun

    Returns
    -------
    str
        Several lines, no trailing newline. Judge figures are scaled from the sample to
        the whole input; each step says whether it is ``exact`` (counted on the sample)
        or ``assumed``. URLs appear without credentials
        (:func:`ragbatch.core.redact.redact_text`).
    """
    size = result.input_size
    exactness = "exact" if size.exact else "estimate"
    piloted = any(j.pilot is not None and j.pilot.calls for j in result.judges)
    lines = [
        "dry run: nothing is run and nothing is written"
        if not piloted
        else "dry run: no metric is run and nothing is written; a pilot sent judge calls (below)",
        f"input   {result.config.input.uri}: {result.read_tasks} read task(s), "
        f"{size.rows:,} rows ({exactness}, {size.how})",
    ]
    if result.judges:
        lines.append(
            f"sample  the first {result.sample_rows:,} rows; judge figures are scaled "
            f"to all {size.rows:,} rows (x{result.scale:.2f})"
        )
    lines += ["", "stages, in order:"]
    for number, stage in enumerate(result.stages, start=1):
        lines += _stage_lines(number, stage)
    for judge in result.judges:
        lines += [""] + _judge_lines(result, judge)
    return redact_text("\n".join(lines))


def _stage_lines(number: int, stage: StagePlan) -> list[str]:
    head = f"  {number}. {stage.name:<22}"
    pad = " " * len(head)
    lines = textwrap.wrap(
        ", ".join(stage.metrics),
        width=_WIDTH,
        initial_indent=head,
        subsequent_indent=pad,
        break_on_hyphens=False,
    ) or [head.rstrip()]
    if stage.actors is not None:
        resources = ", ".join(
            f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in stage.resources.items()
        )
        lines.append(f"{pad}engine {stage.engine}; actors: {stage.actors}")
        lines += textwrap.wrap(
            f"per actor: {resources}",
            width=_WIDTH,
            initial_indent=pad,
            subsequent_indent=pad + "  ",
        )
    for note in stage.notes:
        lines += textwrap.wrap(
            note, width=_WIDTH, initial_indent=pad, subsequent_indent=pad + "  "
        ) or [pad]
    if not stage.metrics and stage.actors is None:
        # read and write stages: the note is the description; put it on the first line
        lines = [f"{head}{stage.notes[0]}"] + [f"{pad}{n}" for n in stage.notes[1:]]
    return lines


def _judge_lines(result: DryRun, judge: JudgeStageEstimate) -> list[str]:
    if judge.token_counter == "tokenizer":
        counting = f"counted with the {judge.token_source} (chat template applied)"
    else:
        counting = (
            f"APPROXIMATE, {judge.token_counter} of the prompt text "
            f"({judge.token_source}; set the engine's `tokenizer` for exact counts)"
        )
    window = (
        f"{judge.window:,} tokens ({judge.window_source})" if judge.window else judge.window_source
    )
    lines = [
        f"judge engine {judge.engine}",
        f"  prompt tokens: {counting}",
        f"  window: {window}",
        f"  {judge.cache_note}",
    ]
    table = [row for metric in judge.metrics for row in _metric_rows(result, metric)]
    totals = [result.scaled(judge.total(k)) for k in _KEYS]
    table.append(("total", "", None, totals))
    width = max(len(label) for label, *_ in table)
    header = f"  {'metric / step':<{width}}  {'basis':<13}" + "".join(f"{c:>15}" for c in _COLUMNS)
    lines += [header, "  " + "-" * (len(header) - 2)]
    for label, basis, rows, values in table:
        cells = [f"{rows:>14,}" if rows is not None else " " * 14]
        cells += [f"{v:>14,}" if v is not None else " " * 14 for v in values]
        lines.append((f"  {label:<{width}}  {basis:<13}" + "".join(cells)).rstrip())
    lines += _notes(judge)
    return lines


def _metric_rows(result: DryRun, metric: MetricEstimate) -> list[tuple]:
    """``(label, basis, rows, figures)`` table rows of one metric: one row for a single
    step, else a total row and a row per step."""
    rows = result.scaled(metric.rows_judged)
    if len(metric.steps) == 1 and metric.steps_declared == 1:
        step = metric.steps[0]
        return [(f"{metric.metric_id}: {step.name}", _basis(step), rows, _figures(result, step))]
    basis = "+".join(dict.fromkeys(_basis(s) for s in metric.steps)) or "-"
    out: list[tuple] = [
        (metric.metric_id, basis, rows, [result.scaled(metric.total(k)) for k in _KEYS])
    ]
    out += [(f"  {s.number} {s.name}", _basis(s), None, _figures(result, s)) for s in metric.steps]
    out += [
        (f"  {n} (not estimated)", "", None, [None] * len(_KEYS))
        for n in range(len(metric.steps) + 1, metric.steps_declared + 1)
    ]
    return out


def _basis(step: StepEstimate) -> str:
    return step.basis


def _figures(result: DryRun, step: StepEstimate) -> list[int]:
    return [result.scaled(getattr(step, k)) for k in _KEYS]


def _notes(judge: JudgeStageEstimate) -> list[str]:
    notes = ["exact: the requests a run sends for the sampled rows, counted, then scaled."]
    bases = {s.basis for m in judge.metrics for s in m.steps}
    if "assumed" in bases:
        notes.append(
            "assumed: the prompt holds the judge's earlier reply, taken to be the "
            "sentences of the text it splits; every row is assumed to reach the step "
            "(--pilot-rows N sends the earlier steps of N rows to the judge instead)."
        )
    if judge.pilot is not None:
        p = judge.pilot
        notes.append(
            f"pilot: the earlier steps of up to {p.rows:,} rows per multi-step metric "
            f"were sent to the judge ({p.calls:,} calls, {p.prompt_tokens:,} prompt and "
            f"{p.completion_tokens:,} completion tokens, not in the table); their real "
            "replies built the later prompts, counted for those rows."
        )
    if "pilot-scaled" in bases:
        notes.append(
            "pilot-scaled: the assumed figure for all rows, times real / assumed on "
            "the piloted rows."
        )
    retries = (
        f"parse retries (parse_retries={judge.parse_retries}: an unparseable reply is "
        "asked again, at the same prompt cost) and "
        if judge.parse_retries
        else ""
    )
    notes.append(f"not included: {retries}embedding requests.")
    return [
        line
        for note in notes
        for line in textwrap.wrap(note, width=_WIDTH, initial_indent="  ", subsequent_indent="    ")
    ]
