"""The engine registry: a fake judge engine, added with its adapter and one registration
only, validates in a config, has its own cache identity and shows in the plan and the
manifest; unknown engine types are errors, never taken for another engine."""

from __future__ import annotations

from typing import Any, Literal, Sequence

import pytest

from ragbatch.calibrate.config import calibration_from_dict
from pydantic import BaseModel

from ragbatch.config.engine_spec import JudgeSettings, normalize_engine
from ragbatch.config.job import JobConfig
from ragbatch.engines import load_judge_engine
from ragbatch.engines.openai import OpenAIEngine
from ragbatch.engines.vllm import VllmEngine
from ragbatch.core.engine_registry import (
    EngineType,
    engine_names,
    engine_of,
    engine_types,
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
#: The judge engines registered before the fake one.
JUDGES = engine_names("judge")


def test_each_built_in_engine_is_one_module_of_the_engines_package():
    import pkgutil

    import ragbatch.engines

    modules = {
        f"ragbatch.engines.{m.name}" for m in pkgutil.iter_modules(ragbatch.engines.__path__)
    }
    built_in = [e for e in engine_types() if e.spec.__module__ in modules]
    assert built_in == engine_types()  # nothing else is installed in this environment
    for entry in built_in:
        # spec model, adapter and registration in one module
        assert isinstance(entry.loader, str)
        assert entry.loader.partition(":")[0] == entry.spec.__module__, entry.name
    assert [e.order for e in built_in] == sorted(e.order for e in built_in)
    assert engine_names("judge") == tuple(e.name for e in built_in if e.stage == "judge")
    assert JudgeMetric.engine_types == engine_names("judge")
    assert set(engine_names()) >= {"embedding", "vllm", "presidio"}  # the synonyms' targets


def test_an_unknown_type_names_the_field_and_the_known_types():
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict(
            _config({"j": {"kind": "vlm", "model": "m"}}, [{"name": "faithfulness"}])
        )
    known = ", ".join(engine_names())
    assert str(err.value) == (
        f"engines.j.type: unknown engine type 'vlm' (did you mean 'vllm'?); the engine types "
        f"are {known} (an engine from another package is found once that package is "
        "installed in this environment, through the entry-point group ragbatch.engines)"
    )
    with pytest.raises(ConfigError, match="engines.j.type: required field is missing"):
        JobConfig.from_dict(_config({"j": {"model": "m"}}, [{"name": "faithfulness"}]))


def test_engine_modules_do_not_import_their_backends():
    import subprocess
    import sys

    code = (
        "import sys, ragbatch.engines.vllm, ragbatch.engines.openai, "
        "ragbatch.engines.sentence_transformers, ragbatch.engines.presidio\n"
        "from ragbatch.config.job import JobConfig\n"
        "JobConfig.from_dict({'input': {'uri': 'x.csv'}, 'output': {'uri': 'o'}, "
        "'metrics': [{'name': 'exact_match'}], 'engines': {'e': {'kind': 'vllm', 'model': 'm'}}})\n"
        "heavy = ('vllm', 'torch', 'ray', 'presidio_analyzer', 'sentence_transformers', 'openai')\n"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


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
    assert JudgeMetric.engine_types == (*JUDGES, FAKE)
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
    assert "engines.j.type: unknown engine type 'fake_echo'" in str(err.value)
    assert JudgeMetric.engine_types == JUDGES
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


def test_entry_points_register_modules_and_objects_and_a_broken_one_is_skipped(monkeypatch, caplog):
    from importlib.metadata import EntryPoint

    from ragbatch.core import plugins

    points = [
        EntryPoint("broken", "ragbatch_no_such_engine_module", "ragbatch.engines"),
        EntryPoint("fake", "test_engine_registry:FAKE_TYPE", "ragbatch.engines"),
        EntryPoint("module", "json", "ragbatch.engines"),
    ]
    monkeypatch.setattr(plugins.metadata, "entry_points", lambda group: points)
    registered: list = []
    loaded = plugins.load_entry_points("ragbatch.engines", registered.append)
    assert loaded == ["fake = test_engine_registry:FAKE_TYPE", "module = json"]
    assert registered == [FAKE_TYPE]  # a module is only imported: it registers itself
    assert "entry point broken = ragbatch_no_such_engine_module" in caplog.text


class FakeEmbedSpec(BaseModel):
    """A fake model-stage engine that says it embeds texts (it is never loaded here)."""

    type: Literal["fake_embed"]
    model: str = "none"


def test_metrics_ask_for_capabilities_so_a_new_engine_serves_them():
    from ragbatch.scoring.registry import get_metric

    similarity, pii = get_metric("semantic_similarity"), get_metric("answer_contains_pii")
    relevancy = get_metric("answer_relevancy")
    # the built-in engines, by what they provide
    assert set(similarity.engine_types) == {"embedding", "cross_encoder"}
    assert pii.engine_types == ("presidio",) and relevancy.second_engine_types == ("embedding",)
    assert similarity.default_engine == {"type": "embedding"}
    assert pii.default_engine == {"type": "presidio"}
    entry = EngineType(
        "fake_embed", FakeEmbedSpec, "model", "x:y", "pip install z", provides=("embed",)
    )
    register_engine(entry)
    try:
        assert "fake_embed" in similarity.engine_types
        assert "fake_embed" in relevancy.second_engine_types
        assert "fake_embed" not in pii.engine_types
        # it takes no default: the packaged model stays the default for `embed`
        assert similarity.default_engine == {"type": "embedding"}
        # a synonym resolves to its engine; a second default for one capability is refused
        assert normalize_engine({"kind": "pii"}) == {"type": "presidio"}
        unregister_engine("fake_embed")
        register_engine(
            EngineType(
                "fake_embed",
                FakeEmbedSpec,
                "model",
                "x:y",
                "pip install z",
                provides=("embed",),
                default_for=("embed",),
            )
        )
        with pytest.raises(ConfigError, match="claim to be the default"):
            similarity.default_engine  # noqa: B018 - the descriptor raises
    finally:
        unregister_engine("fake_embed")
    with pytest.raises(ValueError, match="does not provide"):
        EngineType("fake_embed", FakeEmbedSpec, "model", "x:y", "z", default_for=("embed",))


def test_an_adapter_without_its_required_method_is_refused_at_registration():
    class NoComplete(JudgeEngine):  # a judge engine that forgot `complete`
        model_id = "x"

        def sampling_key(self) -> dict[str, Any]:
            return {}

    class NoCompleteSpec(JudgeSettings):
        type: Literal["no_complete"]

    with pytest.raises(TypeError, match="lacks complete"):
        register_engine(EngineType("no_complete", NoCompleteSpec, "judge", NoComplete, "pip x"))
    assert "no_complete" not in engine_names()
