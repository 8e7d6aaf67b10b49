"""Judge panels without Ray: the config's checks, the combine rules, Krippendorff's alpha
(against a hand-worked example and the ``krippendorff`` package) and the summary of a
scores table written before the ``judge`` column existed."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragbatch.analysis.panel_agreement import (
    alpha_interval,
    krippendorff_alpha,
    panel_agreement,
)
from ragbatch.analysis.summary import summarize_run
from ragbatch.config.job import JobConfig, OutputSection
from ragbatch.core.errors import ConfigError
from ragbatch.io.write import OutputLayout
from ragbatch.judge.panel import PanelPlan, combine_cells
from ragbatch.pipeline.plan import build_plan

ENGINE = {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
PLAN = PanelPlan("hs", ("a", "b", "c"), ("hs[a]", "hs[b]", "hs[c]"), "majority")


def _config(metrics: list[dict], engines=("a", "b", "c")) -> dict:
    return {
        "input": {"uri": "in.parquet"},
        "output": {"uri": "/tmp/out"},
        "engines": {name: dict(ENGINE) for name in engines},
        "metrics": metrics,
    }


def _problems(metrics: list[dict], **kw) -> str:
    with pytest.raises(ConfigError) as err:
        build_plan(JobConfig.from_dict(_config(metrics, **kw)), inspect_input=False)
    return str(err.value)


# -- config -------------------------------------------------------------------------------


def test_a_panel_plans_its_judges_on_their_engines():
    plan = build_plan(
        JobConfig.from_dict(_config([{"name": "hate_speech", "engines": ["a", "b", "c"]}])),
        inspect_input=False,
    )
    assert plan.metric_ids == ["hate_speech", "hate_speech[a]", "hate_speech[b]", "hate_speech[c]"]
    assert [s.name for s in plan.stages] == ["judge:a", "judge:b", "judge:c"]
    assert [[m.id for m in s.metrics] for s in plan.stages] == [
        ["hate_speech[a]"],
        ["hate_speech[b]"],
        ["hate_speech[c]"],
    ]
    [panel] = plan.panels
    assert panel.combine == "majority"  # the default for a 0/1 metric
    assert plan.member_judges["hate_speech[b]"] == ("hate_speech", "b")


def test_one_engine_in_engines_is_the_same_as_engine():
    plan = build_plan(
        JobConfig.from_dict(_config([{"name": "hate_speech", "engines": ["b"]}])),
        inspect_input=False,
    )
    assert plan.metric_ids == ["hate_speech"] and plan.panels == []
    assert plan.metrics[0].engine == "b"
    # a `panel:` over one judge is refused rather than silently run without a panel
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict(
            _config([{"name": "hate_speech", "engines": ["b"], "panel": {"combine": "majority"}}])
        )
    assert "metrics[0].panel: a panel needs two judges or more" in str(err.value)


def test_a_continuous_metric_defaults_to_mean_and_refuses_majority():
    plan = build_plan(
        JobConfig.from_dict(_config([{"name": "answer_similarity", "engines": ["a", "b"]}])),
        inspect_input=False,
    )
    assert plan.panels[0].combine == "mean"
    text = _problems(
        [{"name": "answer_similarity", "engines": ["a", "b"], "panel": {"combine": "majority"}}]
    )
    assert "metrics[0].panel.combine: 'majority' needs a metric scored 0/1" in text
    assert "use `combine: mean`" in text


def test_config_errors_name_the_field():
    text = _problems([{"name": "response_length", "engines": ["a", "b"]}])
    assert "metrics[0].engines: response_length is not a judge metric" in text
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict(
            _config([{"name": "hate_speech", "engines": ["a", "b", "a", "judge_x"]}])
        )
    text = str(err.value)
    assert "metrics[0].engines[2]: 'a' is already metrics[0].engines[0]" in text
    assert "metrics[0].engines[3]: 'judge_x' is not defined under `engines`" in text
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict(
            _config([{"name": "hate_speech", "engine": "a", "engines": ["a", "b"]}])
        )
    assert "give either `engine:` (one judge) or `engines:`" in str(err.value)
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict(
            _config([{"name": "hate_speech", "engine": "a", "panel": {"combine": "mean"}}])
        )
    assert "metrics[0].panel: a panel needs `engines: [...]`" in str(err.value)
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict(
            _config([{"name": "hate_speech", "engines": ["a", "b"], "panel": {"combine": "vote"}}])
        )
    assert "metrics[0].panel.combine" in str(err.value)


def _validate(tmp_path, capsys, metrics: str) -> tuple[int, str]:
    """``ragbatch validate`` of a job config with judges a and b and ``metrics`` (YAML)."""
    from ragbatch.cli import main

    (tmp_path / "in.jsonl").write_text('{"a": "some answer"}\n')
    path = tmp_path / "job.yaml"
    path.write_text(
        f"input: {{uri: {tmp_path / 'in.jsonl'}, columns: {{answer: a}}}}\n"
        f"output: {{uri: {tmp_path / 'out'}}}\n"
        "engines:\n"
        "  a: {kind: openai, base_url: http://127.0.0.1:9/v1, model: m}\n"
        "  b: {kind: openai, base_url: http://127.0.0.1:9/v1, model: m}\n"
        f"metrics:\n{metrics}"
    )
    code = main(["validate", str(path)])
    return code, capsys.readouterr().err


def test_two_panels_sharing_an_id_are_one_plain_problem(tmp_path, capsys):
    """Two panels of one metric without ids: one problem saying that they share the id,
    not one more per judge key ('hate_speech[a]' is not the id of metrics[0])."""
    code, err = _validate(
        tmp_path,
        capsys,
        "  - {name: hate_speech, engines: [a, b]}\n"
        "  - {name: hate_speech, engines: [a, b], panel: {combine: unanimous}}\n",
    )
    assert code == 2
    assert err == (
        "ragbatch: error: config: metrics[1]: id 'hate_speech' is already used by metrics[0]: "
        "two panels share the id 'hate_speech', and each metric or panel needs an id of its "
        "own (it names their cells, summary rows and judge keys); give one of them a distinct "
        "`id:`, e.g. `id: hate_speech_2`\n"
    )
    # the fix the message gives: an id of its own for one of them
    fixed = _config(
        [
            {"name": "hate_speech", "engines": ["a", "b"]},
            {"name": "hate_speech", "engines": ["a", "b"], "id": "hate_speech_2"},
        ]
    )
    assert [m.metric_id for m in JobConfig.from_dict(fixed).metrics] == [
        "hate_speech",
        "hate_speech_2",
    ]


def test_a_metric_sharing_a_panels_id_or_judge_key(tmp_path, capsys):
    code, err = _validate(
        tmp_path,
        capsys,
        "  - {name: hate_speech, engines: [a, b]}\n"
        "  - {name: hate_speech, engine: a, id: 'hate_speech[a]'}\n"
        "  - {name: hate_speech, engine: b}\n",
    )
    assert code == 2
    assert err == (
        "ragbatch: error: config: metrics[1]: id 'hate_speech[a]' is the judge key of engine "
        "'a' in the panel of metrics[0]; give metrics[1] a distinct `id:`; metrics[2]: id "
        "'hate_speech' is already used by metrics[0]: a metric and a panel share the id "
        "'hate_speech', and each metric or panel needs an id of its own (it names their "
        "cells, summary rows and judge keys); give one of them a distinct `id:`, "
        "e.g. `id: hate_speech_2`\n"
    )


# -- combine rules ------------------------------------------------------------------------


def test_majority_names_the_split_and_leaves_failed_judges_out():
    score, status, reason, details = combine_cells(
        PLAN, [(1.0, "ok", None), (1.0, "ok", None), (0.0, "ok", None)]
    )
    assert (score, status, reason) == (1.0, "ok", "judges split 2-1: a=1, b=1, c=0")
    assert json.loads(details)["scores"] == {"a": 1.0, "b": 1.0, "c": 0.0}
    assert combine_cells(PLAN, [(1.0, "ok", None)] * 3)[:3] == (1.0, "ok", None)
    score, status, reason, _ = combine_cells(
        PLAN, [(0.0, "ok", None), (None, "timeout", "slow"), (0.0, "ok", None)]
    )
    assert (score, status, reason) == (0.0, "ok", "b timeout, not counted")


def test_a_tie_has_no_majority():
    score, status, reason, _ = combine_cells(
        PLAN, [(1.0, "ok", None), (None, "parse_failure", "x"), (0.0, "ok", None)]
    )
    assert (score, status) == (None, "not_applicable")
    assert reason == (
        "judges tied 1-1: a=1, c=0; b parse_failure, not counted; a majority needs an odd count"
    )


def test_unanimous_and_mean():
    cells = [(1.0, "ok", None), (1.0, "ok", None), (0.0, "ok", None)]
    unanimous = PanelPlan("hs", PLAN.judges, PLAN.member_keys, "unanimous")
    mean = PanelPlan("hs", PLAN.judges, PLAN.member_keys, "mean")
    assert combine_cells(unanimous, cells)[:2] == (0.0, "ok")
    assert combine_cells(unanimous, [(1.0, "ok", None)] * 3)[:2] == (1.0, "ok")
    assert combine_cells(mean, cells)[0] == pytest.approx(2 / 3)
    score, _, reason, _ = combine_cells(
        mean, [(0.8, "ok", None), (0.6, "ok", None), (0.5, "ok", None)]
    )
    assert score == pytest.approx(0.6333333) and reason == "judges split: a=0.8, b=0.6, c=0.5"


def test_no_judge_scored_the_row():
    same = [(None, "missing_input", "answer is empty")] * 3
    assert combine_cells(PLAN, same)[:3] == (None, "missing_input", "answer is empty")
    score, status, reason, _ = combine_cells(
        PLAN,
        [(None, "judge_error", "boom"), (None, "timeout", None), (None, "judge_error", "boom")],
    )
    assert (score, status) == (None, "judge_error")
    assert (
        reason == "no judge scored the row: a judge_error (boom); b timeout; c judge_error (boom)"
    )


# -- agreement ----------------------------------------------------------------------------


def _three_judges() -> np.ndarray:
    """tests/test_panel_run.py's matrix: 8 rows (1,1,1), 11 rows (0,0,1), one (0,-,1)."""
    rows = [[1, 1, 1]] * 8 + [[0, 0, 1]] * 11 + [[0, np.nan, 1]]
    return np.array(rows, dtype=float)


