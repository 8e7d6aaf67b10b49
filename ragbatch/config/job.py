"""The job config: a YAML file validated with pydantic.

Shape (see docs/config.md for every field)::

    run:     {name, run_date, run_id}
    input:   {uri, format, columns, contexts_format, contexts_field, contexts_delimiter,
            slice_columns,
              storage_options, encoding, latency_unit}
    output:  {uri, storage_options}
    metrics: [{name, id, params, engine | engines, panel}, ...]
    engines: {engine name: {type (or kind), model, ..., num_gpus, num_cpus, concurrency,
              batch_size}}; each type's fields are its spec model's, found through the
              engine registry (:mod:`ragbatch.config.engine_spec`)
    cache:   {enabled, uri, storage_options, keep_runs, keep_days}   (the judgment cache)
    diagnostics: {min_cells, modal_share_max, ..., fail_on_degenerate}   (judge health)
    labels:  {columns: {metric id: input column}, calibration: {uri, run_id, columns},
              estimator}   (human labels, docs/ppi.md)

:func:`load_config` raises :class:`~ragbatch.core.errors.ConfigError` whose message lists every
problem as ``<field path>: <what is wrong>; <what to do>``.
"""

from __future__ import annotations

import datetime as dt
import difflib
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ragbatch.config.engine_spec import EngineSpec, engine_spec_models
from ragbatch.config.panel import PanelSection, member_key, panel_problems
from ragbatch.core.errors import ConfigError
from ragbatch.core.ids import PathId
from ragbatch.config.safe_yaml import MAX_YAML_BYTES, load_yaml


from ragbatch.config.formats import (
    FILTER_OPERATORS,
    TABLE_FORMATS,
    TRACE_COLUMN_DEFAULTS,
    check_installed,
    input_formats,
)


#: A config model class (:func:`validate_mapping`).
M = TypeVar("M", bound=BaseModel)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


#: The most read tasks ``run.tasks_in_flight`` may ask for (each holds its rows in memory).
MAX_TASKS_IN_FLIGHT = 1024


