"""Label-corrected means in a real run (config ``labels``): summary.parquet's PPI columns
on local Ray, and bad label columns refused before any metric runs.

``exact_match`` (case-insensitive) stands in for a judge: PPI applies to any metric with
labels. Its scores follow from the rows' texts, so the expected estimates are computed in
the test from the input alone, with the formulas of docs/ppi.md written out in numpy.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragbatch.config.job import JobConfig
from ragbatch.core.errors import ConfigError, InputError
from ragbatch.pipeline.runner import run_job

pytestmark = pytest.mark.slow

Z = NormalDist().inv_cdf(0.975)
WORDS = ["paris", "rome", "oslo", "lima", "kyiv", "baku"]


def _rows(n: int = 240, seed: int = 11) -> dict[str, list]:
    """Reference words, answers equal to them (up to case) 70 % of the time, a human label
    agreeing with that 85 % of the time on the first 80 rows (null after), and an app
    slice; app ``c`` has one labelled row."""
    rng = np.random.default_rng(seed)
    refs = [WORDS[i] for i in rng.integers(0, len(WORDS), n)]
    same = rng.random(n) < 0.7
    answers = [
        r.upper() if s and k % 2 else (r if s else r[::-1] + "x")
        for k, (r, s) in enumerate(zip(refs, same))
    ]
    agree = rng.random(n) < 0.85
    labels = [float(s == a) if k < 80 else None for k, (s, a) in enumerate(zip(same, agree))]
    apps = ["a" if k % 2 else "b" for k in range(n)]
    if n > 81:
        apps[81], apps[3] = "c", "c"  # one unlabelled, one labelled row
    return {
        "question": [f"q{k}" for k in range(n)],
        "answer": answers,
        "reference": refs,
        "human_em": labels,
        "app": apps,
    }


def _config(tmp_path, data, labels, estimator="ppi++"):
    return JobConfig.from_dict(
        {
            "run": {"name": "ppi", "run_date": "2026-02-01"},
            "input": {
                "uri": str(data),
                "columns": {"question": "question", "answer": "answer", "reference": "reference"},
                "slice_columns": ["app"],
            },
            "output": {"uri": str(tmp_path / "out")},
            "metrics": [
                {"name": "exact_match", "params": {"case_sensitive": False}},
                {"name": "json_valid", "id": "unlabelled_metric"},
            ],
            "labels": {"columns": labels, "estimator": estimator},
        }
    )


def _expected(f: np.ndarray, y: np.ndarray, tuned: bool) -> tuple[float, float, float, float]:
    """(lambda, theta, low, high) by the PPI formulas, clipped to [0, 1]."""
    known = ~np.isnan(y)
    u, fl, yl = f[~known], f[known], y[known]
    n, big_n = fl.size, u.size
    lam = 1.0
    if tuned:
        cov = np.cov(fl, yl, ddof=1)[0, 1]
        lam = min(max((cov / n) / (u.var(ddof=1) / big_n + fl.var(ddof=1) / n), 0.0), 1.0)
    theta = lam * u.mean() + (yl - lam * fl).mean()
    se = math.sqrt(lam**2 * u.var(ddof=1) / big_n + (yl - lam * fl).var(ddof=1) / n)
    return lam, theta, max(theta - Z * se, 0.0), min(theta + Z * se, 1.0)


ESTIMATORS = ("ppi", "ppi++")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, ray_local):
    """The same input run twice under one root: with ``ppi``, then with ``ppi++``."""
    base = tmp_path_factory.mktemp("ppi_runs")
    data = base / "traces.parquet"
    pq.write_table(pa.table(_rows()), data)
    return {
        e: run_job(
            _config(base, data, {"exact_match": "human_em"}, e), run_id=f"ppi-{e.replace('+', 'p')}"
        )
        for e in ESTIMATORS
    }


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_summary_reports_corrected_means(runs, estimator) -> None:
    rows = _rows()
    result = runs[estimator]
    summary = pq.read_table(result.layout.summary_path).to_pylist()
    f = np.array([a.lower() == r for a, r in zip(rows["answer"], rows["reference"])], float)
    y = np.array([np.nan if v is None else v for v in rows["human_em"]])

    overall = next(r for r in summary if r["metric"] == "exact_match" and r["slice_column"] is None)
    lam, theta, low, high = _expected(f, y, tuned=estimator == "ppi++")
    assert overall["label_column"] == "human_em"
    assert overall["n_labelled"] == 80
    assert overall["mean"] == pytest.approx(f.mean())
    assert overall["ppi_lambda"] == pytest.approx(lam)
    assert (overall["ppi_mean"], overall["ppi_ci_low"], overall["ppi_ci_high"]) == pytest.approx(
        (theta, low, high)
    )
    yl = y[~np.isnan(y)]
    half = Z * yl.std(ddof=1) / math.sqrt(yl.size)
    assert (
        overall["labels_mean"],
        overall["labels_ci_low"],
        overall["labels_ci_high"],
    ) == pytest.approx((yl.mean(), yl.mean() - half, yl.mean() + half))
    assert overall["ppi_reason"] is None
    # an informative stand-in judge narrows the interval
    assert high - low < overall["labels_ci_high"] - overall["labels_ci_low"]

    # per slice value: the same over that value's rows
    apps = np.array(rows["app"])
    row_a = next(r for r in summary if r["metric"] == "exact_match" and r["slice_value"] == "a")
    _, theta_a, low_a, high_a = _expected(f[apps == "a"], y[apps == "a"], estimator == "ppi++")
    assert (row_a["ppi_mean"], row_a["ppi_ci_low"], row_a["ppi_ci_high"]) == pytest.approx(
        (theta_a, low_a, high_a)
    )
    row_c = next(r for r in summary if r["metric"] == "exact_match" and r["slice_value"] == "c")
    assert row_c["n_labelled"] == 1 and row_c["ppi_ci_low"] is None
    assert "an interval needs at least 2" in row_c["ppi_reason"]

    # a metric without labels: the columns are null
    other = next(r for r in summary if r["metric"] == "unlabelled_metric")
    assert all(other[c] is None for c in ("label_column", "n_labelled", "ppi_mean", "ppi_reason"))
    # the label column passes through to the scores table but is no slice of the summary
    assert {r["slice_column"] for r in summary} == {None, "app"}
    assert "human_em" in pq.read_table(result.layout.scores_path).column_names
    assert result.manifest.summary["labels"] == {"exact_match": "human_em"}
    assert result.manifest.summary["ppi_estimator"] == estimator
    # the console table after the run
    from ragbatch.cli.run import _summary_text

    text = _summary_text(result.summary.table.to_pylist(), 0.95)
    assert (
        f"  exact_match: {theta:.3f} [{low:.3f}, {high:.3f}]; labels only {yl.mean():.3f} "
        f"[{yl.mean() - half:.3f}, {yl.mean() + half:.3f}] (80 labelled of 240 ok)"
    ) in text
    assert "unlabelled_metric:" not in text


def test_compare_and_report_show_corrected_means(runs) -> None:
    from ragbatch.analysis.compare import compare_runs
    from ragbatch.analysis.compare_text import format_comparison
    from ragbatch.analysis.report import build_report
    from ragbatch.analysis.runs import find_run

    root = runs["ppi"].config.output.uri
    baseline, candidate = find_run(root, "ppi-ppi"), find_run(root, "ppi-ppipp")
    expected = {}
    for label, result in (("baseline", runs["ppi"]), ("candidate", runs["ppi++"])):
        row = next(
            r
            for r in pq.read_table(result.layout.summary_path).to_pylist()
            if r["metric"] == "exact_match" and r["slice_column"] is None
        )
        expected[label] = row
    comparison = compare_runs(baseline, candidate)
    corrected = comparison.corrected.to_dicts()
    assert [(r["run"], r["metric"]) for r in corrected] == [
        ("baseline", "exact_match"),
        ("candidate", "exact_match"),
    ]
    for r in corrected:
        e = expected[r["run"]]
        assert (
            r["ppi_mean"],
            r["ppi_ci_low"],
            r["ppi_lambda"],
            r["labels_mean"],
            r["n_labelled"],
        ) == (e["ppi_mean"], e["ppi_ci_low"], e["ppi_lambda"], e["labels_mean"], 80)
    assert expected["baseline"]["ppi_lambda"] == 1.0 != expected["candidate"]["ppi_lambda"]
    text = format_comparison(comparison)
    assert "label-corrected means (prediction-powered inference" in text
    b = expected["baseline"]
    assert f"{b['ppi_mean']:.3f} [{b['ppi_ci_low']:.3f}, {b['ppi_ci_high']:.3f}]" in text
    assert comparison.to_dict()["corrected"][1]["ppi_lambda"] == expected["candidate"]["ppi_lambda"]

    html = build_report(candidate)
    c = expected["candidate"]
    assert 'id="corrected-table"' in html
    assert f"{c['ppi_mean']:.3f} [{c['ppi_ci_low']:.3f}, {c['ppi_ci_high']:.3f}]" in html
    assert f"{c['labels_mean']:.3f} [{c['labels_ci_low']:.3f}, {c['labels_ci_high']:.3f}]" in html


def _from_run_config(
    root: str, data, run_id: str = "ppi-ppi", params: dict | None = None, column: str = "human_em"
) -> JobConfig:
    """A job over the same input, its labels taken from the labelled run ``run_id``."""
    return JobConfig.from_dict(
        {
            "run": {"name": "ppi-from-run", "run_date": "2026-02-02"},
            "input": {
                "uri": str(data),
                "columns": {"question": "question", "answer": "answer", "reference": "reference"},
                "slice_columns": ["app"],
            },
            "output": {"uri": root},
            "metrics": [{"name": "exact_match", "params": params or {"case_sensitive": False}}],
            "labels": {
                "calibration": {"uri": root, "run_id": run_id, "columns": {"exact_match": column}}
            },
        }
    )


def test_labels_from_another_run(runs) -> None:
    root = runs["ppi"].config.output.uri
    data = runs["ppi"].config.input.uri
    result = run_job(_from_run_config(root, data), run_id="ppi-from-run")
    rows = _rows()
    f = np.array([a.lower() == r for a, r in zip(rows["answer"], rows["reference"])], float)
    y = np.array([np.nan if v is None else v for v in rows["human_em"]])
    known = ~np.isnan(y)
    # the labelled run's 80 labelled cells are the labelled sample; all 240 cells of this
    # run are unlabelled
    fl, yl, u = f[known], y[known], f
    n, big_n = fl.size, u.size
    cov = np.cov(fl, yl, ddof=1)[0, 1]
    lam = min(max((cov / n) / (u.var(ddof=1) / big_n + fl.var(ddof=1) / n), 0.0), 1.0)
    theta = lam * u.mean() + (yl - lam * fl).mean()
    se = math.sqrt(lam**2 * u.var(ddof=1) / big_n + (yl - lam * fl).var(ddof=1) / n)
    summary = pq.read_table(result.layout.summary_path).to_pylist()
    overall = next(r for r in summary if r["slice_column"] is None)
    assert overall["label_column"] == "human_em of run ppi-ppi"
    assert (overall["n_labelled"], overall["ppi_lambda"]) == (80, pytest.approx(lam))
    assert (overall["ppi_mean"], overall["ppi_ci_low"], overall["ppi_ci_high"]) == pytest.approx(
        (theta, max(theta - Z * se, 0.0), min(theta + Z * se, 1.0))
    )
    assert overall["labels_mean"] == pytest.approx(yl.mean())
    sliced = [r for r in summary if r["slice_column"] == "app"]
    assert sliced and all(
        r["ppi_mean"] is None and "overall mean only" in r["ppi_reason"] for r in sliced
    )
    assert result.manifest.summary["labelled_runs"] == {"exact_match": "human_em of run ppi-ppi"}


def test_labels_from_another_run_refused_when_they_do_not_fit(runs) -> None:
    root = runs["ppi"].config.output.uri
    data = runs["ppi"].config.input.uri
    with pytest.raises(
        ConfigError,
        match=r"labels.calibration.columns.exact_match: run ppi-ppi "
        r"computed 'exact_match' with params",
    ):
        run_job(_from_run_config(root, data, params={"case_sensitive": True}), run_id="ppi-x1")
    with pytest.raises(InputError, match=r"run ppi-ppi has no column 'human_emm'"):
        run_job(_from_run_config(root, data, column="human_emm"), run_id="ppi-x2")
    with pytest.raises(InputError, match=r"no committed run 'nope'"):
        run_job(_from_run_config(root, data, run_id="nope"), run_id="ppi-x3")


def test_label_outside_range_refused_before_running(tmp_path) -> None:
    rows = _rows(40)
    rows["human_em"][7] = 2.0
    data = tmp_path / "traces.jsonl"
    pa.Table.from_pydict(rows).to_pandas().to_json(data, orient="records", lines=True)
    with pytest.raises(InputError) as info:
        run_job(_config(tmp_path, data, {"exact_match": "human_em"}), run_id="ppi-bad")
    message = str(info.value)
    assert "labels.columns.exact_match: column 'human_em' holds 1 label(s) outside" in message
    assert "[0, 1]" in message and "(first: 2.0 at row traces.jsonl:7)" in message
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("manifest.json"))


def test_label_column_problems(tmp_path) -> None:
    rows = _rows(20)
    rows["text_label"] = ["yes"] * 20
    data = tmp_path / "traces.parquet"
    pq.write_table(pa.table(rows), data)
    with pytest.raises(
        InputError,
        match=r"labels.columns.exact_match: column 'text_label' has "
        r"type string; labels need numbers or booleans",
    ):
        run_job(_config(tmp_path, data, {"exact_match": "text_label"}), run_id="ppi-type")
    with pytest.raises(InputError, match=r"column 'human_emm' does not exist"):
        run_job(_config(tmp_path, data, {"exact_match": "human_emm"}), run_id="ppi-missing")
    with pytest.raises(
        ConfigError,
        match=r"labels: 'exact_matc' is not the id of any "
        r"metric \(did you mean 'exact_match'\?\)",
    ):
        _config(tmp_path, data, {"exact_matc": "human_em"})


def test_cli_exits_2_on_a_bad_label(tmp_path) -> None:
    from support.cli_process import run_ragbatch

    (tmp_path / "in.jsonl").write_text(
        '{"answer": "a", "reference": "a", "h": 1}\n{"answer": "b", "reference": "a", "h": 3}\n'
    )
    (tmp_path / "job.yaml").write_text(
        "input: {uri: in.jsonl, columns: {answer: answer, reference: reference}}\n"
        "output: {uri: out}\nmetrics: [{name: exact_match}]\n"
        "labels: {columns: {exact_match: h}}\n"
    )
    done = run_ragbatch(["run", "job.yaml"], tmp_path)
    assert done.returncode == 2, done.stderr
    assert (
        "labels.columns.exact_match: column 'h' holds 1 label(s) outside exact_match's range "
        "[0, 1] (first: 3.0 at row in.jsonl:1)"
    ) in done.stderr
    assert not (tmp_path / "out").exists()
