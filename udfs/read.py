"""Read stage: one Ray task per read task (a file or a slice of a Parquet file)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from ragbatch.config.job import InputSection
from ragbatch.io.read import ReadTask, read_task
from ragbatch.io.schema import normalize


def read_stage(
    batch: pa.Table,
    tasks: list[ReadTask],
    input_cfg: InputSection,
    slices: list[tuple[str, str]],
    ledger: Any = None,
    quote_values: bool = True,
) -> pa.Table:
    """Read and normalize the read tasks whose indices are in ``batch["task"]``.

    Returns canonical rows (``ragbatch.core.columns.CANONICAL_SCHEMA`` plus the planned
    ``slices``, so every block has the same columns) in task order. When ``ledger`` (a
    :class:`udfs.ledger.RunLedger` actor handle) is given, the row
    count of each task is recorded there, keyed by task index, so the driver knows how
    many rows entered the run even though it never sees them. ``quote_values`` is passed
    to :func:`ragbatch.io.schema.normalize` (false in runs with PII metrics).
    """
    tables = []
    for index in batch.column("task").to_pylist():
        task = tasks[index]
        table = normalize(
            read_task(task, input_cfg), input_cfg, task, slices=slices, quote_values=quote_values
        )
        if ledger is not None:
            import ray

            ray.get(ledger.record.remote(index, table.num_rows))
        tables.append(table)
    return pa.concat_tables(tables, promote_options="permissive") if len(tables) != 1 else tables[0]


def drop_rows(batch: pa.Table, row_ids: Any) -> pa.Table:
    """``batch`` without the rows whose ``row_id`` is in ``row_ids`` (a sorted list of
    str, or an object ref to one): the rows an earlier attempt of a resumed run scored."""
    import pyarrow.compute as pc

    if not isinstance(row_ids, list):
        import ray

        row_ids = ray.get(row_ids)
    if not row_ids or batch.num_rows == 0:
        return batch
    keep = pc.invert(pc.is_in(batch.column("row_id"), value_set=pa.array(row_ids, pa.string())))
    return batch.filter(keep)
