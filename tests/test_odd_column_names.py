"""Input column names that used to crash a run or vanish from it.

A CSV written by ``pandas.DataFrame.to_csv()`` (unnamed index column first), a column named
like an internal one (``judge::<metric id>``, ``cell::<metric id>``), a column in the
pipeline's reserved namespace, and empty, whitespace-only or repeated names. Each run uses
real local Ray and real files, and each either commits with every value where it belongs
or stops before Ray with an InputError naming the column and the fix (exit 2 from the CLI).
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragbatch.cli import main
from ragbatch.core.columns import INTERNAL_PREFIX, JUDGE, JUDGE_FIELDS
from ragbatch.config.job import JobConfig
from ragbatch.core.errors import InputError
from ragbatch.pipeline.plan import build_plan
from ragbatch.pipeline.runner import run_job

pytestmark = pytest.mark.slow

METRICS = [{"name": "response_length", "params": {"max_chars": 3}}, {"name": "exact_match"}]


def _config(src: Path, out: Path, **input_extra) -> JobConfig:
    return JobConfig.from_dict(
        {
            "run": {"name": "odd-names"},
            "input": {
                "uri": str(src),
                "columns": {"answer": "answer", "reference": "ref"},
                **input_extra,
            },
            "output": {"uri": str(out)},
            "metrics": METRICS,
        }
    )


def _scores(result) -> tuple[list[str], list[list]]:
    """(column names, rows) of the committed scores, ordered by row and metric."""
    con = duckdb.connect()
    judge_columns = ", ".join([*(name for name, _ in JUDGE_FIELDS), JUDGE])
    cur = con.execute(
        f"SELECT * EXCLUDE (run_date, run_id, details, model, {judge_columns}) FROM read_parquet("
        f"'{result.layout.root}/scores/**/*.parquet', hive_partitioning=true) ORDER BY row_id, metric"
    )
    rows = [list(r) for r in cur.fetchall()]
    return [d[0] for d in cur.description], rows


def test_pandas_index_column_is_skipped_and_the_run_commits(ray_local, tmp_path):
    src = tmp_path / "traces.csv"
    pd.DataFrame({"answer": ["abcd", "ok"], "ref": ["abcd", "no"], "team": ["a", "b"]}).to_csv(src)
    assert src.read_text().splitlines()[0] == ",answer,ref,team"  # what pandas writes
    result = run_job(_config(src, tmp_path / "out"))
    columns, rows = _scores(result)
    assert columns == ["row_id", "metric", "score", "status", "reason", "team"]
    assert rows == [
        ["traces.csv:0", "exact_match", 1.0, "ok", None, "a"],
        ["traces.csv:0", "response_length", 0.0, "ok", "4 chars outside [0, 3]", "a"],
        ["traces.csv:1", "exact_match", 0.0, "ok", "answer differs from reference", "b"],
        ["traces.csv:1", "response_length", 1.0, "ok", None, "b"],
    ]


@pytest.mark.parametrize(
    "name", ["judge::response_length", "cell::exact_match", "judge::", "__ragbatch", "_issues"]
)
def test_columns_named_like_internal_ones_pass_through(ray_local, tmp_path, name):
    src = tmp_path / "traces.jsonl"
    rows = [{"answer": "abcd", "ref": "abcd", name: "x"}, {"answer": "ok", "ref": "no", name: "y"}]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run_job(_config(src, tmp_path / "out"))
    columns, rows = _scores(result)
    out_name = "input__issues" if name == "_issues" else name  # a reserved output name is renamed
    assert columns == ["row_id", "metric", "score", "status", "reason", out_name]
    assert [[r[0], r[1], r[2], r[5]] for r in rows] == [
        ["traces.jsonl:0", "exact_match", 1.0, "x"],
        ["traces.jsonl:0", "response_length", 0.0, "x"],
        ["traces.jsonl:1", "exact_match", 0.0, "y"],
        ["traces.jsonl:1", "response_length", 1.0, "y"],
    ]


def _write(fmt: str, path: Path, names: list[str]) -> Path:
    table = pa.Table.from_arrays(
        [pa.array(["abcd", "ok"]), pa.array(["abcd", "no"]), pa.array(["x", "y"])], names=names
    )
    if fmt == "parquet":
        pq.write_table(table, path)
    elif fmt == "csv":
        pd.DataFrame({n: table.column(i).to_pylist() for i, n in enumerate(names)}).to_csv(
            path, index=False
        )
    else:
        rows = [dict(zip(names, r)) for r in zip(*(c.to_pylist() for c in table.columns))]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    "fmt, names, message",
    [
        (
            "jsonl",
            ["answer", "ref", f"{INTERNAL_PREFIX}nonstring__"],
            "'__ragbatch_nonstring__' start with '__ragbatch_'.*rename them in the input",
        ),
        ("csv", ["answer", "ref", f"{INTERNAL_PREFIX}cell::x"], "start with '__ragbatch_'"),
        (
            "parquet",
            ["answer", "ref", f"{INTERNAL_PREFIX}judge::exact_match"],
            "start with '__ragbatch_'",
        ),
        (
            "jsonl",
            ["answer", "ref", ""],
            r"column 3 has an empty name \(''\); name it in the input",
        ),
        ("parquet", ["answer", "ref", ""], r"column 3 has an empty name"),
        ("csv", ["answer", "ref", "  "], r"column 3 has a whitespace-only name \('  '\)"),
        ("parquet", ["answer", "ref", "ref"], r"column name 'ref' appears 2 times"),
    ],
)
def test_unusable_names_stop_validate_and_run_before_ray(tmp_path, capsys, fmt, names, message):
    src = _write(fmt, tmp_path / f"traces.{fmt}", names)
    config = _config(src, tmp_path / "out")
    with pytest.raises(InputError, match=message):
        build_plan(config)  # what validate and run_job do first, before Ray starts
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(config.model_dump(mode="json", exclude_none=True)))
    assert main(["validate", str(path)]) == 2
    assert main(["run", str(path)]) == 2
    assert not (tmp_path / "out").exists()


def test_an_unusable_name_left_out_by_slice_columns_is_not_read(ray_local, tmp_path):
    src = _write("parquet", tmp_path / "traces.parquet", ["answer", "ref", " "])
    result = run_job(_config(src, tmp_path / "out", slice_columns=[]))
    assert _scores(result)[0] == ["row_id", "metric", "score", "status", "reason"]
