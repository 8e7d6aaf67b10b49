"""``ragbatch calibrate`` end to end on the shipped ARES and HaluEval calibration configs,
and the run's calibration guard.

The judge is the tiny random model behind the session's ``vllm serve``
(``vllm_base_url``), as an ``openai`` engine: its verdicts are noise, so the tests check
that every number the calibration writes is recomputed exactly, here and independently
(scikit-learn, a bootstrap loop of its own), from the written scores and labels.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml
from sklearn import metrics as skm

from ragbatch.analysis.runs import find_run, load_scores
from ragbatch.calibrate.measures import NOT_PROBABILITIES
from ragbatch.calibrate.guard import calibration_problems, check_calibration
from ragbatch.calibrate.output import find_calibration
from ragbatch.cli import main
from ragbatch.config.job import JobConfig
from ragbatch.core.errors import ConfigError
from ragbatch.pipeline.plan import build_plan
from ragbatch.ops.nightly_job import run_nightly
from ragbatch.pipeline.runner import run_job

pytest.importorskip(
    "openai", reason="the calibration tests need the judge stack (ragbatch[judge-cpu])"
)
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
RESAMPLES = 200
#: Rows of the shipped configs the tests judge (one verdict each, seconds per call on two
#: cores); the metrics are single-verdict ones the random model answers in shape.
ARES_ROWS = 6
PAIRS = 4
MAX_TOKENS = 160


def _engine(base_url: str) -> dict:
    return {
        "kind": "openai",
        "base_url": base_url,
        "model": "tiny",
        "max_concurrency": 8,
        "concurrency": 1,
        "batch_size": 16,
        "request_timeout_s": 300,
        "max_tokens": MAX_TOKENS,
        "parse_retries": 0,
    }


def _config_copy(
    tmp: Path, name: str, base_url: str, judges: list[str], limit: int, keep_metrics: list[str]
) -> Path:
    """The shipped calibration config with the test's judge(s), a row limit and fewer
    metrics and resamples; input paths made absolute."""
    data = yaml.safe_load((REPO / "jobs" / f"calibrate_{name}.yaml").read_text())
    data["input"]["uri"] = str(REPO / data["input"]["uri"])
    data["output"]["uri"] = str(tmp / name)
    data["engines"] = {j: _engine(base_url) for j in judges}
    data["judges"] = judges
    data["metrics"] = [m for m in data["metrics"] if m["name"] in keep_metrics]
    data["labels"] = {k: v for k, v in data["labels"].items() if k in keep_metrics}
    data["limit"] = limit
    data["bootstrap"] = {"resamples": RESAMPLES, "seed": 7, "confidence": 0.95}
    data["top_disagreements"] = 5
    path = tmp / f"calibrate_{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _calibrate(tmp: Path, base_url: str, name: str, limit: int, metric: str) -> dict:
    """One calibrate run of the shipped config ``name`` through the CLI, with judge ``a``."""
    path = _config_copy(tmp, name, base_url, ["a"], limit, [metric])
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["calibrate", str(path), "--run-id", f"cal-{name}"])
    (tmp / f"{name}.txt").write_text(buf.getvalue())
    assert code == 0, buf.getvalue()
    root = str(tmp / name)
    return {
        "text": buf.getvalue(),
        "root": root,
        "config": yaml.safe_load(path.read_text()),
        "cal": find_calibration(root, f"cal-{name}"),
    }


@pytest.fixture(scope="module")
def ares_calibration(ray_local, vllm_base_url, tmp_path_factory):
    """The ARES calibration (:data:`ARES_ROWS` rows, retrieval_precision)."""
    return _calibrate(
        tmp_path_factory.mktemp("calibrate"),
        vllm_base_url,
        "ares",
        ARES_ROWS,
        "retrieval_precision",
    )


@pytest.fixture(scope="module")
def halueval_calibration(ray_local, vllm_base_url, tmp_path_factory):
    """The HaluEval calibration (:data:`PAIRS` pairs, augmentation_accuracy)."""
    return _calibrate(
        tmp_path_factory.mktemp("calibrate"),
        vllm_base_url,
        "halueval",
        PAIRS,
        "augmentation_accuracy",
    )


def _cells(root: str, run_id: str, metric: str) -> pl.DataFrame:
    return load_scores(find_run(root, run_id)).filter(pl.col("metric") == metric)


def _bootstrap(fn, a: np.ndarray, b: np.ndarray, seed: int) -> tuple[float | None, float | None]:
    """Percentile interval of ``fn`` over resampled positions, a loop of its own."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, a.size, size=(RESAMPLES, a.size))
    draws = [v for v in (fn(a[i], b[i]) for i in idx) if v is not None and not math.isnan(v)]
    if len(draws) * 2 < RESAMPLES:
        return None, None
    low, high = np.quantile(draws, [0.025, 0.975])
    return float(low), float(high)


