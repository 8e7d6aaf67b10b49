"""One attempt per run id: a lease in the run's staging prefix on the output storage.

::

    _staging/run_id=<id>/lease/<generation>.json     who holds the run, until when

An attempt takes the lease by creating the next generation's file with an exclusive
create (:func:`create_exclusive`: ``O_EXCL`` on a local disk, a conditional ``PUT`` with
``If-None-Match: *`` on S3): of attempts that race for one generation exactly one
succeeds, whichever process or machine they run in. A new
generation may be taken only when the latest one has ended: released, expired, or held
by a process that no longer exists on this machine.

The file records the holder (host, pid, a random token, when it took the lease) and an
expiry :data:`LEASE_TTL_S` ahead, which the holder renews every :data:`RENEW_EVERY_S`
from a background thread while it runs. An attempt that crashes stops renewing: another
machine takes the run over once the expiry has passed, and this machine at once (the
holder's process is gone). A holder that finds a later generation lost the lease (it
stalled past its expiry) and does not commit. Generations only grow while the staging
prefix exists; committing removes the prefix, lease included.

Expiry is read against the reader's clock: machines that share an output root need
clocks that agree to well within :data:`LEASE_TTL_S` (NTP does).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable

from fsspec.implementations.local import LocalFileSystem

from ragbatch.core.errors import RunInProgressError

log = logging.getLogger("ragbatch")

#: Seconds a lease lasts without renewal.
LEASE_TTL_S = 120.0
#: Seconds between renewals by the holder.
RENEW_EVERY_S = 30.0
#: Attempts at taking a generation when others keep taking it first.
_CONTENDED_TRIES = 5


def _process_scope() -> str:
    """What makes a pid meaningful: the host name, its boot and its pid namespace (the
    last two where Linux tells them), so that a pid is only judged on its own machine
    and container."""
    parts = [socket.gethostname()]
    for read in (
        lambda: open("/proc/sys/kernel/random/boot_id").read().strip(),
        lambda: os.readlink("/proc/self/ns/pid"),
    ):
        try:
            parts.append(read())
        except OSError:
            parts.append("")
    return "|".join(parts)


def _process_gone(pid: int) -> bool:
    """Whether no process ``pid`` runs here (a zombie counts as gone)."""
    if os.name != "posix":
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def create_exclusive(fs: Any, path: str, data: bytes) -> None:
    """Create ``path`` holding ``data``, or raise :class:`FileExistsError` when it exists.

    Of processes that race to create one path, exactly one succeeds. On a local disk
    this is the operating system's ``O_CREAT | O_EXCL`` open: fsspec's own
    ``pipe_file(..., mode="create")`` there looks for the file, then opens it for
    writing, and two processes can both pass the look. Elsewhere it is the filesystem's
    ``mode="create"``: exclusive where the filesystem implements it (s3fs: a conditional
    ``PUT`` with ``If-None-Match: *``); a filesystem that leaves it to fsspec's default
    gets the same look-then-write, so two attempts started within moments of each other
    on such a store may both run. A reader may see a local file empty for the moment
    between the create and the write.

    Raises
    ------
    FileExistsError
        ``path`` exists (another attempt created it first).
    OSError
        The storage's own errors.
    """
    if isinstance(fs, LocalFileSystem):
        with open(fs._strip_protocol(path), "xb") as fh:
            fh.write(data)
        return
    fs.pipe_file(path, data, mode="create")


def _when(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class LeaseRecord:
    """The content of one generation's lease file (times in seconds since the epoch)."""

    generation: int
    token: str
    host: str
    pid: int
    scope: str
    acquired_at: float
    renewed_at: float
    expires_at: float
    released: bool = False
    #: True when the file could not be read (it is being written): then only
    #: ``generation`` and ``expires_at`` (file time + TTL) mean anything.
    unreadable: bool = False

    @classmethod
    def new(cls, generation: int, ttl_s: float) -> "LeaseRecord":
        now = time.time()
        return cls(
            generation,
            secrets.token_hex(8),
            socket.gethostname(),
            os.getpid(),
            _process_scope(),
            now,
            now,
            now + ttl_s,
        )

    def to_bytes(self) -> bytes:
        data = asdict(self)
        data.pop("unreadable")
        data.update(
            {f"{k}_utc": _when(data[k]) for k in ("acquired_at", "renewed_at", "expires_at")}
        )
        return (json.dumps(data, indent=2) + "\n").encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes) -> "LeaseRecord":
        raw = json.loads(data)
        return cls(
            **{
                k: raw[k]
                for k in (
                    "generation",
                    "token",
                    "host",
                    "pid",
                    "scope",
                    "acquired_at",
                    "renewed_at",
                    "expires_at",
                    "released",
                )
            }
        )

    def live(self, now: float) -> bool:
        """Whether the holder may still be running: not released, not expired, and not a
        process of this machine that is gone."""
        if self.released or now >= self.expires_at:
            return False
        return self.unreadable or self.scope != _process_scope() or not _process_gone(self.pid)

    def describe(self) -> str:
        """``host H, pid P, since T; its lease expires at E unless renewed``."""
        if self.unreadable:
            return (
                f"an attempt that is writing lease generation {self.generation}; it "
                f"expires at {_when(self.expires_at)} unless renewed"
            )
        return (
            f"host {self.host}, pid {self.pid}, since {_when(self.acquired_at)}; its "
            f"lease expires at {_when(self.expires_at)} unless renewed (every "
            f"{RENEW_EVERY_S:g} s while it runs)"
        )