def test_alpha_of_the_hand_worked_example():
    # n0 = 23, n1 = 36, n = 59; observed 11 x 2 + 2 = 24; expected 59^2 - 23^2 - 36^2 = 1656
    matrix = _three_judges()
    assert krippendorff_alpha(matrix, "nominal") == pytest.approx(1 - 58 * 24 / 1656)
    assert krippendorff_alpha(matrix, "nominal") == pytest.approx(11 / 69)
    assert krippendorff_alpha(matrix[:, :2], "nominal") == 1.0
    # every score the same: alpha is undefined
    assert krippendorff_alpha(np.ones((5, 3)), "nominal") is None


def test_alpha_of_krippendorff_2011_example():
    """Krippendorff (2011), section C: 4 coders, 12 units, nominal alpha 0.743."""
    n = np.nan
    data = np.array(
        [
            [1, 2, 3, 3, 2, 1, 4, 1, 2, n, n, n],
            [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, n, 3],
            [n, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, n],
            [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, n],
        ]
    ).T
    assert krippendorff_alpha(data, "nominal") == pytest.approx(0.743, abs=5e-4)
    assert krippendorff_alpha(data, "interval") == pytest.approx(0.849, abs=5e-4)


@pytest.mark.parametrize("level,values", [("nominal", 2), ("interval", 6)])
def test_alpha_equals_the_krippendorff_package(level, values):
    krippendorff = pytest.importorskip("krippendorff")
    rng = np.random.default_rng(3)
    for _ in range(5):
        matrix = rng.integers(0, values, size=(60, 3)).astype(float)
        matrix[rng.random(matrix.shape) < 0.2] = np.nan
        ours = krippendorff_alpha(matrix, level)
        theirs = krippendorff.alpha(reliability_data=matrix.T, level_of_measurement=level)
        assert ours == pytest.approx(theirs, rel=1e-9)