class RunSection(_Strict):
    """``run``: naming of the run. ``run_date`` defaults to today (UTC); ``run_id`` is
    generated (``YYYYMMDDTHHMMSSZ-xxxxxx``) unless given here or with ``--run-id``; it
    names directories, so it is checked as a path segment (:mod:`ragbatch.core.ids`), also
    when a field is assigned after loading. ``name`` is a label (manifest, reports) and
    never part of a path.
    ``error_budget`` (fraction in [0, 1], default 0.01) is the largest share of input rows
    that may end with status ``error`` on some metric: past it the run stops (early, when
    failed batches exceed it) and is not committed. ``executor`` chooses where the run
    executes (:mod:`ragbatch.pipeline.in_process`): ``auto`` runs a job of expression
    metrics only in the ``ragbatch`` process when no Ray cluster is named, and on Ray
    otherwise; ``ray`` always starts or joins Ray; ``in_process`` insists on the first.
    ``tasks_in_flight`` sets how many read tasks a run in the process works on at once
    (default: sized to the machine's cores and memory)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    name: str = "ragbatch"
    run_date: dt.date | None = None
    run_id: PathId | None = None
    #: Largest fraction of input rows that may end with status ``error`` on some metric
    #: (a batch that kept failing, a callback that raised) for the run to commit.
    error_budget: float = Field(0.01, ge=0, le=1)
    #: Where the run executes: ``auto``, ``ray`` or ``in_process``
    #: (:mod:`ragbatch.pipeline.in_process`).
    executor: Literal["auto", "ray", "in_process"] = "auto"
    #: Read tasks a run in the process holds at once, and its threads (at least 1);
    #: unset: one per core, as memory allows, at least two
    #: (:func:`ragbatch.pipeline.in_process.tasks_in_flight`). Not used on Ray.
    tasks_in_flight: int | None = Field(None, ge=1, le=MAX_TASKS_IN_FLIGHT, strict=True)


class ColumnMapping(_Strict):
    """``input.columns``: canonical column -> input column name. Omit what the data lacks."""

    row_id: str | None = None
    question: str | None = None
    contexts: str | None = None
    answer: str | None = None
    reference: str | None = None
    latency_s: str | None = None
    #: Ranking columns (docs/config.md#ranking-columns): retrieved ids in order, the ids
    #: known relevant, graded relevance (id -> grade).
    context_ids: str | None = None
    relevant_ids: str | None = None
    relevance: str | None = None


class InputSection(_Strict):
    """``input``: where the RAG traces are and how their columns map."""

    uri: str
    #: A file format (:data:`INPUT_FORMATS`) or a table format (:data:`TABLE_FORMATS`).
    format: str | None = None
    #: Table formats: the table version to read (Delta Lake: the commit version, >= 0).
    #: Unset, a run reads the latest version and pins it (docs/lakehouse.md).
    version: int | None = Field(default=None, ge=0)
    #: Iceberg: the table's identifier in the catalog, ``namespace.name``.
    table: str | None = None
    #: Iceberg: the catalog's properties, as pyiceberg's ``load_catalog`` takes them
    #: (``type``, ``uri``, ``warehouse``, ...); ``type`` defaults to ``sql``, pyiceberg's
    #: SQL catalog, embedded on a SQLite file: ``{uri: sqlite:///lake/catalog.db}``.
    catalog: dict[str, Any] | None = None
    #: Iceberg: the snapshot to read. Unset, a run reads the current snapshot and pins it.
    snapshot_id: int | None = None
    #: OpenInference traces: slice columns taken from span attributes, column name ->
    #: attribute key (``{model: llm.model_name}``): the root span's value, else the first
    #: span's that has it.
    trace_attributes: dict[str, str] | None = None
    #: Table formats: conditions a row must all meet, each ``[column, operator, value]``
    #: (operators :data:`FILTER_OPERATORS`; ``in`` and ``not in`` take a list). Those on
    #: partition columns choose the data files read; the others filter their rows.
    filter: list[tuple[str, str, Any]] | None = None
    columns: ColumnMapping = Field(default_factory=ColumnMapping)
    contexts_format: Literal["auto", "list", "json", "text", "delimited"] = "auto"
    contexts_field: str | None = None
    #: With ``contexts_format: delimited``, the text between two contexts (e.g. ``"|"``).
    contexts_delimiter: str | None = None
    slice_columns: list[str] | None = None
    storage_options: dict[str, Any] = Field(default_factory=dict)
    encoding: str = "utf-8"
    latency_unit: Literal["s", "ms"] = "s"

    @field_validator("format")
    @classmethod
    def _known_format(cls, value: str | None) -> str | None:
        if value is None or value in input_formats():
            return value
        raise ValueError(f"unknown input format {value!r}; use one of {', '.join(input_formats())}")

    @model_validator(mode="after")
    def _table_options_go_with_tables(self) -> "InputSection":
        if self.trace_attributes is not None and self.format != "openinference":
            raise ValueError(
                "input.trace_attributes applies to input.format openinference; remove it "
                "or read a span export"
            )
        check_installed(self.format)
        needs = TABLE_FORMATS.get(self.format or "")
        taken = needs.fields if needs is not None else ()
        for name in sorted({f for n in TABLE_FORMATS.values() for f in n.fields} - set(taken)):
            if getattr(self, name) is not None:
                formats = [f for f, n in TABLE_FORMATS.items() if name in n.fields]
                raise ValueError(
                    f"input.{name} applies to input.format {' or '.join(formats)}, not to "
                    f"input.format {self.format!r}; remove it or read such a table"
                )
        if needs is None:
            return self
        for name in needs.required:
            if not getattr(self, name):
                raise ValueError(f"input.format {self.format!r} needs input.{name}")
        for condition in self.filter or []:
            column, operator, value = condition
            if operator not in FILTER_OPERATORS:
                raise ValueError(
                    f"input.filter {list(condition)!r}: unknown operator {operator!r}; "
                    f"use one of {', '.join(FILTER_OPERATORS)}"
                )
            listed = isinstance(value, list)
            if listed != (operator in ("in", "not in")):
                raise ValueError(
                    f"input.filter {list(condition)!r}: 'in' and 'not in' take a list of "
                    "values, the other operators one value"
                )
        return self

    @model_validator(mode="after")
    def _trace_columns_mapped(self) -> "InputSection":
        if self.format == "openinference":
            for canonical, column in TRACE_COLUMN_DEFAULTS.items():
                if getattr(self.columns, canonical) is None:
                    setattr(self.columns, canonical, column)
        return self

    @model_validator(mode="after")
    def _delimiter_goes_with_delimited(self) -> "InputSection":
        delimited = self.contexts_format == "delimited"
        if delimited and not self.contexts_delimiter:
            raise ValueError(
                "contexts_format 'delimited' needs contexts_delimiter: the non-empty "
                "text between two contexts, e.g. contexts_delimiter: '|'"
            )
        if not delimited and self.contexts_delimiter is not None:
            raise ValueError(
                f"contexts_delimiter is only used with contexts_format: delimited "
                f"(contexts_format is {self.contexts_format!r}); set both or remove it"
            )
        return self


class MlflowSection(_Strict):
    """``output.mlflow``: log each committed run as an MLflow run (docs/lakehouse.md).
    ``tracking_uri`` is any MLflow tracking URI; the default, ``mlruns``, is a local file
    store in the folder ``ragbatch`` runs in. ``experiment`` defaults to ``run.name``."""

    tracking_uri: str = "mlruns"
    experiment: str | None = None

    @model_validator(mode="after")
    def _mlflow_installed(self) -> "MlflowSection":
        import importlib.util

        if importlib.util.find_spec("mlflow") is None:
            raise ValueError(
                "output.mlflow needs the mlflow package, which is not installed: "
                "pip install 'ragbatch[mlflow]'"
            )
        return self


class TableOutputSection(_Strict):
    """``output.table``: also write each committed run's scores and summary to a
    lakehouse table (docs/lakehouse.md). ``format: delta``: ``uri`` is a folder holding
    the Delta tables ``scores`` and ``summary`` (``storage_options`` as for any fsspec
    URI). ``format: iceberg``: the tables ``<namespace>.scores`` and
    ``<namespace>.summary`` of the catalog ``catalog`` (pyiceberg's properties, ``type``
    defaulting to ``sql``)."""

    format: Literal["delta", "iceberg"]
    uri: str | None = None
    storage_options: dict[str, Any] = Field(default_factory=dict)
    catalog: dict[str, Any] | None = None
    namespace: str | None = None

    @model_validator(mode="after")
    def _fields_of_the_format(self) -> "TableOutputSection":
        if self.format == "delta" and not self.uri:
            raise ValueError("output.table with format delta needs uri: the tables' folder")
        if self.format == "iceberg" and (not self.namespace or not self.catalog):
            raise ValueError(
                "output.table with format iceberg needs namespace and catalog "
                "(e.g. catalog: {uri: sqlite:///lake/catalog.db, warehouse: ...})"
            )
        check_installed(self.format, "output.table.format")
        return self


class OutputSection(_Strict):
    """``output``: root URI of the scores, summary and manifest tables; optionally, a
    lakehouse table each committed run is also written to, and the MLflow tracking
    server it is logged to."""

    uri: str
    storage_options: dict[str, Any] = Field(default_factory=dict)
    table: TableOutputSection | None = None
    mlflow: MlflowSection | None = None


class MetricSpec(_Strict):
    """One entry of ``metrics``. ``id`` (default: ``name``) is what the scores table's
    ``metric`` column holds; ``engine`` names an entry of ``engines``. A judge metric may
    name several instead, ``engines: [a, b, ...]``, with ``panel`` saying how their cells
    combine (a judge panel, :mod:`ragbatch.config.panel`); one name there is the same as
    ``engine``."""

    name: str
    id: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    engine: str | None = None
    engines: list[str] | None = None
    panel: PanelSection | None = None

    @property
    def metric_id(self) -> str:
        return self.id or self.name

    @property
    def judges(self) -> list[str] | None:
        """The engines of a panel (two or more, in config order), else None."""
        if self.engines is not None and len(dict.fromkeys(self.engines)) > 1:
            return list(dict.fromkeys(self.engines))
        return None

    @property
    def single_engine(self) -> str | None:
        """The one engine of an entry that is not a panel (``engine``, or the only name
        in ``engines``), else None."""
        if self.engines is not None and self.judges is None and self.engines:
            return self.engines[0]
        return self.engine


class CacheSection(_Strict):
    """``cache``: the judgment cache. ``uri`` defaults to ``<output.uri>/judge_cache``;
    any fsspec URI works, so a cluster run can share it through object storage.
    ``keep_runs`` / ``keep_days``: the retention ``ragbatch cache prune`` applies when
    no flag is given (entries used within the last N runs or D days; docs/cache.md).
    ``rejudge``: cell statuses whose cached replies are asked again under new cache keys
    (``parse_failure``; ``judge_error``, ``timeout`` and ``context_too_long`` are never
    cached and always asked again); unset, ``ragbatch run`` asks nothing again and
    ``ragbatch nightly`` asks ``parse_failure`` again; ``[]`` turns it off for both
    (docs/cache.md, "Asking failed replies again")."""

    enabled: bool = True
    uri: str | None = None
    storage_options: dict[str, Any] = Field(default_factory=dict)
    keep_runs: int | None = Field(default=None, ge=0)
    keep_days: float | None = Field(default=None, ge=0)
    rejudge: list[str] | None = None

    @field_validator("rejudge")
    @classmethod
    def _known_rejudge_statuses(cls, value: list[str] | None) -> list[str] | None:
        from ragbatch.core.status import check_rejudge

        return None if value is None else check_rejudge(value, "cache.rejudge")


class CalibrationGuardSection(_Strict):
    """``calibration``: the judge metrics a run may use only with recorded agreement.

    ``uri`` is the output root of ``ragbatch calibrate``; ``run_id`` picks one committed
    calibration there (default: the latest). ``min_agreement`` maps a metric id of this
    config to ``{measure: minimum}`` (measures: accuracy, precision, recall, f1, kappa,
    roc_auc, spearman, kendall, pairwise_agreement). ``ragbatch run`` refuses to start when
    such a metric has no recorded value for its judge model and prompt version, or one
    below the minimum, unless ``proceed`` is true (or ``--allow-uncalibrated`` is given):
    then it warns and runs."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    uri: str
    storage_options: dict[str, Any] = Field(default_factory=dict)
    run_id: PathId | None = None
    min_agreement: dict[str, dict[str, float]] = Field(min_length=1)
    proceed: bool = False


