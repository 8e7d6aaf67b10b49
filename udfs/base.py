"""What every actor stage (model, PII and judge) shares: :class:`ActorStage`.

An actor stage is a Ray Data callable class run as an actor pool, one pool per engine::

    ds.map_batches(
        ModelStage,  # or PiiStage, JudgeStage
        batch_format="pyarrow",
        fn_constructor_kwargs={"engine_name": ..., "engine_spec": ..., "metrics": [...]},
        **stage_options(engine_spec),
    )

Each actor validates its engine spec, takes its metrics, loads its engine once (in
``__init__``), and then scores batches of canonical rows under a
:class:`udfs.guard.BatchGuard`, returning every input column unchanged followed by the
columns it appends. The subclasses add only what is theirs: the engine they load and how
a batch is scored. The model and PII stages score one batch at a time
(:class:`SyncActorStage`); the judge stage's ``__call__`` is a coroutine
(:class:`udfs.judge.JudgeStage`).
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from contextlib import contextmanager
from typing import Any, ClassVar, Iterable, Iterator, Sequence

import polars as pl
import pyarrow as pa
from pydantic import ValidationError

from ragbatch.core.columns import CELL_TYPE, ISSUES, cell_column, is_internal
from ragbatch.engines.sentence_transformers import CrossEncoderEngine, EmbeddingEngine
from ragbatch.config.engine_spec import engine_adapter, normalize_engine
from ragbatch.core.engine_registry import engine_names
from ragbatch.core.errors import ConfigError, EngineError
from ragbatch.core.heap import HeapTrimmer
from ragbatch.engines.threads import set_thread_variables
from ragbatch.judge.protocol import run_sync
from ragbatch.scoring.base import Metric
from ragbatch.scoring.registry import get_metric
from ragbatch.core.stages import StageKind
from udfs.guard import BatchGuard
from udfs.ledger import report_placement

#: A metric as an actor stage takes it: a built :class:`~ragbatch.scoring.base.Metric`
#: (what a run passes), or ``{"name": str, "id": str, "params": dict}`` built in the actor.
MetricEntry = Metric | dict[str, Any]


def parse_engine_spec(engine_name: str, engine_spec: dict[str, Any] | Any) -> Any:
    """Validate an engine spec mapping with the config's engine models.

    Parameters
    ----------
    engine_name : str
        The key under ``engines`` (used in error messages).
    engine_spec : dict or engine model
        ``{type, model, device, num_gpus, num_cpus, concurrency, batch_size, ...}``; an
        already validated embedding or cross-encoder engine model is returned unchanged.

    Returns
    -------
    engine model
        The spec model of the registered engine type named by ``type``
        (:func:`ragbatch.config.engine_spec.engine_adapter`).

    Raises
    ------
    ConfigError
        A field is unknown, missing or invalid; each problem is named
        ``engines.<engine_name>.<field>``.
    """
    if isinstance(engine_spec, (EmbeddingEngine, CrossEncoderEngine)):
        return engine_spec
    try:
        return engine_adapter().validate_python(normalize_engine(engine_spec))
    except ValidationError as exc:
        types = engine_names()
        problems = []
        for err in exc.errors():
            loc = [str(p) for p in err.get("loc", ()) if p not in types]
            where = ".".join(["engines", engine_name, *loc])
            problems.append(f"{where}: {err.get('msg', 'invalid').removeprefix('Value error, ')}")
        raise ConfigError(problems) from None


def stage_options(engine_spec: dict[str, Any] | Any) -> dict[str, Any]:
    """Keyword arguments for ``Dataset.map_batches`` that size an actor stage's pool.

    Parameters
    ----------
    engine_spec : dict or engine model
        Uses ``concurrency`` (an int ``n`` for a fixed pool of ``n`` actors, or
        ``(min, max)`` for an autoscaling pool), ``num_gpus``, ``num_cpus``,
        ``batch_size`` (rows per call), ``accelerator_type``, ``resources`` and, for
        vLLM, ``tensor_parallel_size``.

    Returns
    -------
    dict
        :func:`ragbatch.core.placement.map_batches_options` (``compute``, ``num_gpus``,
        ``num_cpus``, ``batch_size`` and the placement options; ``compute`` runs
        ``batches_in_flight`` calls at once per actor where the spec sets more than 1), and
        ``udf_modifying_row_count=False`` where the installed Ray
        Data accepts it (the stage returns its rows 1:1). ``batch_format`` is not
        included: pass ``batch_format="pyarrow"`` yourself.

    Raises
    ------
    ConfigError
        The spec is invalid (see :func:`parse_engine_spec`).
    """
    import ray.data

    from ragbatch.core.placement import map_batches_options

    spec = parse_engine_spec("<engine>", engine_spec)
    # A dead actor is replaced and the batch it held runs again (Ray Data's defaults for
    # actor pools); the stage's BatchGuard marks a batch that kills every actor it
    # reaches as error after MAX_LOST_STARTS starts, so retries end.
    options = map_batches_options(spec)
    in_flight = int(getattr(spec, "batches_in_flight", 1) or 1)
    if in_flight > 1:
        # Several map tasks at once in each actor, each calling the stage's async
        # __call__ on the actor's one event loop (udfs.judge.JudgeStage caps the
        # batches judged at once at the same number).
        options["compute"].max_concurrent_calls_per_actor = in_flight
    if "udf_modifying_row_count" in inspect.signature(ray.data.Dataset.map_batches).parameters:
        options["udf_modifying_row_count"] = False
    return options


@contextmanager
def engine_errors(engine_name: str) -> Iterator[None]:
    """Re-raise an :class:`~ragbatch.core.errors.EngineError` raised inside the block with its
    message prefixed ``engines.<engine_name>: ``."""
    try:
        yield
    except EngineError as exc:
        raise EngineError(f"engines.{engine_name}: {exc}") from exc


def check_input_columns(engine_name: str, input_columns: Sequence[str], batch: pa.Table) -> None:
    """Raise ``ValueError`` naming the engine when ``batch`` lacks an input column."""
    missing = [c for c in input_columns if c not in batch.column_names]
    if missing:
        raise ValueError(
            f"engine {engine_name!r}: batch lacks input column(s) {missing}; "
            f"present: {batch.column_names}"
        )


def input_frame(input_columns: Sequence[str], batch: pa.Table) -> pl.DataFrame:
    """The input columns of ``batch`` (and ``_issues`` when present) as Polars."""
    wanted = list(input_columns) + ([ISSUES] if ISSUES in batch.column_names else [])
    frame = pl.from_arrow(batch.select(wanted))
    assert isinstance(frame, pl.DataFrame)
    return frame


def cell_array(metric_id: str, cells: pl.Series, n_rows: int) -> pa.Array:
    """A metric's cells as an Arrow array of :data:`ragbatch.core.columns.CELL_TYPE`.

    Raises
    ------
    RuntimeError
        ``cells`` does not hold exactly ``n_rows`` cells.
    """
    if len(cells) != n_rows:
        raise RuntimeError(f"{metric_id}: compute returned {len(cells)} cells for {n_rows} rows")
    return cells.to_arrow().cast(CELL_TYPE)


class ActorStage(ABC):
    """Base of the Ray Data callable classes that score the metrics of one engine.

    Parameters
    ----------
    engine_name : str
        Key of the engine under ``engines`` (used in errors, reports and stage names).
    engine_spec : dict or engine model
        The engine spec, validated with the config's engine models
        (:func:`parse_engine_spec`).
    metrics : list of Metric or dict
        The stage's metrics, in the order their columns are appended: built metrics
        (each an instance of :attr:`metric_class` on engine ``engine_name``), or
        ``{"name": str, "id": str, "params": dict}`` mappings, built here.
    ledger : ray actor handle, optional
        The run's :class:`udfs.ledger.RunLedger`: told where this actor runs
        (``<kind>:<engine>``), and batches run under a :class:`udfs.guard.BatchGuard`
        reporting to it (a batch that keeps failing gets ``error`` cells).
    keep_columns : list of str, optional
        Pass on only these of a batch's input columns, and the pipeline's own (cells of
        earlier stages, :func:`ragbatch.core.columns.is_internal`), in the batch's order,
        before the appended ones: the last actor stage of a run keeps what the scores
        table needs and drops the input texts, which would otherwise be copied out of
        the actor with every batch. None (the default) passes every column on.

    Raises
    ------
    ConfigError
        The engine spec or a metric's params are invalid, a name is unknown, a metric is
        not one this stage runs, or a built metric belongs to another engine.
    EngineError
        The engine cannot be loaded (the message names the engine).

    Notes
    -----
    A subclass sets :attr:`kind`, :attr:`metric_class` and :attr:`wrong_metric`, loads
    its engine in :meth:`load` (abstract: a class without it cannot be instantiated) and
    defines ``__call__``: :class:`SyncActorStage` scores one batch at a time and its
    subclasses append their columns in :meth:`SyncActorStage.columns`; it may check
    the spec (:meth:`check_spec`) and each metric (:meth:`check_metric`), declare other
    output columns (:meth:`output_columns`) and act after each batch
    (:meth:`batch_done`). After a batch, at most once per
    :data:`ragbatch.core.heap.TRIM_INTERVAL_S` seconds, the actor returns freed heap memory to
    the system (:class:`ragbatch.core.heap.HeapTrimmer`), so that its memory stays flat over a
    long run.
    """

    #: The stage kind; the actor reports its placement as ``<kind>:<engine name>``.
    kind: ClassVar[StageKind]
    #: The class every metric of the stage must be an instance of.
    metric_class: ClassVar[type[Metric]] = Metric
    #: The error for a metric of another class; ``{metric}`` is its name.
    wrong_metric: ClassVar[str] = "{metric} is not a metric of this stage"

    def __init__(
        self,
        engine_name: str,
        engine_spec: dict[str, Any] | Any,
        metrics: Sequence[MetricEntry],
        ledger: Any = None,
        keep_columns: Sequence[str] | None = None,
    ) -> None:
        self.engine_name = engine_name
        self.keep_columns = None if keep_columns is None else frozenset(keep_columns)
        report_placement(ledger, f"{self.kind.value}:{engine_name}")
        self.spec = parse_engine_spec(engine_name, engine_spec)
        if getattr(self.spec, "threads", None):
            # Before the engine imports torch: every thread of the actor starts with it.
            set_thread_variables(self.spec.threads)
        self.check_spec()
        self.metrics = [self._metric(i, entry) for i, entry in enumerate(metrics)]
        self.load()
        self.input_columns = list(dict.fromkeys(c for m in self.metrics for c in m.inputs))
        self.guard = BatchGuard(
            f"engine {engine_name}",
            self.output_columns(),
            ledger,
            label=f"{self.kind.value}:{engine_name}",
        )
        self.heap = HeapTrimmer()

    # -- construction hooks --------------------------------------------------------------------

    def check_spec(self) -> None:
        """Raise :class:`~ragbatch.core.errors.ConfigError` when :attr:`spec` is not an engine
        this stage runs on. Accepts any by default."""

    def check_metric(self, where: str, metric: Metric) -> None:
        """Raise :class:`~ragbatch.core.errors.ConfigError` (naming ``where``) when
        ``metric`` cannot run on this engine. Accepts any by default."""

    @abstractmethod
    def load(self) -> None:
        """Load the engine (once per actor). Called after the metrics are built. Each
        stage defines it; the base has no engine of its own."""

    def output_columns(self) -> list[tuple[str, pa.DataType]]:
        """The columns a batch gets, in order: ``__ragbatch_cell::<metric id>`` of
        :data:`ragbatch.core.columns.CELL_TYPE` per metric by default."""
        return [(cell_column(m.id), CELL_TYPE) for m in self.metrics]

    def _metric(self, index: int, entry: MetricEntry) -> Metric:
        where = f"metrics[{index}]"
        cls = (
            type(entry)
            if isinstance(entry, Metric)
            else get_metric(entry["name"], where=f"{where}.name")
        )
        if not issubclass(cls, self.metric_class):
            raise ConfigError(f"{where}: {self.wrong_metric.format(metric=cls.name)}")
        if isinstance(entry, Metric):
            metric = entry
            if metric.engine != self.engine_name:
                raise ConfigError(
                    f"{where}: {metric.id} runs on engine {metric.engine!r}, not "
                    f"on engines.{self.engine_name}; give this stage only the "
                    "metrics of its engine"
                )
        else:
            metric = cls.from_params(
                entry.get("params"),
                metric_id=entry.get("id") or cls.name,
                engine=self.engine_name,
                where=f"{where}.params",
            )
        self.check_metric(where, metric)
        return metric

    # -- batches -------------------------------------------------------------------------------

    def pruned(self, out: pa.Table) -> pa.Table:
        """``out`` with only the columns of :attr:`keep_columns` and the pipeline's own
        (no copy); unchanged when it is None."""
        if self.keep_columns is None:
            return out
        return out.select([c for c in out.column_names if c in self.keep_columns or is_internal(c)])

    def check_batch(self, batch: pa.Table) -> None:
        """Raise ``TypeError`` when ``batch`` is not a pyarrow Table, and what
        :meth:`check_columns` raises: not batch faults, so not run under the guard."""
        if not isinstance(batch, pa.Table):
            raise TypeError(
                f"{type(self).__name__} expects pyarrow.Table batches, got "
                f"{type(batch).__name__}; call map_batches with batch_format=\"pyarrow\""
            )
        # A missing column is a pipeline bug, not a batch fault: raised as is.
        self.check_columns(batch)

    def check_columns(self, batch: pa.Table) -> None:
        """Raise ``ValueError`` when ``batch`` lacks one of the metrics' input columns."""
        check_input_columns(self.engine_name, self.input_columns, batch)

    def input_frame(self, batch: pa.Table) -> pl.DataFrame:
        """What :meth:`columns` reads: the metrics' input columns and ``_issues``."""
        return input_frame(self.input_columns, batch)

    def batch_done(self, batch: pa.Table) -> None:
        """Called after each batch, scored or marked ``error``. Does nothing by default."""

    def check_free(self, batch: pa.Table) -> None:
        """Raise ``ValueError`` when ``batch`` already has one of :meth:`output_columns`."""
        for name, _ in self.output_columns():
            if name in batch.column_names:
                raise ValueError(f"column {name!r} is already present in the batch")


