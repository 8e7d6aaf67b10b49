"""Hostile and degenerate inputs for the run check, the summary and the in-process executor.

The run check (:func:`ragbatch.io.write.verify_run`) groups one metric's row ids when every
metric's row-id fingerprint agrees; the summary counts few-valued scores and all slice
columns in one DuckDB grouping; the executor runs two read tasks at once. Each test feeds
them what a user's data or a buggy metric can produce, with the expected figures worked
out here (by hand or with numpy over the cells) rather than taken from the code.
"""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support.score_cells import mean_ci_as_set, write_cells
import ragbatch.analysis.summary_groups as summary_groups
from ragbatch.analysis.summary import summarize_view
from ragbatch.analysis.summary_types import MetricInfo, SummarySettings
from ragbatch.config.job import JobConfig, OutputSection
from ragbatch.core.errors import ConservationError
from ragbatch.io.write import OutputLayout, verify_run

# ------------------------------------------------------------------------- run check


@pytest.fixture
def layout(tmp_path):
    return OutputLayout.for_run(OutputSection(uri=str(tmp_path / "out")), dt.date(2026, 1, 2), "r")


def test_a_cell_without_a_metric_id_is_a_conservation_error(layout, tmp_path):
    # Both metrics hold rows a and b; one more cell has a null metric and row id c: the
    # check names the stray cell and counts 3 distinct row ids instead of failing itself.
    f = write_cells(
        tmp_path / "a.parquet", ["a", "b", "a", "b", "c"], ["m1", "m1", "m2", "m2", None]
    )
    with pytest.raises(ConservationError) as err:
        verify_run(layout, [f], ["m1", "m2"], 2)
    assert "metric None is not in the config but has 1 cells" in str(err.value)
    assert "3 distinct row ids in the scores, expected 2" in str(err.value)


#: Two 16-character row ids whose DuckDB ``hash`` is equal: DuckDB hashes a string 8 bytes
#: at a time (state ^= block; state *= odd constant), so the second block can cancel any
#: difference in the first. Found by searching first blocks ``row-NNNN``.
COLLIDING = ("row-000100000000", "row-00030000000^")


def test_row_ids_of_equal_hash_swapped_between_metrics_are_found(layout, tmp_path):
    # m1 scores rows {x, a, b}, m2 rows {y, a, b}: 4 distinct row ids for 3 input rows,
    # though both metrics have 3 cells and x and y hash alike.
    x, y = COLLIDING
    (same,) = duckdb.connect().execute("SELECT hash(?) = hash(?)", [x, y]).fetchone()
    if not same:
        pytest.skip("this DuckDB hashes strings differently; the pair no longer collides")
    f = write_cells(tmp_path / "s.parquet", [x, "a", "b", y, "a", "b"], ["m1"] * 3 + ["m2"] * 3)
    with pytest.raises(ConservationError, match="4 distinct row ids in the scores, expected 3"):
        verify_run(layout, [f], ["m1", "m2"], 3)


QUOTED, UNICODE = "it's '; DROP TABLE s; --", "日本\u0301🙂"


@pytest.mark.parametrize(
    ("cells", "n_rows", "problems"),
    [
        # empty-string, backslash and quote row ids, hostile metric ids: all sound
        (["", "a\\b", "'"] * 2, 3, []),
        # one metric repeats a row id in place of another: same counts, other multiset
        (
            ["", "a\\b", "'", "", "", "'"],
            3,
            [
                "1 (row_id, metric) pairs appear more than once, e.g. ('', '日本\u0301🙂') x2; "
                "if input.columns maps row_id, that input column has duplicate values"
            ],
        ),
        # a null row id in one metric
        (["", "a\\b", "'", "", None, "'"], 3, ["4 distinct row ids in the scores, expected 3"]),
        # the first metric's row ids swapped for one the second lacks
        (["", "z", "'", "", "a\\b", "'"], 3, ["4 distinct row ids in the scores, expected 3"]),
    ],
)
def test_hostile_row_and_metric_ids_get_the_full_checks_messages(
    layout, tmp_path, cells, n_rows, problems
):
    metrics = [QUOTED] * 3 + [UNICODE] * 3
    f = write_cells(tmp_path / "c.parquet", cells, metrics)
    if not problems:
        assert verify_run(layout, [f], [QUOTED, UNICODE], n_rows).counts == {
            QUOTED: {"ok": 3},
            UNICODE: {"ok": 3},
        }
        return
    with pytest.raises(ConservationError) as err:
        verify_run(layout, [f], [QUOTED, UNICODE], n_rows)
    listed = str(err.value).split("\n  - ")[1:]
    assert listed == problems


