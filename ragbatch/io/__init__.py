"""Input layer: find, read and normalize RAG traces from any fsspec location.

Typical use (the runner does this per task, in one process)::

    tasks = plan_read(cfg.input)
    slices = slice_columns(cfg.input, peek_schema(cfg.input))
    for task in tasks:
        table = normalize(read_task(task, cfg.input), cfg.input, task, slices)
"""

from ragbatch.io.fs import describe_storage_error, is_process_local, resolve, to_pyarrow
from ragbatch.io.read import (
    NONSTRING_COLUMN,
    ReadTask,
    input_fingerprint,
    peek_schema,
    plan_read,
    read_task,
)
from ragbatch.io.contexts import CONTEXT_TEXT_FIELDS
from ragbatch.io.schema import check_columns, normalize, slice_columns

__all__ = [
    "CONTEXT_TEXT_FIELDS",
    "NONSTRING_COLUMN",
    "ReadTask",
    "check_columns",
    "describe_storage_error",
    "input_fingerprint",
    "is_process_local",
    "normalize",
    "peek_schema",
    "plan_read",
    "read_task",
    "resolve",
    "slice_columns",
    "to_pyarrow",
]
