"""The typed manifest: what ``manifest.json`` holds, as pydantic models.

:func:`ragbatch.pipeline.manifest.build_manifest` builds a :class:`Manifest`; the writer dumps it
(:meth:`Manifest.to_json_dict`), and every reader parses it with :func:`read_manifest` (or
:meth:`Manifest.model_validate_json`) instead of indexing a dict by key.

Versions
--------
``schema_version`` is :data:`SCHEMA_VERSION` (1). Manifests written before the field
existed have the same layout without it, and read as version 1. A manifest with a
version above :data:`SCHEMA_VERSION` was written by a newer ragbatch: reading it raises
a :class:`~ragbatch.core.errors.InputError` that says to upgrade. Sections added to the layout
later read as empty from older manifests (their defaults below); keys this version does
not know are kept as they are.

The parts whose shape depends on what ran (the config, each stage's and metric's
description, engine counters, the summary's settings) stay JSON objects (``dict``).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ragbatch.core.errors import InputError

#: The manifest layout this ragbatch writes and the newest it reads.
SCHEMA_VERSION = 1


class _Section(BaseModel):
    """A part of the manifest; keys it does not declare are kept (read and written back)."""

    model_config = ConfigDict(extra="allow")


class RunInfo(_Section):
    """The manifest's ``run`` section."""

    id: str
    name: str = ""
    date: dt.date = Field(description="the run date (``YYYY-MM-DD``)")
    status: str = "committed"
    started_at: str = Field("", description="ISO 8601 with offset, UTC")
    finished_at: str = Field("", description="ISO 8601 with offset, UTC")
    uri_templates: dict[str, str] = Field(
        default_factory=dict,
        description="URI field -> its value as written, with "
        "``{run_date}`` placeholders; empty when none",
    )


class SliceColumn(_Section):
    """One slice column: its name in the input and in the scores table."""

    input: str
    output: str


class InputInfo(_Section):
    """The manifest's ``input`` section."""

    uri: str
    read_tasks: int
    rows: int
    fingerprint: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "files, sizes, ETags or modification times, and their ``sha256`` "
            "(:func:`ragbatch.io.read.input_fingerprint`)"
        ),
    )
    slice_columns: list[SliceColumn] = Field(default_factory=list)


class OutputInfo(_Section):
    """The manifest's ``output`` section: the output root and the run's URIs."""

    root: str
    scores: str
    summary: str
    manifest: str


class RowCounts(_Section):
    """The manifest's ``rows`` section."""

    input: int = Field(description="input rows")
    scores: int = Field(description="score cells (rows x metrics)")


class JudgeTally(_Section):
    """Judge counters of one metric, or of all: the manifest's section, and what the
    judge runner counts per batch as it judges (:data:`ragbatch.judge.run.Tally`).

    Attributes
    ----------
    judge_calls : int
        Requests the engine served in this run (cache hits and refused requests
        excluded; identical requests of a batch share one).
    cache_hits : int
        Requests answered from the judgment cache or by an identical request.
    prompt_tokens, completion_tokens, cached_prompt_tokens : int
        Tokens of the served requests.
    refused_too_long : int
        Requests refused as ``context_too_long`` without being served.
    refused_prompt_tokens : int
        Prompt tokens counted for the refused requests (where the engine counted them).

    All counts are >= 0.
    """

    judge_calls: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    refused_too_long: int = 0
    refused_prompt_tokens: int = 0


class JudgeInfo(_Section):
    """The manifest's ``judge`` section (:func:`ragbatch.pipeline.manifest.judge_summary`).

    Runs since 2026-12-05 also write ``cache_files_set_aside``: the URIs of the judgment
    cache's files set aside under ``v2/damaged/`` while the run's stages ran (a list of
    at most 1,000 str, empty when none or when the folder could not be listed). It is not
    declared here, so that a manifest written before it existed reads and writes back as
    it was; read it from the section's extra keys (``judge.model_extra``).
    """

    metrics: dict[str, JudgeTally] = Field(default_factory=dict)
    total: JudgeTally = Field(default_factory=JudgeTally)
    engines: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description=("per engine its counters; for vLLM the prefix-cache hit rate in [0, 1]"),
    )


class ResumeInfo(_Section):
    """The manifest's ``resume`` section."""

    attempt: int = 1
    resumed: bool = False
    rows_reused: int = 0
    files_reused: int = 0
    files_set_aside: int = 0


class FaultInfo(_Section):
    """The manifest's ``faults`` section (:func:`ragbatch.pipeline.manifest.fault_summary`):
    ``stages`` maps each actor stage to its counters (:data:`FAULT_COUNTERS`, ints >= 0)
    and ``total`` holds their sums."""

    error_budget: float = Field(0.01, description="fraction of input rows in [0, 1]")
    stages: dict[str, dict[str, int]] = Field(default_factory=dict)
    total: dict[str, int] = Field(default_factory=dict)