def test_degenerate_runs_empty_unscored_metric_and_files_read_twice(layout, tmp_path):
    # No files and no rows: sound. No files for 2 rows, a configured metric without a
    # cell, the same file given twice: each named as the full check names it.
    assert verify_run(layout, [], ["m1"], 0).counts == {}
    with pytest.raises(ConservationError, match="metric 'm1': 0 cells, expected 2"):
        verify_run(layout, [], ["m1"], 2)
    f = write_cells(tmp_path / "d.parquet", ["a", "b", "a", "b"], ["m1", "m1", "m2", "m2"])
    with pytest.raises(ConservationError) as err:
        verify_run(layout, [f], ["m1", "m2", "m3"], 2)
    assert str(err.value).split("\n  - ")[1:] == ["metric 'm3': 0 cells, expected 2"]
    with pytest.raises(ConservationError) as err:
        verify_run(layout, [f, f], ["m1", "m2"], 2)
    assert str(err.value).split("\n  - ")[1:] == [
        "metric 'm1': 4 cells, expected 2",
        "metric 'm2': 4 cells, expected 2",
        "4 (row_id, metric) pairs appear more than once, e.g. ('a', 'm1') x2, "
        "('a', 'm2') x2, ('b', 'm1') x2, ('b', 'm2') x2; if input.columns maps row_id, "
        "that input column has duplicate values",
    ]


# --------------------------------------------------------------------------- summary


def _summarize(tmp_path: Path, table: pa.Table, metrics, slices, settings) -> list[dict]:
    path = tmp_path / f"scores-{len(list(tmp_path.glob('scores-*')))}.parquet"
    pq.write_table(table, path)
    con = duckdb.connect()
    con.execute(f"CREATE VIEW s AS SELECT * FROM read_parquet('{path}')").fetchall()
    return summarize_view(con, metrics, slices, settings).table.to_pylist()


def _expected_row(scores: np.ndarray, status: np.ndarray, settings: SummarySettings) -> dict:
    """A summary row's counts and interval worked out with numpy and mean_ci over the
    group's cells: ``scores`` (NaN where not ok) and ``status``."""
    ok = np.sort(scores[status == "ok"])
    mean, low, high, method = mean_ci_as_set(ok, settings)
    return {
        "n_total": status.size,
        "n_ok": ok.size,
        "n_error": int((status == "error").sum()),
        "n_pass": int((ok == 1.0).sum()),
        "mean": mean,
        "mean_ci_low": low,
        "mean_ci_high": high,
        "mean_ci_method": method,
    }


def _assert_matches(row: dict, want: dict) -> None:
    got = {k: row[k] for k in want if k != "n_pass"}
    got["n_pass"] = round(row["pass_rate"] * row["n_ok"]) if row["n_ok"] else 0
    for key in ("mean", "mean_ci_low", "mean_ci_high"):
        if want[key] is not None:
            assert got[key] == pytest.approx(want[key], rel=1e-12, abs=1e-12), key
            got[key] = want[key]
    assert got == want


#: Slice values a user's data can hold: SQL-hostile text, a NUL, a long value, CJK,
#: emoji, "é" composed and decomposed (two values), and null.
HOSTILE_TEXT = [
    "it's",
    "a\\b",
    "'; DROP TABLE s; --",
    "x\x00y",
    "L" * 5000,
    "红",
    "🙂",
    "e\u0301",
    "\u00e9",
    None,
]