class DiagnosticsSection(_Strict):
    """``diagnostics``: when a judge metric's result is marked ``degenerate``
    (docs/judges.md, "Judge health").

    Each ``*_max`` is a share in [0, 1]: a measure above it flags the metric (1 turns the
    check off). A check flags only a group with at least ``min_cells`` cells in its
    denominator, so a run or slice with few rows raises no false alarm.
    ``fail_on_degenerate`` makes ``run`` and ``nightly`` exit 5 when a metric's
    all-rows result is degenerate (as ``--fail-on-degenerate`` does)."""

    min_cells: int = Field(20, ge=1, description="cells a check needs before it can flag")
    modal_share_max: float = Field(
        0.95,
        ge=0,
        le=1,
        description=("share of ok cells holding the most common score (a constant judge)"),
    )
    empty_extraction_max: float = Field(
        0.5,
        ge=0,
        le=1,
        description=(
            "share of extraction steps that returned an empty list (or a noncommittal flag)"
        ),
    )
    junk_reason_max: float = Field(
        0.5,
        ge=0,
        le=1,
        description=(
            "share of ok cells whose reason is empty or only a verdict word (true, no, 1)"
        ),
    )
    reason_modal_share_max: float = Field(
        0.9, ge=0, le=1, description=("share of ok cells whose reason is the most common reason")
    )
    parse_failure_max: float = Field(
        0.1,
        ge=0,
        le=1,
        description=("share of judged cells (all but missing_input) with status parse_failure"),
    )
    context_too_long_max: float = Field(
        0.25, ge=0, le=1, description=("share of judged cells with status context_too_long")
    )
    position_gap_max: float = Field(
        0.9,
        ge=0,
        le=1,
        description=(
            "largest gap between the share of 1 verdicts in the first and the second half of "
            "verdict lists"
        ),
    )
    fail_on_degenerate: bool = False


