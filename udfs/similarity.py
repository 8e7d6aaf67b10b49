"""Model stage: the model metrics of one embedding or cross-encoder engine.

One actor pool per engine (an :class:`udfs.base.ActorStage`). Each actor loads its
model once, in ``__init__``, and then scores batches of canonical rows, appending one
``__ragbatch_cell::<metric id>`` column per metric. Run it with::

    ds.map_batches(
        ModelStage,
        batch_format="pyarrow",
        fn_constructor_kwargs={"engine_name": ..., "engine_spec": ..., "metrics": [...]},
        **stage_options(engine_spec),
    )

(``stage_options`` from :mod:`udfs.base`.)
"""

from __future__ import annotations

from typing import Any, ClassVar, Iterator

import polars as pl
import pyarrow as pa

from ragbatch.core.columns import cell_column
from ragbatch.engines.sentence_transformers import load_model
from ragbatch.core.errors import ConfigError
from ragbatch.scoring.base import Metric, ModelMetric
from ragbatch.core.stages import StageKind
from udfs.base import SyncActorStage, cell_array, engine_errors


class ModelStage(SyncActorStage):
    """Ray Data callable class scoring the model metrics of one engine.

    Parameters
    ----------
    engine_name : str
        Key of the engine under ``engines`` (recorded on each metric, used in errors).
    engine_spec : dict or engine model
        An ``embedding`` or ``cross_encoder`` engine spec, validated with the config's
        engine models.
    metrics : list of ModelMetric or dict
        Built :class:`~ragbatch.scoring.base.ModelMetric` objects on this engine, or
        ``{"name": str, "id": str, "params": dict}`` per metric; each must support the
        engine's type.
    ledger : ray actor handle, optional
        The run's :class:`udfs.ledger.RunLedger` (see :class:`udfs.base.ActorStage`).

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
    through to the output untouched (see :meth:`udfs.base.SyncActorStage.__call__`).
    """

    kind: ClassVar[StageKind] = StageKind.MODEL
    metric_class: ClassVar[type[Metric]] = ModelMetric
    wrong_metric: ClassVar[str] = "{metric} is not a model metric; it has no engine stage"

    def check_metric(self, where: str, metric: Metric) -> None:
        """Raise ``ConfigError`` when ``metric`` does not support the engine's type."""
        if self.spec.type not in metric.engine_types:
            raise ConfigError(
                f"{where}: {metric.name} needs an engine of type {' or '.join(metric.engine_types)}, "
                f"but engines.{self.engine_name} has type {self.spec.type!r}"
            )

    def load(self) -> None:
        """Load the engine's model into :attr:`model`."""
        with engine_errors(self.engine_name):
            self.model: Any = load_model(self.spec)

    def columns(self, batch: pa.Table, frame: pl.DataFrame) -> Iterator[tuple[str, pa.Array]]:
        """Per metric, ``__ragbatch_cell::<id>``: its ``compute`` over ``frame``.

        Raises
        ------
        RuntimeError
            A metric returned a number of cells different from the batch's rows.
        """
        for metric in self.metrics:
            assert isinstance(metric, ModelMetric)
            yield (
                cell_column(metric.id),
                cell_array(metric.id, metric.compute(self.model, frame), batch.num_rows),
            )
