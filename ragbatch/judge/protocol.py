"""Types exchanged between judge metrics, the judge stage and the engine adapters.

A judge metric describes each judge call as an :class:`Ask` (chat messages, the
structured output the reply must follow, and a parser). The stage turns asks into
:class:`EngineRequest` objects, sends them to a :class:`JudgeEngine` in batches, and gets
one :class:`Completion` back per request, in order. Engines never raise for a single
request: a failed request is a completion whose ``status`` says why.

An engine answers through one coroutine, :meth:`JudgeEngine.complete`; the judge stage
awaits it on the actor's event loop whatever the number of batches in flight. Code
outside an event loop (a worked example, a pilot, a benchmark) calls it through
:func:`run_sync`.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable, Sequence, TypeVar

from ragbatch.core.status import CONTEXT_TOO_LONG, JUDGE_ERROR, OK, TIMEOUT

#: Completion statuses an engine may return (a subset of the cell statuses).
ENGINE_STATUSES = (OK, JUDGE_ERROR, TIMEOUT, CONTEXT_TOO_LONG)

T = TypeVar("T")


def run_sync(awaitable: Awaitable[T]) -> T:
    """The result of ``awaitable``, awaited on a new event loop (:func:`asyncio.run`):
    how synchronous code outside a run's actors calls the judge path.

    Parameters
    ----------
    awaitable : awaitable
        For example ``engine.complete(requests)`` or
        ``ragbatch.judge.batch.judge_frame(runner, frame)``.

    Returns
    -------
    object
        What ``awaitable`` returns.

    Raises
    ------
    RuntimeError
        Called from a thread whose event loop is running (await instead); and whatever
        ``awaitable`` raises.
    """
    import asyncio

    async def wait() -> T:
        return await awaitable

    return asyncio.run(wait())


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
    logprobs : int
        Alternatives per generated token whose log probabilities the engine returns
        with the reply (:attr:`Completion.logprobs`); 0 asks for none.
    """

    choice: tuple[str, ...] | None = None
    json_schema: str | None = None
    max_tokens: int = 256
    logprobs: int = 0

    def __post_init__(self) -> None:
        if (self.choice is None) == (self.json_schema is None):
            raise ValueError("OutputSpec needs exactly one of choice and json_schema")
        if self.max_tokens < 1:
            raise ValueError("OutputSpec.max_tokens must be at least 1")
        if self.logprobs < 0:
            raise ValueError("OutputSpec.logprobs must be 0 or more")

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
        """What this spec contributes to a cache key (``logprobs`` only when asked for,
        so the keys of requests without logprobs are those they always had)."""
        key: dict[str, Any] = {
            "choice": list(self.choice) if self.choice else None,
            "json_schema": self.json_schema,
            "max_tokens": self.max_tokens,
        }
        if self.logprobs:
            key["logprobs"] = self.logprobs
        return key


#: Alternatives per token asked for when a request's reply holds verdicts
#: (:class:`VerdictSlots`): enough for every verdict value of the package's metrics
#: (two, or six ratings) plus a few spellings of them; OpenAI's API allows at most 20.
VERDICT_TOP_LOGPROBS = 8


@dataclass(frozen=True)
class VerdictSlots:
    """Where a reply holds its verdicts, and what each verdict value is worth.

    Attributes
    ----------
    values : tuple of (str, float)
        Each valid verdict as written in the reply (``"true"``, ``"0"``, ``"3"``) and
        its numeric value (for the probability-weighted score).
    key : str or None
        The JSON member holding a verdict (every member of that name, in reply order);
        None when the whole reply is one verdict (a choice output).
    items : bool
        The member holds an array of bare verdicts (``{"verdicts": [1, 0]}``).
    """

    values: tuple[tuple[str, float], ...]
    key: str | None = None
    items: bool = False

    @property
    def literals(self) -> tuple[str, ...]:
        """The valid verdicts as written in a reply."""
        return tuple(v for v, _ in self.values)


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token: its text, log probability, and the engine's top
    alternatives at that position as ``(text, log probability)`` pairs, most likely
    first (the generated token may or may not be among them)."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()

    def as_list(self) -> list[Any]:
        """``[token, logprob, [[text, logprob], ...]]`` (JSON-serialisable)."""
        return [self.token, self.logprob, [list(t) for t in self.top]]

    @classmethod
    def from_list(cls, item: Sequence[Any]) -> "TokenLogprob":
        """The inverse of :meth:`as_list`."""
        token, logprob, top = item
        return cls(str(token), float(logprob), tuple((str(t), float(v)) for t, v in top))


def logprobs_json(logprobs: Sequence[TokenLogprob] | None) -> str | None:
    """Token logprobs as one JSON text (None stays None)."""
    if logprobs is None:
        return None
    return json.dumps([t.as_list() for t in logprobs], ensure_ascii=False)


def logprobs_from_json(text: str | None) -> tuple[TokenLogprob, ...] | None:
    """The inverse of :func:`logprobs_json`."""
    if text is None:
        return None
    return tuple(TokenLogprob.from_list(item) for item in json.loads(text))


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
    verdicts : VerdictSlots, optional
        Where the reply holds verdicts whose probabilities the judge stage reads from
        the token logprobs (:mod:`ragbatch.judge.confidence`). An ask with verdicts
        always asks for :data:`VERDICT_TOP_LOGPROBS` alternatives per token (its
        ``output.logprobs`` is raised to that when lower).
    """

    messages: tuple[Message, ...]
    output: OutputSpec
    parse: Callable[[str], Any] = field(compare=False, hash=False)
    step: str = "judge"
    verdicts: VerdictSlots | None = None

    def __post_init__(self) -> None:
        if self.verdicts is not None and self.output.logprobs < VERDICT_TOP_LOGPROBS:
            object.__setattr__(self, "output", replace(self.output, logprobs=VERDICT_TOP_LOGPROBS))

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
    logprobs : tuple of TokenLogprob or None
        One entry per generated token, when the request asked for logprobs
        (``output.logprobs`` > 0) and the engine returned them; None otherwise.
    """

    status: str
    text: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int | None = None
    error: str | None = None
    logprobs: tuple[TokenLogprob, ...] | None = None

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
    async def complete(self, requests: Sequence[EngineRequest]) -> list[Completion]:
        """Answer every request; one :class:`Completion` per request, in order.

        A coroutine: calls from several batches in flight on one event loop may overlap
        and share the engine. Must not raise for a problem with one request (that
        request's completion gets a non-``ok`` status); raises
        :class:`~ragbatch.core.errors.EngineError` (or a subclass) when the engine
        itself fails, and nothing else for a backend failure.
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
