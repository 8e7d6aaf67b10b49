"""Agreement measures of ``ragbatch calibrate`` against scikit-learn and scipy, hand-worked
cases, degenerate inputs, label conversion and answer pairs."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from scipy import stats
from sklearn import metrics as skm

from ragbatch.calibrate.config import CalibrationConfig, LabelSpec, calibration_from_dict
from ragbatch.calibrate.labels import label_values
from ragbatch.calibrate.measures import (
    Bootstrap,
    binary_measures,
    confusion,
    graded_measures,
    pairwise_agreement,
)
from ragbatch.calibrate.prepare import split_pairs
from ragbatch.core.errors import ConfigError, InputError

BOOT = Bootstrap(resamples=200, seed=3)


def _by_name(measures):
    return {m.name: m for m in measures}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_binary_measures_equal_scikit_learn(seed):
    rng = np.random.default_rng(seed)
    score = rng.random(60).round(2)
    human = (rng.random(60) < 0.4).astype(float)
    got = _by_name(binary_measures(score, human, 0.5, BOOT))
    verdict = (score >= 0.5).astype(int)
    want = {
        "accuracy": skm.accuracy_score(human, verdict),
        "precision": skm.precision_score(human, verdict),
        "recall": skm.recall_score(human, verdict),
        "f1": skm.f1_score(human, verdict),
        "kappa": skm.cohen_kappa_score(human, verdict),
        "roc_auc": skm.roc_auc_score(human, score),
    }
    for name, value in want.items():
        m = got[name]
        assert m.value == pytest.approx(value, abs=1e-12), name
        assert m.n == 60 and m.reason is None
        assert m.ci_low <= m.value <= m.ci_high, name


def test_graded_measures_equal_scipy():
    rng = np.random.default_rng(5)
    human = rng.integers(0, 4, 50) / 3
    score = np.clip(human + rng.normal(0, 0.4, 50), 0, 1).round(1)
    got = _by_name(graded_measures(score, human, BOOT))
    assert got["spearman"].value == pytest.approx(stats.spearmanr(score, human).statistic)
    assert got["kendall"].value == pytest.approx(stats.kendalltau(score, human).statistic)
    assert got["spearman"].ci_low < got["spearman"].value < got["spearman"].ci_high


def test_hand_worked_confusion_kappa_and_pairs():
    # human 1 1 1 0 0 ; verdict 1 1 0 1 0 -> tp 2, fn 1, fp 1, tn 1
    score = np.array([0.9, 0.6, 0.2, 0.7, 0.1])
    human = np.array([1, 1, 1, 0, 0.0])
    assert confusion(score, human, 0.5) == {"tn": 1, "fp": 1, "fn": 1, "tp": 2}
    got = _by_name(binary_measures(score, human, 0.5, BOOT))
    # p_o = 3/5; p_e = (3*3 + 2*2)/25 = 13/25; kappa = (15/25 - 13/25) / (12/25) = 1/6
    assert got["kappa"].value == pytest.approx(1 / 6)
    assert got["precision"].value == pytest.approx(2 / 3)
    # AUC: positives 0.9, 0.6, 0.2 vs negatives 0.7, 0.1: 0.9 wins 2, 0.6 wins 1, 0.2 wins 1 -> 4 of 6
    assert got["roc_auc"].value == pytest.approx(4 / 6)
    # pairs: (0.9 > 0.1) win, (0.5 = 0.5) tie, (0.2 < 0.4) loss -> 1.5 / 3
    pw = pairwise_agreement(np.array([0.9, 0.5, 0.2]), np.array([0.1, 0.5, 0.4]), BOOT)
    assert pw.value == pytest.approx(0.5) and pw.n == 3


def test_degenerate_cases_give_null_with_a_reason():
    # all labels one class: recall defined, kappa/roc_auc not
    got = _by_name(binary_measures(np.array([0.9, 0.1, 0.8]), np.ones(3), 0.5, BOOT))
    assert got["accuracy"].value == pytest.approx(2 / 3)
    assert got["roc_auc"].value is None and "one class" in got["roc_auc"].reason
    # judge says 1 always, humans all 1: p_e = 1
    got = _by_name(binary_measures(np.array([0.9, 0.8]), np.ones(2), 0.5, BOOT))
    assert got["kappa"].value is None and "chance agreement" in got["kappa"].reason
    # judge never says 1: precision undefined
    got = _by_name(binary_measures(np.array([0.1, 0.2]), np.array([1.0, 0.0]), 0.5, BOOT))
    assert got["precision"].value is None and got["precision"].reason
    # no ok cells at all
    for m in binary_measures(np.array([]), np.array([]), 0.5, BOOT) + graded_measures(
        np.array([]), np.array([]), BOOT
    ):
        assert m.n == 0 and m.value is None and m.ci_low is None and m.reason
    # constant judge scores: no correlation
    got = _by_name(graded_measures(np.full(4, 0.5), np.array([0, 1, 2, 3.0]), BOOT))
    assert got["spearman"].value is None and "same score" in got["spearman"].reason
    assert pairwise_agreement(np.array([]), np.array([]), BOOT).value is None
    # undefined in most resamples: value kept, interval null with the count
    got = _by_name(
        binary_measures(
            np.array([0.9, 0.1, 0.9, 0.9]),
            np.array([1, 0, 1, 1.0]),
            0.5,
            Bootstrap(resamples=50, seed=0),
        )
    )
    assert got["roc_auc"].value == 1.0
    if got["roc_auc"].ci_low is None:
        assert "resamples" in got["roc_auc"].reason
    with pytest.raises(ValueError, match="0 or 1"):
        binary_measures(np.array([0.5]), np.array([2.0]), 0.5, BOOT)


def test_intervals_are_reproducible_and_depend_on_the_seed():
    rng = np.random.default_rng(1)
    score, human = rng.random(40), (rng.random(40) < 0.5).astype(float)
    a = binary_measures(score, human, 0.5, BOOT)
    assert a == binary_measures(score, human, 0.5, BOOT)
    assert a != binary_measures(score, human, 0.5, Bootstrap(resamples=200, seed=4))


def test_label_values_map_threshold_and_errors():
    ids = pl.Series(["a", "b", "c", "d"])
    text = pl.Series("lab", ["hateful", "non-hateful", None, "hateful"])
    spec = LabelSpec(column="lab", values={"hateful": 1, "non-hateful": 0})
    assert label_values(text, spec, ids).to_list() == [1.0, 0.0, None, 1.0]
    graded = pl.Series("g", ["0.0", "0.3333", "1.0", ""])
    assert label_values(graded, LabelSpec(column="g", type="graded"), ids).to_list() == [
        0.0,
        0.3333,
        1.0,
        None,
    ]
    assert label_values(graded, LabelSpec(column="g", threshold=0.5), ids).to_list() == [
        0.0,
        0.0,
        1.0,
        None,
    ]
    with pytest.raises(InputError, match=r"'lab', row 'b'.*'maybe'"):
        label_values(pl.Series("lab", ["hateful", "maybe", None, None]), spec, ids)
    with pytest.raises(InputError, match="is not 0 or 1"):
        label_values(graded, LabelSpec(column="g"), ids)


def _cal(**extra) -> CalibrationConfig:
    data = {
        "input": {"uri": "x.jsonl", "columns": {"question": "q", "contexts": "k"}},
        "output": {"uri": "out"},
        "engines": {"j": {"kind": "openai", "base_url": "http://x/v1", "model": "m"}},
        "judges": ["j"],
        "metrics": [{"name": "faithfulness"}],
        "labels": {"faithfulness": {"column": "ok"}},
        **extra,
    }
    return calibration_from_dict(data)


def test_pairs_split_one_row_into_labelled_answers():
    frame = pl.DataFrame(
        {"q": ["q1", "q2"], "k": ["k1", "k2"], "good": ["g1", "g2"], "bad": ["b1", "b2"]}
    )
    cal = _cal(pairs={"answers": {"good": 1, "bad": 0}, "label_column": "ok"})
    out = split_pairs(frame, cal)
    assert out.select("q", "answer", "ok", "pair_id", "pair_member").rows() == [
        ("q1", "g1", 1.0, "0", "good"),
        ("q1", "b1", 0.0, "0", "bad"),
        ("q2", "g2", 1.0, "1", "good"),
        ("q2", "b2", 0.0, "1", "bad"),
    ]


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"judges\[0\]: 'nope' is not defined"):
        _cal(judges=["nope"])
    with pytest.raises(ConfigError, match="labels.other: no metric has id"):
        _cal(labels={"faithfulness": {"column": "ok"}, "other": {"column": "x"}})
    with pytest.raises(ConfigError, match="threshold applies to binary"):
        _cal(labels={"faithfulness": {"column": "ok", "type": "graded", "threshold": 0.5}})


def test_output_schema_doc_lists_every_calibration_column():
    import re
    from pathlib import Path

    from ragbatch.calibrate.output import SCHEMAS

    doc = (Path(__file__).resolve().parents[1] / "docs" / "output-schema.md").read_text(
        encoding="utf-8"
    )
    section = doc.split("## Calibration tables\n", 1)[1]
    tables = re.findall(
        r"\| column \| Parquet \(Arrow\) \| meaning \|\n\|---\|---\|---\|\n((?:\|.*\n)+)", section
    )
    assert len(tables) == 4
    for name, body in zip(("agreement", "confusion", "disagreements", "alignment"), tables):
        rows = [
            [c.strip() for c in line.strip("|").split("|")] for line in body.strip().splitlines()
        ]
        assert [(r[0].strip("`"), r[1]) for r in rows] == [
            (f.name, {"string": "string", "int64": "int64", "double": "double"}[str(f.type)])
            for f in SCHEMAS[name]
        ], name


@pytest.mark.parametrize("name", ["ares", "halueval", "hatecheck", "rubric", "trec_dl"])
def test_shipped_calibration_configs_read_their_data_and_labels(name, monkeypatch):
    """Every shipped config loads, reads its data (first rows) and turns every label into
    numbers; the job each judge runs validates."""
    from pathlib import Path

    from ragbatch.calibrate.command import judge_job
    from ragbatch.calibrate.config import load_calibration
    from ragbatch.calibrate.prepare import read_labelled

    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(repo)
    cal = load_calibration(repo / "jobs" / f"calibrate_{name}.yaml")
    cal.limit = 40
    labelled = read_labelled(cal)
    assert labelled.frame.height == (80 if cal.pairs else 40)
    frame = labelled.frame
    for mid, spec in cal.labels.items():
        values = label_values(frame[spec.column], spec, frame[labelled.row_id])
        assert values.null_count() == 0, mid
        allowed = {0.0, 1.0} if spec.type == "binary" else {0.0, 1 / 3, 2 / 3, 1.0}
        assert all(min(abs(v - a) for a in allowed) < 1e-9 for v in values), mid
    for judge in cal.judges:
        job = judge_job(cal, judge, "labelled.parquet", labelled.row_id, labelled.answer)
        assert [m.engine for m in job.metrics] == [judge] * len(cal.metrics)


def test_input_columns_named_like_scratch_columns_pass_through():
    # split_pairs sorted on scratch columns "__pair_pos"/"__member_pos" and dropped them,
    # overwriting and then dropping an input column of that name.
    frame = pl.DataFrame(
        {
            "q": ["q1", "q2"],
            "__pair_pos": ["u1", "u2"],
            "__member_pos": [7, 8],
            "__label": ["x", "y"],
            "good": ["g1", "g2"],
            "bad": ["b1", "b2"],
        }
    )
    cal = _cal(pairs={"answers": {"good": 1, "bad": 0}, "label_column": "ok"})
    out = split_pairs(frame, cal)
    assert out.select("q", "__pair_pos", "__member_pos", "__label", "answer", "ok").rows() == [
        ("q1", "u1", 7, "x", "g1", 1.0),
        ("q1", "u1", 7, "x", "b1", 0.0),
        ("q2", "u2", 8, "y", "g2", 1.0),
        ("q2", "u2", 8, "y", "b2", 0.0),
    ]


@pytest.mark.parametrize("seed", [0, 1])
def test_probability_measures_equal_scikit_learn(seed):
    """Brier and ROC AUC from probabilities against scikit-learn; ECE against
    scikit-learn's reliability curve (``calibration_curve`` with uniform bins)."""
    from sklearn.calibration import calibration_curve

    rng = np.random.default_rng(seed)
    p = rng.random(80).round(3)
    human = (rng.random(80) < p).astype(float)
    got = _by_name(binary_measures(p, human, 0.5, BOOT, probabilities=True))
    assert got["brier"].value == pytest.approx(skm.brier_score_loss(human, p), abs=1e-12)
    assert got["roc_auc"].value == pytest.approx(skm.roc_auc_score(human, p), abs=1e-12)
    observed, mean_p = calibration_curve(human, p, n_bins=10, strategy="uniform")
    counts = np.bincount(np.searchsorted(np.linspace(0, 1, 11)[1:-1], p), minlength=10)
    weights = counts[counts > 0] / p.size
    assert got["ece"].value == pytest.approx(float(np.sum(weights * np.abs(observed - mean_p))))
    assert got["brier"].ci_low <= got["brier"].value <= got["brier"].ci_high


