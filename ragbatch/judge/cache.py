"""The judgment cache: judge replies keyed by everything that determines them.

A key is the SHA-256 of a canonical JSON document holding the engine's model id, its
sampling settings, the request's seed (which carries the parse-retry attempt, so a
retry never reuses the reply it retries), the full prompt, the output spec, and the
metric's name, version and params (:func:`cache_key`).

Storage: Parquet segments under ``<uri>/metric=<metric name>/part-<uuid>.parquet`` on
any fsspec filesystem (by default next to the run outputs, so a cluster run shares it
through object storage). Each judge-stage actor loads the segments of its metrics once,
when it starts, into memory (about 200 bytes plus the reply text per entry, and its
token logprobs as JSON, about 40 bytes per alternative, for replies that asked for
them: a cached reply gives the same verdict probabilities as the first), and writes
the replies it obtained as one new segment per metric after every batch, so a crashed
run keeps what it paid for. Segments are immutable; concurrent writers never touch the
same file. Entries are never evicted: delete the directory to start afresh.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from ragbatch.judge.protocol import Ask, Completion, logprobs_from_json, logprobs_json
from ragbatch.core.status import OK

log = logging.getLogger(__name__)

SEGMENT_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("text", pa.string()),
        ("finish_reason", pa.string()),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("model_id", pa.string()),
        ("logprobs", pa.string()),
    ]
)
#: Columns read back; ``logprobs`` (JSON, :func:`~ragbatch.judge.protocol.logprobs_json`)
#: is absent from segments written before it existed, and read as null there.
_READ = ("key", "text", "finish_reason", "prompt_tokens", "completion_tokens", "logprobs")


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


class JudgmentCache:
    """Replies already obtained, for the metrics of one judge stage.

    Parameters
    ----------
    uri : str
        Root of the cache (any fsspec URI).
    storage_options : dict
        fsspec options for ``uri``.
    metric_names : list of str
        The metric names whose segments to load.

    Raises
    ------
    OutputError
        The cache root cannot be listed or a segment cannot be read (the message names
        the URI).
    """

    def __init__(self, uri: str, storage_options: dict[str, Any], metric_names: list[str]):
        from ragbatch.io.fs import resolve

        self.uri = uri.rstrip("/")
        self.fs, self.root = resolve(self.uri, storage_options)
        self._entries: dict[str, tuple[str, str, int, int, str | None]] = {}
        self._new: dict[str, list[tuple[str, str, str, int, int, str, str | None]]] = {}
        for name in dict.fromkeys(metric_names):
            self._load(name)

    def __len__(self) -> int:
        return len(self._entries)

    def _dir(self, metric_name: str) -> str:
        return f"{self.root.rstrip('/')}/metric={metric_name}"

    def _load(self, metric_name: str) -> None:
        from ragbatch.core.errors import OutputError

        folder = self._dir(metric_name)
        try:
            paths = sorted(self.fs.glob(f"{folder}/*.parquet")) if self.fs.exists(folder) else []
            for path in paths:
                with self.fs.open(path, "rb") as handle:
                    table = pq.read_table(handle)
                columns = [
                    table.column(name).to_pylist()
                    if name in table.column_names
                    else [None] * table.num_rows
                    for name in _READ
                ]
                for key, text, finish, pt, ct, lp in zip(*columns):
                    self._entries[key] = (text, finish, pt, ct, lp)
        except Exception as exc:
            raise OutputError(
                f"judgment cache {self.uri}: cannot read {folder}: {type(exc).__name__}: {exc}"
            ) from exc

    def get(self, key: str) -> Completion | None:
        """The cached completion for ``key`` (status ``ok``), or None."""
        found = self._entries.get(key)
        if found is None:
            return None
        text, finish, pt, ct, lp = found
        return Completion(
            OK,
            text=text,
            finish_reason=finish,
            prompt_tokens=pt,
            completion_tokens=ct,
            logprobs=logprobs_from_json(lp),
        )

    def put(self, key: str, metric_name: str, model_id: str, completion: Completion) -> None:
        """Remember a reply and its token logprobs (only ``ok`` completions are kept)."""
        if completion.status != OK or completion.text is None:
            return
        logprobs = logprobs_json(completion.logprobs)
        self._entries[key] = (
            completion.text,
            completion.finish_reason or "",
            completion.prompt_tokens,
            completion.completion_tokens,
            logprobs,
        )
        self._new.setdefault(metric_name, []).append(
            (
                key,
                completion.text,
                completion.finish_reason or "",
                completion.prompt_tokens,
                completion.completion_tokens,
                model_id,
                logprobs,
            )
        )

    def flush(self) -> int:
        """Write the replies added since the last flush as new segments; return how many.

        Raises
        ------
        OutputError
            A segment cannot be written (the message names the URI and the cause).
        """
        from ragbatch.core.errors import OutputError

        written = 0
        for metric_name, rows in self._new.items():
            if not rows:
                continue
            table = pa.Table.from_pylist(
                [dict(zip(SEGMENT_SCHEMA.names, r)) for r in rows], schema=SEGMENT_SCHEMA
            )
            path = f"{self._dir(metric_name)}/part-{uuid.uuid4().hex}.parquet"
            try:
                self.fs.makedirs(self._dir(metric_name), exist_ok=True)
                with self.fs.open(path, "wb") as handle:
                    pq.write_table(table, handle)
            except Exception as exc:
                raise OutputError(
                    f"judgment cache {self.uri}: cannot write {path}: {type(exc).__name__}: {exc}"
                ) from exc
            written += len(rows)
        self._new.clear()
        return written
