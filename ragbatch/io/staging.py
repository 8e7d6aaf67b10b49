"""Staging, resume and atomic publish of a run's outputs.

A run writes its scores under a staging prefix that readers of committed runs never
look at, and publishes them only when every check has passed::

    _staging/run_id=<id>/state.json                     run date, fingerprint, attempts
    _staging/run_id=<id>/lease/<generation>.json        the attempt running now (ragbatch.io.lease)
    _staging/run_id=<id>/scores/attempt=<k>/*.parquet   scores written by attempt k

Publishing moves the accepted score files to ``scores/run_date=<d>/run_id=<id>/``, writes
the summary, writes the manifest last (the commit: a run is committed exactly when its
manifest exists) and removes the staging prefix, and ``_staging/`` itself when no other
run's prefix is left in it. Readers key on committed runs (see
docs/output.md): the scores of a run whose manifest is missing are not part of any
result, and a crashed run leaves only its staging prefix, whose name starts with ``_``
(Hive, Spark and the README's DuckDB queries skip it).

Resume: a run started again with the same run id finds its staging prefix and reuses
what earlier attempts wrote. Every complete Parquet file of an earlier attempt is read
(a file cut short by the crash has no footer and is deleted); a row counts as done when
its cells for every metric of the run are in those files and none has status ``error``, and files holding cells of a
row that is not done are set aside, until no such file is left. The done rows are not
scored again; the accepted files are recorded in ``state.json`` so that a file an
orphaned worker of an earlier attempt finishes writing later is never published.
Different run ids never share a path, so concurrent runs under one output root do not
interfere; attempts of one run id exclude each other through the run's lease
(:mod:`ragbatch.io.lease`), taken before anything else is read or written, so that the
"already committed" check and the resume happen under it. Every delete stays inside the
prefix it belongs to (:mod:`ragbatch.io.removal`), and the run id is checked as a path
segment (:func:`ragbatch.core.ids.check_id`) before any path is built from it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ragbatch.config.panel import member_key

from ragbatch.core.errors import OutputError, OutputNotWritableError, RagbatchError
from ragbatch.core.ids import check_id
from ragbatch.io.fs import describe_storage_error, with_storage_retries
from ragbatch.io.lease import RunLease
from ragbatch.io.removal import remove_empty_dir, remove_under
from ragbatch.io.write import OutputLayout
from ragbatch.io.manifest_model import Manifest
from ragbatch.core.status import ERROR

log = logging.getLogger("ragbatch")

STAGING = "_staging"
STATE_FILE = "state.json"
LEASE_DIR = "lease"


@dataclass
class Resume:
    """What an attempt starts from.

    Attributes
    ----------
    attempt : int
        1 for a new run, k for the k-th start of the same run id.
    done_rows : set of str
        Row ids whose cells for every metric earlier attempts wrote.
    accepted : list of str
        Score files of earlier attempts that will be published (paths).
    set_aside : list of str
        Files of earlier attempts that are incomplete or hold cells of rows not done;
        they are deleted now and never published.
    """

    attempt: int
    done_rows: set[str] = field(default_factory=set)
    accepted: list[str] = field(default_factory=list)
    set_aside: list[str] = field(default_factory=list)

    @property
    def resumed(self) -> bool:
        return self.attempt > 1


def run_fingerprint(config: dict[str, Any], input_fingerprint: str) -> str:
    """sha256 of what decides a run's output: the config and the input fingerprint. A
    resume must match it. Left out: the run id and date, the error budget (raising it is
    how a stopped run is let through), where it executes and the read tasks in flight
    (a run that ran out of memory in the process is resumed on Ray or with fewer tasks;
    they change cost, not scores), the storage
    options (rotated credentials must not block a resume), the judgment cache settings
    (they change cost, not scores) and the calibration guard (it decides whether a run
    starts, not what it writes)."""
    config = json.loads(json.dumps(config, default=str))
    for key in ("run_id", "run_date", "error_budget", "executor", "tasks_in_flight"):
        config.get("run", {}).pop(key, None)
    config.pop("cache", None)
    config.pop("calibration", None)
    for section in ("input", "output"):
        config.get(section, {}).pop("storage_options", None)
    blob = json.dumps({"config": config, "input": input_fingerprint}, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class Staging:
    """The staging prefix of one run under ``layout``'s output root.

    Raises
    ------
    ConfigError
        ``layout.run_id`` is not a valid id (:func:`ragbatch.core.ids.check_id`).
    """

    def __init__(self, layout: OutputLayout):
        self.layout = layout
        self.fs = layout.fs
        self.parent = f"{layout.base}/{STAGING}"
        self.root = f"{self.parent}/run_id={check_id(layout.run_id, 'run id')}"
        self.state_path = f"{self.root}/{STATE_FILE}"
        self.attempt = 1
        self.lease = RunLease(self.fs, f"{self.root}/{LEASE_DIR}", layout.run_id, layout.uri)

    def scores_dir(self, attempt: int | None = None) -> str:
        """Where attempt ``attempt`` (default: the current one) writes its score files."""
        return f"{self.root}/scores/attempt={self.attempt if attempt is None else attempt}"

    # -- starting --------------------------------------------------------------------------

    def begin(
        self, fingerprint: str, metric_ids: list[str], input_version: dict | None = None
    ) -> Resume:
        """Take the run's lease, then start attempt 1, or the next attempt of an
        interrupted run. The lease is renewed until :meth:`publish` or :meth:`close`.

        ``input_version`` (a table input: ``{"format": str, <pin field>: int}``, the
        table version the run reads, as :func:`ragbatch.io.read.input_fingerprint` gives
        it) is recorded by attempt 1 for the later attempts
        (:meth:`input_version`).

        Raises
        ------
        RunInProgressError
            Another attempt of this run id holds its lease; the message names it.
        OutputError
            The run id is already committed under this root; or it was started with a
            different config or input (its fingerprint differs); or the root cannot be
            written. Each message names the run id, the root and what to do.
        """
        try:
            self._check_bucket()
            self.lease.acquire()
            resume = self._start(fingerprint, metric_ids, input_version)
        except BaseException as exc:
            self.lease.release()
            if isinstance(exc, RagbatchError) or not isinstance(exc, Exception):
                raise
            raise OutputError(
                str(describe_storage_error(self.layout.root, exc, section="output"))
            ) from None
        self.lease.start_renewing()
        return resume

    def _start(
        self, fingerprint: str, metric_ids: list[str], input_version: dict | None = None
    ) -> Resume:
        """:meth:`begin` under the lease."""
        self.fs.invalidate_cache(self.layout.manifest_path)
        if self.fs.exists(self.layout.manifest_path):
            self._remove_prefix()
            raise OutputError(
                f"run {self.layout.run_id!r} is already committed under {self.layout.root} "
                f"({self.layout.uri(self.layout.manifest_path)}); pass a new --run-id"
            )
        state = self._read_state()
        if state is None:
            if self.fs.exists(self.layout.scores_path):
                raise OutputError(
                    f"run {self.layout.run_id!r} has scores but no manifest under "
                    f"{self.layout.root} ({self.layout.uri(self.layout.scores_path)}), "
                    "written by a version without staging; remove them or pass a new --run-id"
                )
            self._write_state(
                {
                    "run_id": self.layout.run_id,
                    "fingerprint": fingerprint,
                    "run_date": self.layout.run_date.isoformat(),
                    "attempts": 1,
                    "accepted": [],
                    "started_at": _now(),
                    **({"input_version": input_version} if input_version else {}),
                }
            )
            return Resume(attempt=1)
        if state["fingerprint"] != fingerprint:
            raise OutputError(
                f"run {self.layout.run_id!r} under {self.layout.root} was started with a "
                "different config or input, so its partial scores cannot be reused; pass a "
                f"new --run-id, or delete {self.layout.uri(self.root)} to start it over"
            )
        self.attempt = int(state["attempts"]) + 1
        self._undo_partial_publish()
        resume = self._scan(state, metric_ids)
        state.update(attempts=self.attempt, accepted=resume.accepted, resumed_at=_now())
        self._write_state(state)
        return resume

    def _check_bucket(self) -> None:
        check_output_bucket(self.fs, self.layout.base, self.layout.root)

    def run_date(self) -> dt.date | None:
        """The run date an earlier attempt recorded (a resume keeps it), or None."""
        state = self._read_state()
        return dt.date.fromisoformat(state["run_date"]) if state else None

    def input_version(self) -> dict | None:
        """The table version an earlier attempt read (``{"format": str, <pin field>:
        int}``, recorded by :meth:`begin`), or None (no earlier attempt, or not a table
        input)."""
        state = self._read_state()
        return state.get("input_version") if state else None

    def _read_state(self) -> dict[str, Any] | None:
        if not self.fs.exists(self.state_path):
            return None
        with self.fs.open(self.state_path, "r", encoding="utf-8") as fh:
            return json.load(fh)

    def _write_state(self, state: dict[str, Any]) -> None:
        self.fs.makedirs(self.root, exist_ok=True)
        tmp = f"{self.state_path}.tmp"
        with self.fs.open(tmp, "w", encoding="utf-8") as fh:
            json.dump(state, fh, indent=2)
        self.fs.mv(tmp, self.state_path)

    def _undo_partial_publish(self) -> None:
        """An attempt that died while publishing moved some files to the scores partition
        but wrote no manifest: move them back to staging (as attempt 0) to be scanned."""
        moved = self._files(self.layout.scores_path)
        if not moved:
            return
        back = self.scores_dir(0)
        self.fs.makedirs(back, exist_ok=True)
        for path in moved:
            self.fs.mv(path, f"{back}/{path.rsplit('/', 1)[1]}")
        log.info("resume: moved %d files of an unfinished publish back to staging", len(moved))

    def _scan(self, state: dict[str, Any], metric_ids: list[str]) -> Resume:
        """Find the reusable files and done rows of the earlier attempts."""
        current = self.scores_dir() + "/"
        files = sorted(p for p in self._files(f"{self.root}/scores") if not p.startswith(current))
        cells: dict[str, dict[str, set[str]]] = {}  # file -> row id -> metrics
        broken = []
        for path in files:
            try:
                with self.fs.open(path, "rb") as fh:
                    parquet = pq.ParquetFile(fh)
                    names = parquet.schema_arrow.names
                    wanted_columns = ("row_id", "metric", "status", "judge")
                    table = parquet.read(columns=[c for c in wanted_columns if c in names])
            except Exception as exc:  # noqa: BLE001 - a file cut short by the crash
                log.info("resume: %s is incomplete (%s); its rows are scored again", path, exc)
                broken.append(path)
                continue
            per_row: dict[str, set[str]] = {}
            for row_id, metric, status in zip(
                table.column("row_id").to_pylist(),
                _metric_keys(table),
                table.column("status").to_pylist(),
            ):
                # A cell with status error is not done: a resume scores its row again.
                per_row.setdefault(row_id, set()).update(() if status == ERROR else (metric,))
            cells[path] = per_row
        wanted = set(metric_ids)
        accepted = set(cells)
        while True:
            merged: dict[str, set[str]] = {}
            for path in accepted:
                for row_id, metrics in cells[path].items():
                    merged.setdefault(row_id, set()).update(metrics)
            done = {r for r, m in merged.items() if m == wanted}
            drop = {p for p in accepted if any(r not in done for r in cells[p])}
            if not drop:
                break
            accepted -= drop
        set_aside = sorted(set(files) - accepted)
        for path in set_aside:
            remove_under(self.fs, self.root, path)
        log.info(
            "resume of run %s (attempt %d): %d rows reused from %d files; %d files set aside",
            self.layout.run_id,
            self.attempt,
            len(done),
            len(accepted),
            len(set_aside),
        )
        return Resume(self.attempt, done, sorted(accepted), set_aside)

    def _files(self, path: str) -> list[str]:
        if not self.fs.exists(path):
            return []
        return [p for p in self.fs.find(path) if p.endswith(".parquet")]

    # -- finishing -------------------------------------------------------------------------

    def score_files(self, resume: Resume) -> list[str]:
        """The files this run publishes: the accepted files of earlier attempts and every
        file of the current attempt."""
        return sorted(resume.accepted) + sorted(self._files(self.scores_dir()))

    def publish(self, files: list[str], summary: Any, manifest: Manifest) -> None:
        """Confirm that this attempt still holds the run's lease, move ``files`` into the
        run's scores partition, write the summary, write the manifest (the commit), and
        remove the staging prefix (lease included) and ``_staging/`` when it is left
        empty. Each storage call is retried with backoff while the store is unreachable
        or throttling.

        Raises
        ------
        RunInProgressError
            The lease was taken over by another attempt (this one stalled past its
            expiry); nothing is published.
        """
        retry = with_storage_retries
        retry(self.lease.check, "check the run's lease")
        target = self.layout.scores_path
        retry(lambda: self.fs.makedirs(target, exist_ok=True), f"create {target}")
        for i, path in enumerate(files):
            dest = f"{target}/part-{i:05d}.parquet"
            retry(lambda: self.fs.mv(path, dest), f"move {path}")
        retry(
            lambda: self.layout.write_table(self.layout.summary_path, summary), "write the summary"
        )
        retry(
            lambda: self.layout.write_json(self.layout.manifest_path, manifest.to_json_dict()),
            "write the manifest",
        )
        try:
            self._remove_prefix()
        except Exception as exc:  # noqa: BLE001 - the run is committed; leftovers are harmless
            log.warning(
                "run %s committed, but its staging prefix %s was not removed: %s",
                self.layout.run_id,
                self.root,
                exc,
            )

    def close(self) -> None:
        """End this attempt's hold on the run: stop renewing the lease and mark it
        released (unless :meth:`publish` already removed it), so that the next attempt,
        on any machine, can start at once. Call it however the attempt ends."""
        self.lease.release()

    def _remove_prefix(self) -> None:
        """Remove this run's staging prefix, lease included (the run is committed), then
        ``_staging/`` if no other run's prefix is in it."""
        self.lease.release(write=False)
        if self.fs.exists(self.root):
            remove_under(self.fs, self.parent, self.root, recursive=True)
        remove_empty_dir(self.fs, self.layout.base, self.parent)


