"""A pilot for the dry run: real judge replies for the earlier steps of a few rows.

A two-step judge metric builds its second prompt from the judge's first reply (the
statements of an answer, for ``faithfulness``). Without that reply a dry run can only
assume it (:mod:`ragbatch.judge.assumed`). With ``ragbatch run --dry-run --pilot-rows N``
the first ``N`` sampled rows of each multi-step metric are sent to the judge for every
step but the last, exactly as the run would send them (same prompts, ``max_tokens`` cap
and seed); their replies are parsed as the run parses them and build the real follow-up
prompts. A reply that fails (an engine error, a reply cut at ``max_tokens`` or one that
does not parse) ends the row there, as it would in a run with ``parse_retries: 0``.

The pilot is the only part of a dry run that calls a judge, so it is opt-in; its calls
and tokens are reported. Last steps are never sent: their prompts are known without a
reply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ragbatch.judge.protocol import Ask, EngineRequest, JudgeEngine, run_sync
from ragbatch.judge.run import capped
from ragbatch.core.status import OK


@dataclass
class Pilot:
    """Sends the earlier steps of the first rows of each multi-step metric to a judge.

    Parameters
    ----------
    engine : JudgeEngine
        The run's judge engine, loaded in this process.
    rows : int
        Rows piloted per metric (the first ``rows`` of the sample that pass the metric's
        guards); at least 1.
    seed : int
        Seed of the requests (the engine spec's ``seed``: a run's first attempt).
    max_tokens : int or None
        The engine spec's ``max_tokens`` cap.

    Attributes
    ----------
    calls, prompt_tokens, completion_tokens : int
        What the pilot spent, summed over the requests the engine served (token counts
        as the engine reports them; a request refused as ``context_too_long`` is not
        served).
    """

    engine: JudgeEngine
    rows: int
    seed: int = 0
    max_tokens: int | None = None
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def replies(self, asks: Sequence[Sequence[Ask]]) -> list[list[Any] | None]:
        """The parsed replies to each row's asks, in one engine call.

        Parameters
        ----------
        asks : sequence of sequence of Ask
            Per row, the asks of its current step.

        Returns
        -------
        list
            Per row, the parsed value of each ask in order, or None when any of the
            row's asks failed (the row takes no further step).
        """
        flat = [capped(a, self.max_tokens) for row in asks for a in row]
        requests = [EngineRequest(a.messages, a.output, self.seed) for a in flat]
        completions = run_sync(self.engine.complete(requests)) if requests else []
        served = [c for c in completions if not c.refused]
        self.calls += len(served)
        self.prompt_tokens += sum(c.prompt_tokens for c in served)
        self.completion_tokens += sum(c.completion_tokens for c in served)
        out: list[list[Any] | None] = []
        position = 0
        for row in asks:
            values: list[Any] | None = []
            for ask in row:
                value = _parsed(ask, completions[position])
                position += 1
                if value is _FAILED or values is None:
                    values = None
                    continue
                values.append(value)
            out.append(values)
        return out


_FAILED = object()


def _parsed(ask: Ask, completion: Any) -> Any:
    """The parsed reply, or ``_FAILED`` where the run would give the cell a failure
    status (with ``parse_retries: 0``)."""
    if completion.status != OK or completion.finish_reason == "length":
        return _FAILED
    try:
        return ask.parse(completion.text or "")
    except Exception:
        return _FAILED
