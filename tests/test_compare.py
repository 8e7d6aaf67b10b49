"""``ragbatch compare``: pairing, paired bootstrap differences, moved rows, exit codes.

Small hand-made score tables check the arithmetic against values worked out by hand and
scipy's bootstrap; real runs of jobs/ares.yaml (tests/support/nightly_runs.py) check the whole
command: the night whose answers were replaced on a known subset is flagged on exactly
the metrics and rows that a plain-Python recomputation of those metrics says changed.
"""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import polars as pl
import pytest
from scipy import stats

from support.nightly_runs import (
    ALTERED,
    ALTERED_NIGHT,
    DROPPED,
    N_NEW,
    NIGHTS,
    ORIGINAL,
    REEXPORTED,
    REEXPORTED_NAME,
    altered_answer,
    expected_answer_cells,
    read_ares,
    row_id,
    run_cli,
)
from ragbatch.analysis.compare import compare_runs, compare_scores
from ragbatch.analysis.compare_text import format_comparison
from ragbatch.analysis.intervals import N_RESAMPLES, SEED
from ragbatch.analysis.pairing import Pairing, content_keys, pair_by_content, pair_by_row_id
from ragbatch.analysis.runs import find_run, list_runs, previous_run


def _scipy_interval(diffs):
    """scipy's percentile bootstrap of the mean of the sorted differences (the comparison
    sorts them so that row order does not matter), with the same seed."""
    diffs = np.sort(np.asarray(diffs, dtype=float))
    if np.all(diffs == diffs[0]):  # every resample has the same mean
        return float(diffs[0]), float(diffs[0])
    res = stats.bootstrap(
        (diffs,),
        np.mean,
        vectorized=True,
        method="percentile",
        n_resamples=N_RESAMPLES,
        random_state=np.random.default_rng(SEED),
    )
    return res.confidence_interval.low, res.confidence_interval.high


# ----------------------------------------------------------------- pairing (no Ray)


def test_pair_by_row_id_splits_common_and_leftover():
    pairs, left_b, left_c = pair_by_row_id(["a", "b", "c", "b"], ["c", "d", "a"])
    assert pairs.rows() == [("a", "a", "row_id"), ("c", "c", "row_id")]
    assert (left_b, left_c) == (["b"], ["d"])
    pairs, left_b, left_c = pair_by_row_id([], [])
    assert pairs.height == 0 and left_b == left_c == []


def test_content_keys_compare_values_exactly():
    rows = pl.DataFrame(
        {
            "row_id": ["null", "empty", "nfd", "nfc", "list2", "list1", "cjk", "cjk2"],
            "question": [None, "", "cafe\u0301", "caf\u00e9", "q", "q", "检索 😀", "检索 😀"],
            "contexts": [["x"], ["x"], ["x"], ["x"], ["a", "b"], ["ab"], [], []],
        }
    )
    keys = dict(content_keys(rows, ["question", "contexts"]).iter_rows())
    assert keys["null"] != keys["empty"]  # null is not ""
    assert keys["nfd"] != keys["nfc"]  # no Unicode normalization
    assert keys["list2"] != keys["list1"]  # ["a", "b"] is not ["ab"]
    assert keys["cjk"] == keys["cjk2"]  # equal values, equal keys
    assert all(re.fullmatch(r"[0-9a-f]{64}", k) for k in keys.values())
    with pytest.raises(Exception, match="reference"):
        content_keys(rows, ["reference"])


def test_pair_by_content_pairs_unique_keys_and_reports_duplicates():
    base = pl.DataFrame({"row_id": ["A", "B", "C", "D"], "question": ["q1", "q2", "q2", "q3"]})
    cand = pl.DataFrame({"row_id": ["a", "b", "d"], "question": ["q1", "q2", "q4"]})
    pairs, amb_b, amb_c = pair_by_content(base, cand, ["question"])
    assert pairs.rows() == [("A", "a", "content")]
    assert (amb_b, amb_c) == (["B", "C"], ["b"])


# --------------------------------------------------------- comparison arithmetic (no Ray)


def _scores(rows):
    """Long scores table from (row_id, metric, score, status, app)."""
    return pl.DataFrame(
        rows,
        schema={
            "row_id": pl.String,
            "metric": pl.String,
            "score": pl.Float64,
            "status": pl.String,
            "app": pl.String,
        },
        orient="row",
    ).with_columns(reason=pl.concat_str(pl.lit("why "), "row_id"))