class SyncActorStage(ActorStage):
    """An :class:`ActorStage` that scores one batch at a time, synchronously (the model
    and PII stages): its batch guard (a coroutine) runs through
    :func:`~ragbatch.judge.protocol.run_sync` on an event loop of its own per batch."""

    def __call__(self, batch: pa.Table) -> pa.Table:
        """Score one batch.

        Parameters
        ----------
        batch : pyarrow.Table
            ``n`` canonical rows (at least the metrics' input columns; ``_issues`` when
            present supplies null reasons) plus any other columns.

        Returns
        -------
        pyarrow.Table
            All of ``batch``'s columns (with :attr:`keep_columns` set, those and the
            pipeline's own), unchanged and in the same ``n`` rows and order, followed by the columns of
            :meth:`output_columns`, in that order. A batch whose scoring keeps failing
            gets them filled with ``error`` cells when it keeps failing with engine
            faults (:class:`udfs.guard.BatchGuard`).

        Raises
        ------
        TypeError
            ``batch`` is not a pyarrow Table (use ``batch_format="pyarrow"``).
        ValueError
            An input column is missing (see :meth:`check_columns`).
        StageBugError
            Scoring raised an exception that is not an engine fault (a bug in
            ragbatch's own code; :func:`udfs.guard.is_engine_fault`).
        RunError
            The rows marked ``error`` in the run exceed ``run.error_budget``.
        """
        return run_sync(self._process(batch))

    async def _process(self, batch: pa.Table) -> pa.Table:
        """:meth:`__call__`'s work, on the event loop :meth:`__call__` starts for it."""
        self.check_batch(batch)

        async def score(batch: pa.Table) -> pa.Table:
            return self._score(batch)

        out = self.pruned(await self.guard.run(batch, score))
        self.batch_done(batch)
        self.heap.batch_done()
        return out

    @abstractmethod
    def columns(self, batch: pa.Table, frame: pl.DataFrame) -> Iterator[tuple[str, pa.Array]]:
        """The columns to append to ``batch``, as (name, array of ``batch.num_rows``)
        in the order of :meth:`output_columns`. Each stage defines it: the scoring is
        what a stage is for."""

    def _score(self, batch: pa.Table) -> pa.Table:
        """``batch`` with the stage's columns appended (run under the batch guard)."""
        self.check_free(batch)
        return appended(batch, self.columns(batch, self.input_frame(batch)))


def appended(batch: pa.Table, columns: Iterable[tuple[str, pa.Array]]) -> pa.Table:
    """``batch`` with ``columns`` (name, array of ``batch.num_rows``) appended in order."""
    out = batch
    for name, array in columns:
        out = out.append_column(name, array)
    return out
