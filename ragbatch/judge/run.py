"""Run the judge metrics of one batch of rows against one engine.

:class:`JudgeRunner` starts one program (:meth:`JudgeMetric.program`) per (metric,
row) that passed the metric's guards and advances them all in lockstep: each round
collects the requests every live program yielded, answers identical requests once,
serves what it can from the judgment cache (the entries of the batch's rows, looked up
once when it starts), sends the rest to the engine in one awaited ``complete`` call, parses the
replies, retries unparseable ones (up to ``parse_retries`` times, each with a new seed,
which also gives it a new cache key), and sends the parsed values back to the programs.
A request whose cached replies all fail to parse is asked again under a new generation of
keys when the runner re-asks parse failures (``rejudge``, :mod:`ragbatch.judge.rejudge`);
every run follows those generations to the first reply that parses.
:meth:`JudgeRunner.run` is a coroutine: the lookup runs on a worker thread and the engine
calls are awaited, so that several batches share one engine and one event loop.

Replies that hold verdicts also give their verdicts' probabilities
(:mod:`ragbatch.judge.confidence`), which become the cell's ``confidence``, its
``details["p_verdicts"]`` and, for a metric with ``score: probability``, its score
(:func:`settle`). A program whose request failed is closed and its cell takes the
failure's status:

==================  ==============================================================
status              when
==================  ==============================================================
``context_too_long`` the engine refused a prompt longer than the model's window
``judge_error``      the engine failed for the request
``timeout``          the request ran past its time limit
``parse_failure``    the reply was cut at ``max_tokens`` or had the wrong shape, on
                     the first try and every retry; ``judge_reply`` keeps it
``error``            the metric's program returned something other than a cell in
                     range, or an embedding failed
==================  ==============================================================

An exception raised by a metric's program, or by an engine call with anything but an
engine fault (:data:`ENGINE_FAULTS`), is a bug: it propagates, and the judge stage's
batch guard fails the run with the stage named (:mod:`udfs.guard`).
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Generator, Sequence, cast

import numpy as np

from ragbatch.judge.cache import JudgmentCache, cache_key, group_key
from ragbatch.judge.cache_store import Reply
from ragbatch.judge.confidence import CellConfidence
from ragbatch.judge.metric import Embed, JudgeMetric, bind_instructions
from ragbatch.judge.protocol import Ask, Completion, EngineRequest, JudgeEngine, ParseError
from ragbatch.core.errors import EngineError
from ragbatch.io.manifest_model import JudgeTally
from ragbatch.judge.rejudge import Found, first_generation, rejudge_key
from ragbatch.scoring.cells import PyCell
from ragbatch.core.status import ERROR, JUDGE_ERROR, OK, PARSE_FAILURE

log = logging.getLogger(__name__)

#: Longest judge reply kept in the scores table's ``judge_reply``, in characters; longer
#: replies are cut and end with "…[truncated]".
REPLY_MAX_CHARS = 4000

#: What an engine call may raise that fails its requests (``judge_error``) instead of the
#: run: the engine's own failures and time limits. Anything else is a bug and propagates.
ENGINE_FAULTS = (EngineError, TimeoutError)

#: An embedding function: texts -> float32 array (len(texts), dim), rows L2-normalised.
Embedder = Callable[[list[str]], np.ndarray]

#: The judging of one batch as a generator: it yields the engine requests of each round
#: and is sent their completions (same length and order); it returns metric id -> row
#: position -> :class:`JudgeCell`.
Rounds = Generator[list[EngineRequest], list[Completion], dict[str, dict[int, "JudgeCell"]]]


@dataclass
class Trace:
    """The judge bookkeeping of one cell."""

    replies: list[str] = field(default_factory=list)
    prompt_hashes: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    judge_calls: int = 0
    cache_hits: int = 0
    confidence: CellConfidence = field(default_factory=CellConfidence)

    def record(self, ask: Ask, completion: Completion, live: bool) -> None:
        """Note one answered request: its prompt hash always; its reply, tokens and a
        call (``live``) or a cache hit only when the engine served it (a refused
        request, :attr:`Completion.refused`, has no judgment behind the cell)."""
        self.prompt_hashes.append(ask.prompt_hash())
        if completion.refused:
            return
        if completion.text is not None:
            self.replies.append(completion.text)
        self.prompt_tokens += completion.prompt_tokens
        self.completion_tokens += completion.completion_tokens
        if live:
            self.judge_calls += 1
        else:
            self.cache_hits += 1

    def judge_reply(self) -> str | None:
        """The raw reply (a JSON list of replies for a multi-call cell), truncated to
        :data:`REPLY_MAX_CHARS`."""
        if not self.replies:
            return None
        text = (
            self.replies[0]
            if len(self.replies) == 1
            else json.dumps(self.replies, ensure_ascii=False)
        )
        if len(text) > REPLY_MAX_CHARS:
            text = text[:REPLY_MAX_CHARS] + "…[truncated]"
        return text

    def prompt_hash(self) -> str | None:
        """The hash of the one prompt, or of the joined hashes of several."""
        if not self.prompt_hashes:
            return None
        if len(self.prompt_hashes) == 1:
            return self.prompt_hashes[0]
        import hashlib

        return hashlib.sha256("|".join(self.prompt_hashes).encode()).hexdigest()[:16]


@dataclass
class JudgeCell:
    """A judged cell: the cell itself and its trace."""

    cell: PyCell
    trace: Trace


#: Per-metric totals of a batch, counted as the batch is judged: the manifest's judge
#: counters (:class:`~ragbatch.io.manifest_model.JudgeTally`), one definition for both.
Tally = JudgeTally


class _Slot:
    """One live program."""

    def __init__(self, metric: JudgeMetric, index: int, program: Any, group: str | None = None):
        self.metric = metric
        self.index = index
        self.program = program
        self.group = group  # the row's judgment-cache group
        self.trace = Trace()
        self.pending: list[Any] = []
        self.result: PyCell | None = None
        # parsed replies holding verdicts, by request: read in request order once the
        # step is answered, whatever order retries answered them in
        self.verdict_replies: dict[int, tuple[Completion, Any]] = {}

    def advance(self, values: list[Any] | None) -> None:
        """Send ``values`` (None to start) and store the next requests or the result.
        An exception the program raises is a bug in the metric's code: it propagates
        (the run fails with the stage named), no cell is made of it."""
        try:
            step = next(self.program) if values is None else self.program.send(values)
        except StopIteration as stop:
            self.result = _checked(
                self.metric, settle(self.metric, stop.value, self.trace.confidence)
            )
            return
        self.pending = list(step)
        if not self.pending or not all(isinstance(r, (Ask, Embed)) for r in self.pending):
            self.fail(PyCell(None, ERROR, f"{self.metric.id}: a step yielded no valid requests"))

    def fail(self, cell: PyCell) -> None:
        """Settle the slot on ``cell``. Its pending requests stay, so that the replies to
        its other requests of the step (a step may hold several) are still accounted;
        a settled slot makes no further request."""
        self.program.close()
        self.result = cell


def capped(ask: Ask, max_tokens: int | None) -> Ask:
    """``ask`` with its completion budget lowered to ``max_tokens`` (the engine's
    ``max_tokens`` setting) when that is smaller; unchanged when ``max_tokens`` is None.
    The capped ask is what the engine is sent and what the cache key is built from."""
    if max_tokens is None or ask.output.max_tokens <= max_tokens:
        return ask
    return replace(ask, output=replace(ask.output, max_tokens=max_tokens))


def settle(metric: JudgeMetric, cell: Any, confidence: CellConfidence) -> Any:
    """``cell`` as returned by ``metric``'s program, with its verdicts' probabilities.

    Parameters
    ----------
    metric : JudgeMetric
    cell : PyCell
        The program's result (anything else is returned unchanged, for
        :func:`_checked` to reject).
    confidence : CellConfidence
        The verdict distributions of the cell's replies.

    Returns
    -------
    PyCell
        Unchanged unless ``cell`` is ``ok`` and a reply held verdicts. Then, with the
        distributions, ``details["p_verdicts"]`` lists p(generated verdict) per
        verdict, and with ``score: probability`` the score is
        :meth:`JudgeMetric.expected_score` of the verdicts' expected values (the hard
        score moves to ``details["verdict_score"]``). Without them,
        ``details["confidence_note"]`` says why, and with ``score: probability`` the
        cell is ``judge_error`` (no hard verdict is passed off as a probability).
    """
    if not isinstance(cell, PyCell) or cell.status != OK or confidence.asked == 0:
        return cell
    details = dict(cell.details or {})
    if confidence.value is None:
        note = confidence.note or "no verdict found in the reply"
        details["confidence_note"] = note
        if metric.probability_score:
            return PyCell(
                None,
                JUDGE_ERROR,
                f"score: probability needs the verdicts' token logprobs: {note}",
                details,
            )
        return replace(cell, details=details)
    verdicts = confidence.verdicts or []
    details["p_verdicts"] = [v.generated for v in verdicts]
    if not metric.probability_score:
        return replace(cell, details=details)
    details["verdict_score"] = cell.score
    return replace(
        cell, score=metric.expected_score([v.expected for v in verdicts], cell), details=details
    )


def _checked(metric: JudgeMetric, cell: Any) -> PyCell:
    if not isinstance(cell, PyCell):
        return PyCell(
            None, ERROR, f"{metric.id}: program returned {type(cell).__name__}, not a cell"
        )
    if cell.status == OK:
        low, high = metric.score_range
        if cell.score is None or not (low <= cell.score <= high):
            return PyCell(
                None, ERROR, f"{metric.id}: score {cell.score} outside {metric.score_range}"
            )
    return cell


def parse_reply(ask: Ask, completion: Completion) -> tuple[Any, str | None]:
    """``(value, None)`` for an ``ok`` completion whose reply ``ask`` parses, else
    ``(None, problem)``: the reply was cut at ``max_tokens``, or its parser raised (the
    problem names the step and what was wrong)."""
    if completion.status != OK:
        return None, f"{ask.step}: {completion.error or completion.status}"
    if completion.finish_reason == "length":
        return None, f"{ask.step}: reply cut at max_tokens ({ask.output.max_tokens})"
    try:
        return ask.parse(completion.text or ""), None
    except ParseError as exc:
        return None, f"{ask.step}: {exc}"
    except Exception as exc:
        return None, f"{ask.step}: {type(exc).__name__}: {exc}"


def _engine_failed(requests: list[EngineRequest], exc: Exception) -> list[Completion]:
    """A ``judge_error`` completion per request of an engine call that raised ``exc``."""
    log.warning("judge engine failed on %d requests: %r", len(requests), exc)
    return [Completion(JUDGE_ERROR, error=f"{type(exc).__name__}: {exc}") for _ in requests]


def _one_each(requests: list[EngineRequest], completions: list[Completion]) -> list[Completion]:
    """``completions``, or a ``judge_error`` per request when the engine returned another
    number of completions than it was sent requests."""
    if len(completions) != len(requests):
        why = f"engine returned {len(completions)} completions for {len(requests)} requests"
        return [Completion(JUDGE_ERROR, error=why) for _ in requests]
    return completions


class JudgeRunner:
    """Runs judge programs for batches of rows.

    Parameters
    ----------
    engine : JudgeEngine
    metrics : list of JudgeMetric
    embedders : dict
        Embedding engine name -> :data:`Embedder`, for metrics that embed.
    cache : JudgmentCache or None
        None disables the cache (every request goes to the engine).
    parse_retries : int
        Extra attempts for a reply that cannot be parsed.
    seed : int
        Seed of the first attempt; attempt ``k`` uses ``seed + k``.
    max_tokens : int, optional
        Cap on every request's completion budget (the lower of it and the metric's).
    rejudge : bool
        Re-ask a request whose cached replies (every attempt's) fail to parse, under the
        next generation of its keys (:func:`~ragbatch.judge.rejudge.first_generation`);
        False follows the generations earlier runs paid for but starts none.

    The metrics are the stage's: those with ``prompt_layout: instructions_first`` are
    given one instruction block, of them all (:func:`~ragbatch.judge.metric.bind_instructions`).
    """

    def __init__(
        self,
        engine: JudgeEngine,
        metrics: Sequence[JudgeMetric],
        embedders: dict[str, Embedder] | None = None,
        cache: JudgmentCache | None = None,
        parse_retries: int = 1,
        seed: int = 0,
        max_tokens: int | None = None,
        rejudge: bool = False,
    ):
        self.max_tokens = max_tokens
        self.rejudge = rejudge
        self.engine = engine
        self.metrics = list(metrics)
        bind_instructions(self.metrics)
        self.embedders = embedders or {}
        self.cache = cache
        self.parse_retries = parse_retries
        self.seed = seed
        self.tallies: dict[str, Tally] = {m.id: Tally() for m in self.metrics}
        # the cached entries of the batch being judged (:meth:`_rounds`)
        self._found: dict[str, tuple[Reply, str]] = {}

    async def run(
        self, todo: dict[str, list[tuple[int, dict[str, Any]]]]
    ) -> dict[str, dict[int, JudgeCell]]:
        """Judge the rows that passed each metric's guards.

        Parameters
        ----------
        todo : dict
            Metric id -> list of ``(row position, row dict)``.

        Returns
        -------
        dict
            Metric id -> row position -> :class:`JudgeCell`, for every position given.

        Raises
        ------
        OutputError
            The judgment cache cannot be read.

        Notes
        -----
        A coroutine: the batch's judgment-cache lookup (:meth:`_lookup`) runs on a
        worker thread and each round's engine call is awaited, so that other batches
        judged on the same event loop run meanwhile and share the engine. Run concurrent
        batches on runners of their own (:meth:`fork`), so that each batch's totals stay
        its own. A cancelled batch stops waiting for its lookup at once; the thread
        finishes the read and its result is dropped.
        """
        groups = self._groups(todo)
        found = await asyncio.to_thread(self._lookup, groups) if groups else {}
        rounds = self._rounds(todo, groups, found)
        try:
            requests = next(rounds)
            while True:
                requests = rounds.send(await self._complete(requests))
        except StopIteration as stop:
            return stop.value

    def fork(self) -> JudgeRunner:
        """A runner sharing this one's engine, metrics, embedders, cache and settings,
        with totals of its own (all zero): one per batch in flight."""
        twin = copy.copy(self)
        twin.tallies = {m.id: Tally() for m in self.metrics}
        twin._found = {}
        return twin

    def _rounds(
        self,
        todo: dict[str, list[tuple[int, dict[str, Any]]]],
        groups: dict[int, str],
        found: dict[str, tuple[Reply, str]],
    ) -> Rounds:
        """The judging of ``todo`` (see :meth:`run`) as a :data:`Rounds` generator.
        ``groups`` are the rows' groups (:meth:`_groups`) and ``found`` their cached
        entries (:meth:`_lookup`), kept on this runner until its next batch."""
        by_id = {m.id: m for m in self.metrics}
        self._found = found
        slots = [
            _Slot(by_id[mid], i, by_id[mid].program(row), groups.get(i))
            for mid, rows in todo.items()
            for i, row in rows
        ]
        for slot in slots:
            slot.advance(None)
        while True:
            live = [s for s in slots if s.result is None]
            if not live:
                break
            yield from self._step(live)
        return self._collect(slots)

    def _groups(self, todo: dict[str, list[tuple[int, dict[str, Any]]]]) -> dict[int, str]:
        """Row position -> judgment-cache group (:func:`group_key`). Empty without a
        cache."""
        if self.cache is None:
            return {}
        return {i: group_key(self.engine, row) for rows in todo.values() for i, row in rows}

    def _lookup(self, groups: dict[int, str]) -> dict[str, tuple[Reply, str]]:
        """Key -> (reply, group) of the cached entries of ``groups`` (from
        :meth:`_groups`), read from the cache's bucket files
        (:meth:`JudgmentCache.lookup`); empty without a cache.

        It changes nothing on this runner and uses only the cache's reader, which is
        thread-safe, so it may run on any thread (:meth:`run` runs it off the
        event loop).

        Raises
        ------
        OutputError
            A bucket file cannot be read.
        """
        if self.cache is None or not groups:
            return {}
        return self.cache.lookup(groups.values())

    def _cached(self, key: str) -> Completion | None:
        """The cached completion of ``key``: among this batch's entries, or this
        process's own recent replies."""
        if self.cache is None:
            return None
        found = self._found.get(key)
        if found is not None:
            return self.cache.hit(key, found)
        return self.cache.get(key)

    def _collect(self, slots: list[_Slot]) -> dict[str, dict[int, JudgeCell]]:
        out: dict[str, dict[int, JudgeCell]] = {m.id: {} for m in self.metrics}
        for slot in slots:
            assert slot.result is not None
            out[slot.metric.id][slot.index] = JudgeCell(slot.result, slot.trace)
        return out

    def _step(self, live: list[_Slot]) -> Generator[list[EngineRequest], list[Completion], None]:
        """Answer every pending request of ``live`` and advance each program once; the
        engine requests of each attempt are yielded (see :data:`Rounds`)."""
        values: dict[int, list[Any]] = {id(s): [None] * len(s.pending) for s in live}
        self._embed(live, values)
        asks = [(s, j) for s in live for j, r in enumerate(s.pending) if isinstance(r, Ask)]
        for slot, j in asks:
            slot.pending[j] = self._capped(slot.pending[j])
        keys: dict[tuple[int, int, int], str] = {}
        generations = {
            (id(s), j): self._generation(s, j, keys) for s, j in asks if s.result is None
        }
        attempt = 0
        while asks:
            failed = yield from self._ask_round(asks, attempt, values, keys, generations)
            attempt += 1
            if attempt > self.parse_retries:
                for slot, _, problem, completion in failed:
                    if slot.result is None:
                        slot.fail(PyCell(None, PARSE_FAILURE, problem))
                break
            asks = [(s, j) for s, j, _, _ in failed if s.result is None]
        for slot in live:
            for j in sorted(slot.verdict_replies):
                slot.trace.confidence.read(*slot.verdict_replies[j])
            slot.verdict_replies.clear()
            if slot.result is None:
                slot.advance(values[id(slot)])

    def _embed(self, live: list[_Slot], values: dict[int, list[Any]]) -> None:
        wanted: dict[str, list[tuple[_Slot, int]]] = {}
        for slot in live:
            for j, request in enumerate(slot.pending):
                if isinstance(request, Embed):
                    wanted.setdefault(request.engine, []).append((slot, j))
        for engine_name, places in wanted.items():
            embed = self.embedders.get(engine_name)
            texts = [t for s, j in places for t in s.pending[j].texts]
            try:
                if embed is None:
                    raise KeyError(f"no embedding engine {engine_name!r} was loaded")
                vectors = np.asarray(embed(texts), dtype=np.float32) if texts else np.zeros((0, 0))
            except Exception as exc:
                for slot, _ in places:
                    if slot.result is None:
                        slot.fail(
                            PyCell(None, ERROR, f"embedding failed: {type(exc).__name__}: {exc}")
                        )
                continue
            at = 0
            for slot, j in places:
                n = len(slot.pending[j].texts)
                values[id(slot)][j] = vectors[at : at + n]
                at += n

    def _key(self, slot: _Slot, j: int, attempt: int, keys: dict[tuple[int, int, int], str]) -> str:
        """The generation-0 cache key of attempt ``attempt`` of ``slot``'s request ``j``
        (seed ``seed + attempt``), worked out once per step (``keys``)."""
        at = (id(slot), j, attempt)
        if at not in keys:
            identity = slot.metric.cache_identity()
            keys[at] = cache_key(self.engine, identity, slot.pending[j], self.seed + attempt)
        return keys[at]

    def _generation(self, slot: _Slot, j: int, keys: dict[tuple[int, int, int], str]) -> int:
        """The generation of cache keys ``slot``'s request ``j`` is answered from
        (:func:`~ragbatch.judge.rejudge.first_generation`): 0 without a cache."""
        if self.cache is None:
            return 0
        ask = slot.pending[j]
        return first_generation(
            lambda attempt: self._key(slot, j, attempt, keys),
            self.parse_retries + 1,
            self._peek,
            lambda completion: parse_reply(ask, completion)[1] is None,
            self.rejudge,
        )

    def _peek(self, key: str) -> Found | None:
        """The cached completion of ``key`` and whether it was read from the cache's
        files (this batch's entries) rather than obtained by this process; the use of a
        stored entry is noted (a touch), as for :meth:`_cached`."""
        found = self._found.get(key)
        if found is not None:
            return cast(JudgmentCache, self.cache).hit(key, found), True
        completion = self._cached(key)
        return None if completion is None else (completion, False)

    def _ask_round(
        self,
        asks: list[tuple[_Slot, int]],
        attempt: int,
        values: dict[int, list[Any]],
        keys: dict[tuple[int, int, int], str],
        generations: dict[tuple[int, int], int],
    ) -> Generator[list[EngineRequest], list[Completion], list[tuple[_Slot, int, str, Completion]]]:
        """One attempt for each ask, under the cache keys of its generation
        (``generations``, from :meth:`_generation`); the requests not served by the cache
        are yielded (see :data:`Rounds`). Returns the asks whose reply could not be
        parsed."""
        seed = self.seed + attempt
        keyed: dict[str, list[tuple[_Slot, int]]] = {}
        for slot, j in asks:
            if slot.result is not None:
                continue
            generation = generations.get((id(slot), j), 0)
            key = rejudge_key(self._key(slot, j, attempt, keys), generation)
            keyed.setdefault(key, []).append((slot, j))
        answers: dict[str, tuple[Completion, bool]] = {}
        to_send: list[str] = []
        for key in keyed:
            hit = self._cached(key)
            if hit is not None:
                answers[key] = (hit, False)
            else:
                to_send.append(key)
        if to_send:
            requests = [
                EngineRequest(
                    keyed[k][0][0].pending[keyed[k][0][1]].messages,
                    keyed[k][0][0].pending[keyed[k][0][1]].output,
                    seed,
                )
                for k in to_send
            ]
            completions = yield requests
            for key, completion in zip(to_send, completions):
                answers[key] = (completion, True)
                first = keyed[key][0][0]
                if self.cache is not None:
                    self.cache.put(
                        key, first.metric.name, self.engine.model_id, completion, first.group
                    )
        failed = []
        for key, places in keyed.items():
            completion, live = answers[key]
            for n, (slot, j) in enumerate(places):
                made_here = live and n == 0  # duplicates of a request share one call
                self._account(slot, slot.pending[j], completion, made_here)
                problem = self._use(slot, j, completion, values)
                if problem is not None:
                    failed.append((slot, j, problem, completion))
        return failed

    def _capped(self, ask: Ask) -> Ask:
        return capped(ask, self.max_tokens)

    async def _complete(self, requests: list[EngineRequest]) -> list[Completion]:
        """The engine's completions of ``requests``; a ``judge_error`` per request when
        the engine fails (:data:`ENGINE_FAULTS`) or returns another number of them."""
        try:
            completions = await self.engine.complete(requests)
        except ENGINE_FAULTS as exc:  # the engine failed: every request of the call fails
            return _engine_failed(requests, exc)
        return _one_each(requests, completions)

    def _account(self, slot: _Slot, ask: Ask, completion: Completion, live: bool) -> None:
        slot.trace.record(ask, completion, live)
        tally = self.tallies[slot.metric.id]
        if live and completion.refused:
            tally.refused_too_long += 1
            tally.refused_prompt_tokens += completion.prompt_tokens
        elif live:
            tally.judge_calls += 1
            tally.prompt_tokens += completion.prompt_tokens
            tally.completion_tokens += completion.completion_tokens
            tally.cached_prompt_tokens += completion.cached_prompt_tokens or 0
        else:
            tally.cache_hits += 1

    def _use(
        self, slot: _Slot, j: int, completion: Completion, values: dict[int, list[Any]]
    ) -> str | None:
        """Parse a completion into ``values``; fail the slot on an engine failure; return
        a parse problem (to retry) or None."""
        if slot.result is not None:
            return None
        ask = slot.pending[j]
        if completion.status != OK:
            slot.fail(
                PyCell(
                    None, completion.status, f"{ask.step}: {completion.error or completion.status}"
                )
            )
            return None
        value, problem = parse_reply(ask, completion)
        if problem is not None:
            return problem
        values[id(slot)][j] = value
        if ask.verdicts is not None:
            slot.verdict_replies[j] = (completion, ask.verdicts)
        return None

    def take_tallies(self) -> dict[str, dict[str, int]]:
        """The per-metric totals since the last call (then reset)."""
        out = {mid: t.model_dump() for mid, t in self.tallies.items()}
        self.tallies = {m.id: Tally() for m in self.metrics}
        return out
