"""Delta Lake tables as input (``input.format: delta``), read with the ``deltalake``
package (``pip install 'ragbatch[delta]'``).

The table's transaction log is read once, while planning, to list the data files of the
pinned version (``input.version``, else the latest, which the run then pins): their
paths, sizes, modification times and partition values. The conditions of
``input.filter`` on partition columns are applied to the partition values in the log, so
files of other partitions are never opened; conditions on other columns are applied to
the rows of each file read (:func:`ragbatch.io.formats.filter_rows`). The data
files are then read as hive-partitioned Parquet is (:mod:`ragbatch.io.read`), through the
same fsspec filesystem and ``input.storage_options`` as any other input.

Partition columns are not stored in Delta data files; they reach the rows as ``string``
columns holding the values as Delta writes them in paths (``2026-01-01``, ``7``,
``true``; a null as ``__HIVE_DEFAULT_PARTITION__``, read as null), as hive directory parts
do.

Tables whose rows the data files alone do not give are refused with an explanation:
deletion vectors (rows deleted without rewriting the file) and column mapping (columns
renamed in the log, not in the files).
"""

from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import unquote, urlparse

import fsspec
import pyarrow as pa
from fsspec.utils import get_protocol

from ragbatch.config.job import InputSection
from ragbatch.core.errors import InputError, InputNotFoundError
from ragbatch.io.formats import register_table_format
from ragbatch.io.fs import resolve
from ragbatch.io.listing import InputFile

__all__ = ["DeltaFormat", "object_store_options"]

#: Null partition value, as Delta and hive write it in paths.
_NULL = "__HIVE_DEFAULT_PARTITION__"


def object_store_options(uri: str, storage_options: dict[str, Any]) -> dict[str, str]:
    """``input.storage_options`` (fsspec's, as for every input) in the form ``deltalake``
    takes them (the Rust ``object_store`` keys).

    Parameters
    ----------
    uri : str
        The table URI; only ``s3://`` / ``s3a://`` options are translated.
    storage_options : dict
        s3fs options: ``key``, ``secret``, ``token``, ``endpoint_url`` (also under
        ``client_kwargs``), ``client_kwargs.region_name``, ``anon``.

    Returns
    -------
    dict of str to str
        Empty for local paths. For S3: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
        ``AWS_SESSION_TOKEN``, ``AWS_ENDPOINT_URL`` (with ``AWS_ALLOW_HTTP`` for an
        ``http://`` endpoint), ``AWS_REGION`` and ``AWS_SKIP_SIGNATURE`` as given;
        anything left out comes from the standard ``AWS_*`` environment variables.
    """
    if get_protocol(uri) not in ("s3", "s3a"):
        return {}
    client = dict(storage_options.get("client_kwargs") or {})
    endpoint = storage_options.get("endpoint_url") or client.get("endpoint_url")
    region = storage_options.get("region_name") or client.get("region_name")
    out: dict[str, str] = {}
    for key, name in (("key", "AWS_ACCESS_KEY_ID"), ("secret", "AWS_SECRET_ACCESS_KEY")):
        if storage_options.get(key):
            out[name] = str(storage_options[key])
    if storage_options.get("token"):
        out["AWS_SESSION_TOKEN"] = str(storage_options["token"])
    if endpoint:
        out["AWS_ENDPOINT_URL"] = str(endpoint)
        if urlparse(str(endpoint)).scheme == "http":
            out["AWS_ALLOW_HTTP"] = "true"
        out.setdefault("AWS_REGION", "us-east-1")
    if region:
        out["AWS_REGION"] = str(region)
    if storage_options.get("anon"):
        out["AWS_SKIP_SIGNATURE"] = "true"
    return out


class DeltaFormat:
    """The reader of ``input.format: delta`` (see the module notes)."""

    name = "delta"

    def current_version(self, cfg: InputSection) -> int:
        """The table's latest commit version (>= 0); raises as :meth:`discover`."""
        return int(_open(cfg, None).version())

    def discover(self, cfg: InputSection) -> tuple[fsspec.AbstractFileSystem, list[InputFile]]:
        """The data files of the table at ``cfg.version`` that ``cfg.filter`` keeps
        (:class:`ragbatch.io.formats.TableFormat`), sorted by path."""
        table = _open(cfg, cfg.version)
        version = int(table.version())
        _refuse_unsupported(cfg, table)
        partition_columns = list(table.metadata().partition_columns)
        schema = pa.schema(table.schema().to_arrow())
        conditions = _conditions(cfg, schema, partition_columns)
        actions = pa.table(table.get_add_actions(flatten=True))
        _refuse_deletion_vectors(cfg, actions)
        fs, root = resolve(cfg.uri, cfg.storage_options)
        root = root.rstrip("/")
        files = []
        for action in actions.to_pylist():
            values = {c: action.get(f"partition.{c}") for c in partition_columns}
            if not all(_meets(values[column], op, value) for column, op, value in conditions):
                continue
            path = _data_path(fs, root, str(action["path"]))
            info = {
                "name": path,
                "size": int(action.get("size_bytes") or 0),
                "mtime": str(action.get("modification_time")),
                "table_version": {"format": "delta", "version": version},
            }
            partition = tuple((c, _partition_text(values[c])) for c in partition_columns)
            key = path[len(root) + 1 :] if path.startswith(root + "/") else path
            files.append(InputFile(path, key, "parquet", partition, info))
        if not files:
            what = "no data files" if actions.num_rows == 0 else "no data file meets input.filter"
            raise InputError(
                f"{cfg.uri}: the Delta table at version {version} has {what} "
                f"({actions.num_rows} data file(s) in all); check input.filter and input.version"
            )
        files.sort(key=lambda f: f.path)
        return fs, files


