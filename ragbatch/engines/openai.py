"""Adapter for OpenAI-compatible chat-completions servers (``openai`` engines).

Every call ragbatch makes through the ``openai`` client lives in this file; callers see
only :func:`load_openai_engine` and :class:`OpenAIJudgeEngine`. Written against
``openai`` 3.57 and the OpenAI-compatible server of vLLM 0.32 (``vllm serve``). The
client calls used (``AsyncOpenAI(base_url=, api_key=, max_retries=0, timeout=)``,
``openai.Timeout``, ``models.list``, the generic ``post`` and the ``APIStatusError`` /
``APIConnectionError`` / ``APITimeoutError`` classes) are the same since 1.40, and
nothing here touches the HTTP library underneath (``httpx`` before 3.0, ``httpx2``
since). Chat completions go through ``post("/chat/completions", body=...,
cast_to=object)`` rather than ``chat.completions.create``: the same request, errors and
retries, without the client's typed transform of every request's parameters and the
reply model built from its JSON; against a server that answers at once, leaving them out
cut a job's time by a fifth (docs/benchmarks/vs-peers.md, "A judge that answers at once").
Any server that implements ``GET /v1/models`` and ``POST /v1/chat/completions`` works,
with ``structured_outputs: response_format`` for servers other than vLLM.

How a request is sent
---------------------
Requests of one :meth:`OpenAIJudgeEngine.complete` call run concurrently on an event
loop that the engine runs in a thread of its own. ``complete`` is an ordinary blocking
call, so it works the same from a script, a Ray actor, or code that already runs an
event loop. Every attempt of every request (and every ``/tokenize`` call) first waits
for a slot in the engine's gate (:class:`~ragbatch.engines.openai_limits.SendGate`),
shared by all ``complete`` calls of the engine; a retry is served before any first
attempt. How many slots there are is decided by
:class:`~ragbatch.engines.openai_limits.AimdLimit`, TCP's congestion control applied
to requests in flight (Jacobson 1988; RFC 5681):

* with ``adaptive_concurrency`` (the default) the limit starts at ``min_concurrency``,
  grows by one per success until the first HTTP 429 (slow start), then by one per
  window of successes (additive increase), and is multiplied by 0.7 on a 429
  (multiplicative decrease; once per window: 429s to requests sent before the latest
  decrease change nothing), never below ``min_concurrency`` nor above ``max_concurrency``. A 429's
  ``Retry-After`` pauses every new send of the engine until it has passed, and sends
  are paced over the smoothed reply time so that freed slots do not all send at once.
  With ``latency_backoff`` a reply slower than that multiple of the fastest one lowers
  the limit as a 429 does;
* with ``adaptive_concurrency: false``, ``max_concurrency`` requests are in flight
  and a ``Retry-After`` holds back only the request that got it.

Against a stand-in server admitting 10 to 50 requests a second through a token bucket
that holds 0.2 s or more of its rate, the adaptive limit used 0.87 to 0.995 of the
allowed requests with 0.04 to 0.5 429s per request, where a fixed 16 in flight drew 3
to 26 (docs/benchmarks/rate-limits.md). Each request is sent with the
config's ``temperature`` and ``top_p``, the request's own ``seed`` (the judge stage
derives it from the config's ``seed`` and the parse-retry attempt) and
``max_tokens`` from its :class:`~ragbatch.judge.protocol.OutputSpec`.

Structured outputs are asked for in one of two ways (``structured_outputs`` in the
config):

* ``"vllm"``: vLLM's own request field, sent in the JSON body as
  ``"structured_outputs": {"choice": [...]}`` or ``"structured_outputs": {"json":
  <schema>}``. This is the form vLLM 0.12 and later accept; older releases used
  ``guided_choice`` / ``guided_json``, which vLLM 0.32 no longer reads.
* ``"response_format"``: the OpenAI form, ``response_format={"type": "json_schema",
  "json_schema": {"name": "verdict", "schema": ..., "strict": true}}``. A choice becomes
  the schema ``{"verdict": <one of the options>}`` (with ``max_tokens`` raised by
  :data:`CHOICE_WRAPPER_TOKENS` for the wrapper) and the adapter returns the chosen
  string, so metrics see the same reply text whichever form is used.

Token logprobs. A request whose output asks for them (``OutputSpec.logprobs`` = k, the
requests whose replies hold verdicts) is sent with ``"logprobs": true, "top_logprobs":
k``, and the reply's ``choices[0].logprobs.content`` (per token ``token``, ``logprob``
and ``top_logprobs``) becomes :attr:`Completion.logprobs`. A server that ignores the
fields returns none, and the verdicts get no confidence (the cell says why); one that
rejects them fails the request as ``judge_error``: set ``logprobs: false`` on the engine
for such a server, and no request asks for them. vLLM's server computes them as its
offline engine does (after the grammar's mask; see :mod:`ragbatch.engines.vllm`).
With ``structured_outputs: response_format`` the tokens of a choice spell the wrapper
``{"verdict": "..."}``, which :mod:`ragbatch.judge.confidence` reads through.

vLLM's JSON grammars allow any run of whitespace between tokens by default, and a weak
or small judge can fill ``max_tokens`` with it. vLLM 0.32 reads the switch against that
only from the server's configuration, not from a request: serve the judge with
``--structured-outputs-config '{"backend": "xgrammar", "disable_any_whitespace": true}'``.

Prompt length
-------------
A prompt whose tokens plus ``max_tokens`` exceed the model's window gets the status
``context_too_long`` without anything being generated. The adapter counts the prompt's
tokens with the first of these that is available:

1. the tokenizer in the local directory ``tokenizer`` of the config (transformers'
   ``AutoTokenizer.apply_chat_template`` with the generation prompt added);
2. the server's ``POST /tokenize`` endpoint (vLLM has one, at the server root, not under
   ``/v1``), probed once when the engine loads. A request is counted this way only when
   it might not fit: one whose UTF-8 bytes, plus the chat template's tokens per message
   (from the server's counts of two tiny chats at load) and 32, plus ``max_tokens``, are
   within the window is sent without asking. A byte-level BPE token (the tokenizers of
   GPT, Llama 3, Qwen, Mistral's Tekken) covers at least one byte, so such a request fits;
   for a SentencePiece tokenizer whose normalization lengthens rare characters the
   bound could in principle be passed, and the request then meets the server's own
   check as in 3. Asking ``/tokenize`` for every request made the client's cost per
   judge call 1.4 times as high (docs/benchmarks/vs-peers.md, "A judge that answers at once");
3. none: the request is sent, and the server's HTTP 400 "maximum context length" reply is
   mapped to ``context_too_long``. vLLM refuses only a prompt that alone exceeds the
   window; one that fits but leaves less than ``max_tokens`` gets a shortened
   ``max_tokens`` and may come back cut (``finish_reason="length"``).

Failures
--------
5xx replies and connection errors (timeouts included) are retried up to
``max_retries`` times, the k-th retry waiting ``backoff_s * 2**(k-1)`` seconds (times a
random factor between 0.5 and 1.5), or what the server's ``Retry-After`` header says (at
most :data:`MAX_RETRY_AFTER_S`). HTTP 429 replies do not use up ``max_retries``: under a
provider's rate limit every request must get through in the end, however many 429s it
meets on the way. A request retries them until ``rate_limit_timeout_s`` (600 s by
default) has passed since its first 429, waiting ``Retry-After`` when the server sends
one (with an adaptive limit, in the gate's engine-wide pause), else the backoff above
capped at :data:`MAX_RATE_LIMIT_BACKOFF_S`; then it gets ``judge_error`` saying so. A
429 whose ``error.code`` says the account's quota is spent (:data:`QUOTA_CODES`) is
not retried. ``request_timeout_s`` bounds each attempt (the connection
itself must open within :data:`CONNECT_TIMEOUT_S`). A request whose last attempt timed
out gets the status ``timeout``; any other failure, and every 4xx reply other than 429,
gets ``judge_error`` with the HTTP status and the server's message; the error text ends
with the number of attempts made. ``batch_timeout_s`` bounds a whole
:meth:`~OpenAIJudgeEngine.complete` call: requests still unanswered then are cancelled
and get ``timeout``, and no retry starts that could not finish its wait before it.
:meth:`~OpenAIJudgeEngine.stats` counts requests, attempts, retries and outcomes, and
what the concurrency limit did (429s, the limit now, its highest and lowest, time
paused for ``Retry-After``). The engine never raises for one request;
:func:`load_openai_engine` raises :class:`~ragbatch.core.errors.EngineError` when the
server cannot be used at all.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import os
import random
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Coroutine, Sequence, TypeVar, cast

from ragbatch.config.job import OpenAIEngine
from ragbatch.core.errors import EngineError
from ragbatch.engines.openai_limits import AimdLimit, SendGate
from ragbatch.judge.protocol import Completion, EngineRequest, JudgeEngine, OutputSpec, TokenLogprob
from ragbatch.core.redact import redact_url
from ragbatch.core.status import CONTEXT_TOO_LONG, JUDGE_ERROR, OK, TIMEOUT

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: pip command that installs the client.
PIP_COMMAND = "pip install 'openai>=1.40'  # or: pip install 'ragbatch[judge-cpu]'"
#: Seconds allowed to open a connection, on load and for every request.
CONNECT_TIMEOUT_S = 5.0
#: Seconds allowed for the model listing made on load.
LOAD_TIMEOUT_S = 30.0
#: Longest wait a ``Retry-After`` header can impose, in seconds.
MAX_RETRY_AFTER_S = 120.0
#: Longest backoff before retrying a 429 reply that names no wait, in seconds (before the
#: random factor): the k-th 429 of a request waits ``backoff_s * 2**(k-1)`` up to this.
MAX_RATE_LIMIT_BACKOFF_S = 30.0
#: ``error.code`` / ``error.type`` of a 429 reply that no wait can cure (OpenAI's for an
#: account out of credit): such a reply is not retried.
QUOTA_CODES = frozenset({"insufficient_quota"})
#: Tokens added to the byte bound of a chat's length (:meth:`OpenAIJudgeEngine._fits_by_bytes`)
#: for what the probe chats do not show of the template.
BYTE_BOUND_MARGIN = 32

#: Name of the schema sent with ``structured_outputs: response_format``.
SCHEMA_NAME = "verdict"
#: Property that carries the chosen option when a choice is sent as a JSON schema.
CHOICE_PROPERTY = "verdict"
#: Completion tokens added to a choice's ``max_tokens`` when it is sent as a JSON schema,
#: for the ``{"verdict": "..."}`` around the option.
CHOICE_WRAPPER_TOKENS = 16

#: Server messages that mean the prompt (plus ``max_tokens``) does not fit the window.
_CONTEXT_MESSAGE = re.compile(
    r"maximum context length|context length|context window|max_model_len|"
    r"too many (?:input )?tokens|prompt is too long|input is too long",
    re.IGNORECASE,
)


@dataclass
class _Counters:
    requests: int = 0
    attempts: int = 0
    retries: int = 0
    ok: int = 0
    timeouts: int = 0
    judge_errors: int = 0
    context_too_long: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    tokenize_failures: int = 0
    length_checks_by_bytes: int = 0


class _Failure(Exception):
    """One failed attempt, classified."""

    def __init__(
        self,
        message: str,
        retryable: bool,
        timed_out: bool = False,
        retry_after: float | None = None,
        context: bool = False,
        rate_limited: bool = False,
    ):
        super().__init__(message)
        self.retryable = retryable
        self.timed_out = timed_out
        self.retry_after = retry_after
        self.context = context
        self.rate_limited = rate_limited


@dataclass
class _Tries:
    """Where one request stands in its retries."""

    attempts: int = 0
    #: Retries spent of ``max_retries`` (5xx replies, connection errors, timeouts).
    server_retries: int = 0
    #: 429 replies so far, and the event loop's time at the first.
    rate_limits: int = 0
    first_rate_limit: float | None = None
    #: Added to the error text when the rate-limit budget ends the retries.
    note: str = ""


def _backoff(base_s: float, k: int, cap_s: float | None = None) -> float:
    """``base_s * 2**(k-1)`` seconds (at most ``cap_s``), times a random factor in
    [0.5, 1.5]: the wait before a request's k-th retry (k >= 1)."""
    wait = base_s * 2.0 ** min(k - 1, 60)
    if cap_s is not None:
        wait = min(wait, cap_s)
    return wait * random.uniform(0.5, 1.5)


