"""The query ``ragbatch run`` prints at the end, for reading the scores it committed.

A local output root gets a DuckDB query over its absolute path (it works from any
folder). An output root on object storage gets a Polars snippet instead: DuckDB would
need its ``httpfs`` extension and a secret. The snippet names the storage options Polars
needs, with the values of non-secret ones (endpoint, region) and ``"..."`` for all others,
so no credential is ever printed.
"""

from __future__ import annotations

import json
from typing import Any

from ragbatch.io.fs import is_process_local
from ragbatch.io.write import OutputLayout
from ragbatch.core.redact import redact_url

#: s3fs storage option -> the object_store key Polars reads, for options shown in full.
_S3_PLAIN = {
    "endpoint_url": "aws_endpoint_url",
    "region_name": "aws_region",
    "region": "aws_region",
}
#: s3fs storage option -> the object_store key Polars reads, for credentials (never shown).
_S3_SECRET = {
    "key": "aws_access_key_id",
    "secret": "aws_secret_access_key",
    "token": "aws_session_token",
}


def query_hint(layout: OutputLayout, storage_options: dict[str, Any] | None) -> list[str]:
    """Lines telling how to query the run's scores.

    Parameters
    ----------
    layout : OutputLayout
        The committed run's layout (its ``base`` is absolute for a local root).
    storage_options : dict or None
        The output's storage options as configured.

    Returns
    -------
    list of str
        A heading and the query: DuckDB SQL for a local root, a Polars snippet for object
        storage; empty for a root that lives in this process's memory only.
    """
    if is_process_local(layout.fs):
        return []
    scores = f"{redact_url(layout.uri(layout.base))}/scores/**/*.parquet"
    run_id = layout.run_id
    if layout.uri(layout.base) == layout.base:  # a local path, absolute (no credentials)
        sql_path = scores.replace("'", "''")
        return [
            "query it with DuckDB:",
            f"  SELECT metric, status, count(*), avg(score) FROM read_parquet('{sql_path}', "
            f"hive_partitioning=true) WHERE run_id = '{run_id}' GROUP BY ALL ORDER BY ALL;",
        ]
    options = polars_storage_options(storage_options or {})
    extra = f", storage_options={json.dumps(options)}" if options else ""
    return [
        "query it with Polars (fill in the credentials written as \"...\"):",
        "  import polars as pl",
        f"  scores = pl.scan_parquet({json.dumps(scores)}, hive_partitioning=True{extra})",
        f"  scores.filter(pl.col('run_id') == {json.dumps(run_id)}).group_by('metric', 'status')"
        ".agg(pl.len(), pl.col('score').mean()).sort('metric', 'status').collect()",
    ]


def polars_storage_options(options: dict[str, Any]) -> dict[str, str]:
    """The Polars (object_store) storage options matching s3fs ``options``: endpoint and
    region with their values, every credential and any other option as ``"..."``.

    Returns
    -------
    dict of str to str
        E.g. ``{"aws_endpoint_url": "http://127.0.0.1:9000", "aws_allow_http": "true",
        "aws_access_key_id": "...", "aws_secret_access_key": "..."}``.
    """
    flat = {
        **{k: v for k, v in options.items() if k != "client_kwargs"},
        **(options.get("client_kwargs") or {}),
    }
    out: dict[str, str] = {}
    for key, value in flat.items():
        if key in _S3_PLAIN and isinstance(value, str):
            out[_S3_PLAIN[key]] = redact_url(value)
        elif key in _S3_SECRET:
            out[_S3_SECRET[key]] = "..."
        elif key not in ("anon", "use_ssl"):
            out[key] = "..."
    if out.get("aws_endpoint_url", "").startswith("http://"):
        out["aws_allow_http"] = "true"
    return out