def check_output_bucket(fs: Any, base: str, root: str) -> None:
    """On object storage, the output bucket must exist: creating a directory there would
    otherwise create the bucket (s3fs and gcsfs do), under whatever account the
    credentials belong to.

    Raises
    ------
    OutputNotWritableError
        The bucket of ``base`` does not exist or cannot be seen (exit status 2); the
        message names ``root``. (s3fs answers "no" also when the endpoint cannot be
        reached; :func:`ragbatch.io.probe.probe_output`, which runs first, tells the two
        apart.)
    """
    protocol = fs.protocol
    protocol = protocol[0] if isinstance(protocol, (tuple, list)) else protocol
    if protocol not in ("s3", "s3a", "gs", "gcs", "abfs", "az"):
        return
    bucket = base.split("/", 1)[0]
    if not fs.exists(bucket):
        raise OutputNotWritableError(
            f"{root}: cannot write under output.uri: bucket {bucket!r} does not exist (or "
            "these credentials cannot see it); create it, or fix output.uri / "
            "output.storage_options"
        )


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


def _metric_keys(table: pa.Table) -> list[str]:
    """Each score row's metric key: ``metric``, or ``<metric>[<judge>]`` for a judge
    panel's member cell (:func:`ragbatch.config.panel.member_key`); files without a
    ``judge`` column give ``metric``."""
    metrics = table.column("metric").to_pylist()
    if "judge" not in table.column_names:
        return metrics
    judges = table.column("judge").to_pylist()
    return [m if j is None else member_key(m, j) for m, j in zip(metrics, judges)]