class RunLease:
    """The lease of one run id in ``folder`` (a path of ``fs``).

    Parameters
    ----------
    fs : fsspec.AbstractFileSystem
    folder : str
        The lease folder, ``<staging prefix>/lease``.
    run_id : str
        For messages.
    uri : callable, optional
        Turns a path of ``fs`` into a URI for messages.
    ttl_s, renew_every_s : float, optional
        Default :data:`LEASE_TTL_S` and :data:`RENEW_EVERY_S`.
    """

    def __init__(
        self,
        fs: Any,
        folder: str,
        run_id: str,
        uri: Callable[[str], str] = str,
        ttl_s: float | None = None,
        renew_every_s: float | None = None,
    ):
        self.fs, self.folder, self.run_id, self.uri = fs, folder.rstrip("/"), run_id, uri
        self.ttl_s = LEASE_TTL_S if ttl_s is None else ttl_s
        self.renew_every_s = RENEW_EVERY_S if renew_every_s is None else renew_every_s
        self.record: LeaseRecord | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lost_to: str | None = None

    def path(self, generation: int) -> str:
        """The file of lease generation ``generation``."""
        return f"{self.folder}/{generation:08d}.json"

    # -- taking and checking ---------------------------------------------------------------

    def acquire(self) -> LeaseRecord:
        """Take the lease: create the next generation when the latest one has ended.

        Returns
        -------
        LeaseRecord
            What this attempt wrote.

        Raises
        ------
        RunInProgressError
            Another attempt holds the lease; the message names its host, pid, since when
            and when its lease expires.
        OSError
            The storage's own errors.
        """
        self.fs.makedirs(self.folder, exist_ok=True)
        for _ in range(_CONTENDED_TRIES):
            generations = self._generations()
            top = generations[-1] if generations else 0
            holder = self._read(top) if top else None
            if holder is not None and holder.live(time.time()):
                raise RunInProgressError(
                    f"run {self.run_id!r} is being run by another attempt: {holder.describe()}; "
                    f"wait for it to end (a crashed attempt's lease lapses), or pass a new "
                    f"--run-id (lease: {self.uri(self.path(top))})"
                )
            record = LeaseRecord.new(top + 1, self.ttl_s)
            try:
                create_exclusive(self.fs, self.path(record.generation), record.to_bytes())
            except FileExistsError:
                continue  # another attempt took this generation first: look again
            if holder is not None:
                log.info(
                    "run %s: took over the lease of an attempt that ended (%s)",
                    self.run_id,
                    holder.describe(),
                )
            self.record = record
            return record
        raise RunInProgressError(
            f"run {self.run_id!r}: other attempts kept taking its lease "
            f"({self.uri(self.folder)}); try again, or pass a new --run-id"
        )

    def check(self) -> None:
        """Confirm that this attempt still holds the lease (before it commits).

        Raises
        ------
        RunInProgressError
            A later generation exists (another attempt took the run over after this one's
            lease expired), or this attempt's lease file is gone or replaced.
        """
        with self._lock:
            lost = self._lost_to or self._lost_reason()
        if lost is not None:
            raise RunInProgressError(
                f"run {self.run_id!r}: this attempt lost its lease (it was not renewed in "
                f"time) to {lost}; it is not committed"
            )

    def _lost_reason(self) -> str | None:
        """Who took this attempt's lease over (as :meth:`LeaseRecord.describe` says), or
        None while this attempt holds it."""
        if self.record is None:
            return None
        mine = self.record.generation
        later = [g for g in self._generations() if g > mine]
        if later:
            holder = self._read(later[-1])
            return holder.describe() if holder is not None else f"lease generation {later[-1]}"
        current = self._read(mine)
        if current is None:
            return "nobody (its lease file was removed)"
        return None if current.token == self.record.token else current.describe()

    def _generations(self) -> list[int]:
        self.fs.invalidate_cache(self.folder)
        try:
            names = self.fs.ls(self.folder, detail=False)
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            stem = name.rstrip("/").rsplit("/", 1)[-1]
            if stem.endswith(".json") and stem[:-5].isdigit():
                found.append(int(stem[:-5]))
        return sorted(found)

    def _read(self, generation: int) -> LeaseRecord | None:
        """The record of ``generation``; None when its file is gone. A file that cannot
        be parsed (an exclusive create whose content is still being written) is read
        again briefly, then counts as live until its modification time plus the TTL."""
        path = self.path(generation)
        for wait in (0.05, 0.2, 0.5):
            try:
                return LeaseRecord.from_bytes(self.fs.cat_file(path))
            except FileNotFoundError:
                return None
            except (ValueError, KeyError, TypeError):
                time.sleep(wait)
        try:
            modified = self.fs.modified(path).timestamp()
        except FileNotFoundError:
            return None
        return LeaseRecord(
            generation, "", "?", 0, "", modified, modified, modified + self.ttl_s, unreadable=True
        )

    # -- renewing and ending ---------------------------------------------------------------

    def start_renewing(self) -> None:
        """Renew the lease every ``renew_every_s`` from a daemon thread until
        :meth:`release`; a renewal that finds the lease lost stops (see :meth:`check`)."""
        if self.record is None or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._renew_loop, daemon=True, name=f"ragbatch-lease-{self.run_id}"
        )
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.renew_every_s):
            try:
                with self._lock:
                    if self.record is None or self._stop.is_set():
                        return
                    lost = self._lost_reason()
                    if lost is not None:
                        self._lost_to = lost
                        log.error("run %s: lost its lease to %s", self.run_id, lost)
                        return
                    self._write(renewed=True)
            except Exception as exc:  # noqa: BLE001 - try again next time; check() decides
                log.warning(
                    "run %s: could not renew its lease (%s); trying again in %g s",
                    self.run_id,
                    exc,
                    self.renew_every_s,
                )

    def _write(self, *, renewed: bool = False, released: bool = False) -> None:
        now = time.time()
        assert self.record is not None
        self.record = replace(
            self.record,
            renewed_at=now if renewed else self.record.renewed_at,
            expires_at=now if released else now + self.ttl_s,
            released=released,
        )
        self.fs.pipe_file(self.path(self.record.generation), self.record.to_bytes())

    def release(self, *, write: bool = True) -> None:
        """Stop renewing and give the lease up. With ``write`` (a failed or stopped
        attempt) the file is marked released, so that the next attempt starts at once,
        on any machine; without it (the caller removes the staging prefix, lease and
        all) nothing is written. Idempotent; storage errors are logged, not raised (the
        lease then lapses at its expiry)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            if self.record is None:
                return
            try:
                if write and self._lost_to is None and self._lost_reason() is None:
                    self._write(released=True)
            except Exception as exc:  # noqa: BLE001 - it lapses at its expiry instead
                log.warning(
                    "run %s: could not release its lease (%s); it lapses at %s",
                    self.run_id,
                    exc,
                    _when(self.record.expires_at),
                )
            self.record = None