@pytest.mark.parametrize("path", ["one grouping", "per column", "sorted"])
def test_hostile_slice_values_of_every_type(tmp_path, monkeypatch, path):
    # 400 cells over slice columns of text, bool, float (NaN, -0.0, inf), date, list and
    # struct values, each with nulls; 6 values kept per column, the rest pooled (the 6th
    # and 7th text values tie). Scores
    # -0.0, 0.25, 0.9999999999999999 and 1.0 (only 1.0 passes), 10% errors. Counted in
    # one grouping, per slice column, or (max_distinct exceeded on purpose) as a sorted
    # stream: every text-slice row equals the counts and mean_ci worked out here, and
    # every column's rows add up to the overall counts.
    monkeypatch.setattr(summary_groups, "MAX_GROUP_ROWS", 1 if path == "per column" else 1 << 40)
    if path == "sorted":
        real = summary_groups.distinct_ok_scores
        monkeypatch.setattr(
            summary_groups,
            "distinct_ok_scores",
            lambda con, ids: {k: 10**9 for k in real(con, ids)},
        )
    rng = np.random.default_rng(17)
    n = 400
    text = np.array(HOSTILE_TEXT, dtype=object)[rng.integers(0, len(HOSTILE_TEXT), n)]
    floats = [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1.5, None]
    status = np.where(rng.random(n) < 0.1, "error", "ok")
    scores = np.array([-0.0, 0.25, 0.9999999999999999, 1.0])[rng.integers(0, 4, n)]
    scores[status != "ok"] = np.nan
    k = rng.integers(0, 7, n)
    table = pa.table(
        {
            "metric": ["m"] * n,
            "status": status,
            "score": pa.array(scores, from_pandas=True),
            "txt": pa.array(text.tolist(), pa.string()),
            "flag": pa.array([None if i == 0 else bool(i % 2) for i in k], pa.bool_()),
            "fl": pa.array([floats[i] for i in k], pa.float64()),
            "day": pa.array([None if i == 0 else dt.date(2024, i, 1) for i in k], pa.date32()),
            "lst": pa.array([None if i == 0 else ["a,b"] * (i % 3) for i in k]),
            "st": pa.array([None if i == 0 else {"a": int(i % 2), "b": "q'"} for i in k]),
        }
    )
    slices = ["txt", "flag", "fl", "day", "lst", "st"]
    settings = SummarySettings(
        max_resample_n=30, max_distinct=8, n_resamples=200, max_slice_values=6
    )
    rows = _summarize(tmp_path, table, [MetricInfo("m", "exact_match", True)], slices, settings)
    _assert_matches(rows[0], _expected_row(scores, status, settings))
    for column in slices:
        group = [r for r in rows if r["slice_column"] == column]
        assert sum(r["n_total"] for r in group) == n, column
        assert sum(r["n_ok"] for r in group) == rows[0]["n_ok"], column
    # the text column's groups by hand: the 6 most frequent values (ties by text, null
    # last), then the pooled ones
    counts = {v: int(sum(t == v for t in text)) for v in HOSTILE_TEXT}
    order = sorted(counts, key=lambda v: (-counts[v], v is None, v or ""))
    kept = order[:6]
    assert counts[order[5]] == counts[order[6]]
    text_rows = [r for r in rows if r["slice_column"] == "txt"]
    assert [r["slice_value"] for r in text_rows] == kept + [None]
    assert [r["slice_other"] for r in text_rows] == [False] * 6 + [True]
    for row, value in zip(text_rows, kept + ["pooled"]):
        mask = np.array(
            [t not in kept for t in text] if value == "pooled" else [t == value for t in text]
        )
        _assert_matches(row, _expected_row(scores[mask], status[mask], settings))


@pytest.mark.parametrize("extra", [[], [0.5]])
def test_scores_at_and_past_max_distinct(tmp_path, monkeypatch, extra):
    # max_distinct 4. Scores -0.0, 0.0 (one value), 0.25, 0.9999999999999999 and 1.0: 4
    # distinct, counted. With 0.5 as well: 5, a sorted stream. Either way each row is
    # mean_ci of its sorted scores, and only the exact 1.0 passes.
    values = [-0.0, 0.0, 0.25, 0.9999999999999999, 1.0, *extra]
    other = "ok_streams" if not extra else "counted_streams"

    def wrong_path(*args, **kwargs):
        raise AssertionError(f"{len(values)} scores must not take {other}")

    monkeypatch.setattr(summary_groups, other, wrong_path)
    n = 240
    scores = np.array(values)[np.arange(n) * 7 % len(values)]
    status = np.array(["ok"] * n)
    half = np.where(np.arange(n) % 3 == 0, "a", "b")
    table = pa.table({"metric": ["m"] * n, "status": status, "score": scores, "half": half})
    settings = SummarySettings(max_resample_n=50, max_distinct=4, n_resamples=300)
    rows = _summarize(tmp_path, table, [MetricInfo("m", "exact_match", True)], ["half"], settings)
    assert [r["slice_value"] for r in rows] == [None, "b", "a"]
    for row, mask in zip(rows, [half == half, half == "b", half == "a"]):
        _assert_matches(row, _expected_row(scores[mask], status[mask], settings))