def _label_columns_named(value: dict[str, str]) -> dict[str, str]:
    for metric_id, column in value.items():
        if not column.strip():
            raise ValueError(
                f"the label column of {metric_id!r} is empty; name the column "
                "that holds its human labels"
            )
    return value


class LabelledRunSection(_Strict):
    """``labels.calibration``: human labels from another committed run of the same
    metrics on rows of the same distribution (a judge run of ``ragbatch calibrate``, or
    an earlier labelled run): the run ``run_id`` under ``uri``, and per metric id the
    column of its scores table that holds the labels. Its ``ok`` labelled cells are the
    labelled sample; every row of this run is unlabelled."""

    uri: str
    run_id: PathId
    storage_options: dict[str, Any] = Field(default_factory=dict)
    columns: dict[str, str] = Field(min_length=1)

    @field_validator("columns")
    @classmethod
    def _columns_named(cls, value: dict[str, str]) -> dict[str, str]:
        return _label_columns_named(value)


class LabelsSection(_Strict):
    """``labels``: human labels for some rows, per metric id: a column of the input
    (``columns``; a null value: the row is not labelled), or a labelled run of the same
    distribution (``calibration``). The summary then reports each such metric's mean
    corrected by the labels (prediction-powered inference, :mod:`ragbatch.analysis.ppi`;
    ``estimator`` ``ppi++`` tunes the judge's weight, ``ppi`` keeps it at 1) beside the
    labels-only mean. Input label columns pass through to the scores table but are not
    slice columns of the summary. See docs/ppi.md."""

    columns: dict[str, str] = Field(default_factory=dict)
    calibration: LabelledRunSection | None = None
    estimator: Literal["ppi", "ppi++"] = "ppi++"

    @field_validator("columns")
    @classmethod
    def _columns_named(cls, value: dict[str, str]) -> dict[str, str]:
        return _label_columns_named(value)

    @model_validator(mode="after")
    def _some_labels_once_each(self) -> "LabelsSection":
        external = self.calibration.columns if self.calibration is not None else {}
        if not self.columns and not external:
            raise ValueError(
                "labels needs `columns` (metric id: input column) or `calibration` "
                "(a labelled run); remove the section to run without labels"
            )
        both = sorted(set(self.columns) & set(external))
        if both:
            raise ValueError(
                f"metric(s) {both} have labels both in `columns` and in "
                "`calibration.columns`; keep one source per metric"
            )
        return self

    def metric_ids(self) -> list[str]:
        """Every metric id with labels, from either source."""
        external = self.calibration.columns if self.calibration is not None else {}
        return [*self.columns, *external]


