"""A sample of the input and its row count, for plans made without running (dry runs).

The sample is the first rows of the input in read-task order (files in path order), read
and normalized to the canonical columns as a run would. The row count is exact where
that is cheap and estimated otherwise:

* Parquet files: exact, from their footers (no data is read).
* Text files (CSV, TSV, JSON lines, JSON) read for the sample: exact, counted.
* Other text files: counted too when together they hold at most
  :data:`COUNT_BYTES_LIMIT` bytes; beyond that, estimated from their size and the bytes
  per row of the text files already read, and marked as an estimate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from ragbatch.io.read import ReadTask, _parquet_metadata, read_task, read_task_head
from ragbatch.io.schema import normalize

if TYPE_CHECKING:
    from ragbatch.io.planned import PlannedInput

#: Most bytes of text files read only to count their rows; past it the rows of the files
#: not read for the sample are estimated from their size.
COUNT_BYTES_LIMIT = 64 << 20


@dataclass
class InputSize:
    """How many rows the input holds.

    Attributes
    ----------
    rows : int
        The count, or the estimate when ``exact`` is false.
    exact : bool
    how : str
        How it was obtained ("Parquet footers", "counted", or the estimate's basis).
    """

    rows: int
    exact: bool
    how: str


@dataclass
class InputSample:
    """The first rows of the input, normalized, and the input's size.

    Attributes
    ----------
    table : pyarrow.Table
        At most the requested number of rows, with the canonical columns
        (:func:`ragbatch.io.schema.normalize`) in input order.
    size : InputSize
    """

    table: pa.Table
    size: InputSize


def sample_input(plan: "PlannedInput", max_rows: int) -> InputSample:
    """Read the first ``max_rows`` rows of a plan's input and count its rows.

    Parameters
    ----------
    plan : ragbatch.io.planned.PlannedInput
        Built with the input inspected (``read_tasks`` and ``slices`` set).
    max_rows : int
        Sample size, at least 1.

    Returns
    -------
    InputSample

    Raises
    ------
    ValueError
        ``max_rows`` is below 1.
    InputError
        A file cannot be read (as :func:`ragbatch.io.read.read_task`).
    """
    if max_rows < 1:
        raise ValueError(f"the sample needs at least 1 row, got {max_rows}")
    cfg = plan.config.input
    tasks: list[ReadTask] = plan.read_tasks
    parts: list[pa.Table] = []
    counted: dict[str, int] = {}  # text file path -> rows
    taken = 0
    for task in tasks:
        if taken >= max_rows:
            break
        if task.format == "parquet":
            raw = read_task_head(task, cfg, max_rows - taken)
        else:
            raw = read_task(task, cfg)
            counted[task.path] = raw.num_rows
            raw = raw.slice(0, max_rows - taken)
        if raw.num_rows:
            parts.append(normalize(raw, cfg, task, plan.slices, quote_values=plan.quote_values))
            taken += raw.num_rows
    table = pa.concat_tables(parts, promote_options="permissive") if parts else pa.table({})
    return InputSample(table, _size(plan, counted))


def _size(plan: "PlannedInput", counted: dict[str, int]) -> InputSize:
    from ragbatch.io.fs import resolve

    cfg = plan.config.input
    fs, _ = resolve(cfg.uri, cfg.storage_options)
    parquet = sorted({t.path for t in plan.read_tasks if t.format == "parquet"})
    text = sorted({t.path for t in plan.read_tasks if t.format != "parquet"})
    rows = sum(_parquet_metadata(fs, path).num_rows for path in parquet)
    unread = [p for p in text if p not in counted]
    sizes = {p: int(fs.size(p) or 0) for p in text}
    if sum(sizes[p] for p in unread) <= COUNT_BYTES_LIMIT:
        by_task = {t.path: t for t in plan.read_tasks}
        for path in unread:
            counted[path] = read_task(by_task[path], cfg).num_rows
        unread = []
    rows += sum(counted.values())
    how = (
        " and ".join(
            part
            for part, present in (("Parquet footers", parquet), ("counted", counted))
            if present
        )
        or "counted"
    )
    if not unread:
        return InputSize(rows, True, how)
    read_bytes = sum(sizes[p] for p in counted)
    per_row = read_bytes / max(sum(counted.values()), 1)
    guess = round(sum(sizes[p] for p in unread) / per_row) if per_row else 0
    return InputSize(
        rows + guess,
        False,
        f"{how}; {len(unread)} of {len(text)} text files estimated from their "
        f"size at {per_row:,.0f} bytes per row",
    )
