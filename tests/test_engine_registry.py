"""The engine registry: a fake judge engine, added with its adapter and one registration
only, validates in a config, has its own cache identity and shows in the plan and the
manifest; unknown engine types are errors, never taken for another engine."""

from __future__ import annotations

from typing import Any, Literal, Sequence

import pytest

from ragbatch.calibrate.config import calibration_from_dict
from ragbatch.config.job import JobConfig, JudgeSettings, OpenAIEngine, VllmEngine
from ragbatch.engines import load_judge_engine
from ragbatch.core.engine_registry import (
    EngineType,
    engine_names,
    engine_of,
    register_engine,
    unregister_engine,
)
from ragbatch.core.errors import ConfigError, EngineError
from ragbatch.judge.cache import cache_key
from ragbatch.judge.cache_probe import engine_identities
from ragbatch.judge.estimate import judge_window
from ragbatch.judge.metric import JudgeMetric
from ragbatch.judge.protocol import Completion, EngineRequest, JudgeEngine
from ragbatch.judge.tokens import prompt_counter
from ragbatch.pipeline.manifest import package_versions
from ragbatch.pipeline.plan import build_plan, preflight_engines

# --- the fake engine: its adapter (spec model, engine, loader, hooks) -------------------

FAKE = "fake_echo"
PREFLIGHTS: list[str] = []


class FakeEchoSpec(JudgeSettings):
    """A fake judge engine for these tests: it echoes, it loads nothing."""

    type: Literal["fake_echo"]
    flavour: str = "plain"


class FakeEchoEngine(JudgeEngine):
    def __init__(self, spec: FakeEchoSpec) -> None:
        self.spec = spec
        self.model_id = f"fake-echo:{spec.model}"
        self.max_model_len = 4096
        self.closed = False

    async def complete(self, requests: Sequence[EngineRequest]) -> list[Completion]:
        raise NotImplementedError

    def sampling_key(self) -> dict[str, Any]:
        return {"engine": FAKE, "flavour": self.spec.flavour, "temperature": self.spec.temperature}

    def close(self) -> None:
        self.closed = True


def _fake_window(spec: FakeEchoSpec) -> tuple[int, str]:
    return 2048, "the fake's own table"


FAKE_TYPE = EngineType(
    FAKE,
    FakeEchoSpec,
    "judge",
    FakeEchoEngine,
    "pip install fake-echo-backend",
    packages=("numpy",),
    local_model=False,
    context_window=_fake_window,
    preflight=lambda spec: PREFLIGHTS.append(spec.model),
)

# -----------------------------------------------------------------------------------------


@pytest.fixture
def fake_engine():
    register_engine(FAKE_TYPE)
    PREFLIGHTS.clear()
    yield FAKE_TYPE
    unregister_engine(FAKE)


def _config(engines: dict, metrics: list[dict]) -> dict:
    return {
        "input": {"uri": "in.parquet"},
        "output": {"uri": "/tmp/out"},
        "engines": engines,
        "metrics": metrics,
    }


FAKE_ENTRY = {"kind": FAKE, "model": "echo-1", "flavour": "salty"}


def test_built_in_engine_types_in_order():
    assert engine_names() == ("embedding", "cross_encoder", "vllm", "openai", "presidio")
    assert engine_names("judge") == ("vllm", "openai")
    assert JudgeMetric.engine_types == ("vllm", "openai")


def test_fake_engine_validates_in_a_config_and_unregisters(fake_engine):
    config = JobConfig.from_dict(
        _config({"j": FAKE_ENTRY}, [{"name": "faithfulness", "engine": "j"}])
    )
    spec = config.engines["j"]
    assert isinstance(spec, FakeEchoSpec) and spec.flavour == "salty" and spec.parse_retries == 1
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict(
            _config({"j": {**FAKE_ENTRY, "flavor": "x"}}, [{"name": "faithfulness", "engine": "j"}])
        )
    assert "engines.j.flavor: unknown field (did you mean 'flavour'" in str(err.value)
    assert JudgeMetric.engine_types == ("vllm", "openai", FAKE)
    calibration = calibration_from_dict(
        {
            "input": {"uri": "in.parquet"},
            "output": {"uri": "/tmp/cal"},
            "engines": {"j": FAKE_ENTRY},
            "judges": ["j"],
            "metrics": [{"name": "faithfulness"}],
            "labels": {"faithfulness": {"column": "y"}},
        }
    )
    assert isinstance(calibration.engines["j"], FakeEchoSpec)

    unregister_engine(FAKE)
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict(_config({"j": FAKE_ENTRY}, [{"name": "faithfulness", "engine": "j"}]))
    assert "does not match any of the expected tags" in str(err.value)
    assert JudgeMetric.engine_types == ("vllm", "openai")
    register_engine(FAKE_TYPE)


