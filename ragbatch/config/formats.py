"""The formats ``input.format`` (and ``output.table.format``) can name, and the optional
packages they need: a registry the job config (:mod:`ragbatch.config.job`) validates
against, whose readers live in :mod:`ragbatch.io.read` and :mod:`ragbatch.io.formats`.
"""

from __future__ import annotations

from pydantic import BaseModel

__all__ = [
    "FILE_FORMAT_NEEDS",
    "FILTER_OPERATORS",
    "INPUT_FORMATS",
    "TABLE_FORMATS",
    "TRACE_COLUMN_DEFAULTS",
    "TableFormatNeeds",
    "check_installed",
    "input_formats",
]

INPUT_FORMATS = ("parquet", "jsonl", "json", "csv", "tsv", "openinference")

#: File formats of ``input.format`` that need an optional package: format -> (module,
#: extra of ragbatch that installs it).
FILE_FORMAT_NEEDS: dict[str, tuple[str, str]] = {
    "openinference": ("openinference.semconv", "traces"),
}

#: The columns an ``openinference`` input gives (one row per trace:
#: :mod:`ragbatch.io.formats.openinference`), by the canonical column each is mapped to
#: when ``input.columns`` leaves it out.
TRACE_COLUMN_DEFAULTS = {
    "row_id": "trace_id",
    "question": "question",
    "contexts": "contexts",
    "answer": "answer",
    "latency_s": "latency_s",
}


class TableFormatNeeds(BaseModel):
    """What an input format read from a table (not from files) needs: the module to
    import and the optional extra of ragbatch that installs it; the ``input`` fields it
    takes (``required`` among them); and ``pin``, the field naming the table version a
    run reads (set by the run when left out: docs/lakehouse.md)."""

    module: str
    extra: str
    fields: tuple[str, ...]
    required: tuple[str, ...] = ()
    pin: str


#: Table formats of ``input.format`` (:mod:`ragbatch.io.formats` holds their readers),
#: by name. A format listed here is a valid ``input.format``; the config is refused when
#: its module is missing, with the ``pip install 'ragbatch[extra]'`` to run.
TABLE_FORMATS: dict[str, TableFormatNeeds] = {
    "delta": TableFormatNeeds(
        module="deltalake", extra="delta", fields=("version", "filter"), pin="version"
    ),
    "iceberg": TableFormatNeeds(
        module="pyiceberg",
        extra="iceberg",
        fields=("table", "catalog", "snapshot_id", "filter"),
        required=("table",),
        pin="snapshot_id",
    ),
}


def input_formats() -> tuple[str, ...]:
    """Every valid ``input.format``: the file formats, then the table formats."""
    return INPUT_FORMATS + tuple(TABLE_FORMATS)


#: Comparison operators of an ``input.filter`` condition.
FILTER_OPERATORS = ("=", "!=", "<", "<=", ">", ">=", "in", "not in")


def check_installed(fmt: str | None, where: str = "input.format") -> None:
    """Refuse a format (of ``where``) whose package is missing, naming the extra."""
    if fmt in TABLE_FORMATS:
        module, extra = TABLE_FORMATS[fmt].module, TABLE_FORMATS[fmt].extra
    elif fmt in FILE_FORMAT_NEEDS:
        module, extra = FILE_FORMAT_NEEDS[fmt]
    else:
        return
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package of a dotted name is missing
        found = False
    if not found:
        raise ValueError(
            f"{where} {fmt!r} needs the {module} package, which is not installed: "
            f"pip install 'ragbatch[{extra}]'"
        )
