"""The calibration config (YAML, validated with pydantic).

Shape (see docs/calibration.md)::

    name:    free text
    input:   the labelled data, as a job's ``input`` section (any format a job reads)
    limit:   first N input rows (pairs count as one row), default all
    pairs:   {answers: {column: label, ...}, answer_column, label_column, id_column}
    output:  {uri, storage_options}   (scores runs and calibration tables go here)
    engines: named engines, as in a job (the judges and any embedder they use)
    judges:  engine names to compare (each runs every metric)
    metrics: [{name, id?, params?}, ...]   (no engine: each judge fills it in)
    labels:  {metric id: {column, type, values, threshold, judge_threshold}}
    cache:   the judgment cache, as in a job
    bootstrap: {resamples, seed, confidence}
    top_disagreements: rows kept per judge and metric
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ragbatch.config.engine_spec import EngineSpec
from ragbatch.config.job import (
    CacheSection,
    InputSection,
    MetricSpec,
    OutputSection,
    validate_mapping,
    read_yaml,
)
from ragbatch.core.engine_registry import engine_names
from ragbatch.core.ids import PathId


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PairsSection(_Strict):
    """``pairs``: each input row holds several answers to one question in their own
    columns (HaluEval QA: ``right_answer``, ``hallucinated_answer``). Each row becomes one
    row per column of ``answers``, with the answer in ``answer_column``, that column's
    label in ``label_column`` and the input row's ``id_column`` value (default: its
    position) in ``pair_id``."""

    answers: dict[str, float] = Field(min_length=2)
    answer_column: str = "answer"
    label_column: str = "pair_label"
    id_column: str | None = None


class LabelSpec(_Strict):
    """How one label column becomes numbers for one metric.

    ``type``: ``binary`` (0/1; accuracy, precision, recall, F1, kappa, ROC AUC) or
    ``graded`` (ordered numbers; Spearman, Kendall). ``values`` maps label cells (as
    text) to numbers; without it cells are read as numbers. ``threshold`` (binary only)
    turns numbers into 1 when ``>= threshold``, else 0. ``judge_threshold`` (binary only)
    is the judge score at or above which the judge's verdict is 1. Encode labels in the
    metric's own direction (for ``hate_speech``, 1 = hateful)."""

    column: str
    type: Literal["binary", "graded"] = "binary"
    values: dict[str, float] | None = None
    threshold: float | None = None
    judge_threshold: float = 0.5

    @model_validator(mode="after")
    def _threshold_binary_only(self) -> "LabelSpec":
        if self.threshold is not None and self.type != "binary":
            raise ValueError(
                "threshold applies to binary labels only; remove it or set type: binary"
            )
        return self


class BootstrapSection(_Strict):
    """``bootstrap``: percentile-bootstrap settings of every interval."""

    resamples: int = Field(1000, ge=1)
    seed: int = 0
    confidence: float = Field(0.95, gt=0, lt=1)


class CalibrationConfig(_Strict):
    """A whole calibration config; build it with :func:`load_calibration`."""

    name: str = "calibration"
    input: InputSection
    limit: int | None = Field(None, ge=1)
    pairs: PairsSection | None = None
    output: OutputSection
    #: Validated as a job's ``engines`` (:mod:`ragbatch.config.engine_spec`: synonyms,
    #: the registry's spec models).
    engines: dict[str, EngineSpec] = Field(default_factory=dict)
    #: Engine names; each judge's scores are run ``<calibration id>-<judge>``, so each is
    #: checked as a path segment (:mod:`ragbatch.core.ids`).
    judges: list[PathId] = Field(min_length=1)
    metrics: list[MetricSpec] = Field(min_length=1)
    labels: dict[str, LabelSpec] = Field(min_length=1)
    cache: CacheSection = Field(default_factory=CacheSection)
    bootstrap: BootstrapSection = Field(default_factory=BootstrapSection)
    top_disagreements: int = Field(10, ge=0)

    @model_validator(mode="after")
    def _names_known(self) -> "CalibrationConfig":
        problems = []
        for i, judge in enumerate(self.judges):
            spec = self.engines.get(judge)
            if spec is None:
                problems.append(f"judges[{i}]: {judge!r} is not defined under `engines`")
            elif spec.type not in engine_names("judge"):
                problems.append(
                    f"judges[{i}]: engine {judge!r} is of type {spec.type!r}; a judge "
                    f"must be a {' or '.join(engine_names('judge'))} engine"
                )
        ids = [m.metric_id for m in self.metrics]
        for i, m in enumerate(self.metrics):
            if m.engine is not None:
                problems.append(
                    f"metrics[{i}].engine: leave it out; each engine under `judges` "
                    "runs every metric"
                )
        for mid in self.labels:
            if mid not in ids:
                problems.append(f"labels.{mid}: no metric has id {mid!r}; metric ids: {ids}")
        for i, mid in enumerate(ids):
            if mid not in self.labels:
                problems.append(
                    f"metrics[{i}]: metric {mid!r} has no entry under `labels`; "
                    "add one naming its label column"
                )
        if problems:
            raise ValueError("; ".join(problems))
        return self


def load_calibration(path: str | Path) -> CalibrationConfig:
    """Read and validate a calibration config.

    Raises
    ------
    ConfigError
        The file is missing or not YAML, or a field is invalid; each problem is named as
        ``<field path>: <what is wrong>``.
    """
    path = Path(path)
    return calibration_from_dict(read_yaml(path, "calibration config"), str(path))


def calibration_from_dict(data: Any, source: str = "calibration config") -> CalibrationConfig:
    """Validate a parsed calibration config mapping (see :func:`load_calibration`)."""
    return validate_mapping(CalibrationConfig, data, source)