BASE = _scores(
    [
        ("r1", "acc", 1.0, "ok", "检索"),
        ("r2", "acc", 1.0, "ok", "检索"),
        ("r3", "acc", 0.0, "ok", "😀"),
        ("r4", "acc", 1.0, "ok", None),
        ("r5", "acc", 0.5, "ok", None),
        ("r6", "acc", 1.0, "ok", "😀"),
        ("r1", "pii", 0.0, "ok", "检索"),
        ("r2", "pii", 0.0, "ok", "检索"),
        ("r3", "pii", 1.0, "ok", "😀"),
        ("r4", "pii", 0.0, "ok", None),
        ("r5", "pii", 0.0, "ok", None),
        ("r6", "pii", 0.0, "ok", "😀"),
        ("r1", "gone", 1.0, "ok", "检索"),
    ]
)
CAND = _scores(
    [
        ("r1", "acc", 0.0, "ok", "检索"),
        ("r2", "acc", 1.0, "ok", "检索"),
        ("r3", "acc", 0.0, "ok", "😀"),
        ("r4", "acc", 0.0, "ok", None),
        ("r5", "acc", None, "timeout", None),
        ("r7", "acc", 1.0, "ok", "😀"),
        ("r1", "pii", 1.0, "ok", "检索"),
        ("r2", "pii", 1.0, "ok", "检索"),
        ("r3", "pii", 1.0, "ok", "😀"),
        ("r4", "pii", 1.0, "ok", None),
        ("r5", "pii", 1.0, "ok", None),
        ("r7", "pii", 0.0, "ok", "😀"),
        ("r1", "new", 0.5, "ok", "检索"),
    ]
)


