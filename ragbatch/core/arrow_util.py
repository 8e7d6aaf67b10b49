"""Small Arrow helpers shared by the stages."""

from __future__ import annotations

import polars as pl
import pyarrow as pa


def plain_type(t: pa.DataType) -> pa.DataType:
    """``t`` with large/view string and list types replaced by their plain forms.

    Polars exports ``large_string`` and ``large_list``; the stages exchange plain
    ``string`` and ``list`` so that every block of a dataset has one schema.
    """
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_large_list(t) or pa.types.is_list_view(t) or pa.types.is_list(t):
        return pa.list_(plain_type(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, plain_type(f.type), f.nullable) for f in t])
    return t


def to_arrow(frame: pl.DataFrame) -> pa.Table:
    """Convert a Polars frame to an Arrow table with plain string/list types."""
    table = frame.to_arrow()
    schema = pa.schema([pa.field(f.name, plain_type(f.type), f.nullable) for f in table.schema])
    return table if schema == table.schema else table.cast(schema)
