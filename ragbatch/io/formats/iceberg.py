"""Apache Iceberg tables as input (``input.format: iceberg``), read with the ``pyiceberg``
package (``pip install 'ragbatch[iceberg]'``).

The table is found in the catalog that ``input.catalog`` describes (pyiceberg's catalog
properties; ``type`` defaults to ``sql``, pyiceberg's SQL catalog, which on a SQLite file
is embedded: no server) under the identifier ``input.table``. ``input.uri`` is the table's
location, the folder that holds its ``metadata/`` and ``data/``; it must be the location
the catalog gives, and it selects the filesystem and ``input.storage_options`` through
which the data files are read, as for any other input.

While planning, the snapshot ``input.snapshot_id`` (else the current one, which the run
then pins) is scanned for its data files: ``input.filter`` is handed to the scan, so the
manifests leave out the files of other partitions (and files whose column statistics
exclude a match) without any data file being opened; the rows of the files kept are then
filtered as they are read. The data files, Parquet, are read as a Parquet directory is
(:mod:`ragbatch.io.read`).
Iceberg data files hold every column, partition columns included, so the rows have the
table's own column types.

Refused, with an explanation, are tables whose rows the data files alone do not give, or
not under the column names of the table: delete files (row-level deletes of format
version 2), and a schema that has changed since files were written.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import fsspec

from ragbatch.config.job import InputSection
from ragbatch.core.errors import InputError, InputNotFoundError
from ragbatch.io.formats import register_table_format
from ragbatch.io.formats.delta import object_store_options
from ragbatch.io.fs import resolve
from ragbatch.io.listing import InputFile

__all__ = ["IcebergFormat", "catalog_properties"]

#: ``object_store_options`` keys -> pyiceberg's FileIO properties.
_FILE_IO_KEYS = {
    "AWS_ACCESS_KEY_ID": "s3.access-key-id",
    "AWS_SECRET_ACCESS_KEY": "s3.secret-access-key",
    "AWS_SESSION_TOKEN": "s3.session-token",
    "AWS_ENDPOINT_URL": "s3.endpoint",
    "AWS_REGION": "s3.region",
}


def catalog_properties(cfg: InputSection) -> dict[str, Any]:
    """The properties ``pyiceberg.catalog.load_catalog`` gets: ``input.catalog`` with
    ``type`` defaulting to ``sql``, and, for an ``s3://`` table, the S3 settings of
    ``input.storage_options`` as pyiceberg's FileIO properties (``s3.endpoint``,
    ``s3.access-key-id``, ...) where the catalog's properties leave them out.

    Returns
    -------
    dict
        Property name -> value.
    """
    props: dict[str, Any] = {"type": "sql", **(cfg.catalog or {})}
    for key, value in object_store_options(cfg.uri, cfg.storage_options).items():
        name = _FILE_IO_KEYS.get(key)
        if name is not None:
            props.setdefault(name, value)
    if props.get("type") == "sql" and not props.get("uri"):
        raise InputError(
            "input.catalog: the SQL catalog needs its database: uri: sqlite:///path/catalog.db "
            "(or another SQLAlchemy URL)"
        )
    return props


class IcebergFormat:
    """The reader of ``input.format: iceberg`` (see the module notes)."""

    name = "iceberg"

    def current_version(self, cfg: InputSection) -> int:
        """The table's current snapshot id; raises as :meth:`discover`, and
        :class:`InputError` for a table without snapshots."""
        table = _load(cfg)
        snapshot = table.current_snapshot()
        if snapshot is None:
            raise InputError(f"{_where(cfg)}: the Iceberg table has no snapshot (no data yet)")
        return int(snapshot.snapshot_id)

    def discover(self, cfg: InputSection) -> tuple[fsspec.AbstractFileSystem, list[InputFile]]:
        """The data files of snapshot ``cfg.snapshot_id`` (current when None) that
        ``cfg.filter`` keeps (:class:`ragbatch.io.formats.TableFormat`), sorted by path."""
        table = _load(cfg)
        fs, root = resolve(cfg.uri, cfg.storage_options)
        root = root.rstrip("/")
        location = fs._strip_protocol(table.location()).rstrip("/")
        if location != root:
            raise InputError(
                f"input.uri is {cfg.uri}, but the catalog places the Iceberg table "
                f"{cfg.table} at {table.location()}; set input.uri to the table's location"
            )
        snapshot_id = cfg.snapshot_id
        if snapshot_id is None:
            snapshot_id = self.current_version(cfg)
        elif table.snapshot_by_id(snapshot_id) is None:
            known = [s.snapshot_id for s in table.snapshots()][-5:]
            raise InputError(
                f"{_where(cfg)}: the Iceberg table has no snapshot {snapshot_id} (its latest "
                f"snapshots: {known}); set input.snapshot_id to one of its snapshots (not "
                "expired), or remove it to read the current one"
            )
        if len(table.metadata.schemas) > 1:
            raise InputError(
                f"{_where(cfg)}: the Iceberg table's schema has changed "
                f"({len(table.metadata.schemas)} schemas), and ragbatch reads data files by "
                "column name; rewrite the table under its current schema (or export the "
                "snapshot to Parquet) and read that"
            )
        scan = table.scan(row_filter=_row_filter(cfg, table), snapshot_id=snapshot_id)
        tasks = list(scan.plan_files())
        files = []
        for task in tasks:
            if task.delete_files:
                raise InputError(
                    f"{_where(cfg)}: the Iceberg table has delete files at snapshot "
                    f"{snapshot_id} (rows deleted without rewriting their files), which "
                    "this reader does not apply; compact the table (rewrite_data_files) "
                    "and read the new snapshot"
                )
            data = task.file
            path = fs._strip_protocol(data.file_path)
            info = {
                "name": path,
                "size": int(data.file_size_in_bytes),
                "table_version": {"format": "iceberg", "snapshot_id": snapshot_id},
            }
            key = path[len(root) + 1 :] if path.startswith(root + "/") else path
            files.append(InputFile(path, key, "parquet", (), info))
        if not files:
            what = "no data file meets input.filter" if cfg.filter else "no data files"
            raise InputError(
                f"{_where(cfg)}: the Iceberg table at snapshot {snapshot_id} has {what}; "
                "check input.filter and input.snapshot_id"
            )
        files.sort(key=lambda f: f.path)
        return fs, files


def _where(cfg: InputSection) -> str:
    return f"{cfg.uri} (table {cfg.table})"


def _load(cfg: InputSection) -> Any:
    """The ``pyiceberg`` table ``cfg.table`` of the configured catalog."""
    try:
        from pyiceberg.catalog import load_catalog
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
    except ImportError:  # the config check names the extra first; this is the fallback
        raise InputError(
            "input.format 'iceberg' needs the pyiceberg package: pip install 'ragbatch[iceberg]'"
        ) from None
    props = catalog_properties(cfg)
    try:
        catalog = load_catalog(str(props.pop("name", "default")), **props)
    except ImportError as exc:
        raise InputError(
            f"input.catalog: the {props.get('type')!r} catalog needs a package that is not "
            f"installed ({exc}); for the SQL catalog: pip install 'ragbatch[iceberg]'"
        ) from None
    except Exception as exc:
        raise InputError(f"input.catalog: cannot open the Iceberg catalog ({exc})") from None
    try:
        return catalog.load_table(str(cfg.table))
    except (NoSuchTableError, NoSuchNamespaceError) as exc:
        raise InputNotFoundError(
            f"{_where(cfg)}: the catalog has no Iceberg table {cfg.table!r} ({exc}); check "
            "input.table (namespace.name) and input.catalog"
        ) from None
    except Exception as exc:
        raise InputError(f"{_where(cfg)}: cannot load the Iceberg table ({exc})") from None


def _row_filter(cfg: InputSection, table: Any) -> Any:
    """``cfg.filter`` as a pyiceberg expression (all conditions), for the scan to leave
    out the files that cannot hold a matching row (by partition values and column
    statistics); the rows of the files kept are filtered as they are read
    (:func:`ragbatch.io.formats.filter_rows`)."""
    from pyiceberg import expressions as ex

    schema = table.schema()
    names = [f.name for f in schema.fields]
    result: Any = ex.AlwaysTrue()
    for column, op, value in cfg.filter or []:
        if column not in names:
            raise InputError(
                f"input.filter names {column!r}, which is not a column of the Iceberg table "
                f"{cfg.table} (columns: {', '.join(names)})"
            )
        result = ex.And(result, _condition(column, op, value))
    try:
        ex.visitors.bind(schema, result, case_sensitive=True)
    except ValueError as exc:
        raise InputError(f"input.filter: a value does not fit its column's type ({exc})") from None
    return result


def _condition(column: str, op: str, value: Any) -> Any:
    from pyiceberg import expressions as ex

    if isinstance(value, list):
        values = [_literal(v) for v in value]
        return ex.In(column, values) if op == "in" else ex.NotIn(column, values)
    if value is None:
        return ex.IsNull(column) if op == "=" else ex.NotNull(column)
    kinds = {
        "=": ex.EqualTo,
        "!=": ex.NotEqualTo,
        "<": ex.LessThan,
        "<=": ex.LessThanOrEqual,
        ">": ex.GreaterThan,
        ">=": ex.GreaterThanOrEqual,
    }
    return kinds[op](column, _literal(value))


def _literal(value: Any) -> Any:
    """YAML dates and times as ISO text, which pyiceberg converts to the column's type."""
    return value.isoformat() if isinstance(value, (dt.date, dt.datetime)) else value


register_table_format(IcebergFormat())