def _step_up(p_values):
    """Benjamini-Hochberg adjusted p-values by the textbook rule: sort ascending, scale
    the i-th smallest by m / i, then take running minima from the largest down."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    out = [0.0] * m
    running = 1.0
    for rank in range(m, 0, -1):
        i = order[rank - 1]
        running = min(running, p_values[i] * m / rank)
        out[i] = running
    return out


def _reference_p(test, diffs):
    """The two-sided p-value of ``diffs`` by the named test, from SciPy directly."""
    from scipy import stats

    d = np.asarray(diffs, dtype=float)
    if test == "mcnemar_exact":
        up, down = int((d > 0).sum()), int((d < 0).sum())
        return 1.0 if up + down == 0 else stats.binomtest(up, up + down, 0.5).pvalue
    assert test == "paired_t"
    return 1.0 if not d.any() else stats.ttest_1samp(d, 0.0).pvalue


@pytest.fixture(scope="module")
def small_comparison():
    pairs, left_b, left_c = pair_by_row_id(
        BASE["row_id"].unique().to_list(), CAND["row_id"].unique().to_list()
    )
    return compare_scores(
        BASE,
        CAND,
        Pairing(pairs, left_b, left_c),
        {"acc": True, "pii": False},
        by=["app"],
        top=2,
        threshold=0.3,
        # a handful of hand-worked pairs: the per-line interval rule (control across
        # lines is tested in tests/test_compare_fdr.py)
        fdr=None,
    )


def test_paired_differences_by_hand_and_scipy(small_comparison):
    table = small_comparison.metrics
    acc = table.filter(pl.col("metric") == "acc", pl.col("slice").is_null()).row(0, named=True)
    # pairs r1..r5; r5 is a timeout in the candidate, so 4 pairs ok in both:
    # diffs r1 -1, r2 0, r3 0, r4 -1 -> mean -0.5; baseline mean 0.75, candidate 0.25
    assert (acc["n_pairs"], acc["n_status_changed"]) == (4, 1)
    assert acc["mean_diff"] == pytest.approx(-0.5)
    assert (acc["baseline_mean"], acc["candidate_mean"]) == (
        pytest.approx(0.75),
        pytest.approx(0.25),
    )
    low, high = _scipy_interval([-1.0, 0.0, 0.0, -1.0])
    assert (acc["ci_low"], acc["ci_high"]) == (pytest.approx(low), pytest.approx(high))
    assert acc["significant"] is bool(high < 0) and acc["change"] == ("worse" if high < 0 else None)
    # pii is lower-is-better: diffs +1 +1 0 +1 +1 over 5 pairs -> worse, mean 0.8
    pii = table.filter(pl.col("metric") == "pii", pl.col("slice").is_null()).row(0, named=True)
    assert (pii["n_pairs"], pii["mean_diff"]) == (5, pytest.approx(0.8))
    low, high = _scipy_interval([1.0, 1.0, 0.0, 1.0, 1.0])
    assert (pii["ci_low"], pii["ci_high"]) == (pytest.approx(low), pytest.approx(high))
    assert low > 0 and pii["change"] == "worse" and pii["higher_is_better"] is False


def test_slices_include_cjk_emoji_and_null_values(small_comparison):
    acc = small_comparison.metrics.filter(pl.col("metric") == "acc", pl.col("slice") == "app")
    got = {r["slice_value"]: (r["n_pairs"], r["mean_diff"]) for r in acc.iter_rows(named=True)}
    # 检索: r1 -1, r2 0; 😀: r3 0 (r6 unpaired); null: r4 -1 (r5 status changed)
    assert got == {
        "检索": (2, pytest.approx(-0.5)),
        "😀": (1, pytest.approx(0.0)),
        None: (1, pytest.approx(-1.0)),
    }


def test_moved_rows_status_changes_and_unshared_metrics(small_comparison):
    moved = small_comparison.moved
    assert moved.filter(pl.col("metric") == "acc").select(
        "baseline_row_id", "diff", "change"
    ).rows() == [("r1", -1.0, "worse"), ("r4", -1.0, "worse")]
    # top=2 keeps the first two of four pii moves (ties by row id)
    assert moved.filter(pl.col("metric") == "pii")["baseline_row_id"].to_list() == ["r1", "r2"]
    assert moved.row(0, named=True)["baseline_reason"] == "why r1"
    assert small_comparison.status_changes.rows() == [("acc", "ok", "timeout", 1)]
    assert small_comparison.status_changed_rows["baseline_row_id"].to_list() == ["r5"]
    assert small_comparison.pairing.only_baseline == ["r6"]
    assert small_comparison.pairing.only_candidate == ["r7"]
    assert (small_comparison.metrics_only_baseline, small_comparison.metrics_only_candidate) == (
        ["gone"],
        ["new"],
    )


def test_regression_threshold_in_metric_units(small_comparison):
    # acc: -0.5 (if significant), pii: +0.8 on a lower-is-better metric = worse by 0.8
    worse = set(
        small_comparison.metrics.filter(pl.col("slice").is_null(), pl.col("change") == "worse")[
            "metric"
        ]
    )
    assert set(small_comparison.regressions(0.3)["metric"]) == worse
    assert set(small_comparison.regressions(0.6)["metric"]) == {"pii"}
    assert small_comparison.regressions(0.8).height == 0  # "beyond": strictly larger
    text = format_comparison(small_comparison)
    assert "REGRESSION beyond 0.3" in text and "only in baseline: r6" in text


def test_large_comparisons_stay_cheap_and_match_the_normal_approximation():
    # 20,000 pairs: a continuous metric (many distinct differences) takes the normal
    # approximation, a 0/1 metric the multinomial bootstrap; both in well under a second.
    import time

    rng = np.random.default_rng(11)
    n = 20_000
    ids = [f"r{i}" for i in range(n)]
    base_sim, cand_sim = rng.random(n), rng.random(n)
    base_flag, cand_flag = (rng.random(n) < 0.5).astype(float), (rng.random(n) < 0.45).astype(float)

    def table(sim, flag):
        return pl.DataFrame(
            {
                "row_id": ids * 2,
                "metric": ["sim"] * n + ["flag"] * n,
                "score": np.concatenate([sim, flag]),
                "status": ["ok"] * (2 * n),
                "reason": [None] * (2 * n),
            }
        )

    pairs, _, _ = pair_by_row_id(ids, ids)
    start = time.perf_counter()
    result = compare_scores(
        table(base_sim, base_flag), table(cand_sim, cand_flag), Pairing(pairs), {}
    )
    assert time.perf_counter() - start < 10
    sim = result.metrics.filter(pl.col("metric") == "sim").row(0, named=True)
    d = cand_sim - base_sim
    half = 1.959963984540054 * d.std() / np.sqrt(n)  # population sd: the bootstrap's
    assert sim["ci_method"] == "normal" and sim["mean_diff"] == pytest.approx(d.mean())
    assert (sim["ci_low"], sim["ci_high"]) == (
        pytest.approx(d.mean() - half),
        pytest.approx(d.mean() + half),
    )
    flag = result.metrics.filter(pl.col("metric") == "flag").row(0, named=True)
    d = cand_flag - base_flag
    half = 1.959963984540054 * d.std() / np.sqrt(n)
    assert flag["ci_method"] == "bootstrap"
    assert flag["ci_low"] == pytest.approx(
        d.mean() - half, abs=0.002
    )  # bootstrap ~ normal at this n
    assert flag["significant"] and flag["change"] == "worse"


def test_no_common_metric_and_bad_arguments():
    empty = pl.DataFrame(
        {"row_id": ["a"], "metric": ["x"], "score": [1.0], "status": ["ok"], "reason": [None]}
    )
    other = empty.with_columns(metric=pl.lit("y"))
    pairs, _, _ = pair_by_row_id(["a"], ["a"])
    result = compare_scores(empty, other, Pairing(pairs), {})
    assert result.metrics.height == 0 and result.moved.height == 0
    assert "no metric computed by both runs" in format_comparison(result)
    with pytest.raises(Exception, match="--by 'nope'"):
        compare_scores(empty, empty, Pairing(pairs), {}, by=["nope"])
    with pytest.raises(Exception, match="must be >= 0"):
        compare_scores(empty, empty, Pairing(pairs), {}, threshold=-0.1)


# ------------------------------------------------------------- real runs of jobs/ares.yaml


@pytest.fixture(scope="module")
def expected_changes():
    """Per metric: the paired differences over rows ok in both nights, the moved rows and
    the status changes, from the raw TSV and the replacement answers."""
    header, rows = read_ares()
    answer = header.index("Answer")
    out = {m: {"diffs": [], "moved": set(), "status": {}} for m in expected_answer_cells("x")}
    out["context_length"] = {"diffs": None, "moved": set(), "status": {}}
    for i, row in enumerate(rows):
        before = expected_answer_cells(row[answer])
        after = expected_answer_cells(altered_answer(i) if i in ALTERED else row[answer])
        for metric, (status, score) in before.items():
            new_status, new_score = after[metric]
            if status == new_status == "ok":
                out[metric]["diffs"].append(new_score - score)
                if new_score != score:
                    out[metric]["moved"].add(row_id(i))
            elif status != new_status:
                key = (status, new_status)
                out[metric]["status"][key] = out[metric]["status"].get(key, 0) + 1
    return out


@pytest.mark.slow
def test_reexported_night_pairs_by_content_and_lists_leftovers(ares_nights, tmp_path):
    ids = ares_nights.run_ids
    out_json = tmp_path / "reexported.json"
    code, out, err = run_cli(
        [
            "compare",
            "--output",
            str(ares_nights.nightly),
            ids[ORIGINAL],
            ids[REEXPORTED],
            "--fail-on-regression",
            "0",
            "--json",
            str(out_json),
        ]
    )
    assert code == 0, err
    result = json.loads(out_json.read_text(encoding="utf-8"))
    pairing = result["pairing"]
    assert (pairing["row_id"], pairing["content"]) == (0, 200 - len(DROPPED))
    assert pairing["only_baseline_row_ids"] == sorted(row_id(i) for i in DROPPED)
    order = ares_nights.reexported_order
    assert pairing["only_candidate_row_ids"] == sorted(
        row_id(k, REEXPORTED_NAME) for k, source in enumerate(order) if source == -1
    )
    assert len(pairing["only_candidate_row_ids"]) == N_NEW
    # Same answers: nothing moved, nothing flagged, the gate passes at threshold 0.
    assert result["regressions"] == [] and result["moved"] == [] and result["status_changes"] == []
    assert all(
        m["mean_diff"] == 0 and not m["significant"] and m["n_pairs"] == 190
        for m in result["metrics"]
    )
    assert "190 paired (0 by row_id, 190 by content hash of question, contexts, reference)" in out
    assert f"10 only in baseline, {N_NEW} only in candidate" in out
    assert "no metric regresses beyond 0" in out
    # Each content pair joins a re-exported row with the shipped row it came from.
    result = compare_runs(
        find_run(str(ares_nights.nightly), ids[ORIGINAL]),
        find_run(str(ares_nights.nightly), ids[REEXPORTED]),
    )
    for base_id, cand_id in result.pairing.pairs.select(
        "baseline_row_id", "candidate_row_id"
    ).iter_rows():
        assert cand_id.startswith(REEXPORTED_NAME + ":")
        assert base_id == row_id(order[int(cand_id.rsplit(":", 1)[1])])


@pytest.mark.slow
def test_candidate_under_another_output_root(ares_nights, tmp_path):
    ids = ares_nights.run_ids
    other = tmp_path / "other_root"
    for table in ("scores", "summary", "runs"):
        part = f"{table}/run_date={REEXPORTED}/run_id={ids[REEXPORTED]}"
        shutil.copytree(ares_nights.nightly / part, other / part)
    code, out, err = run_cli(
        [
            "compare",
            "--output",
            str(ares_nights.nightly),
            "--candidate-output",
            str(other),
            ids[ORIGINAL],
            ids[REEXPORTED],
        ]
    )
    assert code == 0, err
    assert f"candidate: {ids[REEXPORTED]} ({REEXPORTED}, {other})" in out
    assert "190 paired" in out


@pytest.mark.slow
def test_altered_answers_are_flagged_on_the_right_metrics_and_rows(
    ares_nights, expected_changes, tmp_path
):
    ids = ares_nights.run_ids
    out_json = tmp_path / "altered.json"
    argv = [
        "compare",
        "--output",
        str(ares_nights.nightly),
        ids[ORIGINAL],
        ids[ALTERED_NIGHT],
        "--by",
        "Reaction",
        "--top",
        "50",
        "--json",
        str(out_json),
    ]
    code, out, err = run_cli(argv + ["--fail-on-regression", "0.02"])
    assert code == 3, err
    result = json.loads(out_json.read_text(encoding="utf-8"))
    overall = {m["metric"]: m for m in result["metrics"] if m["slice"] is None}
    assert set(overall) == set(expected_changes)
    # Benjamini-Hochberg over every line with a p-value, worked out here from the
    # reported p-values (a second implementation of the step-up rule)
    family = [m for m in result["metrics"] if m["p_value"] is not None]
    adjusted = {id(m): q for m, q in zip(family, _step_up([m["p_value"] for m in family]))}
    for m in family:
        assert m["p_adjusted"] == pytest.approx(adjusted[id(m)], rel=1e-9)
    assert result["fdr"] == 0.05 and result["fdr_method"] == "benjamini-hochberg"
    flagged = set()
    for metric, expected in expected_changes.items():
        got = overall[metric]
        if expected["diffs"] is None:  # contexts did not change
            assert got["n_pairs"] == 200 and got["mean_diff"] == 0 and not got["significant"]
            continue
        diffs = expected["diffs"]
        assert got["n_pairs"] == len(diffs)
        assert got["mean_diff"] == pytest.approx(np.mean(diffs), abs=1e-12)
        low, high = _scipy_interval(diffs)
        assert (got["ci_low"], got["ci_high"]) == (pytest.approx(low), pytest.approx(high))
        assert got["p_value"] == pytest.approx(_reference_p(got["test"], diffs), rel=1e-9)
        excludes_zero = bool(low > 0 or high < 0)
        assert got["significant"] is (excludes_zero and adjusted[id(got)] <= 0.05)
        if got["significant"]:
            flagged.add(metric)
        moved = {r["baseline_row_id"] for r in result["moved"] if r["metric"] == metric}
        assert moved == expected["moved"]
        assert moved <= {row_id(i) for i in ALTERED}
        status = {
            (r["baseline_status"], r["candidate_status"]): r["n"]
            for r in result["status_changes"]
            if r["metric"] == metric
        }
        assert status == expected["status"]
    # Worked out from the replacement answers: every one is a refusal (not_a_refusal 1 -> 0
    # on the 20 non-empty ones) and none names Databricks; lengths stay within [1, 4000].
    assert {"not_a_refusal", "mentions_databricks"} <= flagged
    assert not {"response_length", "context_length"} & flagged
    assert set(result["regressions"]) == flagged  # every flagged change here is a drop
    assert "REGRESSION beyond 0.02" in out and "not_a_refusal" in out
    # Slice lines cover the Reaction values and add up to the overall pairs.
    by_reaction = [
        m for m in result["metrics"] if m["slice"] == "Reaction" and m["metric"] == "not_a_refusal"
    ]
    assert sum(m["n_pairs"] for m in by_reaction) == overall["not_a_refusal"]["n_pairs"]
    # A threshold larger than every drop passes the gate.
    biggest = max(abs(overall[m]["mean_diff"]) for m in flagged)
    code, out, _ = run_cli(argv + ["--fail-on-regression", f"{biggest + 0.01:.3f}"])
    assert code == 0 and "no metric regresses beyond" in out
    # --fdr off: each line flagged by its own interval, no adjusted p-values
    code, out, err = run_cli(argv + ["--fdr", "off"])
    assert code == 0, err
    off = json.loads(out_json.read_text(encoding="utf-8"))
    assert off["fdr"] is None and off["fdr_method"] is None
    for m in off["metrics"]:
        assert m["p_adjusted"] is None
        interval_flag = m["ci_low"] is not None and (m["ci_low"] > 0 or m["ci_high"] < 0)
        enough = m["slice"] is None or m["n_pairs"] >= 20
        assert m["significant"] is (interval_flag and enough)
    assert "--fdr off" in out


@pytest.mark.slow
def test_changed_input_is_not_read_again_and_rows_stay_unpaired(ares_nights):
    import os

    ids = ares_nights.run_ids
    candidate = find_run(str(ares_nights.nightly), ids[REEXPORTED])
    path = candidate.manifest.input.uri
    before = os.stat(path)
    os.utime(
        path, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9)
    )  # input touched after the run
    try:
        result = compare_runs(find_run(str(ares_nights.nightly), ids[ORIGINAL]), candidate)
    finally:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    counts = result.pairing.counts()
    assert (counts["row_id"], counts["content"]) == (0, 0)
    assert (counts["only_baseline"], counts["only_candidate"]) == (200, 190 + N_NEW)
    assert (
        "changed after run" in result.pairing.note
        and result.metrics["n_pairs"].to_list() == [0] * 6
    )
    assert "note: rows with different ids were not paired by content" in format_comparison(result)


@pytest.mark.slow
def test_match_on_a_slice_column_and_unknown_columns(ares_nights):
    ids = ares_nights.run_ids
    argv = ["compare", "--output", str(ares_nights.nightly), ids[ORIGINAL], ids[REEXPORTED]]
    # Sources repeats across rows: those rows are ambiguous and stay unpaired.
    code, out, err = run_cli(argv + ["--match-on", "Sources"])
    assert code == 0, err
    assert "content hash that is not unique" in out
    code, _, err = run_cli(argv + ["--match-on", "question,nope"])
    assert code == 2 and "--match-on 'nope'" in err and "Reaction" in err
    code, _, err = run_cli(argv + ["--by", "nope"])
    assert code == 2 and "--by 'nope'" in err


@pytest.mark.slow
def test_unknown_and_uncommitted_runs_exit_2(ares_nights, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(ares_nights.nightly, root)
    first = ares_nights.run_ids[NIGHTS[0]]
    # Fake of a crashed run (its leftovers, which a real crash leaves): a staging prefix
    # holding score files, and no manifest.
    staged = root / "_staging" / "run_id=crashed-fake" / "scores" / "attempt=1"
    shutil.copytree(root / "scores" / f"run_date={NIGHTS[0]}" / f"run_id={first}", staged)
    assert [r.run_id for r in list_runs(str(root))] == [ares_nights.run_ids[n] for n in NIGHTS]
    code, _, err = run_cli(["compare", "--output", str(root), first, "crashed-fake"])
    assert code == 2 and "'crashed-fake'" in err and "not committed" in err
    code, _, err = run_cli(["compare", "--output", str(root), first, "no-such-run"])
    assert (
        code == 2
        and "no committed run 'no-such-run'" in err
        and ares_nights.run_ids[ALTERED_NIGHT] in err
    )
    code, _, err = run_cli(["compare", "--output", str(tmp_path / "nothing"), first, first])
    assert code == 2 and "does not exist" in err


@pytest.mark.slow
def test_nightly_report_and_comparison_with_the_previous_committed_run(ares_nights):
    root = ares_nights.nightly
    runs = {r.run_id: r for r in list_runs(str(root))}
    ids = [ares_nights.run_ids[n] for n in NIGHTS]
    assert previous_run(runs[ids[0]]) is None
    assert previous_run(runs[ids[1]]).run_id == ids[0]
    assert previous_run(runs[ids[2]]).run_id == ids[1]
    for night, run_id in zip(NIGHTS, ids):
        folder = root / "reports" / f"run_date={night}" / f"run_id={run_id}"
        assert (folder / "report.html").stat().st_size > 10_000
        if night == NIGHTS[0]:
            assert not (folder / "comparison.json").exists()
            continue
        comparison = json.loads((folder / "comparison.json").read_text(encoding="utf-8"))
        assert comparison["baseline"]["run_id"] == ids[NIGHTS.index(night) - 1]
        assert comparison["candidate"]["run_id"] == run_id
        text = (folder / "comparison.txt").read_text(encoding="utf-8")
        assert text.startswith(f"baseline:  {comparison['baseline']['run_id']}")
        worse = {
            m["metric"]
            for m in comparison["metrics"]
            if m["slice"] is None and m["change"] == "worse"
        }
        # the re-exported night pairs with the first by content (same answers: no change);
        # the altered night pairs with the re-exported one by content too
        assert comparison["pairing"]["content"] == 190 and comparison["pairing"]["row_id"] == 0
        assert (worse == set()) if night == REEXPORTED else ("not_a_refusal" in worse)


# ------------------------------------------------- slice minimum and signed differences


def _slice_scores(groups: dict[str, tuple[int, float, float]]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Baseline and candidate tables: per app, ``n`` rows scored ``b`` then ``c``."""
    base, cand = [], []
    for app, (n, b, c) in groups.items():
        for i in range(n):
            base.append((f"{app}{i}", "acc", b, "ok", app))
            cand.append((f"{app}{i}", "acc", c, "ok", app))
    return _scores(base), _scores(cand)


