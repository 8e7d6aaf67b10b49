"""Output: where a run's tables go and the row-conservation check.

Layout under the output root (hive-style partitions, readable with
``read_parquet('<root>/scores/**/*.parquet', hive_partitioning=true)`` in DuckDB)::

    scores/run_date=YYYY-MM-DD/run_id=<id>/*.parquet     long scores table
    summary/run_date=YYYY-MM-DD/run_id=<id>/summary.parquet
    runs/run_date=YYYY-MM-DD/run_id=<id>/manifest.json    written last: the run is committed
    _staging/run_id=<id>/...                              a run in progress (ragbatch.io.staging)

``run_date`` and ``run_id`` are partition keys (directory names), not columns inside the
files. The summary's rows are computed by :mod:`ragbatch.analysis.summary`; every table
and column is described in docs/output-schema.md.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from ragbatch.config.job import OutputSection
from ragbatch.core.errors import ConservationError
from ragbatch.io.fs import is_process_local, resolve
from ragbatch.io.removal import ensure_under
from ragbatch.core.status import OK, STATUSES

SUMMARY_FILE = "summary.parquet"
MANIFEST_FILE = "manifest.json"


@dataclass
class OutputLayout:
    """Paths of one run under an output root. ``root`` is the URI as configured; the
    ``*_path`` attributes are filesystem paths (no protocol) for ``fs``."""

    root: str
    fs: Any
    base: str
    run_date: dt.date
    run_id: str

    @classmethod
    def for_run(cls, output: OutputSection, run_date: dt.date, run_id: str) -> "OutputLayout":
        fs, base = resolve(output.uri, output.storage_options)
        return cls(output.uri, fs, base.rstrip("/"), run_date, run_id)

    def _part(self, table: str) -> str:
        return f"{self.base}/{table}/run_date={self.run_date.isoformat()}/run_id={self.run_id}"

    @property
    def scores_path(self) -> str:
        return self._part("scores")

    @property
    def summary_path(self) -> str:
        return f"{self._part('summary')}/{SUMMARY_FILE}"

    @property
    def manifest_path(self) -> str:
        return f"{self._part('runs')}/{MANIFEST_FILE}"

    @property
    def reports_path(self) -> str:
        """Directory of the run's report and comparison (``reports/run_date=/run_id=``)."""
        return self._part("reports")

    def uri(self, path: str) -> str:
        """``path`` as a URI a user can paste (protocol kept for remote filesystems)."""
        return (
            self.fs.unstrip_protocol(path) if _protocol(self.fs) not in ("file", "local") else path
        )

    @property
    def process_local(self) -> bool:
        return is_process_local(self.fs)

    @property
    def on_local_disk(self) -> bool:
        """Whether the outputs are files on this machine's disk (reading them again is
        cheap; on an object store every scan is a download)."""
        return _protocol(self.fs) in ("file", "local")

    def write_table(self, path: str, table: pa.Table) -> None:
        """Write one Parquet file at ``path``."""
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        with self.fs.open(path, "wb") as fh:
            pq.write_table(table, fh)

    def write_json(self, path: str, data: dict[str, Any]) -> None:
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        with self.fs.open(path, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, ensure_ascii=False, default=str)
            fh.write("\n")


def _protocol(fs: Any) -> str:
    proto = fs.protocol
    return proto[0] if isinstance(proto, (tuple, list)) else proto


#: DuckDB memory per thread of the driver's queries when ``RAGBATCH_DUCKDB_MEMORY_LIMIT``
#: is unset; the cap is this times DuckDB's thread count, and at least :data:`MIN_MEMORY`.
MEMORY_PER_THREAD = 128 * 2**20
MIN_MEMORY = 512 * 2**20