def test_metrics_without_ok_cells_or_any_cell_and_an_empty_run(tmp_path):
    # A metric id full of quotes whose cells all failed, a unicode one with scores, one
    # in the config without a cell, and the same metrics over no cells at all.
    quoted, cjk, absent = "it's '; DROP TABLE s; --", "日本\u0301🙂", "absent"
    metrics = [MetricInfo(m, "exact_match", True) for m in (quoted, cjk, absent)]
    table = pa.table(
        {
            "metric": [quoted, quoted, cjk, cjk, cjk],
            "status": ["error", "timeout", "ok", "ok", "error"],
            "score": pa.array([None, None, 1.0, 0.0, None], pa.float64()),
            "app": ["'", None, "'", None, None],
        }
    )
    settings = SummarySettings(n_resamples=200)
    rows = _summarize(tmp_path, table, metrics, ["app"], settings)
    # per metric: the overall row, then app's values by cells: null (3), then "'" (2)
    assert [(r["metric"], r["slice_column"], r["slice_value"]) for r in rows] == [
        (m, c, v)
        for m in (quoted, cjk, absent)
        for c, v in [(None, None), ("app", None), ("app", "'")]
    ]
    quoted_app = [(r["n_total"], r["n_error"], r["n_timeout"], r["mean"]) for r in rows[1:3]]
    assert quoted_app == [(1, 0, 1, None), (1, 1, 0, None)]
    assert [(r["n_ok"], r["mean"], r["pass_rate"]) for r in rows[4:6]] == [
        (1, 0.0, 0.0),
        (1, 1.0, 1.0),
    ]
    overall = [r for r in rows if r["slice_column"] is None]
    assert [(r["n_total"], r["n_ok"], r["n_timeout"], r["mean"]) for r in overall] == [
        (2, 0, 1, None),
        (3, 2, 0, 0.5),
        (0, 0, 0, None),
    ]
    empty = table.slice(0, 0)
    rows = _summarize(tmp_path, empty, metrics, ["app"], settings)
    assert [(r["metric"], r["n_total"], r["mean"]) for r in rows] == [
        (m, 0, None) for m in (quoted, cjk, absent)
    ]


def test_many_slice_columns_split_the_counts_but_not_the_counted_scores(tmp_path):
    # 6 slice columns of 4 values: 5**6 code combinations, times 18 count rows each, is
    # over MAX_GROUP_ROWS (counts go one column at a time), times 2 distinct scores is
    # not (the scores are counted in one grouping). Every row against numpy.
    rng = np.random.default_rng(23)
    n = 600
    codes = rng.integers(0, 4, (6, n))
    status = np.where(rng.random(n) < 0.05, "error", "ok")
    scores = rng.integers(0, 2, n).astype(float)
    scores[status != "ok"] = np.nan
    table = pa.table(
        {
            "metric": ["m"] * n,
            "status": status,
            "score": pa.array(scores, from_pandas=True),
            **{f"c{j}": codes[j] for j in range(6)},
        }
    )
    settings = SummarySettings(max_resample_n=40, max_distinct=2, n_resamples=200)
    slices = [f"c{j}" for j in range(6)]
    kept = [[str(v) for v in range(4)]] * 6
    assert len(summary_groups.groupings(kept, 18)) == 6
    assert len(summary_groups.groupings(kept, 2)) == 1
    rows = _summarize(tmp_path, table, [MetricInfo("m", "exact_match", True)], slices, settings)
    assert len(rows) == 1 + 6 * 4
    _assert_matches(rows[0], _expected_row(scores, status, settings))
    for row in rows[1:]:
        mask = codes[int(row["slice_column"][1:])] == int(row["slice_value"])
        _assert_matches(row, _expected_row(scores[mask], status[mask], settings))


# ------------------------------------------------------------------ in-process executor