def _sk(name: str):
    def safe(fn):
        def wrapped(a, b):
            try:
                return float(fn(a, b))
            except ValueError:
                return None

        return wrapped

    verdict = {
        "accuracy": lambda h, v: skm.accuracy_score(h, v),
        "precision": lambda h, v: skm.precision_score(h, v, zero_division=np.nan),
        "recall": lambda h, v: skm.recall_score(h, v, zero_division=np.nan),
        "f1": lambda h, v: skm.f1_score(h, v, zero_division=np.nan),
        "kappa": lambda h, v: skm.cohen_kappa_score(h, v),
    }
    if name in verdict:
        return safe(lambda s, h: verdict[name](h, (s >= 0.5).astype(int)))
    return safe(lambda s, h: skm.roc_auc_score(h, s))


def _check_binary(cal, root: str, judge: str, metric: str, label: str, *, pairs: bool = False):
    agreement = cal.table("agreement").filter(
        (pl.col("judge") == judge) & (pl.col("metric") == metric)
    )
    run_id = f"{cal.run_id}-{judge}"
    cells = _cells(root, run_id, metric)
    labels = cells[label].cast(pl.Float64)
    usable = (
        cells.with_columns(labels.alias("lab"))
        .filter((pl.col("status") == "ok") & pl.col("lab").is_not_null())
        .sort("row_id")
    )
    score, human = usable["score"].to_numpy(), usable["lab"].to_numpy()
    assert sorted(agreement["measure"]) == sorted(
        [
            "accuracy",
            "precision",
            "recall",
            "f1",
            "kappa",
            "roc_auc",
            "brier",
            "ece",
            *(["pairwise_agreement"] if pairs else []),
        ]
    )
    # The metrics score hard verdicts (score: verdict): no probabilities, so no Brier or ECE.
    for row in agreement.filter(pl.col("measure").is_in(["brier", "ece"])).iter_rows(named=True):
        assert row["value"] is None and row["reason"] == NOT_PROBABILITIES, row
    for row in agreement.filter(
        ~pl.col("measure").is_in(["pairwise_agreement", "brier", "ece"])
    ).iter_rows(named=True):
        assert row["n"] == usable.height and row["n_cells"] == cells.height
        assert row["model"] == cells["model"].drop_nulls()[0]
        fn = _sk(row["measure"])
        want = fn(score, human) if usable.height else None
        if want is None or math.isnan(want):
            assert row["value"] is None and row["reason"], row
            continue
        assert row["value"] == pytest.approx(want, abs=1e-12), row
        low, high = _bootstrap(fn, score, human, 7)
        if low is None:
            assert row["ci_low"] is None and "resamples" in row["reason"]
        else:
            assert (row["ci_low"], row["ci_high"]) == (pytest.approx(low), pytest.approx(high)), row
    confusion = cal.table("confusion").filter(
        (pl.col("judge") == judge) & (pl.col("metric") == metric)
    )
    verdict = (score >= 0.5).astype(int)
    for row in confusion.iter_rows(named=True):
        assert row["n"] == int(np.sum((human == row["human"]) & (verdict == row["judge_verdict"])))
    return usable, cells