def test_hand_worked_ece_and_reliability_bins():
    # bins of width 0.1: (0.1, 0.2] holds 0.12, 0.18 (labels 0, 1): |0.5 - 0.15| = 0.35;
    # (0.9, 1.0] holds 0.92, 1.0 (labels 1, 1): |1 - 0.96| = 0.04.  ECE = (2*0.35 + 2*0.04)/4
    p = np.array([0.12, 0.18, 0.92, 1.0])
    human = np.array([0.0, 1.0, 1.0, 1.0])
    got = _by_name(binary_measures(p, human, 0.5, BOOT, probabilities=True))
    assert got["ece"].value == pytest.approx(0.195)
    assert got["brier"].value == pytest.approx((0.0144 + 0.6724 + 0.0064 + 0.0) / 4)
    from ragbatch.calibrate.measures import reliability_bins

    assert reliability_bins(p, human) == [
        {"bin_low": 0.1, "bin_high": 0.2, "n": 2, "mean_p": pytest.approx(0.15), "observed": 0.5},
        {"bin_low": 0.9, "bin_high": 1.0, "n": 2, "mean_p": pytest.approx(0.96), "observed": 1.0},
    ]


def test_hard_verdicts_have_no_brier_or_ece():
    got = _by_name(binary_measures(np.array([1.0, 0.0]), np.array([1.0, 0.0]), 0.5, BOOT))
    assert got["brier"].value is None and "score: probability" in got["brier"].reason
    assert got["ece"].value is None
