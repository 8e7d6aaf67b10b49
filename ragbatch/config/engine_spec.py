"""The ``engines`` entries of a config: the fields every engine shares and their
validation through the engine registry.

Each engine type's spec model lives in the engine's own module (under
:mod:`ragbatch.engines`, or in another installed distribution) and subclasses
:class:`StageResources` (a judge engine's: :class:`JudgeSettings`). An ``engines`` entry
is validated by :data:`EngineSpec`: its ``type`` (or ``kind``) is looked up in
:mod:`ragbatch.core.engine_registry` and the entry is validated with that type's spec
model, in the driver and in every Ray worker alike. This module imports no engine module:
the registry finds them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator
from pydantic_core import InitErrorDetails, PydanticCustomError, core_schema

from ragbatch.core.engine_registry import engine_names, engine_synonyms, engine_types, unknown_type


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StageResources(_Strict):
    """Where and how wide an actor stage runs (see :mod:`ragbatch.core.placement`): the
    fields every engine's spec model has (each subclasses this).

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


class JudgeSettings(StageResources):
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


def normalize_engine(spec: Any) -> Any:
    """Accept ``kind:`` as a synonym of ``type:`` and each engine's other names
    (:attr:`ragbatch.core.engine_registry.EngineType.synonyms`) for its type; anything
    else is returned unchanged.

    Parameters
    ----------
    spec : Any
        An ``engines`` entry as written (a mapping), or anything else.

    Returns
    -------
    Any
        A new mapping with ``type`` set when ``spec`` is a mapping, else ``spec``.
    """
    if not isinstance(spec, dict):
        return spec
    spec = dict(spec)
    if "kind" in spec and "type" not in spec:
        spec["type"] = spec.pop("kind")
    if isinstance(spec.get("type"), str):
        spec["type"] = engine_synonyms().get(spec["type"], spec["type"])
    return spec


def validate_engine(value: Any) -> Any:
    """One ``engines`` entry validated with the spec model of its registered type.

    Parameters
    ----------
    value : mapping or spec model
        ``{type (or kind), model, ...}``; an instance of a registered spec model is
        returned unchanged.

    Returns
    -------
    pydantic.BaseModel
        An instance of the spec model registered for ``type``.

    Raises
    ------
    pydantic.ValidationError
        ``type`` is missing or names no registered engine type (at ``type``: the
        message gives the nearest names and every engine type), or a field is invalid
        (at that field, as the spec model reports it).
    """
    types = engine_types()
    if any(isinstance(value, entry.spec) for entry in types):
        return value
    value = normalize_engine(value)
    if not isinstance(value, dict):
        raise ValueError(
            f"an engine is a mapping with `type:` (one of {', '.join(engine_names())}), "
            f"got {type(value).__name__}"
        )
    tag = value.get("type")
    entry = next((e for e in types if e.name == tag), None)
    if entry is None:
        why = (
            unknown_type(tag)
            if tag is not None
            else f"required field is missing; the engine types are {', '.join(engine_names())}"
        )
        error = PydanticCustomError("engine_type", "{why}", {"why": why})
        raise ValidationError.from_exception_data(
            "engine", [InitErrorDetails(type=error, loc=("type",), input=tag)]
        )
    model: type[BaseModel] = entry.spec
    return model.model_validate(value)


class _EngineSpec:
    """The pydantic type of one ``engines`` entry: :func:`validate_engine`, which asks
    the engine registry for the spec model of the entry's ``type`` each time, so that
    an engine registered at any time validates like a built-in one."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        return core_schema.no_info_plain_validator_function(validate_engine)


if TYPE_CHECKING:

    class EngineSpec(Protocol):
        """What every engine spec model has (each one's other fields differ)."""

        type: str

        def model_dump(self, **kwargs: Any) -> dict[str, Any]: ...

else:
    #: The type of an ``engines`` entry (validate a single one with :func:`engine_adapter`).
    EngineSpec = _EngineSpec

_ADAPTER: list[TypeAdapter] = []


def engine_adapter() -> TypeAdapter:
    """A :class:`pydantic.TypeAdapter` validating one engine entry against every engine
    type registered when it validates (for example ``engine_adapter().validate_python(
    {"type": name, "model": ...})``, ``name`` a registered type); raises
    :class:`pydantic.ValidationError` on an invalid entry."""
    if not _ADAPTER:
        _ADAPTER.append(TypeAdapter(EngineSpec))
    return _ADAPTER[0]


def engine_spec_models() -> tuple[type[BaseModel], ...]:
    """The spec models of every registered engine type, in the registry's order."""
    return tuple(entry.spec for entry in engine_types())
