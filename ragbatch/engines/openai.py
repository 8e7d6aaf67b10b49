"""Adapter for OpenAI-compatible chat-completions servers (``openai`` engines).

Callers see only :func:`load_openai_engine` and :class:`OpenAIJudgeEngine`. The requests
of each :meth:`OpenAIJudgeEngine.complete` call run concurrently on an event loop the
engine runs in a thread of its own, through a gate whose number of slots follows the
server's rate limits (:mod:`ragbatch.engines.openai_limits`); each request asks for its
structured output, and for token logprobs where its output wants them. A prompt too long
for the model's window is ``context_too_long`` without a call where it can be counted;
5xx replies, connection errors and HTTP 429 are retried; a request that still fails gets
``timeout`` or ``judge_error``. The engine never raises for one request;
:func:`load_openai_engine` raises :class:`~ragbatch.core.errors.EngineError` when the
server cannot be used at all.

The client and server releases this is written against, how requests are sent and
retried and why, how prompts are counted, and the measurements behind those choices are
in docs/engines.md, "OpenAI-compatible servers".
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Sequence, TypeVar, cast

from typing import Literal

from pydantic import Field, model_validator

from ragbatch.config.engine_spec import JudgeSettings
from ragbatch.core.engine_registry import EngineType, register_engine
from ragbatch.core.errors import EngineError
from ragbatch.core.pool_sizing import NETWORK_POOL
from ragbatch.engines.openai_limits import AimdLimit, SendGate
from ragbatch.judge.protocol import Completion, EngineRequest, JudgeEngine, OutputSpec
from ragbatch.core.redact import redact_url
from ragbatch.engines.openai_http import (
    Failure,
    LoopThread,
    Tries,
    read_api_key,
    classify,
    count_with_tokenizer,
    describe_exception,
    import_openai,
    load_tokenizer,
    request_body,
    server_root,
    status_message,
    to_completion,
    wait_before_retry,
)
from ragbatch.core.status import CONTEXT_TOO_LONG, JUDGE_ERROR, OK, TIMEOUT

# --- the engine type: spec model and registration (adapter below) -----------------------


class OpenAIEngine(JudgeSettings):
    """Any OpenAI-compatible chat-completions server (for example ``vllm serve``).

    ``model`` is the served model name; the API key is read from the environment
    variable ``api_key_env`` (never from the file). At most ``max_concurrency`` requests
    are in flight per actor; with ``adaptive_concurrency`` the engine finds how many the
    server takes, between ``min_concurrency`` and that ceiling (additive increase,
    multiplicative decrease on HTTP 429, as TCP's congestion control:
    :mod:`ragbatch.engines.openai_limits`). 5xx replies and connection errors are
    retried up to ``max_retries`` times with exponential backoff starting at
    ``backoff_s``; 429 replies are retried apart from that count, until
    ``rate_limit_timeout_s`` has passed since a request's first 429."""

    type: Literal["openai"]
    base_url: str
    api_key_env: str | None = None
    #: Most requests in flight per actor (the ceiling of the adaptive limit).
    max_concurrency: int = Field(8, ge=1)
    #: Let the number of requests in flight adapt to the server: it starts at
    #: ``min_concurrency``, doubles per round trip until the first 429, then grows by one
    #: per round trip of successes and is multiplied by 0.7 on a 429 (never below
    #: ``min_concurrency`` nor above ``max_concurrency``); a 429's ``Retry-After`` pauses
    #: every new send of the engine. False keeps ``max_concurrency`` in flight, and a
    #: ``Retry-After`` holds back only the request that got it.
    adaptive_concurrency: bool = True
    #: Fewest requests in flight per actor with ``adaptive_concurrency``; also the start.
    min_concurrency: int = Field(1, ge=1)
    #: Seconds a request keeps retrying 429 replies, counted from its first 429 (429s do
    #: not use up ``max_retries``); then it gets ``judge_error``. None: no limit but
    #: ``batch_timeout_s``. A 429 saying the account's quota is spent is never retried.
    rate_limit_timeout_s: float | None = Field(600.0, gt=0)
    #: With ``adaptive_concurrency``: a reply slower than this multiple of the fastest
    #: reply so far lowers the limit as a 429 does, for servers that queue requests
    #: instead of refusing them. Meant for judge requests of similar size (a long prompt
    #: is slow without any overload). None (the default): reply times are not read.
    latency_backoff: float | None = Field(None, gt=1)
    max_retries: int = Field(4, ge=0)
    backoff_s: float = Field(0.5, ge=0)
    structured_outputs: Literal["vllm", "response_format"] = "vllm"
    #: Ask for token logprobs of verdict replies (verdict confidence, ``score:
    #: probability``). False for a server that rejects the ``logprobs`` field: the
    #: requests then go without it and every cell's ``confidence`` is null, with a reason.
    logprobs: bool = True

    @model_validator(mode="after")
    def _floor_within_ceiling(self) -> "OpenAIEngine":
        if self.min_concurrency > self.max_concurrency:
            raise ValueError(
                f"min_concurrency {self.min_concurrency} exceeds max_concurrency "
                f"{self.max_concurrency}; lower min_concurrency or raise max_concurrency"
            )
        return self