class JobConfig(_Strict):
    """A whole job config. Build it with :func:`load_config` or :meth:`from_dict`."""

    run: RunSection = Field(default_factory=RunSection)
    input: InputSection
    output: OutputSection
    metrics: list[MetricSpec] = Field(min_length=1)
    engines: dict[str, EngineSpec] = Field(default_factory=dict)
    cache: CacheSection = Field(default_factory=CacheSection)
    calibration: CalibrationGuardSection | None = None
    diagnostics: DiagnosticsSection = Field(default_factory=DiagnosticsSection)
    labels: LabelsSection | None = None

    def cache_location(self) -> tuple[str, dict[str, Any]]:
        """URI and storage options of the judgment cache."""
        if self.cache.uri:
            return self.cache.uri, self.cache.storage_options
        return self.output.uri.rstrip("/") + "/judge_cache", self.output.storage_options

    @model_validator(mode="after")
    def _ids_unique_and_engines_known(self) -> "JobConfig":
        problems: list[str] = []
        seen: dict[str, int] = {}  # metric ids and panel judge keys -> metrics index
        ids: dict[str, int] = {}  # metric ids alone
        judge_keys: dict[str, tuple[int, str]] = {}  # judge key -> (metrics index, engine)
        for i, spec in enumerate(self.metrics):
            mid = spec.metric_id
            names = list(self.engines)
            if mid in ids:
                problems.append(_shared_id(mid, ids[mid], i, self.metrics))
            elif mid in judge_keys:
                j, engine = judge_keys[mid]
                problems.append(
                    f"metrics[{i}]: id {mid!r} is the judge key of engine {engine!r} in the "
                    f"panel of metrics[{j}]; give metrics[{i}] a distinct `id:`"
                )
            problems += panel_problems(i, spec.engine, spec.engines, spec.panel, names)
            if mid not in ids:  # a shared id is reported once, not once per judge key
                for engine in spec.judges or []:
                    key = member_key(mid, engine)
                    if key in seen:
                        problems.append(
                            f"metrics[{i}]: the judge key {key!r} of its panel is the id of "
                            f"metrics[{seen[key]}]; give one of them a distinct `id:`"
                        )
                    seen.setdefault(key, i)
                    judge_keys.setdefault(key, (i, engine))
            ids.setdefault(mid, i)
            seen.setdefault(mid, i)
            if spec.engine is not None and spec.engine not in self.engines:
                hint = _suggest(spec.engine, list(self.engines))
                problems.append(
                    f"metrics[{i}].engine: {spec.engine!r} is not defined under `engines`{hint}"
                )
        if self.labels is not None:
            for mid in self.labels.metric_ids():
                if mid not in seen:
                    hint = _suggest(mid, list(seen))
                    problems.append(
                        f"labels: {mid!r} is not the id of any metric{hint}; "
                        f"the metric ids are {', '.join(map(repr, seen))}"
                    )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "JobConfig":
        """Validate a parsed config mapping; raise :class:`ConfigError` naming each field."""
        return validate_mapping(cls, data, source, "a mapping with run/input/output/metrics")