def connect(layout: OutputLayout) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection that can read the layout's filesystem, with capped memory.

    The run's driver checks and summarizes every cell of a run with DuckDB (row
    conservation, error budget, summary). So that its memory does not grow with the
    corpus, DuckDB's memory is capped and what does not fit spills to a folder of its own
    under the system temporary directory, removed when the connection closes. The cap is
    the environment variable ``RAGBATCH_DUCKDB_MEMORY_LIMIT`` (any DuckDB size, e.g.
    ``"2GB"``; ``"none"`` leaves DuckDB's own default of 80 % of the machine's memory),
    else ``max(512 MiB, 128 MiB x threads)``. The queries are written so that this
    suffices for any number of cells (:func:`verify_run`'s bucketed row-id checks, the
    summary's sorted stream); over 80 million cells the whole check and summary peaked at
    about 0.8 GiB of resident memory (docs/benchmarks/scale.md).

    Raises
    ------
    duckdb.Error
        ``RAGBATCH_DUCKDB_MEMORY_LIMIT`` is not a size DuckDB understands.
    """
    limit = os.environ.get("RAGBATCH_DUCKDB_MEMORY_LIMIT", "").strip()
    if limit.lower() == "none":
        con = duckdb.connect()
    else:
        spill = os.path.join(tempfile.gettempdir(), f"ragbatch-duckdb-{os.getpid()}-{id(layout):x}")
        con = duckdb.connect(config={"temp_directory": spill})
        if not limit:
            threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
            limit = f"{max(MIN_MEMORY, MEMORY_PER_THREAD * int(threads)) // 2**20}MiB"
        con.execute("SET memory_limit = ?", [limit])
    if _protocol(layout.fs) not in ("file", "local"):
        con.register_filesystem(layout.fs)
    return con


def file_list(layout: OutputLayout, files: list[str]) -> str:
    """A DuckDB list literal of ``files`` as URIs DuckDB can open."""
    return "[" + ", ".join(_literal(layout.uri(f)) for f in files) + "]"


@dataclass
class RunCheck:
    """Result of :func:`verify_run`."""

    n_rows: int
    n_cells: int
    counts: dict[str, dict[str, int]]  # metric id -> status -> count
    models: dict[str, list[str]]


def verify_run(
    layout: OutputLayout, files: list[str], metric_ids: list[str], n_rows: int
) -> RunCheck:
    """Check row conservation over the score files ``files`` (filesystem paths of
    ``layout.fs``) and count cells per metric and status.

    Conservation: every metric has exactly ``n_rows`` cells (a judge panel's member
    cells are counted under their member key, :func:`metric_key_sql`, as
    ``metric_ids`` names them), no (row_id, metric) pair appears twice, every row id
    appears for every metric, statuses are from the vocabulary, and ``score`` is non-null
    exactly when ``status == 'ok'``.

    The files are scanned once for the counts and a fingerprint of each metric's row ids;
    when the fingerprints agree, only one metric's row ids are grouped to find repeats
    (:func:`_same_row_ids`), otherwise every cell's are.

    Raises
    ------
    ConservationError
        Any of the above fails; the message lists what and gives examples.
    """
    con = connect(layout)
    if files:
        source = (
            f"read_parquet({file_list(layout, files)}, hive_partitioning=false, union_by_name=true)"
        )
        con.execute(
            f"CREATE VIEW s AS SELECT row_id, {metric_key_sql(con, source)} AS metric, score, "
            f"status, model FROM {source}"
        )
    else:
        con.execute(
            "CREATE VIEW s AS SELECT NULL::VARCHAR row_id, NULL::VARCHAR metric, "
            "NULL::DOUBLE score, NULL::VARCHAR status, NULL::VARCHAR model WHERE false"
        )
    # One scan for every per-(metric, status, model) figure and the row-id fingerprints
    # of :func:`_same_row_ids`; the row-id checks scan one metric again.
    con.execute(
        f"CREATE TEMP TABLE agg AS SELECT metric, status, model, count(*) AS n, "
        f"count(*) FILTER (WHERE (status = '{OK}') <> (score IS NOT NULL)) AS mismatch, "
        f"count(row_id) AS n_ids, {_FINGERPRINT} FROM s GROUP BY ALL"
    )
    problems = _conservation_problems(con, metric_ids, n_rows)
    if problems:
        raise ConservationError(
            f"row conservation failed for run {layout.run_id} ({n_rows} input rows x "
            f"{len(metric_ids)} metrics); the run is not committed:\n  - " + "\n  - ".join(problems)
        )
    counts = _status_counts(con)
    models = {m: sorted(v) for m, v in _models(con).items()}
    return RunCheck(n_rows, n_rows * len(metric_ids), counts, models)


def metric_key_sql(con: duckdb.DuckDBPyConnection, source: str) -> str:
    """A SQL expression over ``source`` (a table, view or ``read_parquet`` call of score
    rows) giving each cell's *metric key*: ``metric``, or for a judge panel's member
    cell (``judge`` not null) the member key ``<metric>[<judge>]``
    (:func:`ragbatch.config.panel.member_key`). Scores without a ``judge`` column
    (written before panels existed) give ``metric``."""
    columns = {d[0] for d in con.execute(f"SELECT * FROM {source} LIMIT 0").description}
    if "judge" not in columns:
        return "metric"
    return "CASE WHEN judge IS NULL THEN metric ELSE metric || '[' || judge || ']' END"


def _conservation_problems(
    con: duckdb.DuckDBPyConnection, metric_ids: list[str], n_rows: int
) -> list[str]:
    problems = []
    per_metric = dict(con.execute("SELECT metric, sum(n) FROM agg GROUP BY metric").fetchall())
    n_cells = sum(per_metric.values())
    for mid in metric_ids:
        got = per_metric.pop(mid, 0)
        if got != n_rows:
            problems.append(f"metric {mid!r}: {got} cells, expected {n_rows}")
    for extra, got in per_metric.items():
        problems.append(f"metric {extra!r} is not in the config but has {got} cells")
    dups, n_distinct = _key_checks(con, n_cells, _same_row_ids(con, metric_ids, n_rows))
    if dups:
        n_dup, examples = dups
        problems.append(
            f"{n_dup} (row_id, metric) pairs appear more than once, e.g. {examples}; if "
            "input.columns maps row_id, that input column has duplicate values"
        )
    if n_distinct != n_rows and not dups:
        problems.append(f"{n_distinct} distinct row ids in the scores, expected {n_rows}")
    vocab = ", ".join(f"'{s}'" for s in STATUSES)
    bad_status = con.execute(
        f"SELECT DISTINCT status FROM agg WHERE status IS NULL OR status NOT IN ({vocab}) LIMIT 5"
    ).fetchall()
    if bad_status:
        problems.append(f"statuses outside the vocabulary: {[b[0] for b in bad_status]}")
    mismatch = con.execute("SELECT coalesce(sum(mismatch), 0) FROM agg").fetchone()[0]
    if mismatch:
        problems.append(f"{mismatch} cells have a score without status ok, or ok without a score")
    return problems


#: Two sums of 64-bit hashes of the row ids (as HUGEINT, so they cannot overflow): a
#: fingerprint of a metric's multiset of row ids. The second hashes the row id behind a
#: fixed prefix, so that it is not a function of the first: DuckDB's ``hash(row_id, seed)``
#: only remixes ``hash(row_id)``, and two row ids of equal ``hash`` are easy to write
#: (DuckDB hashes a string 8 bytes at a time, each block XORed into the state and
#: multiplied, so a second block can cancel a difference in the first). Equal sums under
#: both then need row ids written against both hashes at once, not just one collision.
_FINGERPRINT = (
    "sum(hash(row_id)::HUGEINT) AS h1, sum(hash('ragbatch-row-id:' || row_id)::HUGEINT) AS h2"
)


def _same_row_ids(con: duckdb.DuckDBPyConnection, metric_ids: list[str], n_rows: int) -> str | None:
    """The metric whose row ids alone need the exact checks, or None when every cell must.

    When every metric of the config has exactly ``n_rows`` cells, none with a null row
    id, no other metric has cells, and the metrics' row-id fingerprints (count and two
    hash sums, from table ``agg``) are all equal, the metrics hold the same multiset of
    row ids, except with a probability of about 2**-128 (the two sums of an unequal
    multiset would have to agree by chance; :data:`_FINGERPRINT` is no defence against
    row ids crafted to collide under both hashes). Then the row ids of one metric being
    distinct means that no (row_id, metric) pair repeats and that there are as many
    distinct row ids as that metric has cells: :func:`_key_checks` checks that metric's
    ``n_rows`` cells instead of all ``n_rows x len(metric_ids)``. Anything else is
    checked, and reported, cell by cell.
    """
    rows = con.execute(
        "SELECT metric, sum(n), sum(n_ids), sum(h1), sum(h2) FROM agg GROUP BY metric"
    ).fetchall()
    if not metric_ids or len(rows) != len(metric_ids) or {r[0] for r in rows} != set(metric_ids):
        return None
    if {(r[1], r[2]) for r in rows} != {(n_rows, n_rows)}:
        return None
    if len({(r[3], r[4]) for r in rows}) != 1:
        return None
    return metric_ids[0]


#: Cells per hash bucket of the row-id checks: about 0.14 GiB of DuckDB memory per
#: million cells (measured over 80 million cells with 40-character row ids).
CELLS_PER_BUCKET = 2_000_000


def _key_checks(
    con: duckdb.DuckDBPyConnection, n_cells: int, only: str | None = None
) -> tuple[tuple[int, str] | None, int]:
    """Duplicate (row_id, metric) pairs (their number and up to five examples, or None)
    and the number of distinct row ids, in memory that does not grow with the run.

    With ``only`` (a metric id, from :func:`_same_row_ids`), only that metric's cells are
    checked: every metric holds the same row ids, so its figures are the run's. Should
    they show a duplicate after all, every cell is checked, so the message counts them
    all.

    Up to :data:`CELLS_PER_BUCKET` cells this is one grouping over view ``s``. Above,
    the cells' ``row_id`` and ``metric`` are first written once, partitioned by a hash
    of the row id into ``ceil(n_cells / CELLS_PER_BUCKET)`` buckets, to a temporary
    folder (removed afterwards), and each bucket is checked alone: a row id's cells all
    land in one bucket, so duplicates and distinct row ids add up across buckets. (One
    grouping of all cells needs about 1 GiB per 8 million cells, and DuckDB did not
    reliably spill it under a memory limit.)
    """
    if only is not None:
        n_metrics = max(1, con.execute("SELECT count(DISTINCT metric) FROM agg").fetchone()[0])
        view = f"(SELECT row_id, metric FROM s WHERE metric = {_literal(only)})"
        dups, n_distinct = _bucketed_keys(con, view, n_cells // n_metrics, one_metric=True)
        if dups is None:
            return None, n_distinct
    return _bucketed_keys(con, "s", n_cells)


def _bucketed_keys(
    con: duckdb.DuckDBPyConnection, relation: str, n_cells: int, one_metric: bool = False
) -> tuple[tuple[int, str] | None, int]:
    """:func:`_key_checks` over ``relation`` (a view or subquery with ``row_id`` and
    ``metric``) of ``n_cells`` cells; ``one_metric``: every cell of ``relation`` has the
    same metric (:func:`_bucket_keys`)."""
    buckets = max(1, math.ceil(n_cells / CELLS_PER_BUCKET))
    n_dup, examples, n_distinct = 0, [], 0
    folder = tempfile.mkdtemp(prefix="ragbatch-check-") if buckets > 1 else None
    try:
        sources = [relation]
        if folder is not None:
            con.execute(
                f"COPY (SELECT coalesce(hash(row_id) % {buckets}, 0) AS b, row_id, metric "
                f"FROM {relation}) TO {_literal(folder)} (FORMAT parquet, PARTITION_BY (b))"
            )
            sources = [
                f"read_parquet({_literal(os.path.join(folder, part, '*.parquet'))})"
                for part in sorted(os.listdir(folder))
            ]
        for source in sources:
            found, some, distinct = _bucket_keys(con, source, one_metric)
            n_dup, n_distinct = n_dup + found, n_distinct + distinct
            examples.extend(some)
    finally:
        if folder is not None:
            shutil.rmtree(ensure_under(tempfile.gettempdir(), folder), ignore_errors=True)
    if not n_dup:
        return None, n_distinct
    # As DuckDB orders them in one grouping: most repeated first, then by row id (nulls
    # last) and metric.
    examples.sort(key=lambda e: (-e[2], e[0] is None, e[0] or "", e[1] or ""))
    return (n_dup, _examples(examples[:5])), n_distinct


def _bucket_keys(
    con: duckdb.DuckDBPyConnection, source: str, one_metric: bool = False
) -> tuple[int, list[tuple[str, str, int]], int]:
    """Of the cells in ``source`` (a view or a ``read_parquet`` call with ``row_id`` and
    ``metric`` columns): the number of (row_id, metric) pairs that repeat, up to five of
    them as ``(row_id, metric, count)`` (most repeated first), and the number of
    distinct row ids.

    With ``one_metric`` (every cell of ``source`` has the same metric), a pair repeats
    exactly when its row id does, so one grouping of the row ids counts both, and no
    examples are listed (:func:`_key_checks` checks every cell again when one repeats).
    """
    if one_metric:
        n_distinct, n_dup = con.execute(
            f"SELECT count(*), count(*) FILTER (WHERE c > 1) FROM "
            f"(SELECT row_id, count(*) AS c FROM {source} GROUP BY row_id)"
        ).fetchone()
        return int(n_dup), [], int(n_distinct)
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE pairs AS SELECT row_id, metric, count(*) AS c "
        f"FROM {source} GROUP BY row_id, metric"
    )
    n_distinct = con.execute(
        "SELECT count(*) FROM (SELECT row_id FROM pairs GROUP BY row_id)"
    ).fetchone()[0]
    n_dup = con.execute("SELECT count(*) FROM pairs WHERE c > 1").fetchone()[0]
    examples = (
        con.execute(
            "SELECT row_id, metric, c FROM pairs WHERE c > 1 ORDER BY c DESC, row_id, metric LIMIT 5"
        ).fetchall()
        if n_dup
        else []
    )
    con.execute("DROP TABLE pairs")
    return n_dup, examples, n_distinct


def _examples(rows: list[tuple[str, str, int]]) -> str:
    return ", ".join(f"({r!r}, {m!r}) x{c}" for r, m, c in rows)


def _literal(text: str) -> str:
    """``text`` as a DuckDB string literal."""
    return "'" + text.replace("'", "''") + "'"


def _status_counts(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    for metric, status, n in con.execute(
        "SELECT metric, status, sum(n) FROM agg GROUP BY ALL ORDER BY ALL"
    ).fetchall():
        counts.setdefault(metric, {})[status] = int(n)
    return counts


def _models(con: duckdb.DuckDBPyConnection) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for metric, model in con.execute(
        "SELECT DISTINCT metric, model FROM agg WHERE model IS NOT NULL"
    ).fetchall():
        out.setdefault(metric, set()).add(model)
    return out
