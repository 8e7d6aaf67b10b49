"""Judge stage: the LLM-judge metrics of one judge engine, as a Ray Data actor pool.

Each actor loads its judge engine (``vllm.LLM``, or a client of an OpenAI-compatible
server), the embedding models its metrics need, and the judgment cache once, in
``__init__``, then judges batches of canonical rows, appending per metric a
``__ragbatch_cell::<metric id>`` column (the cell) and a ``__ragbatch_judge::<metric id>`` column (reply,
prompt hash, token counts, calls, cache hits). Run it with::

    ds.map_batches(JudgeStage, batch_format="pyarrow",
                   fn_constructor_kwargs={...}, **judge_stage_options(engine_spec))
"""

from __future__ import annotations

import logging
from typing import Any

import polars as pl
import pyarrow as pa

from ragbatch.columns import CELL_TYPE, ISSUES, JUDGE_TYPE, cell_column, judge_column
from ragbatch.errors import ConfigError, EngineError
from ragbatch.heap import HeapTrimmer
from ragbatch.judge.batch import JUDGE_DTYPE, judge_frame
from ragbatch.judge.cache import JudgmentCache
from ragbatch.judge.metric import JudgeMetric
from ragbatch.judge.run import JudgeRunner
from ragbatch.metrics.cells import CELL_DTYPE
from ragbatch.registry import get_metric
from udfs.guard import BatchGuard
from udfs.ledger import report_placement
from udfs.similarity import parse_engine_spec, stage_options

log = logging.getLogger(__name__)

def judge_stage_options(engine_spec: dict[str, Any]) -> dict[str, Any]:
    """``map_batches`` keyword arguments sizing the judge actor pool (see
    :func:`udfs.similarity.stage_options`)."""
    return stage_options(engine_spec)