def _shared_id(mid: str, first: int, again: int, metrics: list[MetricSpec]) -> str:
    """The problem of ``metrics[again]`` reusing ``metrics[first]``'s id ``mid``: says
    whether two metrics, two panels or a metric and a panel share it, and how to fix it."""
    panels = [metrics[k].judges is not None for k in (first, again)]
    what = "two panels" if all(panels) else "a metric and a panel" if any(panels) else "two metrics"
    return (
        f"metrics[{again}]: id {mid!r} is already used by metrics[{first}]: {what} share "
        f"the id {mid!r}, and each metric or panel needs an id of its own (it names their "
        f"cells, summary rows and judge keys); give one of them a distinct `id:`, "
        f"e.g. `id: {mid}_2`"
    )


def load_config(path: str | Path) -> JobConfig:
    """Read and validate a YAML job config.

    Raises
    ------
    ConfigError
        The file is missing, is not YAML, or a field is invalid. Metric params are checked
        separately by :func:`ragbatch.pipeline.plan.build_plan`.
    """
    path = Path(path)
    return JobConfig.from_dict(read_yaml(path, "config file"), source=str(path))


def validate_mapping(model: type[M], data: Any, source: str, expected: str = "a mapping") -> M:
    """``data`` (a parsed config file) validated as ``model``.

    Raises
    ------
    ConfigError
        ``data`` is not a mapping (the message names ``source`` and ``expected``), or
        fields are invalid or unknown: one problem per field, ``<field path>: <what is
        wrong>``.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected {expected}, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError([_describe(err) for err in exc.errors()]) from None


def read_yaml(path: Path, what: str) -> Any:
    """The parsed YAML of ``path``.

    Raises
    ------
    ConfigError
        ``path`` is not a file (the message calls it ``what``), is not valid YAML, or is
        over a size or alias budget (:func:`ragbatch.config.safe_yaml.load_yaml`).
    """
    if not path.is_file():
        raise ConfigError(f"{what} {str(path)!r} does not exist")
    size = path.stat().st_size
    if size > MAX_YAML_BYTES:  # refuse before reading it
        raise ConfigError(
            f"{path}: {size:,} bytes is over the {MAX_YAML_BYTES:,}-byte limit for a {what}"
        )
    return load_yaml(path.read_bytes(), str(path))


def _describe(err: dict[str, Any]) -> str:
    loc = _format_loc(err.get("loc", ()))
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        return f"{loc}: unknown field{_suggest_field(err)}; remove it or fix the spelling"
    if kind == "missing":
        return f"{loc}: required field is missing"
    msg = err.get("msg", "invalid")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    return f"{loc}: {msg}"


def _suggest_field(err: dict[str, Any]) -> str:
    loc = err.get("loc", ())
    field = str(loc[-1]) if loc else ""
    parent = loc[:-1]
    known = _known_fields(parent)
    return _suggest(field, known)


def _known_fields(parent: tuple) -> list[str]:
    model: type[BaseModel] | None = JobConfig
    for part in parent:
        if model is None or isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            # engines.<name>: an entry's fields are those of its type's spec model
            return sorted(set().union(*(m.model_fields for m in engine_spec_models())))
        model = _model_of(field.annotation)
    return sorted(model.model_fields) if model is not None else []


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if annotation is EngineSpec:  # an engine entry: its fields are looked up in every spec model
        return engine_spec_models()[0]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _format_loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "config"


def _suggest(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=3, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"
