"""Only the input columns a run uses are read (ragbatch.pipeline.projection): the
columns no metric reads are neither decoded nor normalized, and every cell is the same
as when everything is read."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragbatch.config.job import JobConfig
from ragbatch.io.read import read_task
from ragbatch.io.write import OutputLayout
from ragbatch.pipeline.in_process import execute_in_process
from ragbatch.pipeline.plan import build_plan
from ragbatch.pipeline.projection import project_input

#: Four rows: CJK, emoji and a combining mark in the texts, a duplicate pair (rows 0
#: and 1), a null reference, an empty context list, and two columns no metric reads:
#: ``tools`` (a struct, a type the Polars decoding path does not take) and ``blob``.
ROWS = {
    "id": ["r0", "r1", "r2", "r3"],
    "q": ["Is Paris big?", "Is Paris big?", "东京在哪里?", None],
    "ctx": [["Paris is big."], ["Paris is big."], ["东京在日本。", "🗼"], []],
    "a": ["Yes.", "Yes.", "日本。", "e\u0301"],
    "ref": ["Yes.", "Yes.", "在日本", None],
    "lat": [1.0, 1.0, 2.5, None],
    "team": ["a", "a", "b", "b"],
    "tools": [{"n": 1}, {"n": 1}, None, {"n": 3}],
    "blob": ["x" * 50, "x" * 50, "y", None],
}


def _config(tmp_path: Path, metrics: list, **input_extra) -> JobConfig:
    src = tmp_path / "in.parquet"
    if not src.exists():
        pq.write_table(pa.table(ROWS), src)
    return JobConfig.from_dict(
        {
            "run": {"name": "projection"},
            "input": {
                "uri": str(src),
                "columns": {
                    "row_id": "id",
                    "question": "q",
                    "contexts": "ctx",
                    "answer": "a",
                    "reference": "ref",
                    "latency_s": "lat",
                },
                "slice_columns": ["team"],
                **input_extra,
            },
            "output": {"uri": str(tmp_path / "out")},
            "metrics": metrics,
        }
    )


LENGTHS = [
    {"name": "response_length", "params": {"min_chars": 1, "max_chars": 3}},
    {"name": "context_length", "params": {"min_chars": 1, "max_chars": 6}},
]


def test_the_projection_names_the_columns_the_metrics_read(tmp_path):
    plan = build_plan(_config(tmp_path, LENGTHS))
    got = project_input(plan)
    assert got.columns == {"id", "a", "ctx", "team"}
    assert got.unread == ("question", "reference", "latency_s")
    assert got.input.columns.question is None and got.input.columns.answer == "a"
    assert got.input.columns.row_id == "id"
    assert plan.config.input.columns.question == "q"  # the plan's own config is unchanged
    # exact_match reads the reference too.
    both = project_input(build_plan(_config(tmp_path, [{"name": "exact_match"}, *LENGTHS[:1]])))
    assert both.columns == {"id", "a", "ref", "team"}
    assert both.unread == ("question", "contexts", "latency_s")


def test_a_callback_metric_reads_every_column(tmp_path):
    # binary hands every canonical column to its callback: nothing is left out.
    callback = {
        "name": "binary",
        "params": {"callback": "support.projection_callbacks:asks_about_paris", "mode": "row"},
    }
    got = project_input(build_plan(_config(tmp_path, [callback])))
    assert got.unread == ()
    assert got.columns == {"id", "q", "ctx", "a", "ref", "lat", "team"}


def test_a_filtered_table_input_reads_every_column(tmp_path):
    config = _config(tmp_path, LENGTHS)
    config.input.filter = [("team", "==", "a")]
    got = project_input(build_plan(config))
    assert got.columns is None and got.unread == ()


@pytest.mark.parametrize("views", [frozenset(), frozenset({"a", "ctx"})])
def test_read_task_reads_only_the_chosen_columns(tmp_path, views):
    plan = build_plan(_config(tmp_path, LENGTHS))
    (task,) = plan.read_tasks
    got = read_task(task, plan.config.input, views, frozenset({"ctx", "id", "a", "absent"}))
    assert got.column_names == ["id", "ctx", "a"]  # the file's order; "absent" ignored
    assert got.column("id").to_pylist() == ROWS["id"]
    assert got.column("ctx").to_pylist() == ROWS["ctx"]
    assert got.column("a").to_pylist() == ROWS["a"]
    # Every column without a choice, or when none of the chosen is in the file.
    assert read_task(task, plan.config.input).column_names == list(ROWS)
    assert read_task(task, plan.config.input, columns=frozenset({"nope"})).column_names == list(
        ROWS
    )


def test_read_task_chooses_columns_on_s3(tmp_path, s3_bucket, s3_storage_options):
    import fsspec

    fs = fsspec.filesystem("s3", **s3_storage_options)
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table(ROWS), src)
    fs.put(str(src), f"{s3_bucket}/proj/in.parquet")
    config = JobConfig.from_dict(
        {
            "run": {"name": "projection"},
            "input": {
                "uri": f"s3://{s3_bucket}/proj/in.parquet",
                "storage_options": s3_storage_options,
                "columns": {"row_id": "id", "answer": "a"},
            },
            "output": {"uri": str(tmp_path / "out")},
            "metrics": LENGTHS[:1],
        }
    )
    plan = build_plan(config)
    (task,) = plan.read_tasks
    got = read_task(task, config.input, frozenset(), frozenset({"id", "a"}))
    assert got.column_names == ["id", "a"]
    assert got.column("a").to_pylist() == ROWS["a"]


def _cells(tmp_path: Path, config: JobConfig, name: str) -> list[tuple]:
    plan = build_plan(config)
    layout = OutputLayout.for_run(config.output, dt.date(2026, 1, 2), name)
    scores = tmp_path / f"scores-{name}"
    assert execute_in_process(plan, layout, str(scores)).n_rows == 4
    return duckdb.sql(
        f"SELECT row_id, metric, score, status, reason, team FROM "
        f"read_parquet('{scores}/*.parquet') ORDER BY ALL"
    ).fetchall()


def test_a_projected_run_scores_every_cell_as_worked_out(tmp_path):
    # Worked out by hand. response_length in [1, 3] code points: "Yes." 4 -> 0,
    # "日本。" 3 -> 1, "e" + combining acute 2 -> 1. context_length in [1, 6]: "Paris is
    # big." 13 -> 0; "东京在日本。" 6 and the emoji 1 -> 1; [] -> not_applicable.
    # exact_match: rows 0 and 1 equal, row 2 not, row 3 has no reference.
    metrics = [*LENGTHS, {"name": "exact_match"}]
    got = _cells(tmp_path, _config(tmp_path, metrics), "projected")
    by_cell = {(r, m): (s, st) for r, m, s, st, _, _ in got}
    assert by_cell == {
        ("r0", "response_length"): (0.0, "ok"),
        ("r1", "response_length"): (0.0, "ok"),
        ("r2", "response_length"): (1.0, "ok"),
        ("r3", "response_length"): (1.0, "ok"),
        ("r0", "context_length"): (0.0, "ok"),
        ("r1", "context_length"): (0.0, "ok"),
        ("r2", "context_length"): (1.0, "ok"),
        ("r3", "context_length"): (None, "not_applicable"),
        ("r0", "exact_match"): (1.0, "ok"),
        ("r1", "exact_match"): (1.0, "ok"),
        ("r2", "exact_match"): (0.0, "ok"),
        ("r3", "exact_match"): (None, "missing_input"),
    }
    assert {(r, t) for r, _, _, _, _, t in got} == {
        ("r0", "a"),
        ("r1", "a"),
        ("r2", "b"),
        ("r3", "b"),
    }


def test_a_callback_still_sees_the_question(tmp_path):
    # The callback reads the question, which no other metric reads: it is read and
    # normalized (row 3's null question gives not_applicable).
    callback = {
        "name": "binary",
        "params": {"callback": "support.projection_callbacks:asks_about_paris", "mode": "row"},
    }
    got = _cells(tmp_path, _config(tmp_path, [callback, *LENGTHS[:1]]), "callback")
    assert [(r, s, st) for r, m, s, st, _, _ in got if m == "binary"] == [
        ("r0", 1.0, "ok"),
        ("r1", 1.0, "ok"),
        ("r2", 0.0, "ok"),
        ("r3", None, "not_applicable"),
    ]