def test_a_slice_needs_min_pairs_to_be_flagged_and_differences_carry_their_sign():
    # "tiny": 2 pairs that both rose by 0.12 (interval [0.12, 0.12], excludes zero);
    # "big": 20 pairs that all fell by 0.05; "flat": 30 pairs unchanged.
    base, cand = _slice_scores(
        {"tiny": (2, 0.5, 0.62), "big": (20, 0.5, 0.45), "flat": (30, 0.3, 0.3)}
    )
    pairs, left_b, left_c = pair_by_row_id(base["row_id"].to_list(), cand["row_id"].to_list())
    pairing = Pairing(pairs, left_b, left_c)
    result = compare_scores(base, cand, pairing, {"acc": True}, by=["app"])
    assert result.min_pairs == 20
    lines = {r["slice_value"]: r for r in result.metrics.iter_rows(named=True)}
    assert lines["tiny"]["n_pairs"] == 2 and lines["tiny"]["ci_low"] == pytest.approx(0.12)
    assert (lines["tiny"]["significant"], lines["tiny"]["change"]) == (False, None)
    assert (lines["big"]["n_pairs"], lines["big"]["significant"], lines["big"]["change"]) == (
        20,
        True,
        "worse",
    )
    assert lines["flat"]["change"] is None
    # all rows: 52 pairs, mean (2 * 0.12 - 20 * 0.05) / 52; no minimum applies there
    assert lines[None]["n_pairs"] == 52
    assert lines[None]["mean_diff"] == pytest.approx((2 * 0.12 - 20 * 0.05) / 52)

    text = format_comparison(result)
    tiny = next(line for line in text.splitlines() if "app=tiny" in line)
    big = next(line for line in text.splitlines() if "app=big" in line)
    assert re.search(r"\s2\s.*\+0\.120\s.*\(fewer than 20 pairs: not flagged\)$", tiny), tiny
    assert re.search(r"\s20\s.*-0\.050\s.*worse \*$", big), big
    assert "a slice needs at least 20 pairs to be flagged (--min-pairs)" in text
    assert result.to_dict()["min_pairs"] == 20

    lowered = compare_scores(base, cand, pairing, {"acc": True}, by=["app"], min_pairs=2)
    tiny = lowered.metrics.filter(pl.col("slice_value") == "tiny").row(0, named=True)
    assert (tiny["significant"], tiny["change"]) == (True, "better")
    with pytest.raises(Exception, match="--min-pairs 0: must be at least 1"):
        compare_scores(base, cand, pairing, {"acc": True}, by=["app"], min_pairs=0)
