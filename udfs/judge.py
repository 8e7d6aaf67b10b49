"""Judge stage: the LLM-judge metrics of one judge engine, as a Ray Data actor pool.

Each actor loads its judge engine (``vllm.LLM``, or a client of an OpenAI-compatible
server) and the embedding models its metrics need, and opens the judgment cache (a
listing; entries are looked up per batch), in ``__init__``, then judges batches of
canonical rows, appending per metric a ``__ragbatch_cell::<metric id>`` column (the
cell) and a ``__ragbatch_judge::<metric id>`` column (reply, prompt hash, token counts,
calls, cache hits). Run it with::

    ds.map_batches(JudgeStage, batch_format="pyarrow",
                   fn_constructor_kwargs={...}, **stage_options(engine_spec))

(``stage_options`` from :mod:`udfs.base`). Its ``__call__`` is a coroutine, run by Ray
Data on one event loop per actor: with ``batches_in_flight`` above 1 (``vllm``
engines) each actor is handed several batches at once and their rounds share the
actor's engine (:meth:`JudgeEngine.complete <ragbatch.judge.protocol.JudgeEngine.complete>`
is a coroutine); with 1, the same code judges one batch at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from typing import Any, AsyncIterator, ClassVar, Iterable, Iterator, Sequence

import polars as pl
import pyarrow as pa

from ragbatch.core.columns import CELL_TYPE, ISSUES, JUDGE_TYPE, cell_column, judge_column
from ragbatch.core.errors import ConfigError, EngineError
from ragbatch.judge.batch import JUDGE_DTYPE, judge_frame
from ragbatch.judge.cache import JudgmentCache
from ragbatch.judge.metric import JudgeMetric
from ragbatch.judge.rejudge import reasks_parse_failures
from ragbatch.judge.run import JudgeRunner
from ragbatch.scoring.base import Metric
from ragbatch.scoring.cells import CELL_DTYPE
from ragbatch.core.stages import StageKind
from udfs.base import ActorStage, MetricEntry, appended, engine_errors, parse_engine_spec

log = logging.getLogger(__name__)

#: The canonical columns a judge batch reads, when present.
JUDGE_INPUTS = ("row_id", "question", "contexts", "answer", "reference", ISSUES)


class JudgeStage(ActorStage):
    """Ray Data callable class scoring the judge metrics of one engine.

    Parameters
    ----------
    engine_name : str
        Key of the judge engine under ``engines``.
    engine_spec : dict
        Its spec (``type`` vllm or openai), validated with the config's models.
    metrics : list of JudgeMetric or dict
        Built judge metrics on this engine, or ``{"name", "id", "params"}`` per judge
        metric.
    embedders : dict, optional
        Embedding engine name -> spec, for metrics that embed (``answer_relevancy``).
    cache : dict, optional
        ``{"uri", "storage_options", "run_id", "rejudge"}`` of the judgment cache
        (``run_id`` stamps the journal rows; ``rejudge`` lists the statuses asked again,
        :mod:`ragbatch.judge.rejudge`); None disables it.
    ledger : ray actor handle, optional
        A :class:`JudgeLedger` receiving per-batch totals and engine counters.
    run_ledger : ray actor handle, optional
        The run's :class:`udfs.ledger.RunLedger` (see :class:`udfs.base.ActorStage`).

    Raises
    ------
    ConfigError
        A spec or params are invalid, or a metric is not a judge metric.
    EngineError
        The judge or an embedding model cannot be loaded (message names the engine).

    Notes
    -----
    A batch is read as its columns of :data:`JUDGE_INPUTS` that are present; a column a
    metric needs but the batch lacks is not an error here.

    ``__call__`` is a coroutine, which Ray Data runs on one event loop per actor, up to
    ``batches_in_flight`` batches at a time (:func:`udfs.base.stage_options` lets that
    many calls into each actor, and a gate holds the batches being judged to that
    number; a batch that lost an actor before is judged alone). Each batch is judged by
    a runner of its own (:meth:`JudgeRunner.fork <ragbatch.judge.run.JudgeRunner.fork>`)
    whose judgment-cache lookup runs on a worker thread and whose rounds await the
    engine, so the next batch's and the next round's requests join the engine while
    earlier ones are still running, and a slow lookup holds only its own batch.

    Per batch, the :class:`udfs.guard.BatchGuard` retries a batch failing with engine
    faults and then marks its rows ``error`` without touching the other batches, and
    fails the run on a bug; the batch's request time limit (``batch_timeout_s``) is its
    own; the judgment cache is flushed and the batch's totals (its runner's, nothing of
    the other batches') go to ``ledger`` once it is done.

    Two batches in flight at once that hold an identical request (same prompt, output,
    seed) may both send it: the second is a cache hit only when the first has already
    been answered. Batches processed one after another never send it twice.
    """

    kind: ClassVar[StageKind] = StageKind.JUDGE
    metric_class: ClassVar[type[Metric]] = JudgeMetric
    wrong_metric: ClassVar[str] = "{metric} is not a judge metric"

    def __init__(
        self,
        engine_name: str,
        engine_spec: dict[str, Any],
        metrics: Sequence[MetricEntry],
        embedders: dict[str, dict[str, Any]] | None = None,
        cache: dict[str, Any] | None = None,
        ledger: Any = None,
        run_ledger: Any = None,
        keep_columns: Sequence[str] | None = None,
    ) -> None:
        self._embedder_specs = embedders or {}
        self._cache_location = cache
        super().__init__(
            engine_name, engine_spec, metrics, ledger=run_ledger, keep_columns=keep_columns
        )
        self.ledger = ledger
        self.batches = 0
        self.actor_key = uuid.uuid4().hex

    def load(self) -> None:
        """Open the judgment cache (:attr:`cache`), load the judge engine
        (:attr:`engine`) and the embedding models the metrics need, build the
        :class:`~ragbatch.judge.run.JudgeRunner` (:attr:`runner`), and set the cap on
        batches judged at once (``batches_in_flight``, 1 when the spec has none)."""
        from ragbatch.engines import load_judge_engine

        cache = self._cache_location
        self.cache = (
            JudgmentCache(
                cache["uri"],
                cache.get("storage_options") or {},
                [m.name for m in self.metrics],
                run_id=cache.get("run_id"),
            )
            if cache
            else None
        )
        with engine_errors(self.engine_name):
            self.engine = load_judge_engine(self.spec)
        self.runner = JudgeRunner(
            self.engine,
            self.judge_metrics(),
            embedders=self._embedders(self._embedder_specs),
            cache=self.cache,
            parse_retries=self.spec.parse_retries,
            seed=self.spec.seed,
            max_tokens=self.spec.max_tokens,
            rejudge=reasks_parse_failures((cache or {}).get("rejudge")),
        )
        self._in_flight = max(1, int(getattr(self.spec, "batches_in_flight", 1) or 1))
        self._gates: dict[asyncio.AbstractEventLoop, _Gate] = {}

    def judge_metrics(self) -> list[JudgeMetric]:
        """:attr:`metrics`, each a :class:`~ragbatch.judge.metric.JudgeMetric` (as
        :attr:`metric_class` makes sure when they are built)."""
        return [m for m in self.metrics if isinstance(m, JudgeMetric)]

    def _embedders(self, specs: dict[str, dict[str, Any]]) -> dict[str, Any]:
        from ragbatch.engines.sentence_transformers import load_model

        out = {}
        for name in dict.fromkeys(n for m in self.judge_metrics() for n in m.embedders()):
            if name not in specs:
                raise ConfigError(
                    f"engines.{name}: embedding engine used by a judge metric is not defined"
                )
            try:
                model = load_model(parse_engine_spec(name, specs[name]))
            except EngineError as exc:
                raise EngineError(f"engines.{name}: {exc}") from exc
            out[name] = model.embed
        return out

    def output_columns(self) -> list[tuple[str, pa.DataType]]:
        """Per metric ``__ragbatch_cell::<id>`` (:data:`CELL_TYPE`) and
        ``__ragbatch_judge::<id>`` (:data:`JUDGE_TYPE`)."""
        return [
            (name, type_)
            for m in self.metrics
            for name, type_ in ((cell_column(m.id), CELL_TYPE), (judge_column(m.id), JUDGE_TYPE))
        ]

    def check_columns(self, batch: pa.Table) -> None:
        """Nothing: a batch is judged on the columns of :data:`JUDGE_INPUTS` it has."""

    def input_frame(self, batch: pa.Table) -> pl.DataFrame:
        """The columns of :data:`JUDGE_INPUTS` present in ``batch``, as Polars."""
        frame = pl.from_arrow(batch.select([c for c in JUDGE_INPUTS if c in batch.column_names]))
        assert isinstance(frame, pl.DataFrame)
        return frame

    def _judged(
        self, results: dict[str, tuple[list[dict], list[dict]]]
    ) -> Iterator[tuple[str, pa.Array]]:
        """The cell and judge columns of :func:`~ragbatch.judge.batch.judge_frame`'s
        results, per metric in order."""
        for metric in self.metrics:
            cells, records = results[metric.id]
            yield (
                cell_column(metric.id),
                pl.Series(cells, dtype=CELL_DTYPE).to_arrow().cast(CELL_TYPE),
            )
            yield (
                judge_column(metric.id),
                pl.Series(records, dtype=JUDGE_DTYPE).to_arrow().cast(JUDGE_TYPE),
            )

    def _report_args(self, batch: pa.Table, tallies: dict[str, dict[str, int]]) -> tuple | None:
        """Count the batch; the arguments of its judge-ledger report (the engine's
        counters read now), or None without a ledger."""
        self.batches += 1
        if self.ledger is None:
            return None
        key = (
            batch.column("row_id")[0].as_py()
            if batch.num_rows and "row_id" in batch.column_names
            else None
        )
        return (self.engine_name, key, tallies, self.engine.stats(), self.actor_key)

    def _send(self, args: tuple | None) -> None:
        if args is None:
            return
        import ray

        # Waited for, so that every batch's report is in before the driver reads the totals.
        ray.get(self.ledger.record.remote(*args))

    async def __call__(self, batch: pa.Table) -> pa.Table:
        """Score one batch, sharing the engine with the other batches in flight on this
        actor's event loop.

        Parameters
        ----------
        batch : pyarrow.Table
            ``n`` canonical rows (see :data:`JUDGE_INPUTS`) plus any other columns.

        Returns
        -------
        pyarrow.Table
            As :meth:`udfs.base.SyncActorStage.__call__`: ``batch``'s columns (with
            ``keep_columns``, those and the pipeline's own), then per metric the cell
            and judge columns of :meth:`output_columns`, in the same ``n`` rows.

        Raises
        ------
        TypeError
            ``batch`` is not a pyarrow Table.
        StageBugError
            Judging raised an exception that is not an engine fault (a bug).
        RunError
            The rows marked ``error`` in the run exceed ``run.error_budget``.

        Notes
        -----
        A batch whose earlier start was lost with its actor is scored alone (no other
        batch in flight on this actor meanwhile): if it kills the actor again, no
        other batch's rows lose a start with it (:data:`udfs.guard.MAX_LOST_STARTS`)."""
        self.check_batch(batch)
        loop = asyncio.get_running_loop()
        gate = self._gates.get(loop)
        if gate is None:  # one per event loop (Ray Data keeps one per actor)
            self._gates = {loop: _Gate(self._in_flight)}
            gate = self._gates[loop]
        runner = self.runner.fork()
        out = self.pruned(
            await self.guard.run(batch, functools.partial(self._judge_batch, runner), gate.enter)
        )
        if self.cache is not None:  # a journal file written (uploaded) off the loop
            await asyncio.to_thread(self.cache.flush)
        # The counters are read here, on the loop that steps the engine; only the wait
        # for the ledger leaves it.
        await asyncio.to_thread(self._send, self._report_args(batch, runner.take_tallies()))
        self.heap.batch_done()
        return out

    async def _judge_batch(self, runner: JudgeRunner, batch: pa.Table) -> pa.Table:
        """``batch`` with the stage's columns appended, judged by ``runner``."""
        self.check_free(batch)
        results = await judge_frame(runner, self.input_frame(batch))
        return appended(batch, self._judged(results))


