"""Judge engines and judge metrics in the config and the plan: names, synonyms, errors."""

from __future__ import annotations

import pytest

from ragbatch.config.job import JobConfig
from ragbatch.core.errors import ConfigError
from ragbatch.pipeline.plan import build_plan


def _config(engines: dict, metrics: list[dict], **extra) -> dict:
    return {
        "input": {"uri": "in.parquet"},
        "output": {"uri": "/tmp/out"},
        "engines": engines,
        "metrics": metrics,
        **extra,
    }


def test_kind_is_a_synonym_of_type_and_sentence_transformers_of_embedding(tmp_path):
    config = JobConfig.from_dict(
        _config(
            {
                "judge": {"kind": "vllm", "model": str(tmp_path)},
                "emb": {"kind": "sentence_transformers"},
            },
            [{"name": "faithfulness", "engine": "judge"}],
        )
    )
    assert config.engines["judge"].type == "vllm"
    assert config.engines["emb"].type == "embedding"
    assert config.engines["judge"].parse_retries == 1 and config.engines["judge"].temperature == 0.0


def test_cache_defaults_next_to_the_outputs():
    config = JobConfig.from_dict(
        _config({}, [{"name": "response_length", "params": {"max_chars": 3}}])
    )
    assert config.cache_location() == ("/tmp/out/judge_cache", {})
    config = JobConfig.from_dict(
        _config(
            {},
            [{"name": "latency"}],
            cache={"uri": "s3://bucket/cache", "storage_options": {"anon": True}},
        )
    )
    assert config.cache_location() == ("s3://bucket/cache", {"anon": True})


def test_engine_field_errors_name_the_field():
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict(
            _config(
                {"served": {"kind": "openai", "model": "m", "max_concurency": 2}},
                [{"name": "faithfulness", "engine": "served"}],
            )
        )
    text = str(err.value)
    assert "engines.served.base_url: required field is missing" in text
    assert "engines.served.max_concurency: unknown field (did you mean 'max_concurrency'" in text


def _plan(engines, metrics):
    return build_plan(JobConfig.from_dict(_config(engines, metrics)), inspect_input=False)


def test_judge_metric_needs_a_judge_engine(tmp_path):
    with pytest.raises(ConfigError) as err:
        _plan({}, [{"name": "faithfulness"}])
    assert "metrics[0].engine: faithfulness needs an engine of type vllm or openai" in str(
        err.value
    )
    with pytest.raises(ConfigError) as err:
        _plan(
            {"emb": {"kind": "sentence_transformers"}}, [{"name": "faithfulness", "engine": "emb"}]
        )
    assert "engine 'emb' has type 'embedding', but faithfulness needs 'vllm' or 'openai'" in str(
        err.value
    )


def test_missing_local_judge_model_is_reported_before_running(tmp_path):
    with pytest.raises(ConfigError) as err:
        _plan(
            {"judge": {"kind": "vllm", "model": str(tmp_path / "nope")}},
            [{"name": "faithfulness", "engine": "judge"}],
        )
    assert "engines.judge.model" in str(err.value) and "does not exist" in str(err.value)
    # and where a model folder comes from
    assert "`ragbatch models build smollm2 --out models/smollm2`" in str(err.value)
    # a served model name is not a path
    plan = _plan(
        {"judge": {"kind": "openai", "base_url": "http://127.0.0.1:1/v1", "model": "judge"}},
        [{"name": "faithfulness", "engine": "judge"}],
    )
    assert [s.kind for s in plan.stages] == ["judge"]


def test_answer_relevancy_embedder_is_resolved(tmp_path):
    judge = {"judge": {"kind": "vllm", "model": str(tmp_path)}}
    plan = _plan(judge, [{"name": "answer_relevancy", "engine": "judge"}])
    assert plan.engines["default_embedding"].type == "embedding"
    with pytest.raises(ConfigError) as err:
        _plan(
            judge, [{"name": "answer_relevancy", "engine": "judge", "params": {"embedder": "mini"}}]
        )
    assert "metrics[0].params.embedder: engine 'mini' is not defined under `engines`" in str(
        err.value
    )
    with pytest.raises(ConfigError) as err:
        _plan(
            judge,
            [{"name": "answer_relevancy", "engine": "judge", "params": {"embedder": "judge"}}],
        )
    assert "it must be an engine that embeds texts (embedding)" in str(err.value)


def test_stages_group_metrics_by_kind_and_engine(tmp_path):
    plan = _plan(
        {
            "a": {"kind": "vllm", "model": str(tmp_path)},
            "b": {"kind": "openai", "base_url": "http://h/v1", "model": "m"},
        },
        [
            {"name": "faithfulness", "engine": "a"},
            {"name": "latency"},
            {"name": "hate_speech", "engine": "b"},
            {"name": "duplication", "engine": "a"},
            {"name": "semantic_similarity"},
        ],
    )
    assert [(s.kind, s.name, [m.id for m in s.metrics]) for s in plan.stages] == [
        ("expression", "expressions", ["latency"]),
        ("model", "model:default_embedding", ["semantic_similarity"]),
        ("judge", "judge:a", ["faithfulness", "duplication"]),
        ("judge", "judge:b", ["hate_speech"]),
    ]
