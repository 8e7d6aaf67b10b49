"""The judgment cache: judge replies keyed by everything that determines them.

A key is the SHA-256 of a canonical JSON document holding the engine's model id, its
sampling settings, the request's seed (which carries the parse-retry attempt, so a
retry never reuses the reply it retries), the full prompt, the output spec, and the
metric's name, version and params (:func:`cache_key`).

Every entry is also filed under its row's *group* (:func:`group_key`): a hash of the
engine's identity and the row's judge inputs. A judge actor looks up the groups of a
batch's rows once, when the batch starts (:meth:`JudgmentCache.lookup`; on a worker
thread, so that the other batches on the actor's event loop go on, see
:meth:`~ragbatch.judge.run.JudgeRunner.run`), and so finds every step of every
metric that was judged on those rows, the later steps of a multi-step metric included;
it keeps them until the batch ends. Its memory and start-up
therefore depend on the batch, not on the cache's size.

After each batch, an actor writes the replies it paid for, and which cached entries it
used, as one journal file (:meth:`JudgmentCache.flush`), so a killed run keeps what it
paid for. When a run commits, the journal is folded into at most one file per bucket
(:func:`ragbatch.judge.cache_upkeep.fold_journal`); ``ragbatch cache compact`` and
``ragbatch cache prune`` merge and trim the buckets. Layout:
:mod:`ragbatch.judge.cache_store`; design and costs: docs/cache.md.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import threading
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Protocol

import pyarrow as pa
from cachetools import LRUCache

from ragbatch.core.errors import OutputError
from ragbatch.judge.cache_files import ENTRY_SCHEMA, CacheFiles, Reply
from ragbatch.judge.cache_store import BucketReader
from ragbatch.judge.protocol import Ask, Completion, logprobs_from_json, logprobs_json
from ragbatch.core.status import OK

log = logging.getLogger(__name__)

#: The row columns a group is made of (besides the engine's identity).
GROUP_COLUMNS = ("question", "contexts", "answer", "reference")
#: Replies an actor obtained itself that it keeps for later batches of its run.
RECENT_ENTRIES = 4096


class KeyedEngine(Protocol):
    """What a cache key takes from an engine: a :class:`~ragbatch.judge.protocol.JudgeEngine`,
    or the identity of one recorded without loading it."""

    @property
    def model_id(self) -> str: ...

    def sampling_key(self) -> dict[str, Any]: ...


def cache_key(engine: KeyedEngine, identity: dict[str, Any], ask: Ask, seed: int) -> str:
    """Hex SHA-256 over model id, sampling settings, ``seed``, prompt, output spec and
    the metric ``identity`` (:meth:`~ragbatch.judge.metric.JudgeMetric.cache_identity`)."""
    document = {
        "model": engine.model_id,
        "sampling": engine.sampling_key(),
        "seed": seed,
        "prompt": ask.prompt_text(),
        "output": ask.output.key(),
        "metric": identity,
    }
    text = json.dumps(document, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def group_key(engine: KeyedEngine, row: dict[str, Any]) -> str:
    """Hex SHA-256 over model id, sampling settings and the row's :data:`GROUP_COLUMNS`
    (absent columns count as null): the group every entry judged on the row is filed
    under. Two rows with the same inputs share a group (and their entries)."""
    document = {
        "model": engine.model_id,
        "sampling": engine.sampling_key(),
        "row": {c: row.get(c) for c in GROUP_COLUMNS},
    }
    text = json.dumps(document, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class JudgmentCache:
    """The judgment cache as one judge actor (or a dry run's probe) uses it.

    Parameters
    ----------
    uri : str
        Root of the cache (any fsspec URI).
    storage_options : dict
        fsspec options for ``uri``.
    metric_names : list of str, optional
        Accepted for compatibility; entries of every metric are found by group.
    run_id : str, optional
        The run this cache serves: every journal row it writes (replies and touches)
        carries it as ``last_run``, so that retention by runs counts each entry for the
        run that used it, whoever folds the journal. None (a dry run's probe, tests)
        leaves ``last_run`` null for the fold to stamp.
    repair : bool
        Set aside a bucket file a lookup finds unreadable
        (:meth:`~ragbatch.judge.cache_files.CacheFiles.set_aside`); False (a dry run's
        probe, which changes nothing) only leaves it out. Either way its entries are
        misses and a warning names it.

    Raises
    ------
    OutputError
        The cache root cannot be listed (the message names the URI).

    Notes
    -----
    Opening lists the bucket files (one listing); nothing else is read until
    :meth:`prefetch`. Memory: the entries of the groups prefetched for the current
    batch, the ``group`` ranges of at most
    :data:`~ragbatch.judge.cache_store.RANGE_CACHE_ROW_GROUPS` row groups,
    :data:`~ragbatch.judge.cache_store.FOOTER_CACHE_BYTES` of serialized footers,
    :data:`~ragbatch.judge.cache_store.ROW_GROUP_CACHE_BYTES` of decoded row groups, and
    up to :data:`RECENT_ENTRIES` replies this process obtained.

    Thread-safe: one cache is shared by every batch in flight on a judge actor, whose
    lookups (:meth:`lookup`) run on worker threads while the event loop's thread answers
    requests (:meth:`hit`, :meth:`get`, :meth:`put`) and flushes. Any method may be
    called from any thread: the reader is thread-safe
    (:class:`~ragbatch.judge.cache_store.BucketReader`), and this object's own entries,
    recent replies, new replies and touches change only under a lock, which is never
    held while storage is read or written.
    """

    def __init__(
        self,
        uri: str,
        storage_options: dict[str, Any],
        metric_names: list[str] | None = None,
        run_id: str | None = None,
        repair: bool = True,
    ):
        from ragbatch.io.fs import resolve

        self.run_id = run_id

        self.uri = uri.rstrip("/")
        fs, root = resolve(self.uri, storage_options)
        self.files = CacheFiles(fs, root)
        with self._errors("list"):
            self.reader = BucketReader(self.files, repair=repair)
        self._batch: dict[str, tuple[Reply, str]] = {}
        self._fetched: set[str] = set()
        # this process's own replies, the least recently used dropped past RECENT_ENTRIES
        self._recent: LRUCache[str, Reply] = LRUCache(RECENT_ENTRIES)
        self._new: list[dict[str, Any]] = []
        self._touched: dict[str, str] = {}
        # guards the five fields above: they are shared by every thread using the cache
        self._lock = threading.Lock()

    def _errors(self, doing: str) -> Any:
        return _storage_errors(self.uri, doing)

    @property
    def empty(self) -> bool:
        """Whether the cache had no bucket files when it was opened."""
        return self.reader.empty

    @property
    def row_groups_read(self) -> int:
        """Row groups of bucket files read so far by :meth:`prefetch`."""
        return self.reader.row_groups_read

    def prefetch(self, groups: Iterable[str]) -> int:
        """Bring the entries of ``groups`` (from :func:`group_key`) into memory until
        the next :meth:`flush`; return how many were found.

        Raises
        ------
        OutputError
            A bucket file cannot be fetched (the message names the URI and the file; a
            damaged one is set aside instead, see :meth:`lookup`).
        """
        asked = set(groups)
        with self._lock:
            todo = asked - self._fetched
            self._fetched |= todo
        found = self.lookup(todo)
        with self._lock:
            self._batch.update(found)
        return len(found)

    def lookup(self, groups: Iterable[str]) -> dict[str, tuple[Reply, str]]:
        """Key -> (reply, group) of every entry stored under ``groups``, kept nowhere
        (for callers that hold a batch's entries themselves, one per batch in flight;
        answer a request from it with :meth:`hit`). It reads only the reader's state, so
        lookups may run on several threads at once.

        A bucket file whose bytes are not a cache file's (cut short, not Parquet, the
        wrong columns) does not fail the lookup: it is set aside with a warning naming
        it, and its entries are misses, asked again
        (:class:`~ragbatch.judge.cache_store.BucketReader`).

        Raises
        ------
        OutputError
            A bucket file cannot be fetched (the store is unreachable; the message names
            the URI and the file).
        """
        groups = set(groups)
        if not groups or self.reader.empty:
            return {}
        with self._errors("read"):
            found = self.reader.lookup(groups)
        return {key: (reply, group) for key, (reply, _, group) in found.items()}

    def hit(self, key: str, found: tuple[Reply, str]) -> Completion:
        """The completion of an entry :meth:`lookup` found, noting its use (written as a
        touch by the next :meth:`flush`)."""
        reply, group = found
        with self._lock:
            self._touched[key] = group
        return _completion(reply)

    def get(self, key: str) -> Completion | None:
        """The cached completion for ``key`` (status ``ok``), or None. Only entries of
        prefetched groups and this process's own recent replies are found."""
        with self._lock:
            found = self._batch.get(key)
            recent = None if found is not None else self._recent.get(key)  # marks it used
        if found is not None:
            return self.hit(key, found)
        return None if recent is None else _completion(recent)

    def put(
        self,
        key: str,
        metric_name: str,
        model_id: str,
        completion: Completion,
        group: str | None = None,
    ) -> None:
        """Remember a reply and its token logprobs (only ``ok`` completions are kept).
        Without a ``group`` it is kept in this process only, never written."""
        if completion.status != OK or completion.text is None:
            return
        reply: Reply = (
            completion.text,
            completion.finish_reason or "",
            completion.prompt_tokens,
            completion.completion_tokens,
            logprobs_json(completion.logprobs),
        )
        with self._lock:
            try:
                self._recent[key] = reply  # the least recently used dropped past the bound
            except ValueError:  # RECENT_ENTRIES of 0: none kept
                pass
        if group is None:
            return
        now = _now()
        text, finish, pt, ct, lp = reply
        entry = {
            "group": group,
            "key": key,
            "metric": metric_name,
            "text": text,
            "finish_reason": finish,
            "prompt_tokens": pt,
            "completion_tokens": ct,
            "model_id": model_id,
            "logprobs": lp,
            "created_at": now,
            "last_used": now,
            "last_run": self.run_id,
        }
        with self._lock:
            self._new.append(entry)

    def flush(self) -> int:
        """Write the replies added since the last flush, and touches of the entries
        used, as one journal file; forget the prefetched entries. Return how many
        replies were written.

        Raises
        ------
        OutputError
            The journal file cannot be written (the message names the URI and the cause).
            The replies and touches it held are kept, and the next flush writes them
            with its own.
        """
        now = _now()
        with self._lock:
            new, touched = self._new, self._touched
            self._new, self._touched, self._batch, self._fetched = [], {}, {}, set()
        touches = [
            {"group": group, "key": key, "last_used": now, "last_run": self.run_id}
            for key, group in touched.items()
        ]
        rows = new + touches
        if not rows:
            return 0
        table = pa.Table.from_pylist(rows, schema=ENTRY_SCHEMA)
        try:
            with self._errors("write"):
                self.files.write(self.files.journal_dir, table)
        except OutputError:
            self._keep_unwritten(new, touched)
            raise
        return len(new)

    def _keep_unwritten(self, new: list[dict[str, Any]], touched: dict[str, str]) -> None:
        """Put back what a failed :meth:`flush` took, ahead of what came meanwhile."""
        with self._lock:
            self._new = new + self._new
            self._touched = {**touched, **self._touched}


def _completion(reply: Reply) -> Completion:
    text, finish, pt, ct, lp = reply
    return Completion(
        OK,
        text=text,
        finish_reason=finish,
        prompt_tokens=pt,
        completion_tokens=ct,
        logprobs=logprobs_from_json(lp),
    )


@contextmanager
def _storage_errors(uri: str, doing: str) -> Iterator[None]:
    """Turn a storage failure into an :class:`~ragbatch.core.errors.OutputError`
    naming the cache URI."""
    try:
        yield
    except OutputError:
        raise
    except Exception as exc:
        raise OutputError(
            f"judgment cache {uri}: cannot {doing}: {type(exc).__name__}: {exc}"
        ) from exc
