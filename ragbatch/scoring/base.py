"""Base classes every metric derives from.

A metric is a class with declarative class attributes (name, inputs, params model, range,
source, degenerate-input policy, worked examples) and one method that computes cells:

* :class:`ExpressionMetric` returns a Polars expression; all expression metrics of a job run
  together in one ``select`` per batch (``udfs/expressions.py``).
* :class:`ModelMetric` computes from a loaded model inside an actor-pool UDF
  (``udfs/similarity.py``, an ``udfs.base.ActorStage``); the model comes from an engine
  adapter under :mod:`ragbatch.engines`.

A *cell* is a struct with the fields of :data:`ragbatch.core.columns.CELL_FIELDS`
(``score`` float64, ``status``, ``reason``, ``details`` JSON, ``model``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import polars as pl
from pydantic import BaseModel, ConfigDict, ValidationError

from ragbatch.core.errors import ConfigError


class NoParams(BaseModel):
    """Params model of a metric that takes none."""

    model_config = ConfigDict(extra="forbid")


class StrictParams(BaseModel):
    """Base of metric params models: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Example:
    """A worked example: one input row, params, and the cell the metric must produce.

    ``inputs`` maps canonical column names to values; columns left out are null. The
    contract test (``tests/test_metric_contract.py``) runs every example of every
    expression metric, and docs/metric-examples.md prints them.
    """

    inputs: dict[str, Any]
    score: float | None
    status: str = "ok"
    params: dict[str, Any] = field(default_factory=dict)
    note: str = ""


class Metric(ABC):
    """Declarative description of a metric plus its validated params.

    Class attributes (set by every subclass):

    name : str
        Stable snake_case name used in configs.
    kind : str
        ``"expression"`` or ``"model"``.
    inputs : tuple of str
        Canonical columns the metric reads; a null value in any of them gives
        ``missing_input``.
    Params : pydantic model
        Validates ``params`` from the config.
    score_range : (float, float)
        Closed interval every ``ok`` score lies in.
    boolean : bool
        True when every ``ok`` score is exactly 0.0 or 1.0.
    higher_is_better : bool
    summary : str
        One-line definition.
    source : str
        The framework or paper the definition follows.
    policy : tuple of (case, outcome)
        The degenerate-input policy, as printed in docs/metrics.md.
    examples : tuple of :class:`Example`

    Instance attribute ``quote_values`` (bool, default True): whether the metric's reasons
    may quote input values (cut to :data:`ragbatch.core.reasons.QUOTE_MAX_CHARS`). The plan
    sets it false in runs with PII metrics (:func:`ragbatch.pipeline.plan.quotes_allowed`).
    """

    name: ClassVar[str]
    kind: ClassVar[str]
    #: The engine ``type`` values (under ``engines``) the metric runs on; empty: none.
    engine_types: ClassVar[tuple[str, ...]] = ()
    #: The engine ``type`` values of a second engine the metric also uses (named by a
    #: param, with a packaged default), e.g. the embedder of ``answer_relevancy``.
    second_engine_types: ClassVar[tuple[str, ...]] = ()
    inputs: ClassVar[tuple[str, ...]]
    Params: ClassVar[type[BaseModel]] = NoParams
    score_range: ClassVar[tuple[float, float]] = (0.0, 1.0)
    boolean: ClassVar[bool] = True
    higher_is_better: ClassVar[bool] = True
    summary: ClassVar[str]
    source: ClassVar[str]
    policy: ClassVar[tuple[tuple[str, str], ...]] = ()
    examples: ClassVar[tuple[Example, ...]] = ()

    def __init__(self, metric_id: str, params: BaseModel, engine: str | None = None):
        self.id = metric_id
        self.params = params
        self.engine = engine
        self.quote_values = True

    @classmethod
    def from_params(
        cls,
        params: dict[str, Any] | None = None,
        *,
        metric_id: str | None = None,
        engine: str | None = None,
        where: str = "params",
    ) -> "Metric":
        """Validate ``params`` with :attr:`Params` and build the metric.

        Raises
        ------
        ConfigError
            A param is unknown, missing or invalid; each problem names
            ``<where>.<param>``.
        """
        try:
            parsed = cls.Params.model_validate(params or {})
        except ValidationError as exc:
            problems = []
            for err in exc.errors():
                loc = ".".join(str(p) for p in err.get("loc", ()))
                path = f"{where}.{loc}" if loc else where
                msg = err.get("msg", "invalid").removeprefix("Value error, ")
                if err.get("type") == "extra_forbidden":
                    known = ", ".join(sorted(cls.Params.model_fields)) or "none"
                    msg = f"unknown param for {cls.name} (known: {known})"
                problems.append(f"{path}: {msg}")
            raise ConfigError(problems) from None
        problems = [f"{where}.{path}: {text}" for path, text in cls.params_problems(parsed)]
        if problems:
            raise ConfigError(problems)
        return cls(metric_id or cls.name, parsed, engine)

    @classmethod
    def params_problems(cls, params: BaseModel) -> list[tuple[str, str]]:
        """``(path under params, problem and fix)`` pairs for valid params that do not fit
        together, which :meth:`from_params` raises; none unless a metric says otherwise."""
        return []

    def manifest_info(self) -> dict[str, Any]:
        """What the run manifest records about this metric."""
        return {
            "id": self.id,
            "name": self.name,
            "kind": self.kind,
            "params": self.params.model_dump(mode="json"),
            "engine": self.engine,
        }

    @classmethod
    def facts(cls) -> dict[str, Any]:
        """What analysis reads about the metric's scores, recorded in its manifest entry:
        ``boolean`` (every ``ok`` score is 0.0 or 1.0), ``higher_is_better`` and
        ``score_range`` (``[low, high]``, floats, closed)."""
        low, high = cls.score_range
        return {
            "boolean": bool(cls.boolean),
            "higher_is_better": bool(cls.higher_is_better),
            "score_range": [float(low), float(high)],
        }

    def validate_notes(self) -> list[str]:
        """Lines ``ragbatch validate`` prints about how this metric will run, each
        without the metric id (the command puts it first). None by default."""
        return []

    def user_modules(self) -> tuple[str, ...]:
        """Modules of user code this metric imports (dotted names); ``ragbatch submit``
        ships those that lie next to the config. None by default."""
        return ()

    def check_input(self, available: set[str]) -> list[str]:
        """Problems with the mapped input columns (missing mappings), for ``validate``."""
        return [
            f"{self.id} reads `{col}` but input.columns maps nothing to {col}; add "
            f"`{col}: <input column>` under input.columns"
            for col in self.inputs
            if col not in available
        ]

    @classmethod
    def describe(cls) -> dict[str, Any]:
        """Static description used by ``ragbatch metrics`` and the docs."""
        params = {}
        for pname, finfo in cls.Params.model_fields.items():
            params[finfo.alias or pname] = {
                "required": finfo.is_required(),
                "default": None
                if finfo.is_required()
                else finfo.get_default(call_default_factory=True),
                "description": finfo.description or "",
            }
        return {
            "name": cls.name,
            "kind": cls.kind,
            "engine": list(cls.engine_types),
            "second_engine": list(cls.second_engine_types),
            "inputs": list(cls.inputs),
            "params": params,
            "range": list(cls.score_range),
            "boolean": cls.boolean,
            "higher_is_better": cls.higher_is_better,
            "summary": cls.summary,
            "source": cls.source,
            "policy": [list(p) for p in cls.policy],
        }


