"""Types exchanged between judge metrics, the judge stage and the engine adapters.

A judge metric describes each judge call as an :class:`Ask` (chat messages, the
structured output the reply must follow, and a parser). The stage turns asks into
:class:`EngineRequest` objects, sends them to a :class:`JudgeEngine` in batches, and gets
one :class:`Completion` back per request, in order. Engines never raise for a single
request: a failed request is a completion whose ``status`` says why.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ragbatch.status import CONTEXT_TOO_LONG, JUDGE_ERROR, OK, TIMEOUT

#: Completion statuses an engine may return (a subset of the cell statuses).
ENGINE_STATUSES = (OK, JUDGE_ERROR, TIMEOUT, CONTEXT_TOO_LONG)


class ParseError(ValueError):
    """A judge reply that does not have the shape the metric asked for.

    Raised by an :attr:`Ask.parse` function; the message says what was wrong (for example
    "expected 3 verdicts, got 2") and ends up in the cell's ``reason``.
    """


@dataclass(frozen=True)
class Message:
    """One chat message. ``role`` is ``"system"``, ``"user"`` or ``"assistant"``."""

    role: str
    content: str

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class OutputSpec:
    """The structured output a reply must follow; exactly one of ``choice`` and
    ``json_schema`` is set.

    Attributes
    ----------
    choice : tuple of str, optional
        The reply is exactly one of these strings.
    json_schema : str, optional
        A JSON Schema, serialised in the order it was written (structured output follows
        the order of ``properties``, so a reason can come before its verdict); the
        reply is a JSON document valid against it.
    max_tokens : int
        Most completion tokens; a reply cut at this limit has ``finish_reason="length"``
        and becomes ``parse_failure``.
    """

    choice: tuple[str, ...] | None = None
    json_schema: str | None = None
    max_tokens: int = 256

    def __post_init__(self) -> None:
        if (self.choice is None) == (self.json_schema is None):
            raise ValueError("OutputSpec needs exactly one of choice and json_schema")
        if self.max_tokens < 1:
            raise ValueError("OutputSpec.max_tokens must be at least 1")

    @classmethod
    def of_choice(cls, options: Sequence[str], max_tokens: int = 8) -> "OutputSpec":
        return cls(choice=tuple(options), max_tokens=max_tokens)

    @classmethod
    def of_schema(cls, schema: dict[str, Any], max_tokens: int = 256) -> "OutputSpec":
        return cls(json_schema=json.dumps(schema), max_tokens=max_tokens)

    @property
    def schema(self) -> dict[str, Any] | None:
        """The JSON Schema as a dict (None for a choice)."""
        return None if self.json_schema is None else json.loads(self.json_schema)

    def key(self) -> dict[str, Any]:
        """What this spec contributes to a cache key."""
        return {"choice": list(self.choice) if self.choice else None,
                "json_schema": self.json_schema, "max_tokens": self.max_tokens}


@dataclass(frozen=True)
class Ask:
    """One judge call a metric wants for one row.

    Attributes
    ----------
    messages : tuple of Message
        The chat, built with :func:`ragbatch.judge.prompt.build_messages` so that the
        shared part of a row comes first.
    output : OutputSpec
    parse : callable
        ``parse(reply_text) -> value``; raises :class:`ParseError` when the reply has the
        wrong shape (wrong number of verdicts, a value out of range, ...). Called only for
        replies that finished normally (``finish_reason == "stop"``).
    step : str
        Short name of the step, for reasons and logs (``"statements"``, ``"verdicts"``).
    """

    messages: tuple[Message, ...]
    output: OutputSpec
    parse: Callable[[str], Any] = field(compare=False, hash=False)
    step: str = "judge"

    def prompt_text(self) -> str:
        """The messages as one canonical JSON text (used for hashing and caching)."""
        return json.dumps([m.as_dict() for m in self.messages], ensure_ascii=False)

    def prompt_hash(self) -> str:
        """SHA-256 hex digest of :meth:`prompt_text` (first 16 hex digits)."""
        return hashlib.sha256(self.prompt_text().encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class EngineRequest:
    """One request to an engine: the chat, the structured output, and a seed."""

    messages: tuple[Message, ...]
    output: OutputSpec
    seed: int = 0


@dataclass
class Completion:
    """An engine's answer to one :class:`EngineRequest`.

    Attributes
    ----------
    status : str
        ``ok`` (a reply came back), ``judge_error`` (the engine failed for this
        request), ``timeout`` (past its time limit) or ``context_too_long`` (the prompt
        plus ``max_tokens`` would exceed the model's window; nothing was generated).
    text : str or None
        The reply (None unless ``status`` is ``ok``).
    finish_reason : str or None
        ``"stop"`` for a complete reply, ``"length"`` when cut at ``max_tokens``.
    prompt_tokens, completion_tokens : int
        Tokens in the prompt (counted even when nothing was generated, where known) and
        in the reply; 0 when unknown.
    cached_prompt_tokens : int or None
        Prompt tokens served from the engine's prefix cache, when it reports them.
    error : str or None
        Why a non-``ok`` completion failed (exception type and message, HTTP status, the
        token counts for ``context_too_long``).
    """

    status: str
    text: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int | None = None
    error: str | None = None

    @property
    def refused(self) -> bool:
        """Whether the engine refused the request without serving it: the prompt plus
        ``max_tokens`` exceed the window (``context_too_long``), found by counting before
        the call or by the server's refusal. Nothing was generated; accounting keeps such
        a request out of the calls made and their prompt tokens."""
        return self.status == CONTEXT_TOO_LONG


class JudgeEngine(ABC):
    """An LLM that answers batches of chat requests with structured outputs.

    Adapters: :mod:`ragbatch.engines.vllm` (offline ``vllm.LLM``) and
    :mod:`ragbatch.engines.openai` (an OpenAI-compatible HTTP server). One instance
    lives in each judge-stage actor and is loaded once.

    Attributes
    ----------
    model_id : str
        Stable identifier of the model (path or served name plus revision or a hash of
        the model's config files); part of every cache key and recorded per cell.
    max_model_len : int
        The model's context window in tokens (prompt plus completion).
    """

    model_id: str
    max_model_len: int

    @abstractmethod
    def complete(self, requests: Sequence[EngineRequest]) -> list[Completion]:
        """Answer every request; one :class:`Completion` per request, in order.

        Must not raise for a problem with one request (that request's completion gets a
        non-``ok`` status); may raise :class:`~ragbatch.errors.EngineError` when the
        engine itself is unusable.
        """

    @abstractmethod
    def sampling_key(self) -> dict[str, Any]:
        """The sampling settings that determine a reply (temperature, top_p, seed, ...),
        as a JSON-serialisable dict; part of every cache key."""

    def stats(self) -> dict[str, Any]:
        """Engine counters since load (for example ``prefix_cache_queries`` and
        ``prefix_cache_hits`` in tokens); empty when the engine reports none."""
        return {}

    def close(self) -> None:
        """Release the engine's resources (GPU memory, HTTP sessions)."""
