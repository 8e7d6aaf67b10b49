"""PII stage: the PII metrics of one ``presidio`` engine.

An :class:`udfs.base.ActorStage`: each worker builds Presidio's analyzer once, in
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

(``stage_options`` from :mod:`udfs.base`). No text leaves the worker; the cells
hold entity types and counts only.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import ClassVar, Iterator

import polars as pl
import pyarrow as pa

from ragbatch.core.columns import cell_column
from ragbatch.engines.presidio import PresidioEngine
from ragbatch.engines.presidio import PiiDetector, unsupported_reason
from ragbatch.core.errors import ConfigError
from ragbatch.scoring.base import Metric
from ragbatch.metrics.pii_base import PiiMetric, PiiResults
from ragbatch.core.stages import StageKind
from udfs.base import SyncActorStage, cell_array, engine_errors

logger = logging.getLogger(__name__)


class PiiStage(SyncActorStage):
    """Ray Data callable class computing the PII metrics of one engine.

    Parameters
    ----------
    engine_name : str
        Key of the engine under ``engines`` (used in errors).
    engine_spec : dict
        A ``presidio`` engine spec (see :class:`ragbatch.engines.presidio.PresidioEngine`).
    metrics : list of PiiMetric or dict
        Built PII metrics on this engine, or ``{"name", "id", "params"}`` per metric;
        each a registered PII metric.
    ledger : ray actor handle, optional
        The run's :class:`udfs.ledger.RunLedger` (see :class:`udfs.base.ActorStage`).

    Raises
    ------
    ConfigError
        The spec or a metric is invalid, or a metric asks for a type the detectors cannot
        find.
    EngineError
        The analyzer cannot be built (for example the NER model does not load); the
        message starts with ``engines.<engine_name>``.
    """

    kind: ClassVar[StageKind] = StageKind.PII
    metric_class: ClassVar[type[Metric]] = PiiMetric
    wrong_metric: ClassVar[str] = "{metric} is not a PII metric"

    def check_spec(self) -> None:
        """Raise ``ConfigError`` unless the engine is a ``presidio`` engine."""
        if not isinstance(self.spec, PresidioEngine):
            raise ConfigError(
                f"engines.{self.engine_name}: the PII stage needs a presidio engine, "
                f"got type {self.spec.type!r}"
            )

    def load(self) -> None:
        """Build the analyzer (:attr:`detector`) and check every metric's ``pii_types``
        against the entity types it supports.

        Raises
        ------
        ConfigError
            A metric asks for a type the detectors cannot find.
        """
        with engine_errors(self.engine_name):
            self.detector = PiiDetector(self.spec)
        why = partial(unsupported_reason, self.spec)
        problems = [
            p
            for m in self.pii_metrics()
            for p in m.check_engine(self.spec, self.detector.entities, why)
        ]
        if problems:
            raise ConfigError(problems)
        # Every supported type is looked for, whatever the metrics select: which type a
        # span is (a card number or a phone number) is decided among all of them, so a
        # metric's cells never depend on the other metrics of the stage.
        self.entities = list(self.detector.entities)

    def pii_metrics(self) -> list[PiiMetric]:
        """:attr:`metrics`, each a :class:`~ragbatch.metrics.pii_base.PiiMetric` (as
        :attr:`metric_class` makes sure when they are built)."""
        return [m for m in self.metrics if isinstance(m, PiiMetric)]

    def columns(self, batch: pa.Table, frame: pl.DataFrame) -> Iterator[tuple[str, pa.Array]]:
        """Per metric, ``__ragbatch_cell::<id>``, from one analysis of every distinct
        text the metrics read in ``frame``.

        Raises
        ------
        RuntimeError
            A metric returned a number of cells different from the batch's rows.
        """
        metrics = self.pii_metrics()
        texts = list(dict.fromkeys(t for m in metrics for t in m.texts(frame)))
        found = dict(zip(texts, self.detector.find(texts, self.entities)))
        for text, result in found.items():
            if isinstance(result, str):
                logger.warning(
                    "engines.%s: PII detection failed on a text of %d chars: %s",
                    self.engine_name,
                    len(text),
                    result,
                )
        results = PiiResults(found, self.detector.model_id)
        for metric in metrics:
            yield (
                cell_column(metric.id),
                cell_array(metric.id, metric.compute(results, frame), batch.num_rows),
            )
