"""Readers of input tables: input formats that name a table, not files.

A table format (``input.format: delta`` or ``iceberg``) resolves a table at one version into the Parquet
data files that make it up, each with its partition values. The rest of the reading side
treats those files as it treats a hive-partitioned Parquet directory
(:mod:`ragbatch.io.read`): one or more read tasks per data file, read through Ray tasks on
the Ray path and in the ``ragbatch`` process in-process, each file straight from its
storage. Nothing of the table is copied to local disk.

Each format is one module here that registers a :class:`TableFormat` under its name; the
config knows the names and what each needs installed
(:data:`ragbatch.config.job.TABLE_FORMATS`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import fsspec

    from ragbatch.config.job import InputSection
    from ragbatch.io.listing import InputFile

__all__ = ["TableFormat", "register_table_format", "table_format"]


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
        (:data:`ragbatch.config.job.TABLE_FORMATS`) is unset.

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
            lacks, a filter names a column that is not a partition column, or no data
            file is left.
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
