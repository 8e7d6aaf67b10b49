"""Local Parquet read through Polars' decoder: the same table as Arrow's reader."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragbatch.config.job import InputSection
from ragbatch.io import ReadTask, plan_read, read_task
from ragbatch.io.read import _read_row_groups, _read_text_columns_fast


def _write(path, table: pa.Table, rows_per_group: int = 2) -> None:
    pq.write_table(table, path, row_group_size=rows_per_group)


def _texts() -> pa.Table:
    schema = pa.schema(
        [
            pa.field("id", pa.string(), nullable=False),
            pa.field("contexts", pa.list_(pa.string())),
            pa.field("answer", pa.large_string()),
            pa.field("latency", pa.float64()),
            pa.field("n", pa.int32()),
            pa.field("ok", pa.bool_()),
        ],
        metadata={"origin": "test"},
    )
    return pa.table(
        [
            ["r0", "r1", "r2", "r3", "r4"],
            [["a", None], None, [], ["é 日本"], ["x", "y", "z"]],
            ["one", None, "", "four", "five"],
            [0.5, None, 1.0, 2.25, 3.0],
            [1, 2, None, 4, 5],
            [True, False, None, True, False],
        ],
        schema=schema,
    )


@pytest.mark.parametrize("groups", [None, (0,), (1, 2), (2,)])
def test_fast_read_equals_arrow_read(tmp_path, groups):
    path = tmp_path / "t.parquet"
    _write(path, _texts())
    task = ReadTask(str(path), "t.parquet", "parquet", 0, groups)
    fast = _read_text_columns_fast(pq.ParquetFile(path, memory_map=True), task)
    slow = _read_row_groups(pq.ParquetFile(path, memory_map=True), task)
    assert fast is not None
    assert fast.equals(slow)
    assert fast.schema.equals(slow.schema, check_metadata=True)


def test_read_task_values_through_the_fast_path(tmp_path):
    # Rows 2-3 (row group 1 of three of two rows each), written out by hand.
    path = tmp_path / "t.parquet"
    _write(path, _texts())
    table = read_task(
        ReadTask(str(path), "t.parquet", "parquet", 2, (1,)), InputSection(uri=str(path))
    )
    assert table.column("id").to_pylist() == ["r2", "r3"]
    assert table.column("contexts").to_pylist() == [[], ["é 日本"]]
    assert table.column("answer").to_pylist() == ["", "four"]
    assert table.column("n").to_pylist() == [None, 4]
    assert table.schema.field("contexts").type == pa.list_(pa.string())
    assert table.schema.field("answer").type == pa.large_string()
    assert not table.schema.field("id").nullable


def test_other_types_and_gaps_read_through_arrow(tmp_path):
    path = tmp_path / "t.parquet"
    table = _texts().append_column(
        "at", pa.array([dt.datetime(2024, 1, d) for d in range(1, 6)], pa.timestamp("us"))
    )
    _write(path, table)
    parquet = pq.ParquetFile(path, memory_map=True)
    task = ReadTask(str(path), "t.parquet", "parquet", 0, None)
    assert _read_text_columns_fast(parquet, task) is None  # a timestamp column
    gap = ReadTask(str(path), "t.parquet", "parquet", 0, (0, 2))
    plain = _texts()
    _write(tmp_path / "p.parquet", plain)
    assert _read_text_columns_fast(pq.ParquetFile(tmp_path / "p.parquet"), gap) is None
    got = read_task(task, InputSection(uri=str(path)))
    assert got.column("at").to_pylist()[4] == dt.datetime(2024, 1, 5)
    assert got.num_rows == 5


def test_planned_tasks_cover_every_row_once(tmp_path):
    path = tmp_path / "t.parquet"
    _write(path, _texts(), rows_per_group=1)
    cfg = InputSection(uri=str(path))
    ids = [
        i
        for t in plan_read(cfg, target_rows_per_task=2)
        for i in read_task(t, cfg)["id"].to_pylist()
    ]
    assert ids == ["r0", "r1", "r2", "r3", "r4"]
