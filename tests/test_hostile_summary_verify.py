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
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragbatch.config.job import JobConfig, OutputSection
from ragbatch.core.errors import ConservationError
from ragbatch.io.write import OutputLayout, verify_run

# ------------------------------------------------------------------------- run check


@pytest.fixture
def layout(tmp_path):
    return OutputLayout.for_run(OutputSection(uri=str(tmp_path / "out")), dt.date(2026, 1, 2), "r")


def _cells(path: Path, row_ids: list, metrics: list) -> str:
    n = len(row_ids)
    pq.write_table(
        pa.table(
            {
                "row_id": pa.array(row_ids, pa.string()),
                "metric": pa.array(metrics, pa.string()),
                "score": pa.array(np.ones(n)),
                "status": pa.array(["ok"] * n),
                "model": pa.nulls(n, pa.string()),
            }
        ),
        path,
    )
    return str(path)


def test_a_cell_without_a_metric_id_is_a_conservation_error(layout, tmp_path):
    # Both metrics hold rows a and b; one more cell has a null metric and row id c: the
    # check names the stray cell and counts 3 distinct row ids instead of failing itself.
    f = _cells(tmp_path / "a.parquet", ["a", "b", "a", "b", "c"], ["m1", "m1", "m2", "m2", None])
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
    f = _cells(tmp_path / "s.parquet", [x, "a", "b", y, "a", "b"], ["m1"] * 3 + ["m2"] * 3)
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
    f = _cells(tmp_path / "c.parquet", cells, metrics)
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
    f = _cells(tmp_path / "d.parquet", ["a", "b", "a", "b"], ["m1", "m1", "m2", "m2"])
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
    until then (and a little longer, so the failure is recorded first). Returns the
    names of the files whose reads started, in order."""
    import ragbatch.io.read as read_module

    real, started, failed = read_module.read_task, [], threading.Event()

    def read_task(task, cfg):
        name = next(p for p in ("f00", "f01", "f02", "f03") if p in str(task))
        started.append(name)
        if name == failing:
            failed.set()
            raise RuntimeError(f"cannot read {name}")
        if name == hold:
            failed.wait(10)
            time.sleep(0.3)
        return real(task, cfg)

    monkeypatch.setattr(read_module, "read_task", read_task)
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