class StagePlacement(_Section):
    """One actor stage's entry of the manifest's ``placement`` section."""

    bundles: list[dict[str, Any]] = Field(default_factory=list)
    min_actors: int = 0
    max_actors: int = 0
    actors: int = 0
    actor_starts: int = 0
    node_ids: list[str] = Field(default_factory=list)


_JUDGE = (
    "per judge metric and in total: `judge_calls` (requests the engine served), "
    "`cache_hits`, `prompt_tokens`, `completion_tokens`, `cached_prompt_tokens` (of the "
    "served requests), `refused_too_long` (requests refused as `context_too_long`, never "
    "served) and `refused_prompt_tokens` (their prompt tokens); engine counters (see "
    "judges.md); `cache_files_set_aside`, the judgment cache's files set aside under "
    "`v2/damaged/` while the run's stages ran, by this run (it could not read them) or by "
    "another process sharing the cache; at most 1,000 ([cache.md](cache.md))"
)
#: The fault counters of each actor stage (:meth:`udfs.ledger.RunLedger.faults`), in the
#: order written, each with its note in docs/output-schema.md ("": none).
FAULT_COUNTERS: dict[str, str] = {
    "batches": "",
    "batch_starts": "",
    "batch_retries": "in-process",
    "actors_lost": "died holding a batch; replaced",
    "failed_batches": "",
    "failed_rows": "marked `error`",
}
_FAULTS = (
    "`error_budget`; `stages`: per actor stage (`engine <name>`) "
    + ", ".join(f"`{k}`" + (f" ({note})" if note else "") for k, note in FAULT_COUNTERS.items())
    + "; `total`: their sums"
)
_PLACEMENT = (
    "per actor stage (plan name: `model:<engine>`, `pii:<engine>`, `judge:<engine>`): "
    "`bundles` (the resources one actor holds: `CPU`, `GPU`, `accelerator_type:<type>`, "
    "custom resources; one bundle per GPU for a tensor-parallel vLLM engine), "
    "`min_actors`, `max_actors`, `actors` (distinct actors), `actor_starts` (Ray "
    "restarts a dead actor under its id), `node_ids` (Ray node ids the actors ran on)"
)
_SUMMARY = (
    "the summary's settings (`confidence`, `n_resamples`, `seed`, `max_slice_values`, "
    "`max_resample_n`, `max_distinct`, `ppi_estimator`), the interval methods, per slice "
    "column its number of distinct `values` and `pooled_values`, and the human labels: "
    "`labels` (metric id -> label column) and `labelled_runs` (metric id -> labels taken "
    "from another run; [ppi.md](ppi.md)); `panels`: per judge panel metric id its "
    "inter-judge agreement (`alpha`, `alpha_ci_low`, `alpha_ci_high`, `alpha_level`, "
    "`n_units`, `pairwise`, `judge_means`, `combine`, `judges`, `note`; "
    "[panels.md](panels.md))"
)