register_engine(
    EngineType(
        "openai",
        OpenAIEngine,
        "judge",
        "ragbatch.engines.openai:load_openai_engine",
        "pip install 'openai>=1.40'",
        ("openai",),
        local_model=False,
        preflight="ragbatch.engines.openai:preflight",
        pool_rule=NETWORK_POOL,
        order=40,
    )
)

# ------------------------------------------------------------------------------------------

logger = logging.getLogger(__name__)

T = TypeVar("T")


#: Seconds allowed to open a connection, on load and for every request.
CONNECT_TIMEOUT_S = 5.0
#: Seconds allowed for the model listing made on load.
LOAD_TIMEOUT_S = 30.0


#: Tokens added to the byte bound of a chat's length (:meth:`OpenAIJudgeEngine._fits_by_bytes`)
#: for what the probe chats do not show of the template.
BYTE_BOUND_MARGIN = 32


#: Completion tokens added to a choice's ``max_tokens`` when it is sent as a JSON schema,
#: for the ``{"verdict": "..."}`` around the option.
CHOICE_WRAPPER_TOKENS = 16


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
        How prompt tokens are counted before a request is sent (docs/engines.md,
        "Prompt length").
    limit : ragbatch.engines.openai_limits.AimdLimit
        The limit on requests in flight (docs/engines.md, "How a request is sent");
        its ``changes`` list each rise and fall.
    """

    def __init__(self, spec: OpenAIEngine) -> None:
        self.spec = spec
        self.base_url = spec.base_url.rstrip("/")
        #: ``base_url`` without credentials: what ids, messages and logs show.
        self.public_url = redact_url(self.base_url)
        self._openai = import_openai()
        api_key = read_api_key(spec)
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
        self._loop = LoopThread()
        try:
            self._client = self._loop.run(self._make_client(api_key))
            card = self._loop.run(self._probe_model())
            self.model_id, self.max_model_len = self._identity(card)
            if spec.tokenizer:
                self._tokenizer = load_tokenizer(spec.tokenizer)
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
                f"{exc.status_code}: {status_message(exc)}; check base_url (it usually ends "
                f"in /v1) and the API key"
            ) from None
        except openai.APIConnectionError as exc:
            raise EngineError(
                f"the openai engine cannot reach {self.public_url}: {describe_exception(exc)}; "
                f"is the server running, and is base_url right?"
            ) from None
        except Exception as exc:  # a reply that is not a model list
            raise EngineError(
                f"{self.public_url} did not answer GET /models with a model list "
                f"({describe_exception(exc)}); is it an OpenAI-compatible server?"
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
                server_root(self.public_url),
                describe_exception(exc),
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
            without asking ``/tokenize``, their bytes showing that they fit; see
            docs/engines.md), ``token_counter``, and what the concurrency limit did
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
                out.append(Completion(status=JUDGE_ERROR, error=describe_exception(exc)))
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
        body = request_body(self.spec, request, messages, self._max_tokens(request.output))
        return await self._send_with_retries(body, request, prompt_tokens or 0, deadline)

    async def _count_prompt(self, messages: list[dict[str, str]], max_tokens: int) -> int | None:
        if self.token_counter == "tokenizer":
            return count_with_tokenizer(self._tokenizer, messages)
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
            server_root(self.base_url) + "/tokenize",
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

    async def _send_with_retries(
        self,
        body: dict[str, Any],
        request: EngineRequest,
        prompt_tokens: int,
        deadline: float | None,
    ) -> Completion:
        loop = asyncio.get_running_loop()
        tries = Tries()
        while True:
            if tries.attempts:
                self._counters.retries += 1
            tries.attempts += 1
            self._counters.attempts += 1
            reply, failure = await self._attempt(body, retry=tries.attempts > 1)
            if failure is None:
                return to_completion(self.spec, reply, request)
            if failure.context:
                return Completion(
                    status=CONTEXT_TOO_LONG, prompt_tokens=prompt_tokens, error=str(failure)
                )
            wait = wait_before_retry(self.spec, failure, tries, loop.time())
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

    async def _attempt(self, body: dict[str, Any], retry: bool) -> tuple[Any, Failure | None]:
        """One chat call in a slot of the gate: ``(reply, None)`` or ``(None, failure)``.
        The concurrency limit is told how it went before the slot is given back."""
        loop = asyncio.get_running_loop()
        epoch = await self._gate.acquire(retry=retry)
        try:
            start = loop.time()
            try:
                reply = await self._client.post("/chat/completions", body=body, cast_to=object)
            except Exception as exc:  # classified here; never raised to the caller
                failure = classify(self._openai, exc)
                if failure.rate_limited:
                    self.limit.on_rate_limit(epoch, loop.time(), failure.retry_after)
                return None, failure
            self.limit.on_success(epoch, loop.time() - start)
            return reply, None
        finally:
            self._gate.release()

    def _gate_waits(self, failure: Failure) -> bool:
        """Whether the gate itself holds the retry back: with an adaptive limit, a 429's
        ``Retry-After`` pauses every send of the engine, this retry's included."""
        return self.limit.adaptive and failure.rate_limited and failure.retry_after is not None


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