def _check_disagreements(
    cal, judge: str, metric: str, usable: pl.DataFrame, cells: pl.DataFrame, texts: dict[str, str]
):
    got = cal.table("disagreements").filter(
        (pl.col("judge") == judge) & (pl.col("metric") == metric)
    )
    distance = (usable["score"] - usable["lab"]).abs()
    ranked = usable.with_columns(distance.alias("d")).sort(
        ["d", "row_id"], descending=[True, False]
    )
    assert got["row_id"].to_list() == ranked["row_id"].head(5).to_list()
    replies = dict(zip(cells["row_id"], cells["judge_reply"]))
    for row in got.iter_rows(named=True):
        # a real row: its judge reply as written in the scores, its answer from the input
        assert row["judge_reply"] == replies[row["row_id"]][:2000] + (
            "..." if len(replies[row["row_id"]]) > 2000 else ""
        )
        assert row["answer"] == texts[row["row_id"]][:2000] + (
            "..." if len(texts[row["row_id"]]) > 2000 else ""
        )


def test_ares_calibration_numbers_are_recomputed_from_the_written_scores(ares_calibration):
    c = ares_calibration
    cal, root = c["cal"], c["root"]
    ares = pl.read_csv(
        REPO / c["config"]["input"]["uri"], separator="\t", infer_schema=False, quote_char=None
    ).head(ARES_ROWS)
    texts = {str(i): a for i, a in enumerate(ares["Answer"])}
    usable, cells = _check_binary(cal, root, "a", "retrieval_precision", "Context_Relevance_Label")
    assert usable.height > 0, "the judge scored no cell ok: nothing was measured"
    _check_disagreements(cal, "a", "retrieval_precision", usable, cells, texts)
    assert f"calibration cal-ares committed ({ARES_ROWS} labelled rows, 1 judge(s))" in c["text"]
    for row in cal.table("agreement").iter_rows(named=True):
        # the console table has every measure with its value and interval (or its reason)
        interval = (
            f"[{row['ci_low']:.3f}, {row['ci_high']:.3f}]" if row["ci_low"] is not None else ""
        )
        value = f"{row['value']:.3f}" if row["value"] is not None else "-"
        assert any(
            row["measure"] in ln and value in ln and interval in ln for ln in c["text"].splitlines()
        )
    # the run's HTML report shows the calibration of its own judge run
    from ragbatch.analysis.report import build_report
    from ragbatch.calibrate.report import calibration_section

    html = build_report(
        find_run(root, "cal-ares-a"), top=2, calibration_section=calibration_section
    )
    assert (
        'id="calibration-table"' in html
        and "retrieval_precision" in html.split('id="calibration-table"')[1]
    )


@pytest.mark.release
def test_halueval_pairs_and_pairwise_agreement(halueval_calibration):
    """Release check; the default suite covers answer pairs and pairwise agreement on
    hand-made tables (tests/test_calibrate_measures.py) and the calibrate command on
    ARES above."""
    c = halueval_calibration
    cal, root = c["cal"], c["root"]
    usable, cells = _check_binary(cal, root, "a", "augmentation_accuracy", "faithful", pairs=True)
    assert cells.height == 2 * PAIRS and set(cells["pair_member"]) == {
        "right_answer",
        "hallucinated_answer",
    }
    assert usable.height > 0, "the judge scored no cell ok: nothing was measured"
    rows = pl.read_ndjson(REPO / c["config"]["input"]["uri"]).head(PAIRS)
    texts = {
        f"{i}:{col}": rows[col][i]
        for i in range(PAIRS)
        for col in ("right_answer", "hallucinated_answer")
    }
    if usable.height:
        _check_disagreements(cal, "a", "augmentation_accuracy", usable, cells, texts)
    good = usable.filter(pl.col("lab") == 1).select(
        "pair_id", pl.col("score").alias("good"), pl.col("row_id").alias("r1")
    )
    bad = usable.filter(pl.col("lab") == 0).select(
        "pair_id", pl.col("score").alias("bad"), pl.col("row_id").alias("r2")
    )
    pairs = good.join(bad, on="pair_id").sort("pair_id", "r1", "r2")
    row = (
        cal.table("agreement").filter(pl.col("measure") == "pairwise_agreement").row(0, named=True)
    )
    assert row["n"] == pairs.height > 0

    def wins(g, b):
        return float(np.mean((g > b) + 0.5 * (g == b)))

    g, b = pairs["good"].to_numpy(), pairs["bad"].to_numpy()
    assert row["value"] == pytest.approx(wins(g, b))
    low, high = _bootstrap(wins, g, b, 7)
    assert (row["ci_low"], row["ci_high"]) == (pytest.approx(low), pytest.approx(high))