class Manifest(_Section):
    """One run's ``manifest.json``: what ran, on what, with what result.

    The top-level keys, in the order written; each field's description is its line in
    docs/output-schema.md (:func:`manifest_doc_table`). The sections built from what the
    user wrote (``run``, ``config``, ``input``, ``output``, ``stages``, ``ray``) are
    redacted before the model is built (:func:`ragbatch.pipeline.manifest.build_manifest`).

    Raises
    ------
    pydantic.ValidationError
        On parsing, a section of the wrong shape, or a ``schema_version`` above
        :data:`SCHEMA_VERSION` (:func:`read_manifest` turns both into an InputError).
    """

    schema_version: int = Field(
        SCHEMA_VERSION,
        description=(
            "layout version of this manifest (absent in manifests written before it: read as 1)"
        ),
    )
    ragbatch_version: str = Field(description="version of ragbatch that wrote the run")
    run: RunInfo = Field(
        description=(
            "`id`, `name`, `date`, `status` (`committed`), `started_at`, `finished_at` (ISO 8601, "
            "UTC), `uri_templates` (the URI fields written with `{run_date}`, as written; empty "
            "when none)"
        )
    )
    config: dict[str, Any] = Field(
        description=(
            "the job config as run (URIs with the run date filled in), every credential redacted "
            "([secrets.md](secrets.md))"
        )
    )
    input: InputInfo = Field(
        description=(
            "`uri`, `read_tasks`, `rows`, `fingerprint` (files, sizes, ETags or modification "
            "times, hashed), `slice_columns` (input and output names)"
        )
    )
    output: OutputInfo = Field(
        description=("`root`, and the URIs of `scores`, `summary` and `manifest`")
    )
    stages: list[dict[str, Any]] = Field(
        description=(
            "the stages that ran, with their metrics and engines (`engine_spec` as run); "
            "an actor stage's `pool`: `concurrency`, `num_cpus`, `num_gpus`, `threads`, "
            "`batch_size`, `chosen` (the fields its engine's pool rule filled in) and `rule` "
            "(why, in words)"
        )
    )
    metrics: list[dict[str, Any]] = Field(
        description=(
            "per metric: `id`, `name`, `kind`, `params`, `engine` (and the regex engine for "
            "`regex`), then the facts analysis reads: `boolean` (every `ok` score is 0 or 1), "
            "`higher_is_better` and `score_range` (`[low, high]`); manifests written before "
            "these three lack them, and analysis takes them from the metric registry"
        )
    )
    models: dict[str, list[str]] = Field(description="metric id -> model ids that scored it")
    counts: dict[str, dict[str, int]] = Field(description="metric id -> status -> cells")
    rows: RowCounts = Field(description="`input` rows and `scores` cells")
    timings_s: dict[str, float] = Field(
        description=("seconds spent planning, executing, verifying, summarizing, in total")
    )
    packages: dict[str, str] = Field(description="distribution -> version")
    python: str = Field(description="Python version")
    platform: str = Field(description="operating system and machine")
    ray: dict[str, Any] = Field(
        description="`executor` (`ray` or `in_process`, "
        "[config.md](config.md#where-a-run-executes)); in the process, `tasks_in_flight` "
        "(read tasks at once) and `tasks_in_flight_reason` (why, in words); on Ray, the "
        "cluster's `address`, `started_locally` and `resources`"
    )
    judge: JudgeInfo = Field(default_factory=JudgeInfo, description=_JUDGE)
    pii: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description=("per PII engine, the detectors that ran (see pii.md)")
    )
    resume: ResumeInfo = Field(
        default_factory=ResumeInfo,
        description=("`attempt`, `resumed`, `rows_reused`, `files_reused`, `files_set_aside`"),
    )
    faults: FaultInfo = Field(default_factory=FaultInfo, description=_FAULTS)
    placement: dict[str, StagePlacement] = Field(default_factory=dict, description=_PLACEMENT)
    summary: dict[str, Any] = Field(default_factory=dict, description=_SUMMARY)
    diagnostics: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "`thresholds` (the config's `diagnostics` section as run) and `metrics`: per judge "
            "metric its all-rows `degenerate`, `reasons` (a list) and health measures "
            "([judges.md](judges.md#judge-health))"
        ),
    )

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, value: int) -> int:
        if value > SCHEMA_VERSION:
            raise ValueError(
                f"schema_version {value} is newer than this ragbatch reads "
                f"({SCHEMA_VERSION}); upgrade ragbatch to read this run"
            )
        if value < 1:
            raise ValueError(f"schema_version {value}: versions start at 1")
        return value

    def to_json_dict(self) -> dict[str, Any]:
        """The manifest as ``manifest.json`` holds it: JSON types only, keys in field
        order (``schema_version`` first), undeclared keys after them; a value JSON cannot
        hold is written as its ``str``."""
        return self.model_dump(mode="json", fallback=str)

    @property
    def metric_names(self) -> dict[str, str]:
        """Metric id -> registered metric name, in config order."""
        return {m["id"]: m.get("name", m["id"]) for m in self.metrics}

    def metric_info(self, metric_id: str) -> dict[str, Any] | None:
        """The ``metrics`` entry of ``metric_id`` (None when the run had no such metric)."""
        return next((m for m in self.metrics if m.get("id") == metric_id), None)


def read_manifest(path: str, fs: Any = None) -> Manifest:
    """Parse the ``manifest.json`` at ``path``.

    Parameters
    ----------
    path : str
        A path of ``fs``; without ``fs``, any URI fsspec opens (a local path, ``s3://...``).
    fs : fsspec filesystem, optional

    Returns
    -------
    Manifest

    Raises
    ------
    InputError
        The file is not JSON, or not a manifest this ragbatch reads (a section of the
        wrong shape, or a newer ``schema_version``); the message names the file and what
        is wrong.
    """
    if fs is None:
        from ragbatch.io.fs import resolve

        fs, path = resolve(path, {})
    with fs.open(path, "r", encoding="utf-8") as fh:
        text = fh.read()
    return parse_manifest(text, path)


def parse_manifest(text: str, source: str) -> Manifest:
    """Parse manifest JSON ``text`` read from ``source`` (named in errors); raises
    :class:`InputError` as :func:`read_manifest` does."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"the manifest {source} is not valid JSON ({exc}); the run cannot be read"
        ) from None
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"
            for e in exc.errors()
        )
        raise InputError(f"the manifest {source} cannot be read: {problems}") from None


def _json_type(annotation: Any) -> str:
    origin = get_origin(annotation) or annotation
    if origin is Union:
        origin = get_origin(get_args(annotation)[0]) or get_args(annotation)[0]
    if origin in (list, tuple):
        return "array"
    if origin is dict or (isinstance(origin, type) and issubclass(origin, BaseModel)):
        return "object"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}[origin]


def manifest_doc_table() -> str:
    """The Markdown table of docs/output-schema.md's "Manifest" section, made from
    :class:`Manifest`: one line per top-level key in the order written, with its JSON
    type and its field description."""
    lines = ["| key | JSON type | meaning |", "|---|---|---|"]
    for name, info in Manifest.model_fields.items():
        lines.append(f"| `{name}` | {_json_type(info.annotation)} | {info.description} |")
    return "\n".join(lines)
