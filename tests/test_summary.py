"""summary.parquet: counts, means, intervals per metric and slice value.

The run (tests/support/summary_run.py) has nine rows whose metric values are worked out by hand
below; intervals are checked against scipy (bootstrap with the same seed, binomtest's
Wilson interval), recomputed from the scores table with DuckDB.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy import stats

from support.score_cells import mean_ci_as_set
from support.summary_run import COMBINING, PRECOMPOSED, small_run
from ragbatch.analysis.intervals import N_RESAMPLES, SEED
from ragbatch.analysis.summary import summarize_run, summarize_view
from ragbatch.analysis.summary_types import SUMMARY_SCHEMA, MetricInfo, SummarySettings
from ragbatch.cli.run import _summary_text
from ragbatch.core.errors import OutputError
from ragbatch.core.status import STATUSES

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory, ray_local):
    return small_run(tmp_path_factory, ray_local)


@pytest.fixture(scope="module")
def rows(run):
    table = pq.read_table(run.layout.summary_path)
    assert table.schema.equals(SUMMARY_SCHEMA)
    return table.to_pylist()


def _scipy_bootstrap(values):
    values = np.sort(np.asarray(values, dtype=float))
    if values.size == 1:  # scipy needs two values; one value: every resample mean is it
        return values[0], values[0]
    res = stats.bootstrap(
        (values,),
        np.mean,
        vectorized=True,
        method="percentile",
        n_resamples=N_RESAMPLES,
        random_state=np.random.default_rng(SEED),
    )
    return res.confidence_interval.low, res.confidence_interval.high


def _wilson(k, n):
    ci = stats.binomtest(k, n).proportion_ci(method="wilson")
    return ci.low, ci.high


def _pick(rows, metric, column=None):
    return [r for r in rows if r["metric"] == metric and r["slice_column"] == column]


# Hand-worked from summary_run.ROWS (1 = pass):
#   exact_match (case-insensitive): 1, 0, missing (reference null), 1, 0, 1, 0, 1, 1
#   latency <= 1.0:                 1, 0, 1, missing (latency null), 0, 1, 1, 1, 1
# (n_total, n_ok, passes) per group:
EXPECTED = {
    ("exact_match", None): [(None, 9, 8, 5)],
    ("latency", None): [(None, 9, 8, 6)],
    # app: by cells, most first; ties by text in byte order with null last; "e" + U+0301
    # (0x65) sorts before precomposed U+00E9 (0xC3 0xA9).
    ("exact_match", "app"): [
        ("检索", 3, 2, 1),
        ("😀 bot", 2, 2, 1),
        (None, 2, 2, 2),
        (COMBINING, 1, 1, 0),
        (PRECOMPOSED, 1, 1, 1),
    ],
    ("latency", "app"): [
        ("检索", 3, 3, 2),
        ("😀 bot", 2, 1, 0),
        (None, 2, 2, 2),
        (COMBINING, 1, 1, 1),
        (PRECOMPOSED, 1, 1, 1),
    ],
    ("exact_match", "tier"): [("1", 6, 6, 4), ("2", 3, 2, 1)],
    ("latency", "tier"): [("1", 6, 6, 5), ("2", 3, 2, 1)],
}


def test_rows_in_order_with_hand_worked_counts_and_intervals(rows):
    assert [(r["metric"], r["slice_column"], r["slice_value"]) for r in rows] == [
        (metric, column, value)
        for metric in ("exact_match", "latency")
        for column in (None, "app", "tier")
        for value, *_ in EXPECTED[(metric, column)]
    ]
    for (metric, column), groups in EXPECTED.items():
        got = _pick(rows, metric, column)
        for r, (value, n_total, n_ok, passes) in zip(got, groups, strict=True):
            assert r["slice_value"] == value
            assert r["slice_other"] is (None if column is None else False)
            assert (r["n_total"], r["n_ok"]) == (n_total, n_ok)
            assert r["n_missing_input"] == n_total - n_ok
            assert sum(r[f"n_{s}"] for s in STATUSES) == n_total
            assert r["metric_name"] == metric
            scores = [1.0] * passes + [0.0] * (n_ok - passes)
            assert r["mean"] == pytest.approx(passes / n_ok)
            assert r["pass_rate"] == pytest.approx(passes / n_ok)
            low, high = _wilson(passes, n_ok)
            assert r["pass_rate_ci_low"] == pytest.approx(low, abs=1e-12)
            assert r["pass_rate_ci_high"] == pytest.approx(high, abs=1e-12)
            low, high = _scipy_bootstrap(scores)
            assert r["mean_ci_low"] == pytest.approx(low, rel=1e-9, abs=1e-12)
            assert r["mean_ci_high"] == pytest.approx(high, rel=1e-9, abs=1e-12)
            assert r["mean_ci_method"] == "bootstrap"


def test_hand_worked_interval_values(rows):
    # exact_match overall: 5 passes of 8. Wilson at z = 1.959964: centre
    # (0.625 + z²/16) / (1 + z²/8) = 0.865091 / 1.480182 = 0.584449; half-width
    # z / 1.480182 * sqrt(0.625 * 0.375 / 8 + z² / 256) = 1.324137 * 0.210482 = 0.278707.
    (overall,) = _pick(rows, "exact_match")
    assert overall["pass_rate_ci_low"] == pytest.approx(0.305742, abs=1e-6)
    assert overall["pass_rate_ci_high"] == pytest.approx(0.863156, abs=1e-6)
    # Null app: both rows pass, every resample mean is 1.
    null_app = _pick(rows, "exact_match", "app")[2]
    assert (null_app["mean"], null_app["mean_ci_low"], null_app["mean_ci_high"]) == (1.0, 1.0, 1.0)


def test_every_row_recomputed_from_the_scores_table(run, rows):
    # A second computation: group the committed scores with DuckDB, then scipy.
    con = duckdb.connect()
    scores = f"read_parquet('{run.layout.root}/scores/**/*.parquet', hive_partitioning = true)"
    for r in rows:
        where = f"metric = '{r['metric']}' AND run_id = '{run.run_id}'"
        if r["slice_column"] is not None:
            cast = f"CAST(\"{r['slice_column']}\" AS VARCHAR)"
            where += f" AND {cast} IS NULL" if r["slice_value"] is None else f" AND {cast} = $value"
        params = {"value": r["slice_value"]} if "$value" in where else {}
        n_total, values = con.execute(
            f"SELECT count(*), list(score) FILTER (WHERE status = 'ok') FROM {scores} WHERE {where}",
            params,
        ).fetchall()[0]
        assert n_total == r["n_total"] and len(values or []) == r["n_ok"]
        low, high = _scipy_bootstrap(values)
        assert (r["mean_ci_low"], r["mean_ci_high"]) == (pytest.approx(low), pytest.approx(high))


def test_manifest_records_settings_and_slice_values(run):
    manifest = json.loads(Path(run.layout.manifest_path).read_text(encoding="utf-8"))
    summary = manifest["summary"]
    assert (summary["confidence"], summary["n_resamples"], summary["seed"]) == (
        0.95,
        N_RESAMPLES,
        SEED,
    )
    assert summary["max_slice_values"] == 50
    assert summary["slice_columns"] == {
        "app": {"values": 5, "pooled_values": 0},
        "tier": {"values": 2, "pooled_values": 0},
    }
    assert "summary_s" in manifest["timings_s"]


def test_values_beyond_the_cap_are_pooled(run):
    # Keep 2 app values: 检索 and 😀 bot; null, COMBINING and PRECOMPOSED are pooled.
    files = sorted(str(p) for p in Path(run.layout.scores_path).glob("*.parquet"))
    summary = summarize_run(
        run.layout,
        files,
        [MetricInfo("exact_match", "exact_match", True)],
        ["app", "tier"],
        SummarySettings(max_slice_values=2),
    )
    app = _pick(summary.table.to_pylist(), "exact_match", "app")
    assert [(r["slice_value"], r["slice_other"], r["n_total"], r["n_ok"]) for r in app] == [
        ("检索", False, 3, 2),
        ("😀 bot", False, 2, 2),
        (None, True, 4, 4),
    ]
    assert app[2]["pass_rate"] == pytest.approx(3 / 4)  # null 2 of 2, COMBINING 0, PRECOMPOSED 1
    assert summary.slice_columns == {
        "app": {"values": 5, "pooled_values": 3},
        "tier": {"values": 2, "pooled_values": 0},
    }
    assert summary.manifest_info()["max_slice_values"] == 2


def test_cli_prints_overall_rows_only(rows):
    text = _summary_text(rows, 0.95)
    lines = text.splitlines()
    assert lines[0].split() == ["metric", "n", "ok", "mean", "95%", "CI", "other", "statuses"]
    assert len(lines) == 4  # header, rule, two metrics
    # exact_match is boolean: 5 of 8 ok cells pass, and the console shows the Wilson
    # interval of 5/8 (worked out by hand: centre 0.5845, half-width 0.2787), not the
    # bootstrap interval of the mean.
    assert lines[2].split() == [
        "exact_match",
        "9",
        "8",
        "0.625",
        "[0.306,",
        "0.863]",
        "missing_input=1",
    ]


def test_cli_shows_wilson_interval_for_a_unanimous_boolean_metric():
    # Three of three cells pass: the bootstrap interval of the mean is [1, 1]; the
    # Wilson interval of 3/3 at 95 % is [0.438503, 1] (z = 1.96: 9 / (9 + z^2) = 0.4385 for
    # the lower end, worked out by hand).
    row = {
        **{f"n_{s}": 0 for s in STATUSES},
        "metric": "hate_speech",
        "slice_column": None,
        "n_total": 3,
        "n_ok": 3,
        "mean": 1.0,
        "mean_ci_low": 1.0,
        "mean_ci_high": 1.0,
        "pass_rate": 1.0,
        "pass_rate_ci_low": 0.438503,
        "pass_rate_ci_high": 1.0,
    }
    line = _summary_text([row], 0.95).splitlines()[2]
    assert line.split()[:6] == ["hate_speech", "3", "3", "1.000", "[0.439,", "1.000]"]


# ------------------------------------------------------------- hand-made score tables


def _view(tmp_path, table: pa.Table) -> duckdb.DuckDBPyConnection:
    path = tmp_path / "scores.parquet"
    pq.write_table(table, path)
    con = duckdb.connect()
    con.execute(f"CREATE VIEW s AS SELECT * FROM read_parquet('{path}')").fetchall()
    return con


def test_non_boolean_metric_all_failed_group_and_float_slices(tmp_path):
    # Scores 0.2, 0.4, 0.9 for temp 0.5; two errors for temp null; a third metric row
    # keeps the view honest about metric filtering.
    table = pa.table(
        {
            "metric": ["sim"] * 5 + ["other"],
            "status": ["ok", "ok", "ok", "error", "timeout", "ok"],
            "score": [0.4, 0.2, 0.9, None, None, 0.0],
            "temp": pa.array([0.5, 0.5, 0.5, None, None, 0.5], pa.float64()),
        }
    )
    summary = summarize_view(
        _view(tmp_path, table), [MetricInfo("sim", "semantic_similarity", False)], ["temp"]
    )
    overall, half, null = summary.table.to_pylist()
    assert (overall["n_total"], overall["n_ok"], overall["n_error"], overall["n_timeout"]) == (
        5,
        3,
        1,
        1,
    )
    assert overall["mean"] == pytest.approx(0.5)
    assert overall["pass_rate"] is None and overall["pass_rate_ci_low"] is None
    assert (half["slice_value"], half["n_ok"]) == ("0.5", 3)
    low, high = _scipy_bootstrap([0.4, 0.2, 0.9])
    assert (half["mean_ci_low"], half["mean_ci_high"]) == (pytest.approx(low), pytest.approx(high))
    # every cell failed: counted, but no mean and no interval
    assert (null["slice_value"], null["slice_other"], null["n_total"], null["n_ok"]) == (
        None,
        False,
        2,
        0,
    )
    assert null["mean"] is None and null["mean_ci_low"] is None and null["mean_ci_method"] is None


def test_large_groups_use_the_scalable_paths(tmp_path):
    rng = np.random.default_rng(3)
    n = 6000
    continuous = rng.random(n)
    passes = (rng.random(n) < 0.4).astype(float)
    table = pa.table(
        {
            "metric": ["sim"] * n + ["flag"] * n,
            "status": ["ok"] * (2 * n),
            "score": np.concatenate([continuous, passes]),
            "app": ["a"] * (2 * n),
        }
    )
    summary = summarize_view(
        _view(tmp_path, table),
        [MetricInfo("sim", "semantic_similarity", False), MetricInfo("flag", "exact_match", True)],
        ["app"],
    )
    rows = summary.table.to_pylist()
    sim, flag = rows[0], rows[2]
    assert sim["mean_ci_method"] == "normal"
    half = 1.959963984540054 * continuous.std() / math.sqrt(n)
    assert sim["mean_ci_low"] == pytest.approx(continuous.mean() - half)
    assert flag["mean_ci_method"] == "bootstrap"  # two distinct values: multinomial draws
    k = int(passes.sum())
    low, high = _wilson(k, n)
    assert (flag["pass_rate_ci_low"], flag["pass_rate_ci_high"]) == (
        pytest.approx(low),
        pytest.approx(high),
    )
    # The bootstrap interval of a 0/1 mean is close to Wilson's at this size.
    assert flag["mean_ci_low"] == pytest.approx(low, abs=0.003)
    assert rows[1] == {**sim, "slice_column": "app", "slice_value": "a", "slice_other": False}


def test_nan_ok_score_is_an_error_naming_the_metric(tmp_path):
    table = pa.table(
        {
            "metric": ["sim", "sim"],
            "status": ["ok", "ok"],
            "score": pa.array([0.5, float("nan")], pa.float64()),
        }
    )
    with pytest.raises(OutputError, match="metric 'sim': 1 cells with status ok hold NaN"):
        summarize_view(
            _view(tmp_path, table), [MetricInfo("sim", "semantic_similarity", False)], []
        )


def test_empty_scores_give_zero_counts(tmp_path):
    table = pa.table(
        {
            "metric": pa.array([], pa.string()),
            "status": pa.array([], pa.string()),
            "score": pa.array([], pa.float64()),
            "app": pa.array([], pa.string()),
        }
    )
    summary = summarize_view(
        _view(tmp_path, table), [MetricInfo("m", "exact_match", True)], ["app"]
    )
    (row,) = summary.table.to_pylist()
    assert row["n_total"] == 0 and row["mean"] is None and row["pass_rate"] is None
    assert summary.slice_columns == {"app": {"values": 0, "pooled_values": 0}}


@pytest.mark.parametrize("chunk_rows", [1 << 20, 7])
def test_streamed_groups_equal_mean_ci_of_each_sorted_group(tmp_path, monkeypatch, chunk_rows):
    # 600 cells of one metric over two slice columns, small thresholds so that all three
    # interval paths occur: 'x' (300 scores on 3 values: multinomial), 'y' (30 scores:
    # index bootstrap), 'z' (270 scores, many values: normal). Streamed in batches of 7
    # scores, each group's interval must still be mean_ci of its sorted scores (exactly
    # for the bootstrap paths, to rounding for the normal one).
    import ragbatch.analysis.summary_groups as summary_groups

    monkeypatch.setattr(summary_groups, "CHUNK_ROWS", chunk_rows)
    rng = np.random.default_rng(11)
    app = np.array(["x"] * 300 + ["y"] * 30 + ["z"] * 270)
    score = np.concatenate([rng.choice([0.0, 0.5, 1.0], 300), rng.random(30), rng.random(270)])
    rng.shuffle(order := np.arange(600))
    app, score = app[order], score[order]
    region = np.where(np.arange(600) % 3 == 0, "北", "südlich")
    table = pa.table(
        {
            "metric": ["sim"] * 600,
            "status": ["ok"] * 600,
            "score": score,
            "app": app,
            "region": region,
        }
    )
    settings = SummarySettings(max_resample_n=50, max_distinct=4, n_resamples=300)
    rows = summarize_view(
        _view(tmp_path, table),
        [MetricInfo("sim", "semantic_similarity", False)],
        ["app", "region"],
        settings,
    ).table.to_pylist()
    groups = {(None, None): score}
    groups.update({("app", v): score[app == v] for v in ("x", "y", "z")})
    groups.update({("region", v): score[region == v] for v in ("北", "südlich")})
    assert len(rows) == len(groups)
    methods = set()
    for row in rows:
        values = np.sort(groups[(row["slice_column"], row["slice_value"])])
        mean, low, high, method = mean_ci_as_set(values, settings)
        methods.add((row["slice_value"], method))
        assert row["mean_ci_method"] == method
        assert row["n_ok"] == values.size
        if method == "bootstrap":
            assert (row["mean_ci_low"], row["mean_ci_high"]) == (
                pytest.approx(low, abs=1e-12),
                pytest.approx(high, abs=1e-12),
            )
        else:
            assert (row["mean"], row["mean_ci_low"]) == (pytest.approx(mean), pytest.approx(low))
    assert {("x", "bootstrap"), ("y", "bootstrap"), ("z", "normal")} <= methods


@pytest.mark.parametrize(
    ("max_group_rows", "materialize"), [(1 << 16, None), (1, None), (1 << 16, True)]
)
def test_counted_groups_equal_mean_ci_of_each_sorted_group(
    tmp_path, monkeypatch, max_group_rows, materialize
):
    # A metric of few distinct scores (5 values, max_distinct 8) takes the counted path:
    # DuckDB counts each score per group and no score leaves it. Every row must still be
    # mean_ci of its group's sorted scores, with counts by status and pass worked out
    # here with numpy: over three slice columns (one with a null value, one with values
    # pooled into 'other'), whether the slice columns are counted in one grouping or,
    # with max_group_rows 1, one at a time, and with the coded cells written out as a
    # table (as for scores on an object store). 12 error cells and a second metric sit
    # beside.
    import ragbatch.analysis.summary_groups as summary_groups

    monkeypatch.setattr(summary_groups, "MAX_GROUP_ROWS", max_group_rows)

    def no_sorted_stream(*args, **kwargs):
        raise AssertionError("a metric of 5 distinct scores must take the counted path")

    monkeypatch.setattr(summary_groups, "ok_streams", no_sorted_stream)
    rng = np.random.default_rng(29)
    n = 912
    score = rng.choice([0.0, 0.25, 0.5, 0.75, 1.0], n)
    status = np.array(["ok"] * n, dtype=object)
    status[rng.choice(n, 12, replace=False)] = "error"
    team = rng.choice(
        np.array(["红", "blue", "e\u0301", "🙂"], dtype=object), n, p=[0.5, 0.3, 0.15, 0.05]
    )
    tier = np.where(np.arange(n) % 150 == 0, None, np.where(np.arange(n) % 2 == 0, "gold", "free"))
    shard = (np.arange(n) % 4).astype(np.int64)
    ok = status == "ok"
    table = pa.table(
        {
            "metric": ["m"] * n + ["other"] * 3,
            "status": list(status) + ["ok"] * 3,
            "score": pa.array([s if k else None for s, k in zip(score, ok)] + [0.1, 0.2, 0.3]),
            "team": list(team) + ["红"] * 3,
            "tier": list(tier) + ["gold"] * 3,
            "shard": list(shard) + [0] * 3,
        }
    )
    settings = SummarySettings(
        max_resample_n=50, max_distinct=8, n_resamples=300, max_slice_values=2
    )
    rows = summarize_view(
        _view(tmp_path, table),
        [MetricInfo("m", "exact_match", True), MetricInfo("other", "semantic_similarity", False)],
        ["team", "tier", "shard"],
        settings,
        materialize=materialize,
    ).table.to_pylist()
    rows = [r for r in rows if r["metric"] == "m"]
    # the two most frequent values of each column get rows; 'team' pools 'e\u0301' and 🙂,
    # 'shard' pools two of its four values (equal counts: the smaller text first)
    all_teams = np.concatenate([team, ["红"] * 3])
    assert [r["slice_value"] for r in rows if r["slice_column"] == "team"] == ["红", "blue", None]
    masks = {(None, None, None): np.ones(n, bool)}
    masks[("team", "红", False)] = team == "红"
    masks[("team", "blue", False)] = team == "blue"
    masks[("team", None, True)] = ~np.isin(team, ["红", "blue"])
    masks[("tier", "free", False)] = tier == "free"
    masks[("tier", "gold", False)] = tier == "gold"
    masks[("tier", None, True)] = np.array([t is None for t in tier])
    for value in ("0", "1"):
        masks[("shard", value, False)] = shard == int(value)
    masks[("shard", None, True)] = shard >= 2
    assert len(all_teams) == n + 3
    assert sorted(
        ((r["slice_column"], r["slice_value"], r["slice_other"]) for r in rows),
        key=str,
    ) == sorted(masks, key=str)
    small = set()
    for row in rows:
        mask = masks[(row["slice_column"], row["slice_value"], row["slice_other"])]
        if (mask & ok).sum() <= 8:  # index bootstrap over the values rebuilt from counts
            small.add(row["slice_column"])
        values = np.sort(score[mask & ok])
        assert (row["n_total"], row["n_ok"], row["n_error"]) == (
            int(mask.sum()),
            int((mask & ok).sum()),
            int((mask & ~ok).sum()),
        )
        assert row["pass_rate"] == pytest.approx(float((values == 1.0).mean()))
        mean, low, high, method = mean_ci_as_set(values, settings)
        assert row["mean_ci_method"] == method == "bootstrap"
        assert (row["mean"], row["mean_ci_low"], row["mean_ci_high"]) == (
            pytest.approx(mean, rel=1e-12),
            pytest.approx(low, abs=1e-12),
            pytest.approx(high, abs=1e-12),
        )
    assert small == {"tier"}
