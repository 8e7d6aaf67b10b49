"""Tests for ragbatch.calibrate.guard on a hand-written agreement table (no run, no
engine): which sentences the guard writes for missing, undefined and low agreement.

The end-to-end check, on a real calibration and judge server, is in
test_calibrate_e2e.py."""

from __future__ import annotations

from types import SimpleNamespace

import polars as pl
import pytest

import ragbatch.calibrate.guard as guard
from ragbatch.core.errors import ConfigError, InputError
from ragbatch.judge.metric import JudgeMetric

#: prompt version v1 on judge model m1: accuracy 0.90, kappa undefined (with a reason),
#: recall undefined (no reason); f1 0.50 is recorded for model m2 only.
AGREEMENT = pl.DataFrame(
    {
        "model": ["m1", "m1", "m1", "m2"],
        "prompt_version": ["v1", "v1", "v1", "v1"],
        "measure": ["accuracy", "kappa", "recall", "f1"],
        "value": [0.90, None, None, 0.50],
        "reason": [None, "one class only", None, None],
    }
)


class _Judge(JudgeMetric):
    def __init__(self, metric_id: str, engine: str):
        self.id, self.engine, self.name = metric_id, engine, "faithfulness"

    def program(self):  # never called
        raise NotImplementedError


@pytest.fixture
def stubs(monkeypatch):
    """The calibration cal-1 holds AGREEMENT; engine e1 runs model m1, e0 cannot be
    identified; every judge metric has prompt version v1."""
    calibration = SimpleNamespace(run_id="cal-1", table=lambda name: AGREEMENT)
    monkeypatch.setattr(guard, "find_calibration", lambda *args: calibration)
    monkeypatch.setattr(guard, "prompt_version", lambda metric: "v1")
    monkeypatch.setattr(
        guard,
        "engine_model_ids",
        lambda name, spec: {"e1": ({"m1"}, ""), "e0": (set(), "no model files")}[name],
    )
    return monkeypatch


def _plan(min_agreement, metrics):
    section = SimpleNamespace(
        min_agreement=min_agreement, uri="cal", run_id=None, storage_options={}, proceed=False
    )
    return SimpleNamespace(
        config=SimpleNamespace(calibration=section),
        metrics=metrics,
        engines={"e1": None, "e0": None},
    )


def test_each_measure_gets_its_own_sentence(stubs):
    where = "faith (judge model m1, prompt version v1) in calibration cal-1"
    problems = guard.calibration_problems(
        _plan(
            {"faith": {"accuracy": 0.95, "kappa": 0.2, "recall": 0.3, "f1": 0.1}},
            [_Judge("faith", "e1")],
        )
    )
    assert problems == [
        f"{where}: accuracy 0.900 is below the minimum 0.95",
        f"{where}: kappa is undefined (one class only); minimum 0.2",
        f"{where}: recall is undefined (no value); minimum 0.3",
        f"{where}: no recorded f1; calibrate this judge model and prompt version first",
    ]


def test_agreement_at_the_minimum_passes(stubs):
    assert (
        guard.calibration_problems(_plan({"faith": {"accuracy": 0.9}}, [_Judge("faith", "e1")]))
        == []
    )


def test_unidentified_judge_model_is_named_once_per_measure(stubs):
    sentence = (
        "faith: the judge model of engine 'e0' cannot be identified (no model files), "
        "so no calibration can be matched"
    )
    assert guard.calibration_problems(
        _plan({"faith": {"accuracy": 0.5, "f1": 0.5}}, [_Judge("faith", "e0")])
    ) == [sentence, sentence]


def test_missing_calibration_is_a_problem_per_metric(stubs):
    def absent(*args):
        raise InputError("no calibration under cal")

    stubs.setattr(guard, "find_calibration", absent)
    assert guard.calibration_problems(
        _plan({"a": {"accuracy": 0.5}, "b": {"f1": 0.5}}, [_Judge("a", "e1"), _Judge("b", "e1")])
    ) == ["a: no calibration under cal", "b: no calibration under cal"]


def test_config_mistakes_raise_before_the_calibration_is_read(stubs):
    stubs.setattr(guard, "find_calibration", lambda *args: pytest.fail("read the calibration"))
    plain = SimpleNamespace(id="em", name="exact_match", engine=None)
    with pytest.raises(ConfigError) as info:
        guard.calibration_problems(
            _plan({"nope": {"accuracy": 0.5}, "em": {"brier": 0.1}}, [_Judge("faith", "e1"), plain])
        )
    text = str(info.value)
    assert "calibration.min_agreement.nope: no metric has this id; ids: ['em', 'faith']" in text
    assert "calibration.min_agreement.em: exact_match is not a judge metric" in text
    assert "calibration.min_agreement.em.brier: unknown measure; use one of accuracy," in text
