"""Shared base of the PII metrics (``answer_contains_pii``, ``context_contains_pii``).

Detection is local (Presidio's analyzer, :mod:`ragbatch.engines.presidio`) and runs in
the PII stage (``udfs/pii.py``), one loaded analyzer per worker. A cell reports whether
PII of the selected types was found (score 1.0) or not (0.0); its reason and details
name the types found and how many, never the text found.
"""

from __future__ import annotations

from abc import abstractmethod
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

import polars as pl
from pydantic import Field, field_validator

from ragbatch.core.columns import ISSUES
from ragbatch.core.engine_registry import DefaultEngineFor, EnginesProviding
from ragbatch.scoring.base import ModelMetric, StrictParams


class PiiParams(StrictParams):
    """Params of the PII metrics."""

    pii_types: list[str] | None = Field(
        None,
        description="Presidio entity types to look for (EMAIL_ADDRESS, PHONE_NUMBER, "
        "CREDIT_CARD, ...); default: every type the engine's detectors support",
    )

    @field_validator("pii_types")
    @classmethod
    def _non_empty_upper(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return value
        if not value:
            raise ValueError("pii_types is empty; leave it out to look for every supported type")
        return list(dict.fromkeys(v.strip().upper() for v in value))


class PiiMetric(ModelMetric):
    """A metric that looks for PII with a ``presidio`` engine (kind ``pii``)."""

    kind: ClassVar[str] = "pii"
    Params = PiiParams
    engine_types: ClassVar[tuple[str, ...]] = EnginesProviding("detect_pii")  # type: ignore[assignment]
    default_engine: ClassVar[dict[str, Any] | None] = DefaultEngineFor("detect_pii")  # type: ignore[assignment]
    boolean: ClassVar[bool] = True
    higher_is_better: ClassVar[bool] = False

    if TYPE_CHECKING:
        # each subclass's staticmethod: (model, the input value, wanted types) -> PyCell
        _cell: Callable[..., Any]

    def check_engine(
        self, spec: Any, supported: Sequence[str], why: Callable[[str], str]
    ) -> list[str]:
        """Problems with ``pii_types`` given the entity types the engine supports.

        A type the configured detectors cannot find would always score 0.0 (a silent
        pass), so it is an error, naming the types that are supported.

        Parameters
        ----------
        spec : ragbatch.engines.presidio.PresidioEngine
            The metric's engine spec (its ``score_threshold`` is quoted).
        supported : sequence of str
            Entity types the engine's detectors find.
        why : callable
            Maps an entity type outside ``supported`` to the reason, for the message
            (the engine's :func:`ragbatch.engines.presidio.unsupported_reason` for
            ``spec``; passed in so that metrics do not import engine adapters).
        """
        if self.params.pii_types is None:
            return (
                []
                if supported
                else [
                    f"{self.id}: engine {self.engine!r} finds no entity type at score_threshold "
                    f"{spec.score_threshold:g}; lower it"
                ]
            )
        unknown = [t for t in self.params.pii_types if t not in supported]
        if not unknown:
            return []
        why_text = "; ".join(why(t) for t in unknown)
        hint = ""
        if any(t in ("PERSON", "LOCATION", "ORGANIZATION", "NRP") for t in unknown):
            hint = (
                f"; set engines.{self.engine}.ner_model to a local spaCy or transformers "
                "NER model for named entities"
            )
        return [
            f"{self.id}: pii_types {unknown} cannot be found by engine {self.engine!r}: "
            f"{why_text} (it finds {', '.join(supported)}){hint}"
        ]

    @abstractmethod
    def texts(self, frame: pl.DataFrame) -> list[str]:
        """The texts of ``frame`` the PII stage must analyze for this metric (each
        distinct text is analyzed once per batch, for all the stage's metrics)."""

    def compute(self, model: "PiiResults", frame: pl.DataFrame) -> pl.Series:
        """Cells for every row of ``frame``.

        Parameters
        ----------
        model : PiiResults
            Findings of (at least) the metric's ``texts(frame)``.
        frame : polars.DataFrame
            The metric's input column; ``_issues`` when present.

        Returns
        -------
        polars.Series
            ``len(frame)`` cells of :data:`~ragbatch.scoring.cells.CELL_DTYPE`, named
            after the metric id; ``score`` 1.0/0.0 when ``ok``. Null inputs get
            :func:`~ragbatch.scoring.cells.missing` (the normalizer's note, which in a
            run with PII metrics never quotes the value); every other row gets the
            subclass's ``_cell``.
        """
        from ragbatch.core.columns import NULLABLE_INPUTS
        from ragbatch.scoring.cells import CELL_DTYPE, missing, python_cells

        column = self.inputs[0]
        wanted = self.params.pii_types
        if ISSUES not in frame.columns:
            issues = pl.Struct({name: pl.String for name in NULLABLE_INPUTS})
            frame = frame.with_columns(pl.lit(None, issues).alias(ISSUES))

        def score(rows: list[dict[str, Any]]) -> list:
            return [self._cell(model, row[column], wanted) for row in rows]

        expr = python_cells([missing(column)], [column], score, model=model.model_id)
        return frame.select(expr.alias(self.id)).to_series().cast(CELL_DTYPE)

    def types(self, supported: Sequence[str]) -> list[str]:
        """The entity types this metric looks for."""
        return list(self.params.pii_types) if self.params.pii_types else list(supported)


def count_types(findings: Sequence[Any], types: Sequence[str] | None) -> Counter:
    """Entity type -> number of findings whose type is in ``types`` (every finding when
    ``types`` is None)."""
    return Counter(f.entity_type for f in findings if types is None or f.entity_type in types)


def describe_counts(counts: Counter) -> str:
    """``"EMAIL_ADDRESS x2, PHONE_NUMBER x1"`` (types sorted), or ``"no PII found"``."""
    if not counts:
        return "no PII found"
    return ", ".join(f"{t} x{n}" for t, n in sorted(counts.items()))


class PiiResults:
    """Findings of one batch's texts, shared by the PII metrics of a stage.

    Parameters
    ----------
    found : dict
        Text -> list of :class:`~ragbatch.engines.presidio.Finding`, or an error string
        when the analyzer raised on that text.
    model_id : str
        Recorded in each cell's ``model`` field.
    """

    def __init__(self, found: dict[str, Any], model_id: str):
        self.found = found
        self.model_id = model_id

    def get(self, text: str) -> Any:
        """Findings of ``text`` (a list) or its error string.

        Raises
        ------
        KeyError
            ``text`` was not analyzed in this batch (a stage bug, never a data problem).
        """
        return self.found[text]


def detector_failure(error: str) -> str:
    """The reason of a cell whose text the detector failed on: the exception type only
    (an exception message could quote the text, and reasons never hold PII)."""
    return f"PII detection failed ({error.split(':', 1)[0]}); the worker log has the message"
