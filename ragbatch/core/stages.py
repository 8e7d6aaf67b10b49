"""The kinds of metric stage a plan chains: the built-in ones as an enum, and the
registry of every kind, built-in or added by another distribution.

A module of :mod:`ragbatch.core`, importing nothing above it, so that the planner, the
runner, the CLI, the manifest and the stages under ``udfs/`` can all use it without
import cycles. A stage kind's entry (:class:`StageType`) names, as ``"module:function"``
strings imported on first use, the function that adds a stage of that kind to the
Ray Data pipeline; the planner (:mod:`ragbatch.pipeline.plan`) makes one stage per kind
and engine, in the registry's order, and the runner (:mod:`ragbatch.pipeline.runner`)
asks the registry for each stage's builder.

The built-in kinds are registered at the end of this module. Another distribution adds a
kind through the entry-point group ``ragbatch.stages`` (:data:`ENTRY_POINT_GROUP`): its
module calls :func:`register_stage_kind` when imported, or the entry point names a
:class:`StageType`.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable

from ragbatch.core.plugins import load_entry_points

#: The entry-point group other distributions declare their stage kinds in.
ENTRY_POINT_GROUP = "ragbatch.stages"


class StageKind(str, Enum):
    """What runs a stage of the pipeline (:class:`ragbatch.pipeline.plan.Stage`).

    A ``str`` enum: each member equals, formats as and serialises to its value
    (``"expression"``, ``"model"``, ``"pii"``, ``"judge"``), the text the manifest,
    the dry-run listing and stage names (``<kind>:<engine>``) show.

    Members
    -------
    EXPRESSION
        All expression metrics, as Ray tasks (:func:`udfs.expressions.expression_stage`).
    MODEL
        The model metrics of one embedding or cross-encoder engine, as an actor pool
        (:class:`udfs.similarity.ModelStage`).
    PII
        The PII metrics of one ``presidio`` engine, as an actor pool
        (:class:`udfs.pii.PiiStage`).
    JUDGE
        The LLM-judge metrics of one judge engine, as an actor pool
        (:class:`udfs.judge.JudgeStage`).
    """

    EXPRESSION = "expression"
    MODEL = "model"
    PII = "pii"
    JUDGE = "judge"

    # What enum.StrEnum (Python 3.11+) does, on Python 3.10 as well: str() and format()
    # give the value, not "StageKind.MODEL".
    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return self.value.__format__(spec)

    @property
    def uses_actors(self) -> bool:
        """True for the stages that run as an actor pool on an engine (all but
        :attr:`EXPRESSION`)."""
        return self is not StageKind.EXPRESSION


@dataclass(frozen=True)
class StageType:
    """One stage kind: its name and how a stage of it joins the pipeline.

    Attributes
    ----------
    name : str
        The kind as the manifest, the dry-run listing and stage names (``<kind>:<engine>``)
        show it; an engine's :attr:`ragbatch.core.engine_registry.EngineType.stage` names it.
    builder : callable or str
        ``builder(ds, plan, stage, run) -> ds``: adds ``stage`` (a
        :class:`ragbatch.pipeline.plan.Stage`) to the Ray Data dataset ``ds``; ``run``
        is the run's :class:`ragbatch.pipeline.stage_builders.StageRun` (ledgers, run id,
        the columns to keep). A ``"module:function"`` string is imported on first use.
    actors : bool
        True for a stage that runs as an actor pool on one engine (its metrics are those
        whose engine has this stage kind); False for the expression stage, which holds
        every expression metric and no engine.
    """

    name: str
    builder: Callable[..., Any] | str
    actors: bool = True

    def build(self, *args: Any) -> Any:
        """Call :attr:`builder` with ``args`` (``ds, plan, stage, run``) and return its
        dataset."""
        builder = self.builder
        if isinstance(builder, str):
            module, _, attr = builder.partition(":")
            builder = getattr(importlib.import_module(module), attr)
        return builder(*args)


_KINDS: dict[str, StageType] = {}
_discovered: list[bool] = []


def register_stage_kind(entry: StageType) -> StageType:
    """Add ``entry`` under ``entry.name``; registering the same entry again is a no-op.

    Raises
    ------
    ValueError
        Another entry already has the name.
    """
    existing = _KINDS.get(entry.name)
    if existing is not None and existing != entry:
        raise ValueError(f"stage kind {entry.name!r} registered twice")
    _KINDS[entry.name] = entry
    return entry


def unregister_stage_kind(name: str) -> None:
    """Remove the entry ``name`` (for tests that register a temporary kind); a name that
    is not registered is ignored."""
    _KINDS.pop(name, None)


def _register_loaded(obj: Any) -> None:
    if isinstance(obj, StageType):
        register_stage_kind(obj)


def _discover() -> None:
    """Load the stage kinds of ``ragbatch.stages`` entry points, once per process."""
    if not _discovered:
        _discovered.append(True)
        load_entry_points(ENTRY_POINT_GROUP, _register_loaded)


def stage_types(*, actors: bool | None = None) -> list[StageType]:
    """Every registered stage kind in registration order (the order of a plan's stages);
    only those with :attr:`StageType.actors` equal to ``actors`` when given."""
    _discover()
    return [k for k in _KINDS.values() if actors is None or k.actors == actors]


def stage_kind_names(*, actors: bool | None = None) -> tuple[str, ...]:
    """The names of :func:`stage_types`."""
    return tuple(k.name for k in stage_types(actors=actors))


def stage_type(name: str) -> StageType:
    """The entry registered as ``name``.

    Raises
    ------
    ValueError
        No stage kind has that name; the message gives the nearest names and every kind.
    """
    _discover()
    try:
        return _KINDS[str(name)]
    except KeyError:
        close = difflib.get_close_matches(str(name), list(_KINDS), n=3, cutoff=0.5)
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        raise ValueError(
            f"unknown stage kind {name!r}{hint}; the stage kinds are {', '.join(_KINDS)}"
        ) from None


def stage_kind(name: str) -> str:
    """``name`` as a stage kind: the :class:`StageKind` member for a built-in kind, else
    the registered name itself.

    Raises
    ------
    ValueError
        ``name`` is not a registered stage kind.
    """
    kind = stage_type(name).name
    return StageKind(kind) if kind in StageKind._value2member_map_ else kind


_BUILDERS = "ragbatch.pipeline.stage_builders"
for _entry in (
    StageType(StageKind.EXPRESSION.value, f"{_BUILDERS}:expression_stage", actors=False),
    StageType(StageKind.PII.value, f"{_BUILDERS}:pii_stage"),
    StageType(StageKind.MODEL.value, f"{_BUILDERS}:model_stage"),
    StageType(StageKind.JUDGE.value, f"{_BUILDERS}:judge_stage"),
):
    register_stage_kind(_entry)