def test_alpha_interval_is_seeded_and_covers_the_estimate():
    matrix = _three_judges()
    first = alpha_interval(matrix, "nominal", 0.95, 500, seed=0)
    assert first == alpha_interval(matrix, "nominal", 0.95, 500, seed=0)
    assert first[0] < 11 / 69 < first[1]


def test_pairwise_measures():
    result = panel_agreement("hs", ["a", "b", "c"], _three_judges(), True, 0.95, 200, 0)
    pairs = {tuple(p["judges"]): p for p in result.pairwise}
    assert pairs[("a", "b")] == {"judges": ["a", "b"], "n": 19, "agreement": 1.0}
    assert pairs[("a", "c")]["agreement"] == pytest.approx(0.4)
    assert pairs[("b", "c")] == {"judges": ["b", "c"], "n": 19, "agreement": pytest.approx(8 / 19)}
    continuous = np.array([[0.5, 1.0], [0.25, 0.25], [1.0, 0.0]])
    result = panel_agreement("sim", ["a", "b"], continuous, False, 0.95, 200, 0)
    assert result.level == "interval"
    assert result.pairwise[0]["mean_abs_diff"] == pytest.approx((0.5 + 0 + 1) / 3)
    assert result.judge_means["b"] == {"mean": pytest.approx(1.25 / 3), "n_ok": 3}


# -- scores written before panels ---------------------------------------------------------


def test_scores_without_a_judge_column_are_still_summarised(tmp_path):
    """A scores file written before the ``judge`` column existed."""
    table = pa.table(
        {
            "row_id": ["1", "2", "3"],
            "metric": ["hate_speech"] * 3,
            "score": [1.0, 0.0, None],
            "status": ["ok", "ok", "parse_failure"],
            "reason": [None, None, "bad"],
            "details": [None, None, None],
            "model": ["m"] * 3,
        }
    )
    path = tmp_path / "part-0.parquet"
    pq.write_table(table, path)
    layout = OutputLayout.for_run(
        OutputSection(uri=str(tmp_path)), __import__("datetime").date(2024, 6, 1), "old"
    )
    plan = build_plan(
        JobConfig.from_dict(_config([{"name": "hate_speech", "engine": "a"}])),
        inspect_input=False,
    )
    summary = summarize_run(layout, [str(path)], plan.metrics, [])
    [row] = summary.overall()
    assert (row["metric"], row["judge"], row["n_ok"], row["mean"]) == ("hate_speech", None, 2, 0.5)
    assert summary.panels == {}
