"""The pairwise judging config (YAML, validated with pydantic; unknown keys are errors).

Shape (see docs/pairwise.md)::

    name:     free text
    input:    the answers of every system, as a job's ``input`` section (any format a job
              reads), with a column naming the system of each row; or
    runs:     [{output, run_id, system, storage_options}, ...]: committed runs, one
              system each, whose inputs are read again
    pairwise: {system_column, match_on, systems, max_questions, prompt, engine}
    engines:  named engines, as in a job (the judge)
    output:   {uri, storage_options}
    cache:    the judgment cache, as in a job
    bootstrap: {resamples, seed, confidence}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ragbatch.config.engine_spec import EngineSpec
from ragbatch.config.job import (
    CacheSection,
    InputSection,
    OutputSection,
    read_yaml,
    validate_mapping,
)
from ragbatch.core.engine_registry import engine_names
from ragbatch.core.ids import PathId


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RubricPrompt(_Strict):
    """``prompt: {rubric: ...}``: the criteria the judge applies, written in the config,
    in place of the built-in preference criteria."""

    rubric: str = Field(min_length=1)


class RunSource(_Strict):
    """One entry of ``runs``: a committed run whose input rows hold one system's answers.
    ``output``: the run's output root; ``system``: the name its answers go by (default:
    the run id)."""

    output: str
    run_id: PathId
    system: str | None = None
    storage_options: dict[str, Any] = Field(default_factory=dict)

    @property
    def name(self) -> str:
        """The system name of this run's answers."""
        return self.system if self.system is not None else self.run_id


class PairwiseSection(_Strict):
    """``pairwise``: which rows are compared and by which judge.

    ``system_column``: the input column naming the system that gave each answer (a
    partition key such as ``system=<name>/`` folders counts). ``match_on``: canonical or
    input columns whose values, hashed together, match one question across systems
    (default the question text). ``systems``: the systems compared (default: every
    system in the input, at least two). ``max_questions``: the first N matched questions
    (in input order), for small machines. ``prompt``: ``builtin`` or ``{rubric: text}``.
    ``engine``: the judge, a name under ``engines``."""

    system_column: str = "system"
    match_on: list[str] = Field(default_factory=lambda: ["question"], min_length=1)
    systems: list[str] | None = Field(None, min_length=2)
    max_questions: int | None = Field(None, ge=1)
    prompt: Literal["builtin"] | RubricPrompt = "builtin"
    engine: str


class BootstrapSection(_Strict):
    """``bootstrap``: resamples of the questions for the rating and win-rate intervals,
    their seed, and the confidence of every interval."""

    resamples: int = Field(1000, ge=1)
    seed: int = 0
    confidence: float = Field(0.95, gt=0, lt=1)


class PairwiseConfig(_Strict):
    """A whole pairwise config; build it with :func:`load_pairwise`."""

    name: str = "pairwise"
    #: The answers of every system in one table (with ``pairwise.system_column``) ...
    input: InputSection | None = None
    #: ... or committed runs, one system each (exactly one of the two).
    runs: list[RunSource] | None = Field(None, min_length=2)
    pairwise: PairwiseSection
    engines: dict[str, EngineSpec] = Field(default_factory=dict)
    output: OutputSection
    cache: CacheSection = Field(default_factory=CacheSection)
    bootstrap: BootstrapSection = Field(default_factory=BootstrapSection)

    @model_validator(mode="after")
    def _engine_known(self) -> "PairwiseConfig":
        name = self.pairwise.engine
        spec = self.engines.get(name)
        judges = engine_names("judge")
        if spec is None:
            raise ValueError(
                f"pairwise.engine: {name!r} is not defined under `engines` "
                f"(defined: {sorted(self.engines) or 'none'})"
            )
        if spec.type not in judges:
            raise ValueError(
                f"pairwise.engine: engine {name!r} is of type {spec.type!r}; a judge must "
                f"be a {' or '.join(judges)} engine"
            )
        systems = self.pairwise.systems
        if systems is not None and len(set(systems)) != len(systems):
            raise ValueError("pairwise.systems: a system is named twice")
        if (self.input is None) == (self.runs is None):
            raise ValueError(
                "give the answers either as `input` (one table with a system column) or "
                "as `runs` (committed runs, one system each), not both or neither"
            )
        names = [r.name for r in self.runs or []]
        if len(set(names)) != len(names):
            raise ValueError(f"runs: two runs go by the same system name: {names}")
        return self

    @property
    def criteria(self) -> str | None:
        """The rubric's criteria, or None for the built-in prompt."""
        prompt = self.pairwise.prompt
        return prompt.rubric if isinstance(prompt, RubricPrompt) else None


def load_pairwise(path: str | Path) -> PairwiseConfig:
    """Read and validate a pairwise config.

    Raises
    ------
    ConfigError
        The file is missing or not YAML, or a field is invalid or unknown; each problem
        is named as ``<field path>: <what is wrong>``.
    """
    path = Path(path)
    return pairwise_from_dict(read_yaml(path, "pairwise config"), str(path))


def pairwise_from_dict(data: Any, source: str = "pairwise config") -> PairwiseConfig:
    """Validate a parsed pairwise config mapping (see :func:`load_pairwise`)."""
    return validate_mapping(PairwiseConfig, data, source)
