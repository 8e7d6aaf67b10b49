"""Calibration tables under the output root, committed by a manifest written last.

Layout (hive-style, like a run's tables)::

    calibration/run_date=YYYY-MM-DD/run_id=<id>/agreement.parquet      one row per (judge, metric, measure)
    calibration/run_date=YYYY-MM-DD/run_id=<id>/confusion.parquet      binary: (judge, metric, human, verdict) counts
    calibration/run_date=YYYY-MM-DD/run_id=<id>/disagreements.parquet  the rows judge and humans disagree on most
    calibration/run_date=YYYY-MM-DD/run_id=<id>/alignment.parquet      --align only: before, after, change
    calibration/run_date=YYYY-MM-DD/run_id=<id>/manifest.json          written last: the calibration is committed

The judges' scores are ordinary committed runs under the same root (run id
``<id>-<judge>``), and the labelled rows they read are in
``calibration_inputs/run_id=<id>/labelled.parquet`` (with ``--align``, the held-out rows
the judges read in ``held_out.parquet`` beside it).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from ragbatch.core.errors import InputError, OutputError
from ragbatch.core.ids import check_id
from ragbatch.io.fs import resolve

TABLES = ("agreement", "confusion", "disagreements", "reliability")
#: Tables written only by the calibrations that hold them (``ragbatch calibrate --align``).
OPTIONAL_TABLES = ("alignment",)
MANIFEST = "manifest.json"

#: The leading columns of the per-bin and per-row tables: which judge and metric they
#: describe, and the run that scored them.
_JUDGED_BY = [
    ("judge", pa.string()),
    ("model", pa.string()),
    ("metric", pa.string()),
    ("metric_name", pa.string()),
    ("prompt_version", pa.string()),
    ("scores_run_id", pa.string()),
]

#: Column types of each table (an empty table keeps its columns).
SCHEMAS: dict[str, pa.Schema] = {
    "agreement": pa.schema(
        [
            ("judge", pa.string()),
            ("model", pa.string()),
            ("metric", pa.string()),
            ("metric_name", pa.string()),
            ("metric_version", pa.int64()),
            ("prompt_version", pa.string()),
            ("label_column", pa.string()),
            ("label_type", pa.string()),
            ("scores_run_id", pa.string()),
            ("n_cells", pa.int64()),
            ("n_ok", pa.int64()),
            ("n_labelled", pa.int64()),
            ("measure", pa.string()),
            ("n", pa.int64()),
            ("value", pa.float64()),
            ("ci_low", pa.float64()),
            ("ci_high", pa.float64()),
            ("reason", pa.string()),
        ]
    ),
    "confusion": pa.schema(
        [
            *_JUDGED_BY,
            ("human", pa.int64()),
            ("judge_verdict", pa.int64()),
            ("n", pa.int64()),
            ("judge_threshold", pa.float64()),
        ]
    ),
    "reliability": pa.schema(
        [
            *_JUDGED_BY,
            ("bin_low", pa.float64()),
            ("bin_high", pa.float64()),
            ("n", pa.int64()),
            ("mean_p", pa.float64()),
            ("observed", pa.float64()),
        ]
    ),
    "alignment": pa.schema(
        [
            ("judge", pa.string()),
            ("model", pa.string()),
            ("metric", pa.string()),
            ("metric_name", pa.string()),
            ("prompt_version_before", pa.string()),
            ("prompt_version_after", pa.string()),
            ("measure", pa.string()),
            ("n_before", pa.int64()),
            ("before", pa.float64()),
            ("before_low", pa.float64()),
            ("before_high", pa.float64()),
            ("n_after", pa.int64()),
            ("after", pa.float64()),
            ("after_low", pa.float64()),
            ("after_high", pa.float64()),
            ("n_paired", pa.int64()),
            ("difference", pa.float64()),
            ("difference_low", pa.float64()),
            ("difference_high", pa.float64()),
            ("reason", pa.string()),
        ]
    ),
    "disagreements": pa.schema(
        [
            *_JUDGED_BY,
            ("rank", pa.int64()),
            ("row_id", pa.string()),
            ("pair_id", pa.string()),
            ("label", pa.float64()),
            ("score", pa.float64()),
            ("distance", pa.float64()),
            ("reason", pa.string()),
            ("judge_reply", pa.string()),
            ("question", pa.string()),
            ("answer", pa.string()),
        ]
    ),
}


@dataclass
class CalibrationRun:
    """A committed calibration: its root, date, id, manifest and paths."""

    root: str
    run_date: dt.date
    run_id: str
    manifest: dict[str, Any]
    fs: Any
    path: str

    def table(self, name: str) -> pl.DataFrame:
        """One of :data:`TABLES` as a DataFrame."""
        with self.fs.open(f"{self.path}/{name}.parquet", "rb") as fh:
            return pl.from_arrow(pq.read_table(fh))


def calibration_path(base: str, run_date: dt.date, run_id: str) -> str:
    """Directory of one calibration's tables (a path of the root's filesystem).

    Raises
    ------
    ConfigError
        ``run_id`` is not a valid id (:func:`ragbatch.core.ids.check_id`).
    """
    run_id = check_id(run_id, "calibration id")
    return f"{base.rstrip('/')}/calibration/run_date={run_date.isoformat()}/run_id={run_id}"


def write_calibration(
    root: str,
    storage_options: dict[str, Any],
    run_date: dt.date,
    run_id: str,
    tables: dict[str, list[dict[str, Any]]],
    manifest: dict[str, Any],
) -> str:
    """Write the tables (every one of :data:`TABLES`, empty when ``tables`` lacks it, and
    those of :data:`OPTIONAL_TABLES` that ``tables`` holds), then the manifest (the
    commit); return the directory's URI.

    Raises
    ------
    OutputError
        A calibration with this id is already committed under ``root``.
    """
    fs, base = resolve(root, storage_options)
    path = calibration_path(base, run_date, run_id)
    if fs.exists(f"{path}/{MANIFEST}"):
        raise OutputError(
            f"calibration {run_id!r} is already committed under {root}; pass a new --run-id"
        )
    fs.makedirs(path, exist_ok=True)
    for name in (*TABLES, *(t for t in OPTIONAL_TABLES if t in tables)):
        table = pa.Table.from_pylist(tables.get(name, []), schema=SCHEMAS[name])
        with fs.open(f"{path}/{name}.parquet", "wb") as fh:
            pq.write_table(table, fh)
    with fs.open(f"{path}/{MANIFEST}", "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=2, default=str)
        fh.write("\n")
    return path


def list_calibrations(
    root: str, storage_options: dict[str, Any] | None = None
) -> list[CalibrationRun]:
    """Every committed calibration under ``root``, oldest first (by run date, start
    time, run id)."""
    fs, base = resolve(root, storage_options or {})
    pattern = f"{base.rstrip('/')}/calibration/run_date=*/run_id=*/{MANIFEST}"
    found = []
    for manifest_path in fs.glob(pattern):
        path = manifest_path.rsplit("/", 1)[0]
        run_id = path.rsplit("run_id=", 1)[1]
        run_date = dt.date.fromisoformat(path.split("run_date=", 1)[1].split("/", 1)[0])
        with fs.open(manifest_path, "r", encoding="utf-8") as fh:
            manifest = json.load(fh)
        found.append(CalibrationRun(root, run_date, run_id, manifest, fs, path))
    return sorted(
        found,
        key=lambda c: (c.run_date.isoformat(), str(c.manifest.get("started_at", "")), c.run_id),
    )


def find_calibration(
    root: str, run_id: str | None = None, storage_options: dict[str, Any] | None = None
) -> CalibrationRun:
    """The committed calibration ``run_id`` under ``root``, or the latest one.

    Raises
    ------
    InputError
        There is none (the message names the root and the id).
    """
    runs = list_calibrations(root, storage_options)
    if run_id is not None:
        runs = [c for c in runs if c.run_id == run_id]
    if not runs:
        which = f"calibration {run_id!r} not found" if run_id else "no committed calibration"
        raise InputError(
            f"{which} under {root}; run `ragbatch calibrate` with output.uri "
            f"{root} first, or fix calibration.uri / calibration.run_id"
        )
    return runs[-1]