def _guarded_config(c, vllm_base_url: str, guard: dict, params: dict | None = None) -> JobConfig:
    cal = c["cal"]
    return JobConfig.from_dict(
        {
            "input": {
                "uri": cal.manifest["labelled_input"]["uri"],
                "format": "parquet",
                "columns": {
                    "row_id": "calibration_row_id",
                    "question": "Question",
                    "contexts": "Document",
                    "answer": "Answer",
                },
                "contexts_format": "text",
            },
            "output": {"uri": c["root"] + "_nightly"},
            "engines": {"judge": _engine(vllm_base_url)},
            "metrics": [{"name": "retrieval_precision", "engine": "judge", "params": params or {}}],
            "cache": {"uri": c["root"] + "/judge_cache"},
            "calibration": {"uri": c["root"], **guard},
        }
    )


def test_guard_refuses_without_or_below_and_proceeds_when_allowed(
    ares_calibration, vllm_base_url, tmp_path
):
    """The guard matches the run's judge model (from the engine, without a judge call)
    and prompt version against the recorded agreement."""
    c = ares_calibration
    recorded = (
        c["cal"]
        .table("agreement")
        .filter((pl.col("metric") == "retrieval_precision") & (pl.col("measure") == "accuracy"))[
            "value"
        ][0]
    )
    # no calibration under the root named
    empty = _guarded_config(
        c, vllm_base_url, {"min_agreement": {"retrieval_precision": {"accuracy": 0.1}}}
    )
    empty.calibration.uri = str(tmp_path / "nothing")
    with pytest.raises(ConfigError, match="no committed calibration"):
        check_calibration(build_plan(empty, inspect_input=False))
    if recorded is not None:
        # recorded, at or above the minimum: no problem
        ok = _guarded_config(
            c, vllm_base_url, {"min_agreement": {"retrieval_precision": {"accuracy": recorded}}}
        )
        assert calibration_problems(build_plan(ok, inspect_input=False)) == []
        above = recorded + 0.01
    else:
        above = 0.0
    # below the minimum (or undefined): refused, naming metric, measure and minimum
    below = _guarded_config(
        c, vllm_base_url, {"min_agreement": {"retrieval_precision": {"accuracy": above}}}
    )
    with pytest.raises(ConfigError, match=r"retrieval_precision .*accuracy .*minimum"):
        check_calibration(build_plan(below, inspect_input=False))
    # a measure the calibration did not record for this label type: refused
    other = _guarded_config(
        c, vllm_base_url, {"min_agreement": {"retrieval_precision": {"spearman": 0.1}}}
    )
    with pytest.raises(ConfigError, match="no recorded spearman"):
        check_calibration(build_plan(other, inspect_input=False))
    # `ragbatch run` checks before anything starts (no Ray, nothing written) ...
    with pytest.raises(ConfigError, match="--allow-uncalibrated"):
        run_job(below, run_id="refused")
    assert not Path(below.output.uri).exists()
    # a night under the guard exits 2 (invalid), before anything starts
    night = run_nightly(below, run_date=dt.date(2026, 11, 29))
    assert night.exit_code == 2 and "--allow-uncalibrated" in night.message, night.message
    assert not Path(below.output.uri).exists()
    # ... and proceeds, warning, when told to (--allow-uncalibrated, or calibration.proceed)
    plan = build_plan(below, inspect_input=False)
    allowed = check_calibration(plan, allow=True)
    assert len(allowed) == 1 and "retrieval_precision" in allowed[0]
    below.calibration.proceed = True
    assert check_calibration(build_plan(below, inspect_input=False)) == allowed