def _quota_spent(exc: Any) -> bool:
    """Whether a 429 reply's ``error.code`` or ``error.type`` says the account's quota
    is spent (:data:`QUOTA_CODES`): a limit that waiting does not lift."""
    body = getattr(exc, "body", None)
    inner = body.get("error", body) if isinstance(body, dict) else None
    if not isinstance(inner, dict):
        return False
    return bool({inner.get("code"), inner.get("type")} & QUOTA_CODES)


class _LoopThread:
    """An asyncio event loop running forever in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._run, name="ragbatch-openai-engine", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on this loop and wait for its result, blocking the caller."""
        return self._submit(coro).result()

    async def run_async(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on this loop and await its result from the caller's loop;
        cancelling the caller cancels ``coro``."""
        return await asyncio.wrap_future(self._submit(coro))

    def _submit(self, coro: Coroutine[Any, Any, T]) -> Any:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("OpenAIJudgeEngine methods cannot be called from its own loop")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


def _import_openai() -> Any:
    try:
        import openai
    except ImportError as exc:
        raise EngineError(
            f"the openai engine needs the `openai` package, which cannot be imported "
            f"({exc}); install it with: {PIP_COMMAND}"
        ) from None
    return openai


def _api_key(spec: OpenAIEngine) -> str:
    if spec.api_key_env is None:
        return "EMPTY"
    value = os.environ.get(spec.api_key_env)
    if not value:
        raise EngineError(
            f"engines.<openai>.api_key_env names the environment variable "
            f"{spec.api_key_env!r}, which is not set (or empty); export it with the API key "
            f"of {redact_url(spec.base_url)}"
        )
    return value


def _server_root(base_url: str) -> str:
    """``http://host:port/v1`` -> ``http://host:port`` (where vLLM serves ``/tokenize``)."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def _parse_retry_after(headers: Any) -> float | None:
    """Seconds to wait from ``Retry-After`` (seconds or HTTP date) or ``retry-after-ms``."""
    if headers is None:
        return None
    try:
        millis = headers.get("retry-after-ms")
        if millis is not None:
            return min(max(float(millis) / 1000.0, 0.0), MAX_RETRY_AFTER_S)
    except (TypeError, ValueError):
        pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - time.time()
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def _choice_schema(options: Sequence[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {CHOICE_PROPERTY: {"type": "string", "enum": list(options)}},
        "required": [CHOICE_PROPERTY],
        "additionalProperties": False,
    }


class OpenAIJudgeEngine(JudgeEngine):
    """A judge engine that sends chat requests to an OpenAI-compatible server.

    Build it with :func:`load_openai_engine`, which checks the server before returning.

    Parameters
    ----------
    spec : OpenAIEngine
        The engine's config entry.

    Attributes
    ----------
    model_id : str
        ``"<model>@<base_url>"`` (the URL without credentials:
        :func:`ragbatch.core.redact.redact_url`), followed by ``"#<root>"`` when the server reports the
        model a served name stands for (vLLM reports the path or hub id it loaded as
        ``root``) and ``"@<revision>"`` when it reports a revision.
    max_model_len : int
        Context window in tokens: what the server's model card says (vLLM's
        ``max_model_len``), else the config's ``max_model_len``.
    token_counter : {"tokenizer", "server", "none"}
        How prompt tokens are counted before a request is sent (see the module notes).
    limit : ragbatch.engines.openai_limits.AimdLimit
        The limit on requests in flight (see the module notes); its ``changes`` list
        each rise and fall.
    """

    def __init__(self, spec: OpenAIEngine) -> None:
        self.spec = spec
        self.base_url = spec.base_url.rstrip("/")
        #: ``base_url`` without credentials: what ids, messages and logs show.
        self.public_url = redact_url(self.base_url)
        self._openai = _import_openai()
        api_key = _api_key(spec)
        read = spec.request_timeout_s
        self._timeout = self._openai.Timeout(
            read, connect=min(CONNECT_TIMEOUT_S, read or CONNECT_TIMEOUT_S)
        )
        self._counters = _Counters()
        # The concurrency limit and the gate every attempt passes through: one per
        # engine, so that complete() calls from several threads share them.
        self.limit = AimdLimit(
            spec.max_concurrency,
            floor=spec.min_concurrency,
            adaptive=spec.adaptive_concurrency,
            latency_backoff=spec.latency_backoff,
        )
        self._gate = SendGate(self.limit)
        self._tokenizer: Any = None
        self.token_counter = "none"
        self._chat_overhead = 0
        self._closed = False
        self._loop = _LoopThread()
        try:
            self._client = self._loop.run(self._make_client(api_key))
            card = self._loop.run(self._probe_model())
            self.model_id, self.max_model_len = self._identity(card)
            if spec.tokenizer:
                self._tokenizer = _load_tokenizer(spec.tokenizer)
                self.token_counter = "tokenizer"
            elif self._loop.run(self._probe_tokenize()):
                self.token_counter = "server"
        except BaseException:
            self.close()
            raise
        logger.info(
            "openai engine %s: max_model_len=%d, prompt tokens counted by %s",
            self.model_id,
            self.max_model_len,
            self.token_counter,
        )

    # ------------------------------------------------------------------ loading

    async def _make_client(self, api_key: str) -> Any:
        # Built on the engine's loop: the client's connection pool belongs to the loop it
        # runs on. Retries are done here, not by the client, so that every attempt counts
        # and passes the engine's gate.
        return self._openai.AsyncOpenAI(
            base_url=self.base_url, api_key=api_key, max_retries=0, timeout=self._timeout
        )

    async def _probe_model(self) -> dict[str, Any]:
        openai = self._openai
        try:
            page = await self._client.models.list(
                timeout=self._openai.Timeout(LOAD_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
            )
            cards = [m.model_dump() for m in page.data]
        except openai.APIStatusError as exc:
            raise EngineError(
                f"the openai engine cannot list the models of {self.public_url}: HTTP "
                f"{exc.status_code}: {_status_message(exc)}; check base_url (it usually ends "
                f"in /v1) and the API key"
            ) from None
        except openai.APIConnectionError as exc:
            raise EngineError(
                f"the openai engine cannot reach {self.public_url}: {_describe_exception(exc)}; "
                f"is the server running, and is base_url right?"
            ) from None
        except Exception as exc:  # a reply that is not a model list
            raise EngineError(
                f"{self.public_url} did not answer GET /models with a model list "
                f"({_describe_exception(exc)}); is it an OpenAI-compatible server?"
            ) from None
        for card in cards:
            if card.get("id") == self.spec.model:
                return card
        served = ", ".join(repr(c.get("id")) for c in cards) or "none"
        raise EngineError(
            f"{self.public_url} does not serve the model {self.spec.model!r} (it serves {served}); "
            f"set engines.<openai>.model to a served name"
        )

    def _identity(self, card: dict[str, Any]) -> tuple[str, int]:
        model_id = f"{self.spec.model}@{self.public_url}"
        root = card.get("root")
        if isinstance(root, str) and root and root != self.spec.model:
            model_id += f"#{root}"
        revision = card.get("revision")
        if isinstance(revision, str) and revision:
            model_id += f"@{revision}"
        window = card.get("max_model_len")
        if not isinstance(window, int) or window <= 0:
            window = self.spec.max_model_len
        if window is None:
            raise EngineError(
                f"{self.public_url} does not report the context window of {self.spec.model!r}; "
                f"set engines.<openai>.max_model_len to it (in tokens)"
            )
        return model_id, int(window)

    async def _probe_tokenize(self) -> bool:
        """Whether the server's ``/tokenize`` counts chats; also sets the chat template's
        overhead per message (:meth:`_fits_by_bytes`) from its counts of two tiny chats."""
        try:
            count = await self._server_count([{"role": "user", "content": "ping"}])
        except Exception as exc:
            logger.info(
                "no usable /tokenize endpoint at %s (%s); prompt lengths are checked by the server",
                _server_root(self.public_url),
                _describe_exception(exc),
            )
            return False
        try:  # some chat templates refuse a system message
            pair = await self._server_count(
                [{"role": "system", "content": "ping"}, {"role": "user", "content": "ping"}]
            )
        except Exception:
            pair = 0
        self._chat_overhead = max(count, pair)
        return count > 0

    def _fits_by_bytes(self, messages: list[dict[str, str]], max_tokens: int) -> bool:
        """Whether the chat surely fits the window with ``max_tokens`` to spare, judged
        without counting: a byte-level BPE token covers at least one byte, so a chat has
        at most the UTF-8 bytes of its messages plus the template's own tokens
        (:data:`_chat_overhead`, taken per message, plus :data:`BYTE_BOUND_MARGIN`)."""
        if not self._chat_overhead:
            return False
        size = sum(len(str(m.get("content", "")).encode()) for m in messages)
        bound = size + self._chat_overhead * len(messages) + BYTE_BOUND_MARGIN
        return bound + max_tokens <= self.max_model_len

    # ------------------------------------------------------------- the protocol

    async def complete(self, requests: Sequence[EngineRequest]) -> list[Completion]:
        """Send every request and wait for all replies.

        The requests run on the engine's own event loop (in a thread of its own), shared
        with the other calls in flight; the caller's loop awaits them.

        Parameters
        ----------
        requests : sequence of EngineRequest
            The requests, of length ``n``.

        Returns
        -------
        list of Completion
            Length ``n``, in the order of ``requests``. Requests still unanswered when
            ``batch_timeout_s`` (seconds, from the start of this call) passes get the
            status ``timeout``.

        Raises
        ------
        EngineError
            The engine was closed.
        """
        if self._closed:
            raise EngineError("the openai engine was closed; load it again")
        if not requests:
            return []
        return await self._loop.run_async(self._complete_all(list(requests)))

    def sampling_key(self) -> dict[str, Any]:
        """``{"engine": "openai", "temperature", "top_p", "structured_outputs"}``, plus
        ``"logprobs": false`` when the engine asks for none (its cached replies hold no
        logprobs, so they must not serve an engine that asks); the seed travels with each
        request."""
        key = {
            "engine": "openai",
            "temperature": self.spec.temperature,
            "top_p": self.spec.top_p,
            "structured_outputs": self.spec.structured_outputs,
        }
        if not self.spec.logprobs:
            key["logprobs"] = False
        return key

    def stats(self) -> dict[str, Any]:
        """Counters since load.

        Returns
        -------
        dict
            ``requests`` (asked for), ``attempts`` (HTTP chat calls made), ``retries``
            (attempts after the first of a request), ``ok``, ``timeouts``,
            ``judge_errors``, ``context_too_long`` (completions by status),
            ``prompt_tokens``, ``completion_tokens`` and ``cached_prompt_tokens`` (summed
            over the replies' usage; a ``context_too_long`` request is not served, and
            its prompt tokens are not included), ``tokenize_failures`` (prompt counts the server's
            ``/tokenize`` could not give), ``length_checks_by_bytes`` (requests sent
            without asking ``/tokenize``, their bytes showing that they fit; see the
            module notes), ``token_counter``, and what the concurrency limit did
            (:meth:`AimdLimit.stats <ragbatch.engines.openai_limits.AimdLimit.stats>`):
            ``rate_limited`` (429 replies), ``concurrency`` (requests allowed in flight
            now), ``concurrency_max`` and ``concurrency_min`` (most reached, and fewest
            a decrease left), ``concurrency_decreases``, ``latency_decreases`` and
            ``retry_after_paused_s`` (seconds during which ``Retry-After`` held back
            every new send).
        """
        out: dict[str, Any] = dict(vars(self._counters))
        out["token_counter"] = self.token_counter
        out.update(self.limit.stats())
        return out

    def __enter__(self) -> "OpenAIJudgeEngine":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the HTTP connections and stop the engine's event loop (idempotent)."""
        if self._closed:
            return
        self._closed = True
        client = getattr(self, "_client", None)
        if not self._loop.loop.is_closed():
            try:
                if client is not None:
                    self._loop.run(client.close())
            except Exception as exc:  # closing must not fail the caller
                logger.debug("closing the openai engine's client: %s", exc)
        self._loop.stop()

    # ------------------------------------------------------------- internals

    async def _complete_all(self, requests: list[EngineRequest]) -> list[Completion]:
        loop = asyncio.get_running_loop()
        budget = self.spec.batch_timeout_s
        deadline = None if budget is None else loop.time() + budget
        self._counters.requests += len(requests)
        tasks = [asyncio.ensure_future(self._complete_one(r, deadline)) for r in requests]
        done, pending = await asyncio.wait(tasks, timeout=budget)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        out: list[Completion] = []
        for task in tasks:
            if task in pending or task.cancelled():
                out.append(
                    Completion(
                        status=TIMEOUT,
                        error=(f"no reply within batch_timeout_s={budget} s for the whole batch"),
                    )
                )
            elif task.exception() is not None:
                exc = cast(BaseException, task.exception())  # not None: checked just above
                out.append(Completion(status=JUDGE_ERROR, error=_describe_exception(exc)))
            else:
                out.append(task.result())
        for c in out:
            self._count(c)
        return out

    def _count(self, c: Completion) -> None:
        k = self._counters
        if c.status == OK:
            k.ok += 1
        elif c.status == TIMEOUT:
            k.timeouts += 1
        elif c.status == CONTEXT_TOO_LONG:
            k.context_too_long += 1
        else:
            k.judge_errors += 1
        if c.refused:
            return
        k.prompt_tokens += c.prompt_tokens
        k.completion_tokens += c.completion_tokens
        k.cached_prompt_tokens += c.cached_prompt_tokens or 0

    def _max_tokens(self, output: OutputSpec) -> int:
        if self.spec.structured_outputs == "response_format" and output.choice is not None:
            return output.max_tokens + CHOICE_WRAPPER_TOKENS
        return output.max_tokens

    async def _complete_one(self, request: EngineRequest, deadline: float | None) -> Completion:
        messages = [m.as_dict() for m in request.messages]
        max_tokens = self._max_tokens(request.output)
        prompt_tokens = await self._count_prompt(messages, max_tokens)
        if prompt_tokens is not None and prompt_tokens + max_tokens > self.max_model_len:
            return Completion(
                status=CONTEXT_TOO_LONG,
                prompt_tokens=prompt_tokens,
                error=(
                    f"prompt has {prompt_tokens} tokens; with max_tokens={max_tokens} "
                    f"that exceeds max_model_len={self.max_model_len}"
                ),
            )
        body = self._request_body(request, messages)
        return await self._send_with_retries(body, request, prompt_tokens or 0, deadline)

    async def _count_prompt(self, messages: list[dict[str, str]], max_tokens: int) -> int | None:
        if self.token_counter == "tokenizer":
            return _count_with_tokenizer(self._tokenizer, messages)
        if self.token_counter == "server":
            if self._fits_by_bytes(messages, max_tokens):
                self._counters.length_checks_by_bytes += 1
                return None
            try:
                # A /tokenize call holds a slot as a chat request does, so that counting
                # never floods the server.
                await self._gate.acquire()
                try:
                    return await self._server_count(messages)
                finally:
                    self._gate.release()
            except Exception as exc:
                self._counters.tokenize_failures += 1
                logger.debug("/tokenize failed (%s); sending unchecked", exc)
        return None

    async def _server_count(self, messages: list[dict[str, str]]) -> int:
        # The client's generic POST: same connection pool and API key; an absolute URL
        # replaces base_url, since vLLM serves /tokenize outside /v1.
        body = await self._client.post(
            _server_root(self.base_url) + "/tokenize",
            cast_to=object,
            body={"model": self.spec.model, "messages": messages, "add_generation_prompt": True},
        )
        if not isinstance(body, dict):
            raise ValueError(f"reply is not a JSON object: {body!r:.200}")
        count = body.get("count")
        if not isinstance(count, int):
            tokens = body.get("tokens")
            if not isinstance(tokens, list):
                raise ValueError("reply has neither `count` nor `tokens`")
            count = len(tokens)
        return count

    def _request_body(
        self, request: EngineRequest, messages: list[dict[str, str]]
    ) -> dict[str, Any]:
        """The JSON body of the chat-completions request."""
        output = request.output
        body: dict[str, Any] = {
            "model": self.spec.model,
            "messages": messages,
            "max_tokens": self._max_tokens(output),
            "temperature": self.spec.temperature,
            "top_p": self.spec.top_p,
            "seed": request.seed,
        }
        if self.spec.structured_outputs == "vllm":
            if output.choice is not None:
                constraint: dict[str, Any] = {"choice": list(output.choice)}
            else:
                constraint = {"json": output.schema}
            body["structured_outputs"] = constraint
        else:
            schema = _choice_schema(output.choice) if output.choice is not None else output.schema
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": SCHEMA_NAME, "schema": schema, "strict": True},
            }
        if output.logprobs and self.spec.logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = output.logprobs
        return body

    async def _send_with_retries(
        self,
        body: dict[str, Any],
        request: EngineRequest,
        prompt_tokens: int,
        deadline: float | None,
    ) -> Completion:
        loop = asyncio.get_running_loop()
        tries = _Tries()
        while True:
            if tries.attempts:
                self._counters.retries += 1
            tries.attempts += 1
            self._counters.attempts += 1
            reply, failure = await self._attempt(body, retry=tries.attempts > 1)
            if failure is None:
                return self._to_completion(reply, request)
            if failure.context:
                return Completion(
                    status=CONTEXT_TOO_LONG, prompt_tokens=prompt_tokens, error=str(failure)
                )
            wait = self._wait_before_retry(failure, tries, loop.time())
            if wait is None or (deadline is not None and loop.time() + wait >= deadline):
                break
            if not self._gate_waits(failure):
                await asyncio.sleep(wait)
        n = tries.attempts
        attempts = f"{n} attempt{'s' if n > 1 else ''}"
        if failure.timed_out:
            return Completion(
                status=TIMEOUT,
                prompt_tokens=prompt_tokens,
                error=(
                    f"no reply within request_timeout_s={self.spec.request_timeout_s} s "
                    f"({attempts})"
                ),
            )
        return Completion(
            status=JUDGE_ERROR,
            prompt_tokens=prompt_tokens,
            error=f"{failure}{tries.note} ({attempts})",
        )

    async def _attempt(self, body: dict[str, Any], retry: bool) -> tuple[Any, _Failure | None]:
        """One chat call in a slot of the gate: ``(reply, None)`` or ``(None, failure)``.
        The concurrency limit is told how it went before the slot is given back."""
        loop = asyncio.get_running_loop()
        epoch = await self._gate.acquire(retry=retry)
        try:
            start = loop.time()
            try:
                reply = await self._client.post("/chat/completions", body=body, cast_to=object)
            except Exception as exc:  # classified here; never raised to the caller
                failure = self._classify(exc)
                if failure.rate_limited:
                    self.limit.on_rate_limit(epoch, loop.time(), failure.retry_after)
                return None, failure
            self.limit.on_success(epoch, loop.time() - start)
            return reply, None
        finally:
            self._gate.release()

    def _wait_before_retry(self, failure: _Failure, tries: _Tries, now: float) -> float | None:
        """Seconds to wait before the next attempt, or None to give up.

        A 429 reply has a budget of its own (:meth:`_rate_limit_wait`); 5xx replies and
        connection errors share ``max_retries``, waiting ``Retry-After`` if the server
        sent one, else ``backoff_s * 2**(k-1)`` times a random factor in [0.5, 1.5]
        before the k-th retry."""
        if not failure.retryable:
            return None
        if failure.rate_limited:
            return self._rate_limit_wait(failure, tries, now)
        if tries.server_retries >= self.spec.max_retries:
            return None
        tries.server_retries += 1
        if failure.retry_after is not None:
            return failure.retry_after
        return _backoff(self.spec.backoff_s, tries.server_retries)

    def _rate_limit_wait(self, failure: _Failure, tries: _Tries, now: float) -> float | None:
        """Seconds to wait after a 429 reply, or None once ``rate_limit_timeout_s`` has
        passed since the request's first 429: ``Retry-After`` when sent, else
        ``backoff_s * 2**(k-1)`` for the request's k-th 429, at most
        :data:`MAX_RATE_LIMIT_BACKOFF_S`, times a random factor in [0.5, 1.5]."""
        tries.rate_limits += 1
        if tries.first_rate_limit is None:
            tries.first_rate_limit = now
        budget = self.spec.rate_limit_timeout_s
        if budget is not None and now - tries.first_rate_limit >= budget:
            tries.note = (
                f"; still rate limited {now - tries.first_rate_limit:.1f} s after the "
                f"first 429 (rate_limit_timeout_s={budget:g})"
            )
            return None
        if failure.retry_after is not None:
            return failure.retry_after
        return _backoff(self.spec.backoff_s, tries.rate_limits, MAX_RATE_LIMIT_BACKOFF_S)

    def _gate_waits(self, failure: _Failure) -> bool:
        """Whether the gate itself holds the retry back: with an adaptive limit, a 429's
        ``Retry-After`` pauses every send of the engine, this retry's included."""
        return self.limit.adaptive and failure.rate_limited and failure.retry_after is not None

    def _classify(self, exc: BaseException) -> _Failure:
        openai = self._openai
        if isinstance(exc, openai.APITimeoutError):
            return _Failure(
                f"timed out: {_describe_exception(exc)}", retryable=True, timed_out=True
            )
        if isinstance(exc, openai.APIConnectionError):
            return _Failure(f"connection error: {_describe_exception(exc)}", retryable=True)
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            message = _status_message(exc)
            text = f"HTTP {status}: {message}"
            retry_after = _parse_retry_after(exc.response.headers)
            if status == 429 and _quota_spent(exc):
                return _Failure(f"{text} (the account's quota is spent; not retried)", False)
            if status == 429:
                return _Failure(text, retryable=True, retry_after=retry_after, rate_limited=True)
            if status >= 500:
                return _Failure(text, retryable=True, retry_after=retry_after)
            if status in (400, 413, 422) and _CONTEXT_MESSAGE.search(message):
                return _Failure(text, retryable=False, context=True)
            return _Failure(text, retryable=False)
        return _Failure(f"bad reply from the server: {_describe_exception(exc)}", retryable=False)

    def _to_completion(self, reply: Any, request: EngineRequest) -> Completion:
        """The completion of a chat-completions reply body (parsed JSON)."""
        if not isinstance(reply, dict):
            return Completion(
                status=JUDGE_ERROR,
                error=f"bad reply from the server: not a JSON object: {reply!r:.200}",
            )
        usage = _mapping(reply.get("usage"))
        prompt_tokens = _count(usage.get("prompt_tokens"))
        completion_tokens = _count(usage.get("completion_tokens"))
        cached = _mapping(usage.get("prompt_tokens_details")).get("cached_tokens")
        cached = cached if isinstance(cached, int) and not isinstance(cached, bool) else None
        choices = reply.get("choices")
        first = _mapping(choices[0]) if isinstance(choices, list) and choices else None
        if first is None:
            return Completion(
                status=JUDGE_ERROR,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                cached_prompt_tokens=cached,
                error="bad reply from the server: no choices",
            )
        message = _mapping(first.get("message"))
        text = message.get("content")
        finish = first.get("finish_reason")
        finish = finish if isinstance(finish, str) else None
        if not isinstance(text, str):
            refusal = message.get("refusal")
            return Completion(
                status=JUDGE_ERROR,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                cached_prompt_tokens=cached,
                finish_reason=finish,
                error=f"the reply has no content (refusal: {refusal!r})",
            )
        if (
            self.spec.structured_outputs == "response_format"
            and request.output.choice is not None
            and finish == "stop"
        ):
            text = _unwrap_choice(text)
        return Completion(
            status=OK,
            text=text,
            finish_reason=finish,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_prompt_tokens=cached,
            logprobs=_token_logprobs(first) if request.output.logprobs else None,
        )


def _mapping(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one (a reply field of the wrong
    shape reads as absent)."""
    return value if isinstance(value, dict) else {}


def _count(value: Any) -> int:
    """A token count from a reply: a non-negative int, else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _token_logprobs(choice: dict[str, Any]) -> tuple[TokenLogprob, ...] | None:
    """The token logprobs of a chat-completions choice (``logprobs.content``), or None
    when the server sent none or sent them in another shape."""
    content = _mapping(choice.get("logprobs")).get("content")
    if not isinstance(content, list) or not content:
        return None
    out = []
    for item in content:
        item = _mapping(item)
        token, logprob = item.get("token"), item.get("logprob")
        if not isinstance(token, str) or not isinstance(logprob, (int, float)):
            return None
        listed = [
            (_mapping(t).get("token"), _mapping(t).get("logprob"))
            for t in item.get("top_logprobs") or []
        ]
        top = [
            (t, float(v)) for t, v in listed if isinstance(t, str) and isinstance(v, (int, float))
        ]
        out.append(TokenLogprob(token, float(logprob), tuple(top)))
    return tuple(out)


def _unwrap_choice(text: str) -> str:
    """``{"verdict": "yes"}`` -> ``"yes"``; anything else is returned as is, for the
    metric's parser to reject."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if isinstance(value, dict) and isinstance(value.get(CHOICE_PROPERTY), str):
        return value[CHOICE_PROPERTY]
    return text


def _status_message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        if isinstance(body.get("message"), str):
            return body["message"]
    return str(getattr(exc, "message", None) or exc)


def _describe_exception(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause) and str(cause) not in text:
        text += f" ({type(cause).__name__}: {cause})"
    return text


def _load_tokenizer(path: str) -> Any:
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise EngineError(
            f"engines.<openai>.tokenizer needs the `transformers` package ({exc}); install "
            f"it with: pip install transformers"
        ) from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        raise EngineError(
            f"engines.<openai>.tokenizer: cannot load a tokenizer from {path!r} "
            f"({_describe_exception(exc)}); give a local directory holding the served "
            f"model's tokenizer files"
        ) from None
    if not getattr(tokenizer, "chat_template", None):
        raise EngineError(
            f"engines.<openai>.tokenizer: the tokenizer in {path!r} has no chat template, so "
            f"prompt lengths cannot be counted; use the served model's own tokenizer directory"
        )
    return tokenizer


def _count_with_tokenizer(tokenizer: Any, messages: list[dict[str, str]]) -> int:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys") and "input_ids" in ids:  # BatchEncoding (transformers 5)
        ids = ids["input_ids"]
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    return len(ids)


def load_openai_engine(spec: OpenAIEngine) -> OpenAIJudgeEngine:
    """Connect to an OpenAI-compatible server and check that it serves ``spec.model``.

    Parameters
    ----------
    spec : OpenAIEngine
        The engine's config entry.

    Returns
    -------
    OpenAIJudgeEngine
        Ready to answer requests; call :meth:`~OpenAIJudgeEngine.close` when done.

    Raises
    ------
    EngineError
        ``openai`` is not installed; the API key variable is not set; the server cannot
        be reached within a few seconds, answers with an error, or does not serve
        ``spec.model``; its window is unknown and ``max_model_len`` is not configured; or
        the ``tokenizer`` directory cannot be loaded.
    """
    return OpenAIJudgeEngine(spec)


def preflight(spec: OpenAIEngine) -> None:
    """Check that the server answers and serves ``spec.model`` (:func:`load_openai_engine`,
    then close); a few seconds at most. The registry's ``preflight`` hook for ``openai``
    engines.

    Raises
    ------
    EngineError
        As :func:`load_openai_engine`.
    """
    load_openai_engine(spec).close()
