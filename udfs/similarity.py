"""Model stage: the model metrics of one embedding or cross-encoder engine.

One actor pool per engine. Each actor loads its model once, in ``__init__``, and then
scores batches of canonical rows, appending one ``__ragbatch_cell::<metric id>`` column per metric.
Run it with::

    ds.map_batches(
        ModelStage,
        batch_format="pyarrow",
        fn_constructor_kwargs={"engine_name": ..., "engine_spec": ..., "metrics": [...]},
        **stage_options(engine_spec),
    )
"""

from __future__ import annotations

import inspect
from typing import Any

import polars as pl
import pyarrow as pa
from pydantic import TypeAdapter, ValidationError

from ragbatch.columns import CELL_TYPE, ISSUES, cell_column
from udfs.guard import BatchGuard
from udfs.ledger import report_placement
from ragbatch.config import (
    ENGINE_TYPES, CrossEncoderEngine, EmbeddingEngine, EngineSpec, normalize_engine,
)
from ragbatch.engines.sentence_transformers import load_model
from ragbatch.errors import ConfigError, EngineError
from ragbatch.heap import HeapTrimmer
from ragbatch.metrics.base import ModelMetric
from ragbatch.registry import get_metric

_ENGINE_SPEC = TypeAdapter(EngineSpec)


def parse_engine_spec(
    engine_name: str, engine_spec: dict[str, Any] | EmbeddingEngine | CrossEncoderEngine
) -> EmbeddingEngine | CrossEncoderEngine:
    """Validate an engine spec mapping with the config's engine models.

    Parameters
    ----------
    engine_name : str
        The key under ``engines`` (used in error messages).
    engine_spec : dict or engine model
        ``{type, model, device, num_gpus, num_cpus, concurrency, batch_size, ...}``; an
        already validated engine model is returned unchanged.

    Returns
    -------
    EmbeddingEngine or CrossEncoderEngine

    Raises
    ------
    ConfigError
        A field is unknown, missing or invalid; each problem is named
        ``engines.<engine_name>.<field>``.
    """
    if isinstance(engine_spec, (EmbeddingEngine, CrossEncoderEngine)):
        return engine_spec
    try:
        return _ENGINE_SPEC.validate_python(normalize_engine(engine_spec))
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = [str(p) for p in err.get("loc", ()) if p not in ENGINE_TYPES]
            where = ".".join(["engines", engine_name, *loc])
            problems.append(f"{where}: {err.get('msg', 'invalid').removeprefix('Value error, ')}")
        raise ConfigError(problems) from None


def stage_options(
    engine_spec: dict[str, Any] | EmbeddingEngine | CrossEncoderEngine,
) -> dict[str, Any]:
    """Keyword arguments for ``Dataset.map_batches`` that size the actor pool.

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
        :func:`ragbatch.placement.map_batches_options` (``compute``, ``num_gpus``,
        ``num_cpus``, ``batch_size`` and the placement options), and
        ``udf_modifying_row_count=False`` where the installed Ray
        Data accepts it (the stage returns its rows 1:1). ``batch_format`` is not
        included: pass ``batch_format="pyarrow"`` yourself.

    Raises
    ------
    ConfigError
        The spec is invalid (see :func:`parse_engine_spec`).
    """
    import ray.data

    from ragbatch.placement import map_batches_options

    spec = parse_engine_spec("<engine>", engine_spec)
    # A dead actor is replaced and the batch it held runs again (Ray Data's defaults for
    # actor pools); the stage's BatchGuard marks a batch that kills every actor it
    # reaches as error after MAX_LOST_STARTS starts, so retries end.
    options = map_batches_options(spec)
    if "udf_modifying_row_count" in inspect.signature(ray.data.Dataset.map_batches).parameters:
        options["udf_modifying_row_count"] = False
    return options


