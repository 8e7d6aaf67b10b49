"""Readers of input tables: input formats that name a table, not files.

A table format (``input.format: delta`` or ``iceberg``) resolves a table at one version
into the Parquet data files that make it up, each with its partition values. The rest of
the reading side treats those files as it treats a hive-partitioned Parquet directory
(:mod:`ragbatch.io.read`): one or more read tasks per data file, read through Ray Data on
the Ray path and in the ``ragbatch`` process in-process, each file straight from its
storage. Nothing of the table is copied to local disk.

Each format is one module here that registers a :class:`TableFormat` under its name; the
config knows the names and what each needs installed
(:data:`ragbatch.config.formats.TABLE_FORMATS`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from ragbatch.core.errors import InputError

if TYPE_CHECKING:
    import fsspec

    from ragbatch.config.job import InputSection
    from ragbatch.io.listing import InputFile

__all__ = ["TableFormat", "filter_rows", "register_table_format", "table_format"]


class TableFormat(Protocol):
    """A reader of one table format.

    Attributes
    ----------
    name : str
        The ``input.format`` it reads.
    """

    name: str

    def current_version(self, cfg: InputSection) -> int:
        """The table's current version (Delta: the latest commit version; Iceberg: the
        current snapshot id), the one a run pins when the format's pin field
        (:data:`ragbatch.config.formats.TABLE_FORMATS`) is unset.

        Raises
        ------
        InputNotFoundError
            No table at ``cfg.uri``.
        InputError
            The table cannot be opened.
        """
        ...

    def discover(self, cfg: InputSection) -> tuple[fsspec.AbstractFileSystem, list[InputFile]]:
        """The data files of the table at the pinned version (current when unset) that
        ``cfg.filter`` keeps, as :func:`ragbatch.io.listing.discover` returns files.

        Each file's ``format`` is ``parquet``, its ``key`` its path relative to the table
        root, its ``partition`` the partition values as text (null as
        ``__HIVE_DEFAULT_PARTITION__``), and its ``info`` holds ``size``, ``mtime`` and
        ``table_version`` (``{"format": name, <pin field>: int}``: what the run read).

        Raises
        ------
        InputNotFoundError
            No table at ``cfg.uri``.
        InputError
            The version does not exist, the table needs a reader feature this reader
            lacks, a filter names a column the table lacks, or no data file is left.
        """
        ...


_FORMATS: dict[str, TableFormat] = {}


def register_table_format(reader: TableFormat) -> TableFormat:
    """Register ``reader`` under ``reader.name``; returns it.

    Raises
    ------
    ValueError
        Another reader holds the name.
    """
    held = _FORMATS.get(reader.name)
    if held is not None and held is not reader:
        raise ValueError(f"table format {reader.name!r} is already registered")
    _FORMATS[reader.name] = reader
    return reader


def table_format(name: str | None) -> TableFormat | None:
    """The reader registered for ``input.format`` ``name``; None for a file format."""
    if name is None:
        return None
    if not _FORMATS:
        from ragbatch.io.formats import delta, iceberg  # noqa: F401 - each registers itself
    return _FORMATS.get(name)


def filter_rows(
    table: pa.Table, conditions: list[tuple[str, str, Any]], skip: frozenset[str] = frozenset()
) -> pa.Table:
    """The rows of ``table`` that meet every condition of ``input.filter`` whose column is
    not in ``skip`` (the partition columns, whose files were already chosen).

    Parameters
    ----------
    table : pyarrow.Table
        One read task's rows, as read.
    conditions : list of (str, str, object)
        ``[column, operator, value]``; ``in`` / ``not in`` take a list.
    skip : frozenset of str
        Columns whose conditions are not applied here.

    Returns
    -------
    pyarrow.Table
        The rows that meet them, in their order. Values are compared in the column's
        type; a null meets only ``!=``, ``not in`` and ``= null`` (as for partition
        values).

    Raises
    ------
    InputError
        A condition names a column the rows lack, or a value that does not fit the
        column's type.
    """
    mask = None
    for column, op, value in conditions:
        if column in skip:
            continue
        if column not in table.column_names:
            raise InputError(
                f"input.filter names {column!r}, which is not a column of the table; "
                f"its columns: {', '.join(table.column_names)}"
            )
        data = table.column(column)
        values = value if isinstance(value, list) else [value]
        try:
            typed = pa.array(values).cast(data.type) if values != [None] else None
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise InputError(
                f"input.filter {[column, op, value]!r}: the value does not fit the column's "
                f"type {data.type} ({exc})"
            ) from None
        nulls = pc.is_null(data)
        if typed is None:
            meets = nulls if op == "=" else pc.invert(nulls)
        elif op in ("in", "not in"):
            found = pc.is_in(data, value_set=typed)
            meets = found if op == "in" else pc.or_kleene(pc.invert(found), nulls)
        else:
            name = {"=": "equal", "!=": "not_equal", "<": "less", "<=": "less_equal"}.get(
                op, {">": "greater", ">=": "greater_equal"}.get(op)
            )
            meets = pc.call_function(name, [data, typed[0]])
            if op == "!=":
                meets = pc.or_kleene(meets, nulls)
        meets = pc.fill_null(meets, False)
        mask = meets if mask is None else pc.and_(mask, meets)
    return table if mask is None else table.filter(mask)