def _files_config(tmp_path: Path, n_files: int) -> JobConfig:
    """``n_files`` input files of 3 rows (one read task each): file k, row i answers
    ``"x" * (k + i)``, so response_length (1 to 5 characters) passes when 1 <= k + i <= 5."""
    src = tmp_path / "in"
    src.mkdir(parents=True)
    for k in range(n_files):
        pq.write_table(
            pa.table(
                {"q": [f"q{k}-{i}" for i in range(3)], "a": ["x" * (k + i) for i in range(3)]}
            ),
            src / f"f{k:02d}.parquet",
        )
    return JobConfig.from_dict(
        {
            "run": {"name": "hostile", "executor": "in_process"},
            "input": {"uri": str(src), "columns": {"question": "q", "answer": "a"}},
            "output": {"uri": str(tmp_path / "out")},
            "metrics": [{"name": "response_length", "params": {"min_chars": 1, "max_chars": 5}}],
        }
    )


def _read_failing(monkeypatch, failing: str, hold: str | None = None) -> list[str]:
    """Make the read of the file named ``failing`` raise; the read of ``hold`` waits
    until a task of the executor's pool has ended with an error. Returns the names of
    the files whose reads started, in order."""
    import ragbatch.io.read as read_module
    import ragbatch.pipeline.in_process as in_process

    real, started, failed = read_module.read_task, [], threading.Event()

    class Pool(in_process.ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):
            future = super().submit(fn, *args, **kwargs)
            future.add_done_callback(lambda f: f.exception() is None or failed.set())
            return future

    def read_task(task, cfg, *views):
        name = next(p for p in ("f00", "f01", "f02", "f03") if p in str(task))
        started.append(name)
        if name == failing:
            raise RuntimeError(f"cannot read {name}")
        if name == hold:
            assert failed.wait(30)
        return real(task, cfg, *views)

    monkeypatch.setattr(read_module, "read_task", read_task)
    monkeypatch.setattr(in_process, "ThreadPoolExecutor", Pool)
    return started


def test_no_task_starts_after_one_failed_while_the_other_runs(tmp_path, monkeypatch):
    # One task: one thread, its 3 rows read. Four tasks, two in flight: task 1 fails while
    # task 0 is still reading. Task 0 finishes and writes its file; tasks 2 and 3 never
    # start; task 1's error is raised.
    from ragbatch.pipeline.in_process import execute_in_process
    from ragbatch.pipeline.plan import build_plan

    one = _files_config(tmp_path / "one", 1)
    layout = OutputLayout.for_run(one.output, dt.date(2026, 1, 2), "one")
    assert execute_in_process(build_plan(one), layout, str(tmp_path / "one-scores")).n_rows == 3
    assert len(list((tmp_path / "one-scores").glob("*.parquet"))) == 1
    config = _files_config(tmp_path, 4)
    plan = build_plan(config)
    started = _read_failing(monkeypatch, failing="f01", hold="f00")
    layout = OutputLayout.for_run(config.output, dt.date(2026, 1, 2), "x")
    scores = tmp_path / "scores"
    with pytest.raises(RuntimeError, match="cannot read f01"):
        execute_in_process(plan, layout, str(scores))
    assert sorted(started) == ["f00", "f01"]
    assert [p.name.split("-")[1] for p in scores.glob("*.parquet")] == ["000000"]


def test_a_failed_last_task_then_a_resumed_attempt(tmp_path, monkeypatch):
    # A run of 3 tasks whose last one fails keeps the other two's files; the next attempt
    # scores only the last file's rows, and every (row, metric) cell is committed once
    # with the score worked out by hand.
    from ragbatch.pipeline.runner import run_job

    config = _files_config(tmp_path, 3)
    started = _read_failing(monkeypatch, failing="f02")
    with pytest.raises(RuntimeError, match="cannot read f02"):
        run_job(config, run_id="cut")
    assert sorted(started) == ["f00", "f01", "f02"]
    monkeypatch.undo()
    result = run_job(config, run_id="cut")
    assert result.manifest.resume.rows_reused == 6
    got = (
        duckdb.connect()
        .execute(
            f"SELECT row_id, score FROM read_parquet('{tmp_path}/out/scores/**/*.parquet') "
            "ORDER BY row_id"
        )
        .fetchall()
    )
    want = [(f"f{k:02d}.parquet:{i}", float(1 <= k + i <= 5)) for k in range(3) for i in range(3)]
    assert got == want