class Intermediate(ABC):
    """A per-batch value several expression metrics read, computed once per batch.

    A metric declares the intermediates it reads in
    :meth:`ExpressionMetric.intermediates`; the expression stage (``udfs/expressions.py``)
    computes each distinct one once over the batch, before any metric's expression runs,
    and hands the values to :meth:`ExpressionMetric.expression_with`. Intermediates are
    compared by value (subclasses are frozen dataclasses), so metrics that declare equal
    ones share a single computation.

    Class attribute ``columns`` (tuple of str): the canonical columns :meth:`compute` reads.
    """

    columns: ClassVar[tuple[str, ...]]

    @abstractmethod
    def compute(self, frame: pl.DataFrame) -> Any:
        """The value over ``frame`` (the batch's columns, every row in batch order)."""


class ExpressionMetric(Metric):
    """A deterministic metric computed as one Polars expression over canonical columns."""

    kind: ClassVar[str] = "expression"

    @abstractmethod
    def expression(self) -> pl.Expr:
        """Return an expression evaluating to a cell struct per row (see module doc)."""

    def intermediates(self) -> tuple[Intermediate, ...]:
        """The shared per-batch values this metric reads (see :class:`Intermediate`);
        none by default."""
        return ()

    def expression_with(self, values: Mapping[Intermediate, Any]) -> pl.Expr:
        """The same cells as :meth:`expression`, reading the intermediates in ``values``.

        ``values`` maps each of :meth:`intermediates` to its value computed over the batch
        the expression will run on (same rows, same order). The default ignores them.
        """
        return self.expression()


class ModelMetric(Metric):
    """A metric computed from a loaded model inside an actor-pool UDF.

    ``engine_types`` lists the engine ``type`` values the metric works with; when the
    config names no engine, :attr:`default_engine` (an engine spec mapping) is used.
    Input guards are Polars expressions (see :mod:`ragbatch.scoring.cells`) so that null
    and empty inputs are settled before any model call.
    """

    kind: ClassVar[str] = "model"
    engine_types: ClassVar[tuple[str, ...]] = ()
    default_engine: ClassVar[dict[str, Any] | None] = None

    @abstractmethod
    def compute(self, model: Any, frame: pl.DataFrame) -> pl.Series:
        """Return a cell-struct Series with one cell per row of ``frame`` (same order)."""