class ModelStage:
    """Ray Data callable class scoring the model metrics of one engine.

    Parameters
    ----------
    engine_name : str
        Key of the engine under ``engines`` (recorded on each metric, used in errors).
    engine_spec : dict
        The engine spec, validated with the config's engine models.
    metrics : list of dict
        ``{"name": str, "id": str, "params": dict}`` per metric; each name must be a
        registered :class:`~ragbatch.metrics.base.ModelMetric` that supports the
        engine's type.
    ledger : ray actor handle, optional
        The run's :class:`udfs.ledger.RunLedger`; batches run under a
        :class:`udfs.guard.BatchGuard` (a batch that keeps failing gets ``error`` cells).

    Raises
    ------
    ConfigError
        The engine spec or a metric's params are invalid, a name is unknown, or a
        metric does not support the engine type.
    EngineError
        The model cannot be loaded (message prefixed ``engines.<engine_name>``).

    Notes
    -----
    The model is loaded once per actor, in ``__init__``. Each call converts only the
    metrics' input columns (and ``_issues``) to Polars; every input column passes
    through to the output untouched. After a batch, at most once per
    :data:`ragbatch.heap.TRIM_INTERVAL_S` seconds, the actor returns freed heap memory to
    the system (:class:`ragbatch.heap.HeapTrimmer`), so that its memory stays flat over a
    long run.
    """

    def __init__(
        self, engine_name: str, engine_spec: dict[str, Any], metrics: list[dict[str, Any]],
        ledger: Any = None,
    ) -> None:
        self.engine_name = engine_name
        report_placement(ledger, "model:" + engine_name)
        self.spec = parse_engine_spec(engine_name, engine_spec)
        self.metrics = [self._build_metric(i, m) for i, m in enumerate(metrics)]
        try:
            self.model = load_model(self.spec)
        except EngineError as exc:
            raise EngineError(f"engines.{engine_name}: {exc}") from exc
        self.input_columns = list(dict.fromkeys(c for m in self.metrics for c in m.inputs))
        self.guard = BatchGuard(f"engine {engine_name}",
                                [(cell_column(m.id), CELL_TYPE) for m in self.metrics], ledger)
        self.heap = HeapTrimmer()

    def _build_metric(self, index: int, entry: dict[str, Any]) -> ModelMetric:
        where = f"metrics[{index}]"
        cls = get_metric(entry["name"], where=f"{where}.name")
        if not issubclass(cls, ModelMetric):
            raise ConfigError(f"{where}: {cls.name} is not a model metric; it has no engine stage")
        if self.spec.type not in cls.engine_types:
            raise ConfigError(
                f"{where}: {cls.name} needs an engine of type {' or '.join(cls.engine_types)}, "
                f"but engines.{self.engine_name} has type {self.spec.type!r}"
            )
        metric = cls.from_params(
            entry.get("params"), metric_id=entry.get("id") or cls.name,
            engine=self.engine_name, where=f"{where}.params",
        )
        assert isinstance(metric, ModelMetric)
        return metric

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
            All of ``batch``'s columns, unchanged and in the same ``n`` rows and order,
            followed by one column ``__ragbatch_cell::<metric id>`` of type
            :data:`ragbatch.columns.CELL_TYPE` per metric, in the order given.

        Raises
        ------
        TypeError
            ``batch`` is not a pyarrow Table (use ``batch_format="pyarrow"``).
        ValueError
            An input column is missing, or a cell column already exists.
        RuntimeError
            A metric returned a number of cells different from ``n``.
        """
        if not isinstance(batch, pa.Table):
            raise TypeError(
                f"ModelStage expects pyarrow.Table batches, got {type(batch).__name__}; "
                'call map_batches with batch_format="pyarrow"'
            )
        # A missing column is a pipeline bug, not a batch fault: raised as is.
        check_input_columns(self.engine_name, self.input_columns, batch)
        out = self.guard.run(batch, self._score)
        self.heap.batch_done()
        return out

    def _score(self, batch: pa.Table) -> pa.Table:
        frame = input_frame(self.input_columns, batch)
        out = batch
        for metric in self.metrics:
            name = cell_column(metric.id)
            if name in out.column_names:
                raise ValueError(f"column {name!r} is already present in the batch")
            out = out.append_column(name, self._cells(metric, frame, batch.num_rows))
        return out

    def _cells(self, metric: ModelMetric, frame: pl.DataFrame, n_rows: int) -> pa.Array:
        cells = metric.compute(self.model, frame)
        if len(cells) != n_rows:
            raise RuntimeError(
                f"{metric.id}: compute returned {len(cells)} cells for {n_rows} rows"
            )
        return cells.to_arrow().cast(CELL_TYPE)


def check_input_columns(engine_name: str, input_columns: list[str], batch: pa.Table) -> None:
    """Raise ``ValueError`` naming the engine when ``batch`` lacks an input column."""
    missing = [c for c in input_columns if c not in batch.column_names]
    if missing:
        raise ValueError(f"engine {engine_name!r}: batch lacks input column(s) {missing}; "
                         f"present: {batch.column_names}")


def input_frame(input_columns: list[str], batch: pa.Table) -> pl.DataFrame:
    """The input columns of ``batch`` (and ``_issues`` when present) as Polars."""
    wanted = input_columns + ([ISSUES] if ISSUES in batch.column_names else [])
    frame = pl.from_arrow(batch.select(wanted))
    assert isinstance(frame, pl.DataFrame)
    return frame
