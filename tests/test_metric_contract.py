"""One contract test per registered metric: declarations complete, examples hold."""

from __future__ import annotations

import re

import pytest

from support.metric_frames import canonical_frame, run_metric
from ragbatch.core.columns import CANONICAL
from ragbatch.scoring.base import ExpressionMetric, ModelMetric
from ragbatch.scoring.registry import all_metrics
from ragbatch.core.status import STATUSES

METRICS = all_metrics()
IDS = [m.name for m in METRICS]


def test_registry_has_the_design_catalogue():
    expected = {
        "answer_match",
        "exact_match",
        "contains_text",
        "regex",
        "response_length",
        "context_length",
        "latency",
        "json_valid",
        "binary",
        "semantic_similarity",
        # judge metrics: Tonic Validate's and Ragas'
        "answer_similarity",
        "answer_consistency",
        "answer_consistency_binary",
        "augmentation_accuracy",
        "augmentation_precision",
        "retrieval_precision",
        "duplication",
        "hate_speech",
        "faithfulness",
        "answer_relevancy",
        "context_relevancy",
        "context_precision",
        "context_recall",
        # PII metrics, detected locally
        "answer_contains_pii",
        "context_contains_pii",
    }
    assert expected <= set(IDS), sorted(expected - set(IDS))


@pytest.mark.parametrize("cls", METRICS, ids=IDS)
def test_declarations(cls):
    assert re.fullmatch(r"[a-z][a-z0-9_]*", cls.name)
    assert cls.kind in ("expression", "model", "judge", "pii")
    assert set(cls.inputs) <= set(CANONICAL)
    low, high = cls.score_range
    assert low < high
    assert cls.summary and cls.source and cls.__doc__
    assert cls.policy, "every metric documents its degenerate-input policy"
    described = cls.describe()
    assert described["name"] == cls.name and described["params"] is not None


@pytest.mark.parametrize(
    "cls",
    [m for m in METRICS if issubclass(m, ExpressionMetric)],
    ids=[m.name for m in METRICS if issubclass(m, ExpressionMetric)],
)
def test_examples_hold_and_scores_in_range(cls):
    for ex in cls.examples:
        metric = cls.from_params(ex.params)
        cell = run_metric(metric, [ex.inputs])[0]
        assert cell["status"] == ex.status, (ex, cell)
        assert cell["status"] in STATUSES
        if ex.score is None:
            assert cell["score"] is None, (ex, cell)
        else:
            assert cell["score"] == pytest.approx(ex.score), (ex, cell)
            low, high = cls.score_range
            assert low <= cell["score"] <= high
            if cls.boolean:
                assert cell["score"] in (0.0, 1.0)


# The PII metrics' examples run with the real analyzer in tests/test_pii_metrics.py.
SENTENCE_MODEL_METRICS = [m for m in METRICS if issubclass(m, ModelMetric) and m.kind == "model"]


@pytest.mark.parametrize(
    "cls", SENTENCE_MODEL_METRICS, ids=[m.name for m in SENTENCE_MODEL_METRICS]
)
def test_model_metric_examples_with_default_engine(cls):
    from pydantic import TypeAdapter

    from ragbatch.config.engine_spec import EngineSpec
    from ragbatch.engines.sentence_transformers import load_model

    assert cls.default_engine is not None and cls.engine_types
    model = load_model(TypeAdapter(EngineSpec).validate_python(cls.default_engine))
    for ex in cls.examples:
        metric = cls.from_params(ex.params)
        cell = metric.compute(model, canonical_frame([ex.inputs])).to_list()[0]
        assert cell["status"] == ex.status, (ex, cell)
        if ex.score is not None:
            assert cell["score"] == pytest.approx(ex.score, abs=1e-3)
