"""Stage kinds come from a registry: the built-in kinds keep the names manifests show, a
kind registered later gets its own stages in the plan, in the registry's order, and the
runner adds each stage through its kind's builder."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import pytest

from ragbatch.config.engine_spec import JudgeSettings
from ragbatch.config.job import JobConfig
from ragbatch.core.engine_registry import EngineType, register_engine, unregister_engine
from ragbatch.core.stages import (
    StageKind,
    StageType,
    register_stage_kind,
    stage_kind,
    stage_kind_names,
    stage_type,
    unregister_stage_kind,
)
from ragbatch.pipeline.plan import Plan, Stage, _stages
from ragbatch.scoring.base import ModelMetric
from ragbatch.scoring.registry import get_metric
from ragbatch.pipeline.stage_builders import StageRun, chain_stages

#: What the fake kind's builder was called with: (stage name, keep_columns).
BUILT: list[tuple[str, Any]] = []


def _lantern_builder(ds: Any, plan: Any, stage: Stage, run: StageRun) -> Any:
    BUILT.append((stage.name, run.keep_columns))
    return ds


class LanternSpec(JudgeSettings):
    type: Literal["lantern"]


LANTERN_KIND = StageType("lantern_stage", _lantern_builder)


def _lantern_engine() -> EngineType:
    return EngineType("lantern", LanternSpec, "lantern_stage", lambda spec: None, "pip install x")


@pytest.fixture
def lantern():
    register_stage_kind(LANTERN_KIND)
    register_engine(_lantern_engine())
    BUILT.clear()
    yield
    unregister_engine("lantern")
    unregister_stage_kind("lantern_stage")


def test_built_in_kinds_keep_their_manifest_names():
    # the order of a plan's stages
    assert stage_kind_names() == ("expression", "pii", "model", "judge")
    assert stage_kind_names(actors=False) == ("expression",)
    assert all(stage_kind(k.value) is k for k in StageKind)
    with pytest.raises(ValueError, match="unknown stage kind 'jugde' \\(did you mean 'judge'"):
        stage_type("jugde")


def test_an_engine_of_an_unknown_stage_kind_is_refused():
    with pytest.raises(ValueError, match="stage 'lantern_stage' is not one of"):
        _lantern_engine()


class _Dataset:
    """Records what the pipeline adds (no Ray needed)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def repartition(self, target_num_rows_per_block: int | None = None) -> "_Dataset":
        self.calls.append(f"repartition {target_num_rows_per_block}")
        return self

    def map_batches(self, fn: Any, **kwargs: Any) -> "_Dataset":
        self.calls.append(f"map_batches {getattr(fn, '__name__', fn)}")
        return self


class LanternScore(ModelMetric):
    """A metric of the fake stage kind (its engine is a lantern)."""

    name: ClassVar[str] = "lantern_score"
    inputs: ClassVar[tuple[str, ...]] = ("answer",)
    engine_types: ClassVar[tuple[str, ...]] = ("lantern",)
    summary: ClassVar[str] = "test"
    source: ClassVar[str] = "test"

    def compute(self, model: Any, frame: Any) -> Any:
        raise NotImplementedError


def test_a_registered_kind_gets_its_stages_and_its_builder(lantern):
    config = JobConfig.from_dict(
        {
            "input": {"uri": "in.parquet"},
            "output": {"uri": "/tmp/out"},
            "engines": {
                "l1": {"type": "lantern", "model": "m", "batch_size": 3},
                "l2": {"kind": "lantern", "model": "m", "batch_size": 5},
            },
            "metrics": [{"name": "exact_match"}],
        }
    )
    metrics = [
        LanternScore.from_params({}, metric_id="a", engine="l2"),
        get_metric("exact_match").from_params({}),
        LanternScore.from_params({}, metric_id="b", engine="l1"),
        LanternScore.from_params({}, metric_id="c", engine="l2"),
    ]
    plan = Plan(config, metrics, _stages(metrics, dict(config.engines)), dict(config.engines))
    assert [(s.kind, s.name, [m.id for m in s.metrics]) for s in plan.stages] == [
        ("expression", "expressions", ["exact_match"]),
        ("lantern_stage", "lantern_stage:l2", ["a", "c"]),
        ("lantern_stage", "lantern_stage:l1", ["b"]),
    ]
    assert plan.stages[0].kind is StageKind.EXPRESSION
    assert plan.stages[1].describe()["kind"] == "lantern_stage"

    ds = _Dataset()
    chain_stages(ds, plan, StageRun())
    # each actor stage gets blocks of 4 of its batches
    assert ds.calls == [
        "map_batches expression_stage",
        "repartition 20",
        "repartition 12",
        "map_batches to_long",
    ]
    # only the last actor stage passes on just the scores table's columns
    assert BUILT == [("lantern_stage:l2", None), ("lantern_stage:l1", ["row_id"])]
