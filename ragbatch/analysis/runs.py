"""Committed runs under an output root: list them, find one, load its tables.

A run is *committed* exactly when its manifest exists
(``runs/run_date=<d>/run_id=<id>/manifest.json``, written last; see
:mod:`ragbatch.io.staging`). Everything here keys on manifests and never reads the
``_staging/`` prefix, so a run in progress or one that crashed is invisible.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ragbatch.core.columns import JUDGE
from ragbatch.core.errors import InputError
from ragbatch.io.fs import describe_storage_error, resolve
from ragbatch.io.staging import STAGING
from ragbatch.io.write import MANIFEST_FILE, OutputLayout
from ragbatch.io.manifest_model import Manifest, read_manifest
from ragbatch.core.redact import drop_redacted, redact_url

_MANIFEST_PATH = re.compile(
    r"/runs/run_date=(\d{4}-\d{2}-\d{2})/run_id=([^/]+)/" + re.escape(MANIFEST_FILE) + "$"
)


@dataclass
class CommittedRun:
    """One committed run under an output root.

    Attributes
    ----------
    root : str
        The output root URI as given (local path, ``s3://...``, ``memory://...``).
    run_date : datetime.date
        The run's ``run_date`` partition.
    run_id : str
    manifest : Manifest
        The parsed ``manifest.json`` (:func:`ragbatch.io.manifest_model.read_manifest`).
    fs : fsspec filesystem
        Filesystem of ``root``; ``base`` is ``root`` without its protocol.
    storage_options : dict
        The fsspec options ``root`` was opened with (empty: the filesystem's defaults
        and the environment); lookups under the same root reuse them.
    """

    root: str
    run_date: dt.date
    run_id: str
    manifest: Manifest = field(repr=False)
    fs: Any = field(repr=False)
    base: str = field(repr=False)
    storage_options: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def layout(self) -> OutputLayout:
        """The run's paths, as the run that wrote them laid them out."""
        return OutputLayout(self.root, self.fs, self.base, self.run_date, self.run_id)

    @property
    def scores_path(self) -> str:
        """Directory of the run's score files (a path of ``fs``)."""
        return self.layout.scores_path

    @property
    def summary_path(self) -> str:
        return self.layout.summary_path

    @property
    def reports_path(self) -> str:
        """Directory for the run's report and comparison (``reports/run_date=/run_id=``)."""
        return self.layout.reports_path

    @property
    def started_at(self) -> str:
        """ISO start time from the manifest ('' when absent)."""
        return self.manifest.run.started_at

    @property
    def name(self) -> str:
        return self.manifest.run.name

    @property
    def metric_names(self) -> dict[str, str]:
        """Metric id -> registered metric name, in config order."""
        return self.manifest.metric_names

    @property
    def slice_columns(self) -> list[str]:
        """Names of the slice columns in the scores table, in input order."""
        return [s.output for s in self.manifest.input.slice_columns]

    def sort_key(self) -> tuple[str, str, str]:
        """Order of runs under one root: run date, then start time, then run id."""
        return (self.run_date.isoformat(), self.started_at, self.run_id)

    def describe(self) -> str:
        """``<run_id> (<run_date>, <root>)`` for messages and headers (the root without
        credentials: :func:`ragbatch.core.redact.redact_url`)."""
        return f"{self.run_id} ({self.run_date.isoformat()}, {redact_url(self.root)})"


def recorded_storage_options(options: dict[str, Any] | None) -> dict[str, Any]:
    """``storage_options`` as a manifest recorded them, usable again: every redacted value
    (:data:`ragbatch.core.redact.REDACTED`, at any depth) is left out, so that the filesystem
    falls back to the environment's credentials for it (``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, ...)
    while non-secret options such as ``endpoint_url`` still apply.

    Parameters
    ----------
    options : dict or None

    Returns
    -------
    dict
        A new dict (nested dicts copied); empty for None.
    """
    return drop_redacted(options or {})


def _open_root(root: str, storage_options: dict[str, Any] | None) -> tuple[Any, str]:
    fs, base = resolve(root, storage_options or {})
    return fs, base.rstrip("/")


def _read_manifest(fs: Any, path: str, root: str) -> Manifest:
    try:
        return read_manifest(path, fs)
    except InputError as exc:
        raise InputError(f"{root}: {exc}") from None


def list_runs(root: str, storage_options: dict[str, Any] | None = None) -> list[CommittedRun]:
    """Every committed run under the output root ``root``, oldest first.

    Parameters
    ----------
    root : str
        Output root URI (what ``output.uri`` was when the runs were written).
    storage_options : dict, optional
        Passed to the fsspec filesystem unchanged.

    Returns
    -------
    list of CommittedRun
        Sorted by :meth:`CommittedRun.sort_key` (run date, start time, run id). Empty when
        the root holds no committed run.

    Raises
    ------
    InputError
        The root does not exist or cannot be listed (the message names it).
    """
    fs, base = _open_root(root, storage_options)
    try:
        if not fs.exists(base):
            raise InputError(
                f"output root {root} does not exist; pass the output.uri the runs were written to"
            )
        paths = fs.glob(f"{base}/runs/run_date=*/run_id=*/{MANIFEST_FILE}")
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - storage errors get a message naming the root
        raise describe_storage_error(root, exc, section="output") from None
    runs = []
    for path in paths:
        match = _MANIFEST_PATH.search("/" + path.lstrip("/"))
        if not match:
            continue
        runs.append(
            CommittedRun(
                root,
                dt.date.fromisoformat(match.group(1)),
                match.group(2),
                _read_manifest(fs, path, root),
                fs,
                base,
                dict(storage_options or {}),
            )
        )
    return sorted(runs, key=CommittedRun.sort_key)


def find_run(root: str, run_id: str, storage_options: dict[str, Any] | None = None) -> CommittedRun:
    """The committed run ``run_id`` under ``root``.

    Parameters
    ----------
    root, run_id : str
        Output root URI and run id.
    storage_options : dict, optional
        fsspec options of ``root``; kept on the returned run
        (:attr:`CommittedRun.storage_options`) for later lookups under the same root.

    Raises
    ------
    InputError
        No committed run has that id: the message says whether the id exists only as a
        staging prefix (a run in progress or one that crashed) and lists the latest
        committed ids under the root.
    """
    runs = list_runs(root, storage_options)
    for run in runs:
        if run.run_id == run_id:
            return run
    fs, base = _open_root(root, storage_options)
    if fs.exists(f"{base}/{STAGING}/run_id={run_id}"):
        raise InputError(
            f"run {run_id!r} under {root} is not committed (it has only a staging prefix: it "
            "is still running or it crashed); resume it with `ragbatch run CONFIG --run-id "
            f"{run_id}` or pick a committed run"
        )
    latest = ", ".join(r.run_id for r in runs[-5:]) or "none"
    raise InputError(f"no committed run {run_id!r} under {root}; latest committed runs: {latest}")


def previous_run(
    run: CommittedRun, storage_options: dict[str, Any] | None = None
) -> CommittedRun | None:
    """The latest committed run under ``run``'s root that sorts before ``run`` (by run date,
    then start time, then run id), or None when ``run`` is the first. The root is listed
    with ``storage_options``, by default the ones ``run`` was found with."""
    options = run.storage_options if storage_options is None else storage_options
    earlier = [
        r
        for r in list_runs(run.root, options)
        if r.run_id != run.run_id and r.sort_key() < run.sort_key()
    ]
    return earlier[-1] if earlier else None


def load_scores(
    run: CommittedRun, columns: list[str] | None = None, judges: bool = False
) -> pl.DataFrame:
    """The run's long scores table: one row per (input row, metric).

    Parameters
    ----------
    run : CommittedRun
    columns : list of str, optional
        File columns to read (default: all); the partition keys are not file columns.
    judges : bool
        Keep the cells of each judge of a judge panel (``judge`` not null). False (the
        default): only one cell per (row, metric), the panel's own for a panel, as every
        analysis of a run's scores needs. ``judge`` is read for this even when
        ``columns`` leaves it out (and dropped again).

    Returns
    -------
    polars.DataFrame
        The columns of docs/output.md "Scores table" without ``run_date``/``run_id``; files are
        concatenated with types unified (a slice column that is all null in one file takes
        the type of the others).

    Raises
    ------
    InputError
        The run has no score files (its scores were removed after it committed).
    """
    try:
        files = sorted(p for p in run.fs.find(run.scores_path) if p.endswith(".parquet"))
    except FileNotFoundError:
        files = []
    if not files:
        raise InputError(
            f"run {run.describe()} has a manifest but no score files under "
            f"{run.scores_path}; its scores were removed"
        )
    tables = []
    for path in files:
        with run.fs.open(path, "rb") as fh:
            parquet = pq.ParquetFile(fh)
            wanted = columns
            if columns is not None and not judges and JUDGE not in columns:
                wanted = [*columns, JUDGE] if JUDGE in parquet.schema_arrow.names else columns
            table = parquet.read(columns=wanted)
        if not judges and JUDGE in table.column_names:
            table = table.filter(pc.is_null(table.column(JUDGE)))
            if columns is not None and JUDGE not in columns:
                table = table.drop_columns([JUDGE])
        tables.append(table)
    return pl.from_arrow(pa.concat_tables(tables, promote_options="permissive"))


def load_summary(run: CommittedRun) -> pl.DataFrame:
    """The run's ``summary.parquet`` as a DataFrame (schema: docs/output.md "Summary table").

    Raises
    ------
    InputError
        The summary file is missing.
    """
    if not run.fs.exists(run.summary_path):
        raise InputError(f"run {run.describe()} has no summary file at {run.summary_path}")
    with run.fs.open(run.summary_path, "rb") as fh:
        return pl.from_arrow(pq.read_table(fh))