def _open(cfg: InputSection, version: int | None):
    """The ``deltalake.DeltaTable`` at ``version`` (latest when None)."""
    try:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError
    except ImportError:  # the config check names the extra first; this is the fallback
        raise InputError(
            "input.format 'delta' needs the deltalake package: pip install 'ragbatch[delta]'"
        ) from None
    options = object_store_options(cfg.uri, cfg.storage_options)
    try:
        return DeltaTable(cfg.uri, version=version, storage_options=options or None)
    except TableNotFoundError as exc:
        raise InputNotFoundError(
            f"{cfg.uri}: no Delta table there ({_first_line(exc)}); point input.uri at the "
            "table's root folder (the one holding _delta_log/)"
        ) from None
    except Exception as exc:
        if version is not None:
            latest = _latest_or_none(cfg, options)
            known = f"; the latest version is {latest}" if latest is not None else ""
            raise InputError(
                f"{cfg.uri}: cannot read version {version} of the Delta table "
                f"({_first_line(exc)}){known}; set input.version to an existing version "
                "whose files are kept (not vacuumed), or remove it to read the latest"
            ) from None
        raise InputError(
            f"{cfg.uri}: cannot open the Delta table ({_first_line(exc)}); check the URI, "
            "input.storage_options and the credentials"
        ) from None


def _latest_or_none(cfg: InputSection, options: dict[str, str]) -> int | None:
    from deltalake import DeltaTable

    try:
        return int(DeltaTable(cfg.uri, storage_options=options or None).version())
    except Exception:  # noqa: BLE001 - only improves the message
        return None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _refuse_unsupported(cfg: InputSection, table: Any) -> None:
    configuration = table.metadata().configuration or {}
    mode = configuration.get("delta.columnMapping.mode", "none")
    if mode != "none":
        raise InputError(
            f"{cfg.uri}: the Delta table uses column mapping (mode {mode!r}), so its data "
            "files do not hold the column names of the table; write a copy without column "
            "mapping, or export the version to Parquet and read that"
        )


def _refuse_deletion_vectors(cfg: InputSection, actions: pa.Table) -> None:
    for name in actions.column_names:
        if name.lower().startswith(("deletionvector", "deletion_vector")):
            if actions.column(name).null_count < actions.num_rows:
                raise InputError(
                    f"{cfg.uri}: the Delta table has deletion vectors (rows deleted without "
                    "rewriting their files), which this reader does not apply; purge them "
                    "(REORG TABLE ... APPLY (PURGE), or OPTIMIZE) and read the new version"
                )
            return


def _conditions(
    cfg: InputSection, schema: pa.Schema, partition_columns: list[str]
) -> list[tuple[str, str, Any]]:
    """The conditions of ``cfg.filter`` on partition columns, each value cast to the
    column's type (the others are applied to the rows read:
    :func:`ragbatch.io.formats.filter_rows`)."""
    out = []
    for column, op, value in cfg.filter or []:
        if column not in schema.names:
            raise InputError(
                f"input.filter names {column!r}, which is not a column of the Delta table "
                f"{cfg.uri} (columns: {', '.join(schema.names)})"
            )
        if column not in partition_columns:
            continue  # a row condition: applied to the rows as they are read
        kind = schema.field(column).type
        values = value if isinstance(value, list) else [value]
        try:
            cast = [pa.scalar(v).cast(kind).as_py() if v is not None else None for v in values]
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise InputError(
                f"input.filter {[column, op, value]!r}: the value does not fit the partition "
                f"column's type {kind} ({exc})"
            ) from None
        out.append((column, op, cast if isinstance(value, list) else cast[0]))
    return out


def _meets(actual: Any, op: str, wanted: Any) -> bool:
    """Whether partition value ``actual`` meets the condition; a null meets only
    ``= null``, ``!= value`` and ``not in`` a list without null."""
    if op == "in":
        return actual in wanted
    if op == "not in":
        return actual not in wanted
    if actual is None or wanted is None:
        return (op == "=" and actual is wanted) or (op == "!=" and actual is not wanted)
    return bool(
        {
            "=": actual == wanted,
            "!=": actual != wanted,
            "<": actual < wanted,
            "<=": actual <= wanted,
            ">": actual > wanted,
            ">=": actual >= wanted,
        }[op]
    )


def _partition_text(value: Any) -> str:
    if value is None:
        return _NULL
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    return str(value)


def _data_path(fs: fsspec.AbstractFileSystem, root: str, path: str) -> str:
    """A data file's path in ``fs``: the log holds it relative to the table root,
    URL-encoded, or as an absolute URI."""
    if "://" in path:
        return fs._strip_protocol(path)
    return f"{root}/{unquote(path)}"


register_table_format(DeltaFormat())