class JudgeStage:
    """Ray Data callable class scoring the judge metrics of one engine.

    Parameters
    ----------
    engine_name : str
        Key of the judge engine under ``engines``.
    engine_spec : dict
        Its spec (``type`` vllm or openai), validated with the config's models.
    metrics : list of dict
        ``{"name", "id", "params"}`` per judge metric.
    embedders : dict, optional
        Embedding engine name -> spec, for metrics that embed (``answer_relevancy``).
    cache : dict, optional
        ``{"uri", "storage_options"}`` of the judgment cache; None disables it.
    ledger : ray actor handle, optional
        A :class:`JudgeLedger` receiving per-batch totals and engine counters.
    run_ledger : ray actor handle, optional
        The run's :class:`udfs.ledger.RunLedger` (see :class:`udfs.guard.BatchGuard`).

    Raises
    ------
    ConfigError
        A spec or params are invalid, or a metric is not a judge metric.
    EngineError
        The judge or an embedding model cannot be loaded (message names the engine).

    Notes
    -----
    After a batch, at most once per :data:`ragbatch.heap.TRIM_INTERVAL_S` seconds, the
    actor returns freed heap memory to the system (:class:`ragbatch.heap.HeapTrimmer`).
    """

    def __init__(self, engine_name: str, engine_spec: dict[str, Any], metrics: list[dict[str, Any]],
                 embedders: dict[str, dict[str, Any]] | None = None,
                 cache: dict[str, Any] | None = None, ledger: Any = None,
                 run_ledger: Any = None) -> None:
        from ragbatch.engines import load_judge_engine

        self.engine_name = engine_name
        report_placement(run_ledger, "judge:" + engine_name)
        self.spec = parse_engine_spec(engine_name, engine_spec)
        self.metrics = [_build_metric(i, m, engine_name) for i, m in enumerate(metrics)]
        self.cache = (JudgmentCache(cache["uri"], cache.get("storage_options") or {},
                                    [m.name for m in self.metrics]) if cache else None)
        try:
            self.engine = load_judge_engine(self.spec)
        except EngineError as exc:
            raise EngineError(f"engines.{engine_name}: {exc}") from exc
        self.runner = JudgeRunner(self.engine, self.metrics, embedders=self._embedders(embedders or {}),
                                  cache=self.cache, parse_retries=self.spec.parse_retries,
                                  seed=self.spec.seed, max_tokens=self.spec.max_tokens)
        self.ledger = ledger
        self.batches = 0
        import uuid

        self.actor_key = uuid.uuid4().hex
        columns = [(name, type_) for m in self.metrics
                   for name, type_ in ((cell_column(m.id), CELL_TYPE), (judge_column(m.id), JUDGE_TYPE))]
        self.guard = BatchGuard(f"engine {engine_name}", columns, run_ledger)
        self.heap = HeapTrimmer()

    def _embedders(self, specs: dict[str, dict[str, Any]]) -> dict[str, Any]:
        from ragbatch.engines.sentence_transformers import load_model

        out = {}
        for name in dict.fromkeys(n for m in self.metrics for n in m.embedders()):
            if name not in specs:
                raise ConfigError(f"engines.{name}: embedding engine used by a judge metric is not defined")
            try:
                model = load_model(parse_engine_spec(name, specs[name]))
            except EngineError as exc:
                raise EngineError(f"engines.{name}: {exc}") from exc
            out[name] = model.embed
        return out

    def __call__(self, batch: pa.Table) -> pa.Table:
        """Judge one batch.

        Parameters
        ----------
        batch : pyarrow.Table
            ``n`` canonical rows (``_issues`` supplies null reasons when present).

        Returns
        -------
        pyarrow.Table
            ``batch`` unchanged, then per metric ``__ragbatch_cell::<id>`` (:data:`CELL_TYPE`) and
            ``__ragbatch_judge::<id>`` (:data:`JUDGE_TYPE`), ``n`` rows in the same order.
        """
        if not isinstance(batch, pa.Table):
            raise TypeError('JudgeStage expects pyarrow.Table batches; use batch_format="pyarrow"')
        out = self.guard.run(batch, self._judge)
        if self.cache is not None:
            self.cache.flush()
        self._report(batch)
        self.heap.batch_done()
        return out

    def _judge(self, batch: pa.Table) -> pa.Table:
        wanted = [c for c in ("row_id", "question", "contexts", "answer", "reference", ISSUES)
                  if c in batch.column_names]
        frame = pl.from_arrow(batch.select(wanted))
        assert isinstance(frame, pl.DataFrame)
        results = judge_frame(self.runner, frame)
        out = batch
        for metric in self.metrics:
            cells, records = results[metric.id]
            for name in (cell_column(metric.id), judge_column(metric.id)):
                if name in out.column_names:
                    raise ValueError(f"column {name!r} is already present in the batch")
            out = out.append_column(cell_column(metric.id),
                                    pl.Series(cells, dtype=CELL_DTYPE).to_arrow().cast(CELL_TYPE))
            out = out.append_column(judge_column(metric.id),
                                    pl.Series(records, dtype=JUDGE_DTYPE).to_arrow().cast(JUDGE_TYPE))
        return out

    def _report(self, batch: pa.Table) -> None:
        self.batches += 1
        tallies = self.runner.take_tallies()
        if self.ledger is None:
            return
        key = batch.column("row_id")[0].as_py() if batch.num_rows and "row_id" in batch.column_names else None
        import ray

        # Waited for, so that every batch's report is in before the driver reads the totals.
        ray.get(self.ledger.record.remote(self.engine_name, key, tallies, self.engine.stats(),
                                          self.actor_key))


def _build_metric(index: int, entry: dict[str, Any], engine_name: str) -> JudgeMetric:
    where = f"metrics[{index}]"
    cls = get_metric(entry["name"], where=f"{where}.name")
    if not issubclass(cls, JudgeMetric):
        raise ConfigError(f"{where}: {cls.name} is not a judge metric")
    metric = cls.from_params(entry.get("params"), metric_id=entry.get("id") or cls.name,
                             engine=engine_name, where=f"{where}.params")
    assert isinstance(metric, JudgeMetric)
    return metric


class JudgeLedger:
    """Collects the judge stage's totals for the manifest. Wrapped with
    ``ray.remote(num_cpus=0)`` by the runner.

    Totals are keyed by (engine, first row id of the batch), so a retried batch replaces
    its earlier report instead of adding to it; engine counters (cumulative per actor)
    are kept per engine as the latest report of each actor process.
    """

    def __init__(self) -> None:
        self._batches: dict[tuple[str, Any], dict[str, dict[str, int]]] = {}
        self._engines: dict[str, dict[str, dict[str, Any]]] = {}

    def record(self, engine: str, batch_key: Any, tallies: dict[str, dict[str, int]],
               stats: dict[str, Any], actor_key: str) -> None:
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
        engines: dict[str, dict[str, Any]] = {}
        for name, per_actor in self._engines.items():
            summed: dict[str, Any] = {}
            for stats in per_actor.values():
                for k, v in stats.items():
                    if isinstance(v, (int, float)):
                        summed[k] = summed.get(k, 0) + v
            engines[name] = summed
        return {"metrics": metrics, "engines": engines}