def test_fake_engine_has_its_own_cache_identity(fake_engine, tmp_path):
    fake = FakeEchoSpec(type=FAKE, model="echo-1")
    identities, note = engine_identities("j", fake)
    assert [(i.model_id, i.sampling_key()) for i in identities] == [
        ("fake-echo:echo-1", {"engine": FAKE, "flavour": "plain", "temperature": 0.0})
    ]
    assert note == ""
    vllm, _ = engine_identities("v", VllmEngine(type="vllm", model=str(tmp_path), dtype="bfloat16"))
    assert len(vllm) == 1 and vllm[0].sampling_key()["engine"] == "vllm"
    metric_identity = {"metric": "m", "version": 1, "params": {}}

    class _Ask:  # cache_key reads the prompt text and the output key only
        def prompt_text(self) -> str:
            return "q"

        class output:
            @staticmethod
            def key() -> dict:
                return {"kind": "text"}

    assert cache_key(identities[0], metric_identity, _Ask(), 0) != cache_key(
        vllm[0], metric_identity, _Ask(), 0
    )


def test_fake_engine_loads_and_answers_the_judge_hooks(fake_engine):
    spec = FakeEchoSpec(type=FAKE, model="echo-1")
    engine = load_judge_engine(spec)
    assert isinstance(engine, FakeEchoEngine) and engine.model_id == "fake-echo:echo-1"
    assert judge_window(spec) == (2048, "the fake's own table")
    assert judge_window(spec.model_copy(update={"max_model_len": 512})) == (512, "max_model_len")
    counter = prompt_counter(spec)
    assert counter.method == "chars/4" and FAKE in counter.source


def test_fake_engine_shows_in_the_plan_and_the_manifest(fake_engine):
    config = JobConfig.from_dict(
        _config({"j": FAKE_ENTRY}, [{"name": "faithfulness", "engine": "j"}])
    )
    plan = build_plan(config, inspect_input=False)  # echo-1 is not a path: not checked
    [stage] = plan.stages
    described = stage.describe()
    assert (described["kind"], described["engine"]) == ("judge", "j")
    assert (
        described["engine_spec"]["type"] == FAKE and described["engine_spec"]["flavour"] == "salty"
    )
    preflight_engines(plan)
    assert PREFLIGHTS == ["echo-1"]
    assert "numpy" in package_versions()


def test_unknown_engine_type_is_an_error_not_another_engine():
    class Stranger:
        type = "not_registered"
        seed = 0

    with pytest.raises(ConfigError, match="unknown engine type 'not_registered'"):
        engine_identities("x", Stranger())
    with pytest.raises(ValueError, match="not a judge engine"):
        load_judge_engine(Stranger())
    assert (
        engine_of(OpenAIEngine(type="openai", model="m", base_url="http://h/v1")).name == "openai"
    )


def test_missing_adapter_names_the_install_command():
    entry = EngineType(
        "fake_missing",
        _missing_spec(),
        "judge",
        "ragbatch_no_such_adapter:load",
        "pip install fake-missing-extra",
    )
    with pytest.raises(EngineError, match=r"install it with: pip install fake-missing-extra"):
        entry.load(None)


def _missing_spec() -> type:
    class FakeMissingSpec(JudgeSettings):
        type: Literal["fake_missing"]

    return FakeMissingSpec


def test_registration_checks_the_tag_and_the_name(fake_engine):
    with pytest.raises(ValueError, match="needs a field `type: Literal\\['other'\\]`"):
        EngineType("other", FakeEchoSpec, "judge", FakeEchoEngine, "pip install x")
    with pytest.raises(ValueError, match="stage 'gpu' is not one of"):
        EngineType(FAKE, FakeEchoSpec, "gpu", FakeEchoEngine, "pip install x")
    register_engine(FAKE_TYPE)  # the same entry again: nothing changes
    with pytest.raises(ValueError, match="registered twice"):
        register_engine(EngineType(FAKE, FakeEchoSpec, "judge", FakeEchoEngine, "pip install y"))


def test_every_judge_engine_has_a_row_in_the_judges_doc():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "judges.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| `")}
    assert {f"`{name}`" for name in engine_names("judge")} <= rows
