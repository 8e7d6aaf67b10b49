"""Several judge calls sharing one ``vllm.LLM`` from one event loop: how
:meth:`ragbatch.engines.vllm.VllmJudgeEngine.complete` runs.

Each call (a coroutine) renders and adds its requests (``LLM.enqueue``), then waits; one
task on the same event loop steps the engine (``LLM.llm_engine.step()``) while any call
has unfinished requests, hands each finished ``RequestOutput`` to the call that added
it, wakes a call when its last request finishes, and yields to the loop after every
step. A call that starts while others run (the next round of a judge program, another
batch) therefore joins vLLM's running batch at the next step, and with one call at a
time this is the loop ``LLM.generate`` runs, plus the time limit.

Only the vLLM calls listed in docs/engines.md are used (``LLM.enqueue``,
``llm_engine.step``, ``llm_engine.has_unfinished_requests``,
``llm_engine.abort_request``), all from the one thread that runs the loop: vLLM's
offline engine is not thread-safe, and nothing here needs a second thread. On a GPU
the engine core runs in its own process and keeps computing while the loop runs the
callers' Python; on a CPU with the engine in the calling process a step and the
callers' Python take turns.

Time limits and failures are per call: ``batch_timeout_s`` counts from the moment a
call's requests are added, and once it has passed that call's unfinished requests are
aborted and come back as ``timeout`` while the other calls go on. A request vLLM
refuses at ``enqueue`` fails alone (``judge_error``). An exception from ``step()``
fails the unfinished requests of every call in flight (``judge_error``, the exception's
type and message), since a step serves them all. A caller that is cancelled while
waiting has its unfinished requests aborted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Sequence

from ragbatch.core.status import JUDGE_ERROR, OK, TIMEOUT
from ragbatch.core.errors import describe_exception
from ragbatch.judge.protocol import Completion, EngineRequest, TokenLogprob

if TYPE_CHECKING:
    from ragbatch.engines.vllm import VllmJudgeEngine

logger = logging.getLogger(__name__)


class _Call:
    """The requests one ``complete`` call added to the engine."""

    def __init__(self, request_ids: list[str | None], lengths: list[int], out: list[Any]):
        self.request_ids = request_ids
        self.lengths = lengths
        self.out = out
        self.pending = {k for k, rid in enumerate(request_ids) if rid is not None}
        self.index = _output_index(request_ids)
        self.start = time.monotonic()
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def unfinished_ids(self) -> list[str | None]:
        return [self.request_ids[k] for k in self.pending]


class VllmFeed:
    """Overlapping :meth:`complete` calls on one loaded :class:`VllmJudgeEngine`.

    Parameters
    ----------
    engine : VllmJudgeEngine
        The loaded engine; its ``vllm.LLM`` must not be stepped by anything else while
        calls are in flight.

    Attributes
    ----------
    steps : int
        Engine steps taken so far.
    peak : int
        The most calls that had requests in the engine at once.
    """

    def __init__(self, engine: VllmJudgeEngine):
        self._engine = engine
        self._calls: list[_Call] = []
        self._owner: dict[str, _Call] = {}
        self._stepper: asyncio.Task[None] | None = None
        self.steps = 0
        self.peak = 0

    async def complete(self, requests: Sequence[EngineRequest]) -> list[Completion]:
        """Answer ``requests``, sharing the engine with the other calls in flight.

        Parameters
        ----------
        requests : sequence of EngineRequest

        Returns
        -------
        list of Completion
            One per request, in order, with the statuses
            :meth:`VllmJudgeEngine.complete` documents.

        Raises
        ------
        asyncio.CancelledError
            The caller was cancelled; its unfinished requests are aborted first.
        """
        engine = self._engine
        results, to_run = engine._prepare(requests)
        if to_run:
            out: list[Completion | None] = [None] * len(to_run)
            request_ids = engine._enqueue(requests, to_run, out)
            call = _Call(request_ids, [len(ids) for _, ids in to_run], out)
            if call.pending:
                self._add(call)
                try:
                    await call.done
                except BaseException:
                    self._drop(call, abort=True)
                    raise
            for (i, _), completion in zip(to_run, out):
                results[i] = completion
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    def _add(self, call: _Call) -> None:
        self._calls.append(call)
        self.peak = max(self.peak, len(self._calls))
        for rid in call.index:
            self._owner[rid] = call
        if self._stepper is None or self._stepper.done():
            self._stepper = asyncio.get_running_loop().create_task(self._run())

    def _drop(self, call: _Call, abort: bool) -> None:
        """Take ``call`` out of the feed (aborting its unfinished requests when asked)
        and wake its caller."""
        if call in self._calls:
            self._calls.remove(call)
        for rid in call.index:
            if self._owner.get(rid) is call:
                del self._owner[rid]
        if abort and call.pending:
            self._engine._abort(call.unfinished_ids())
        if not call.done.done():
            call.done.set_result(None)

    def _settle(self, call: _Call, status: str, error: str | None) -> None:
        """Give ``call``'s unfinished requests ``status`` and ``error``, abort them in
        the engine, and wake the call."""
        for k in call.pending:
            call.out[k] = Completion(status, prompt_tokens=call.lengths[k], error=error)
        self._drop(call, abort=True)
        call.pending = set()

    async def _run(self) -> None:
        """Step the engine while calls have unfinished requests."""
        llm_engine = self._engine._llm.llm_engine
        timeout = self._engine.spec.batch_timeout_s
        try:
            while self._calls:
                if timeout is not None:
                    now = time.monotonic()
                    for call in [c for c in self._calls if now - c.start >= timeout]:
                        n = len(call.request_ids)
                        self._settle(call, TIMEOUT, self._engine._timeout_error(n, call.start))
                    if not self._calls:
                        break
                if not llm_engine.has_unfinished_requests():
                    for call in list(self._calls):
                        self._settle(
                            call, JUDGE_ERROR, "vLLM finished without returning this request"
                        )
                    break
                outputs = llm_engine.step()
                self.steps += 1
                self._dispatch(outputs)
                await asyncio.sleep(0)  # the woken calls parse and add their next requests
        except Exception as exc:  # the engine failed mid-step: every unfinished request fails
            failure = describe_exception(exc)
            logger.warning("vLLM failed with %d calls in flight: %s", len(self._calls), failure)
            for call in list(self._calls):
                self._settle(call, JUDGE_ERROR, failure)

    def _dispatch(self, outputs: Sequence[Any]) -> None:
        """Give each finished ``RequestOutput`` to its call; wake the calls now done."""
        woken = []
        for result in outputs:
            call = self._owner.get(result.request_id)
            if call is None or not result.finished:
                continue
            k = call.index[result.request_id]
            if k not in call.pending:
                continue
            call.pending.discard(k)
            call.out[k] = _completion(result, call.lengths[k])
            if not call.pending:
                woken.append(call)
        for call in woken:
            self._drop(call, abort=False)


def _output_index(request_ids: list[str | None]) -> dict[str, int]:
    """Position of each request by the id its outputs carry.

    ``LLM.enqueue`` returns the engine's internal id, ``"<id>-<8 random characters>"``,
    while a ``RequestOutput`` carries ``<id>``, the id the request was added under (the
    engine appends the characters to keep ids unique; with
    ``VLLM_DISABLE_REQUEST_ID_RANDOMIZATION`` the two are the same). vLLM exposes no
    public way to learn ``<id>`` from the returned id, so both forms are indexed.
    """
    index: dict[str, int] = {}
    for k, rid in enumerate(request_ids):
        if rid is not None:
            index[rid] = k
            index.setdefault(rid.rsplit("-", 1)[0], k)
    return index


def _completion(result: Any, prompt_tokens: int) -> Completion:
    """A :class:`Completion` from a finished ``vllm.RequestOutput``."""
    if not result.outputs:
        return Completion(
            JUDGE_ERROR,
            prompt_tokens=prompt_tokens,
            error="vLLM returned no output for the request",
        )
    choice = result.outputs[0]
    cached = getattr(result, "num_cached_tokens", None)
    finish = choice.finish_reason
    if finish not in ("stop", "length"):
        return Completion(
            JUDGE_ERROR,
            prompt_tokens=prompt_tokens,
            completion_tokens=len(choice.token_ids),
            error=f"vLLM finished the request with reason {finish!r}",
        )
    return Completion(
        OK,
        text=choice.text,
        finish_reason=finish,
        prompt_tokens=prompt_tokens,
        completion_tokens=len(choice.token_ids),
        cached_prompt_tokens=int(cached) if cached is not None else None,
        logprobs=_token_logprobs(choice),
    )


def _token_logprobs(choice: Any) -> tuple[TokenLogprob, ...] | None:
    """The generated tokens of a ``vllm.CompletionOutput`` with their top logprobs, or
    None when none were asked for (or vLLM returned fewer positions than tokens)."""
    positions = choice.logprobs
    if not positions or len(positions) != len(choice.token_ids):
        return None
    out = []
    for token_id, entry in zip(choice.token_ids, positions):
        chosen = entry.get(token_id) if entry else None
        if chosen is None:
            return None
        top = sorted(
            ((lp.decoded_token or "", float(lp.logprob)) for lp in entry.values()),
            key=lambda item: -item[1],
        )
        out.append(TokenLogprob(chosen.decoded_token or "", float(chosen.logprob), tuple(top)))
    return tuple(out)
