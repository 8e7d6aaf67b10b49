"""Write a committed run's scores and summary to lakehouse tables (``output.table``).

After a run commits, :func:`write_run_tables` reads its scores and summary back from the
output root and writes each to a table: for ``format: delta`` the Delta tables
``<uri>/scores`` and ``<uri>/summary`` (``deltalake``), for ``format: iceberg`` the tables
``<namespace>.scores`` and ``<namespace>.summary`` of the configured catalog
(``pyiceberg``). Each row gets the columns ``run_id`` and ``run_date`` first; both tables
are partitioned by ``run_date`` when created.

Each table is written in one commit that replaces the run id's rows (a Delta overwrite
with the predicate ``run_id = '<id>'``, an Iceberg transaction that overwrites with the
filter ``run_id == '<id>'``), so a run written again (a resumed night, a second call)
never duplicates a cell. A column the table lacks (a new slice column, a new metric's
field) is added to its schema. The hive-partitioned Parquet layout under ``output.uri``
is still written and stays what ``compare``, ``report`` and ``nightly`` read; the tables
are a copy for other engines (Spark, Trino, DuckDB, Polars).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ragbatch.config.job import JobConfig, TableOutputSection

__all__ = ["TablesWritten", "write_run_tables"]


@dataclass(frozen=True)
class TablesWritten:
    """Where a run's rows went: the scores and summary tables (Delta URIs or Iceberg
    identifiers) and how many rows each received."""

    scores: str
    summary: str
    score_rows: int
    summary_rows: int


def write_run_tables(config: JobConfig, run_id: str) -> TablesWritten:
    """Write committed run ``run_id`` of ``config`` to ``config.output.table``.

    Parameters
    ----------
    config : JobConfig
        As run (URIs rendered); ``output.table`` must be set.
    run_id : str
        A run committed under ``config.output.uri``.

    Returns
    -------
    TablesWritten

    Raises
    ------
    ValueError
        ``output.table`` is not set.
    Exception
        Whatever reading the committed run or writing a table raises; the caller reports
        it beside the committed run.
    """
    settings = config.output.table
    if settings is None:
        raise ValueError("output.table is not set")
    from ragbatch.analysis.runs import find_run

    run = find_run(config.output.uri, run_id, config.output.storage_options)
    files = sorted(p for p in run.fs.find(run.scores_path) if p.endswith(".parquet"))
    parts = []
    for path in files:
        with run.fs.open(path, "rb") as fh:
            parts.append(pq.read_table(fh))
    scores = _with_run(pa.concat_tables(parts, promote_options="permissive"), run)
    with run.fs.open(run.summary_path, "rb") as fh:
        summary = _with_run(pq.read_table(fh), run)
    write = _write_delta if settings.format == "delta" else _write_iceberg
    return TablesWritten(
        write(settings, "scores", scores, run_id),
        write(settings, "summary", summary, run_id),
        scores.num_rows,
        summary.num_rows,
    )


def _with_run(table: pa.Table, run: Any) -> pa.Table:
    """``table`` with ``run_id`` and ``run_date`` first, and its columns in plain Arrow
    types (no dictionaries, string views or null-typed columns)."""
    table = table.drop_columns([c for c in ("run_id", "run_date") if c in table.column_names])
    fields = []
    for field in table.schema:
        kind = field.type
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        if kind == pa.string_view():
            kind = pa.string()
        if pa.types.is_null(kind):
            kind = pa.string()
        fields.append(pa.field(field.name, kind))
    table = table.cast(pa.schema(fields))
    n = table.num_rows
    table = table.add_column(0, "run_date", pa.array([run.run_date] * n, pa.date32()))
    return table.add_column(0, "run_id", pa.array([run.run_id] * n, pa.string()))


def _write_delta(settings: TableOutputSection, name: str, table: pa.Table, run_id: str) -> str:
    from deltalake import DeltaTable, write_deltalake
    from deltalake.exceptions import TableNotFoundError

    from ragbatch.io.formats.delta import object_store_options

    uri = f"{str(settings.uri).rstrip('/')}/{name}"
    options = object_store_options(uri, settings.storage_options) or None
    try:
        DeltaTable(uri, storage_options=options)
        exists = True
    except TableNotFoundError:
        exists = False
    if exists:
        quoted = run_id.replace("'", "''")
        write_deltalake(
            uri,
            table,
            mode="overwrite",
            predicate=f"run_id = '{quoted}'",
            schema_mode="merge",
            storage_options=options,
        )
    else:
        write_deltalake(uri, table, partition_by=["run_date"], storage_options=options)
    return uri


def _write_iceberg(settings: TableOutputSection, name: str, table: pa.Table, run_id: str) -> str:
    import warnings

    from pyiceberg.catalog import load_catalog
    from pyiceberg.expressions import EqualTo

    props: dict[str, Any] = {"type": "sql", **(settings.catalog or {})}
    catalog = load_catalog(str(props.pop("name", "default")), **props)
    namespace = str(settings.namespace)
    catalog.create_namespace_if_not_exists(namespace)
    identifier = f"{namespace}.{name}"
    if not catalog.table_exists(identifier):
        created = catalog.create_table(identifier, schema=table.schema)
        with created.update_spec() as spec:
            spec.add_identity("run_date")
    target = catalog.load_table(identifier)
    with warnings.catch_warnings():
        # "Delete operation did not match any records": the run's first write
        warnings.simplefilter("ignore", UserWarning)
        with target.transaction() as tx:
            with tx.update_schema() as update:
                update.union_by_name(table.schema)
            tx.overwrite(table, overwrite_filter=EqualTo("run_id", run_id))
    return identifier