class _Gate:
    """Admits up to ``limit`` batches at once, or one batch alone."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0
        self.alone = False
        self.waiting_alone = 0  # batches waiting to go alone: no new batch starts before them
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def enter(self, lost_starts: int) -> AsyncIterator[None]:
        """Hold a place while the batch is scored: one of ``limit``, or the whole gate
        when the batch has ``lost_starts`` > 0."""
        alone = lost_starts > 0
        async with self._changed:
            if alone:
                self.waiting_alone += 1
                try:
                    await self._changed.wait_for(lambda: not self.alone and self.active == 0)
                finally:
                    self.waiting_alone -= 1
                self.alone = True
            else:
                await self._changed.wait_for(
                    lambda: not self.alone and not self.waiting_alone and self.active < self.limit
                )
            self.active += 1
        try:
            yield
        finally:
            async with self._changed:
                self.active -= 1
                if alone:
                    self.alone = False
                self._changed.notify_all()


def judge_stage_class(engine_spec: Any) -> type[JudgeStage]:
    """The judge stage class for an engine spec: :class:`JudgeStage`, whatever its
    ``batches_in_flight`` (kept for the runner's call)."""
    return JudgeStage


class JudgeLedger:
    """Collects the judge stage's totals for the manifest. Wrapped with
    ``ray.remote(num_cpus=0)`` by the runner.

    Totals are keyed by (engine, first row id of the batch), so a retried batch replaces
    its earlier report instead of adding to it; engine counters (cumulative per actor)
    are kept per engine as the latest report of each actor process, and combined over
    the actors by :func:`combine_engine_stats`.
    """

    def __init__(self) -> None:
        self._batches: dict[tuple[str, Any], dict[str, dict[str, int]]] = {}
        self._engines: dict[str, dict[str, dict[str, Any]]] = {}

    def record(
        self,
        engine: str,
        batch_key: Any,
        tallies: dict[str, dict[str, int]],
        stats: dict[str, Any],
        actor_key: str,
    ) -> None:
        self._batches[(engine, batch_key)] = tallies
        self._engines.setdefault(engine, {})[actor_key] = stats

    def totals(self) -> dict[str, Any]:
        """``{"metrics": {id: totals}, "engines": {name: summed counters}}``."""
        metrics: dict[str, dict[str, int]] = {}
        for tallies in self._batches.values():
            for mid, tally in tallies.items():
                into = metrics.setdefault(mid, {})
                for k, v in tally.items():
                    into[k] = into.get(k, 0) + v
        engines = {
            name: combine_engine_stats(per_actor.values())
            for name, per_actor in self._engines.items()
        }
        return {"metrics": metrics, "engines": engines}


def combine_engine_stats(per_actor: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """One engine's numeric counters over its actors: summed, except that a key ending
    in ``_max`` takes the largest value and one ending in ``_min`` the smallest (the
    ``openai`` engine's ``concurrency_max`` and ``concurrency_min``: the most and fewest
    requests in flight any one actor allowed). Values that are not numbers are left out.

    Parameters
    ----------
    per_actor : iterable of dict
        Each actor's latest :meth:`~ragbatch.judge.protocol.JudgeEngine.stats`.

    Returns
    -------
    dict
        ``{key: combined value}`` for every numeric key of any actor.
    """
    out: dict[str, Any] = {}
    for stats in per_actor:
        for k, v in stats.items():
            if not isinstance(v, (int, float)):
                continue
            if k not in out:
                out[k] = v
            elif k.endswith("_max"):
                out[k] = max(out[k], v)
            elif k.endswith("_min"):
                out[k] = min(out[k], v)
            else:
                out[k] = out[k] + v
    return out
