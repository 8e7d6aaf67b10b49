"""PII stage: the PII metrics of one ``presidio`` engine.

A Ray Data callable class: each worker builds Presidio's analyzer once, in
``__init__``, then analyzes a batch at a time. Every distinct text of a batch (answers
and context chunks alike) is analyzed once, for every entity type the engine supports
(overlapping findings of different types are settled among all of them); each metric
then counts the types it asks for. Run it with::

    ds.map_batches(
        PiiStage,
        batch_format="pyarrow",
        fn_constructor_kwargs={"engine_name": ..., "engine_spec": ..., "metrics": [...]},
        **stage_options(engine_spec),
    )

(``stage_options`` from :mod:`udfs.similarity`). No text leaves the worker; the cells
hold entity types and counts only.
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa

from ragbatch.columns import CELL_TYPE, cell_column
from ragbatch.config import PresidioEngine
from ragbatch.engines.presidio import PiiDetector
from ragbatch.errors import ConfigError, EngineError
from ragbatch.heap import HeapTrimmer
from ragbatch.metrics.pii_base import PiiMetric, PiiResults
from ragbatch.registry import get_metric
from udfs.guard import BatchGuard
from udfs.ledger import report_placement
from udfs.similarity import check_input_columns, input_frame, parse_engine_spec

logger = logging.getLogger(__name__)


class PiiStage:
    """Ray Data callable class computing the PII metrics of one engine.

    Parameters
    ----------
    engine_name : str
        Key of the engine under ``engines`` (used in errors).
    engine_spec : dict
        A ``presidio`` engine spec (see :class:`ragbatch.config.PresidioEngine`).
    metrics : list of dict
        ``{"name", "id", "params"}`` per metric; each a registered PII metric.
    ledger : ray actor handle, optional
        The run's :class:`udfs.ledger.RunLedger` (see :class:`udfs.guard.BatchGuard`).

    Raises
    ------
    ConfigError
        The spec or a metric is invalid, or a metric asks for a type the detectors cannot
        find.
    EngineError
        The analyzer cannot be built (for example the NER model does not load); the
        message starts with ``engines.<engine_name>``.
    """

    def __init__(self, engine_name: str, engine_spec: dict[str, Any],
                 metrics: list[dict[str, Any]], ledger: Any = None) -> None:
        self.engine_name = engine_name
        report_placement(ledger, "pii:" + engine_name)
        spec = parse_engine_spec(engine_name, engine_spec)
        if not isinstance(spec, PresidioEngine):
            raise ConfigError(f"engines.{engine_name}: the PII stage needs a presidio engine, "
                              f"got type {spec.type!r}")
        self.metrics = [self._build_metric(i, m) for i, m in enumerate(metrics)]
        try:
            self.detector = PiiDetector(spec)
        except EngineError as exc:
            raise EngineError(f"engines.{engine_name}: {exc}") from exc
        problems = [p for m in self.metrics for p in m.check_engine(spec, self.detector.entities)]
        if problems:
            raise ConfigError(problems)
        # Every supported type is looked for, whatever the metrics select: which type a
        # span is (a card number or a phone number) is decided among all of them, so a
        # metric's cells never depend on the other metrics of the stage.
        self.entities = list(self.detector.entities)
        self.input_columns = list(dict.fromkeys(c for m in self.metrics for c in m.inputs))
        self.guard = BatchGuard(f"engine {engine_name}",
                                [(cell_column(m.id), CELL_TYPE) for m in self.metrics], ledger)
        self.heap = HeapTrimmer()  # see ragbatch.heap: keeps the actor's memory level

    def _build_metric(self, index: int, entry: dict[str, Any]) -> PiiMetric:
        where = f"metrics[{index}]"
        cls = get_metric(entry["name"], where=f"{where}.name")
        if not issubclass(cls, PiiMetric):
            raise ConfigError(f"{where}: {cls.name} is not a PII metric")
        metric = cls.from_params(entry.get("params"), metric_id=entry.get("id") or cls.name,
                                 engine=self.engine_name, where=f"{where}.params")
        assert isinstance(metric, PiiMetric)
        return metric

    def __call__(self, batch: pa.Table) -> pa.Table:
        """Analyze one batch.

        Parameters
        ----------
        batch : pyarrow.Table
            ``n`` canonical rows with at least the metrics' input columns.

        Returns
        -------
        pyarrow.Table
            ``batch`` unchanged (same ``n`` rows, same order) followed by one
            ``__ragbatch_cell::<metric id>`` column (:data:`ragbatch.columns.CELL_TYPE`) per metric.

        Raises
        ------
        TypeError
            ``batch`` is not a pyarrow Table.
        ValueError
            An input column is missing or a cell column already exists.
        """
        if not isinstance(batch, pa.Table):
            raise TypeError(f"PiiStage expects pyarrow.Table batches, got {type(batch).__name__}; "
                            'call map_batches with batch_format="pyarrow"')
        # A missing column is a pipeline bug, not a batch fault: raised as is.
        check_input_columns(self.engine_name, self.input_columns, batch)
        out = self.guard.run(batch, self._score)
        self.heap.batch_done()
        return out

    def _score(self, batch: pa.Table) -> pa.Table:
        frame = input_frame(self.input_columns, batch)
        texts = list(dict.fromkeys(t for m in self.metrics for t in m.texts(frame)))
        found = dict(zip(texts, self.detector.find(texts, self.entities)))
        for text, result in found.items():
            if isinstance(result, str):
                logger.warning("engines.%s: PII detection failed on a text of %d chars: %s",
                               self.engine_name, len(text), result)
        results = PiiResults(found, self.detector.model_id)
        out = batch
        for metric in self.metrics:
            name = cell_column(metric.id)
            if name in out.column_names:
                raise ValueError(f"column {name!r} is already present in the batch")
            cells = metric.compute(results, frame)
            if len(cells) != batch.num_rows:
                raise RuntimeError(f"{metric.id}: {len(cells)} cells for {batch.num_rows} rows")
            out = out.append_column(name, cells.to_arrow().cast(CELL_TYPE))
        return out
