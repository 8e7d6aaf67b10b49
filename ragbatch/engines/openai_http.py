"""The HTTP side of the ``openai`` engine (:mod:`ragbatch.engines.openai`): the event loop
thread its requests run on, the body of a chat-completions request, a reply read into a
:class:`~ragbatch.judge.protocol.Completion`, a failed attempt classified, and the waits
before retries. docs/engines.md, "OpenAI-compatible servers", says what each choice is
for and which client and server releases it was written against.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import asyncio
import email.utils
import json
import os
import random
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Coroutine, Sequence, TypeVar

from ragbatch.core.errors import EngineError
from ragbatch.core.redact import redact_url
from ragbatch.core.status import JUDGE_ERROR, OK
from ragbatch.judge.protocol import Completion, EngineRequest, TokenLogprob

if TYPE_CHECKING:  # the spec lives in the adapter module, which imports this one
    from ragbatch.engines.openai import OpenAIEngine

T = TypeVar("T")

#: pip command that installs the client.
PIP_COMMAND = "pip install 'openai>=1.40'  # or: pip install 'ragbatch[judge-cpu]'"
#: Longest wait a ``Retry-After`` header can impose, in seconds.
MAX_RETRY_AFTER_S = 120.0
#: Longest backoff before retrying a 429 reply that names no wait, in seconds (before the
#: random factor): the k-th 429 of a request waits ``backoff_s * 2**(k-1)`` up to this.
MAX_RATE_LIMIT_BACKOFF_S = 30.0
#: ``error.code`` / ``error.type`` of a 429 reply that no wait can cure (OpenAI's for an
#: account out of credit): such a reply is not retried.
QUOTA_CODES = frozenset({"insufficient_quota"})
#: Name of the schema sent with ``structured_outputs: response_format``.
SCHEMA_NAME = "verdict"
#: Property that carries the chosen option when a choice is sent as a JSON schema.
CHOICE_PROPERTY = "verdict"
#: Server messages that mean the prompt (plus ``max_tokens``) does not fit the window.
CONTEXT_MESSAGE = re.compile(
    r"maximum context length|context length|context window|max_model_len|"
    r"too many (?:input )?tokens|prompt is too long|input is too long",
    re.IGNORECASE,
)


class Failure(Exception):
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
class Tries:
    """Where one request stands in its retries."""

    attempts: int = 0
    #: Retries spent of ``max_retries`` (5xx replies, connection errors, timeouts).
    server_retries: int = 0
    #: 429 replies so far, and the event loop's time at the first.
    rate_limits: int = 0
    first_rate_limit: float | None = None
    #: Added to the error text when the rate-limit budget ends the retries.
    note: str = ""


def backoff(base_s: float, k: int, cap_s: float | None = None) -> float:
    """``base_s * 2**(k-1)`` seconds (at most ``cap_s``), times a random factor in
    [0.5, 1.5]: the wait before a request's k-th retry (k >= 1)."""
    wait = base_s * 2.0 ** min(k - 1, 60)
    if cap_s is not None:
        wait = min(wait, cap_s)
    return wait * random.uniform(0.5, 1.5)


def quota_spent(exc: Any) -> bool:
    """Whether a 429 reply's ``error.code`` or ``error.type`` says the account's quota
    is spent (:data:`QUOTA_CODES`): a limit that waiting does not lift."""
    body = getattr(exc, "body", None)
    inner = body.get("error", body) if isinstance(body, dict) else None
    if not isinstance(inner, dict):
        return False
    return bool({inner.get("code"), inner.get("type")} & QUOTA_CODES)


class LoopThread:
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
        """Stop the loop and its thread (waiting up to 10 s), then close the loop."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


def import_openai() -> Any:
    """The ``openai`` client module; :class:`EngineError` with the pip command when it
    cannot be imported."""
    try:
        import openai
    except ImportError as exc:
        raise EngineError(
            f"the openai engine needs the `openai` package, which cannot be imported "
            f"({exc}); install it with: {PIP_COMMAND}"
        ) from None
    return openai


def read_api_key(spec: OpenAIEngine) -> str:
    """The API key from the environment variable ``spec.api_key_env`` names, or
    ``"EMPTY"`` without one (a local server).

    Raises
    ------
    EngineError
        The variable is not set, or is empty.
    """
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


def server_root(base_url: str) -> str:
    """``http://host:port/v1`` -> ``http://host:port`` (where vLLM serves ``/tokenize``)."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def parse_retry_after(headers: Any) -> float | None:
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


def choice_schema(options: Sequence[str]) -> dict[str, Any]:
    """The JSON schema a choice among ``options`` is sent as with ``structured_outputs:
    response_format``: an object whose :data:`CHOICE_PROPERTY` is one of them."""
    return {
        "type": "object",
        "properties": {CHOICE_PROPERTY: {"type": "string", "enum": list(options)}},
        "required": [CHOICE_PROPERTY],
        "additionalProperties": False,
    }


def mapping(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one (a reply field of the wrong
    shape reads as absent)."""
    return value if isinstance(value, dict) else {}


def token_count(value: Any) -> int:
    """A token count from a reply: a non-negative int, else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def token_logprobs(choice: dict[str, Any]) -> tuple[TokenLogprob, ...] | None:
    """The token logprobs of a chat-completions choice (``logprobs.content``), or None
    when the server sent none or sent them in another shape."""
    content = mapping(choice.get("logprobs")).get("content")
    if not isinstance(content, list) or not content:
        return None
    out = []
    for item in content:
        item = mapping(item)
        token, logprob = item.get("token"), item.get("logprob")
        if not isinstance(token, str) or not isinstance(logprob, (int, float)):
            return None
        listed = [
            (mapping(t).get("token"), mapping(t).get("logprob"))
            for t in item.get("top_logprobs") or []
        ]
        top = [
            (t, float(v)) for t, v in listed if isinstance(t, str) and isinstance(v, (int, float))
        ]
        out.append(TokenLogprob(token, float(logprob), tuple(top)))
    return tuple(out)


def unwrap_choice(text: str) -> str:
    """``{"verdict": "yes"}`` -> ``"yes"``; anything else is returned as is, for the
    metric's parser to reject."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if isinstance(value, dict) and isinstance(value.get(CHOICE_PROPERTY), str):
        return value[CHOICE_PROPERTY]
    return text


def status_message(exc: Any) -> str:
    """The server's message in an HTTP error reply (its ``error.message`` when the body
    is JSON), else the exception's text."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        if isinstance(body.get("message"), str):
            return body["message"]
    return str(getattr(exc, "message", None) or exc)


def describe_exception(exc: BaseException) -> str:
    """``"<type>: <message>"`` of ``exc``, with its cause's message when that adds to it."""
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause) and str(cause) not in text:
        text += f" ({type(cause).__name__}: {cause})"
    return text


def load_tokenizer(path: str) -> Any:
    """The transformers tokenizer in local directory ``path``, to count prompt tokens.

    Raises
    ------
    EngineError
        transformers is not installed, or the directory holds no tokenizer.
    """
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
            f"({describe_exception(exc)}); give a local directory holding the served "
            f"model's tokenizer files"
        ) from None
    if not getattr(tokenizer, "chat_template", None):
        raise EngineError(
            f"engines.<openai>.tokenizer: the tokenizer in {path!r} has no chat template, so "
            f"prompt lengths cannot be counted; use the served model's own tokenizer directory"
        )
    return tokenizer


def count_with_tokenizer(tokenizer: Any, messages: list[dict[str, str]]) -> int:
    """Prompt tokens of ``messages`` rendered with the tokenizer's chat template and the
    generation prompt."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys") and "input_ids" in ids:  # a BatchEncoding (docs/engines.md)
        ids = ids["input_ids"]
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    return len(ids)


def request_body(
    spec: OpenAIEngine, request: EngineRequest, messages: list[dict[str, str]], max_tokens: int
) -> dict[str, Any]:
    """The JSON body of the chat-completions request of ``request`` for an engine of
    ``spec``: ``messages``, ``max_tokens``, the sampling settings, the request's seed,
    its structured output as ``spec.structured_outputs`` asks, and logprobs where its
    output wants them and ``spec.logprobs`` allows."""
    output = request.output
    body: dict[str, Any] = {
        "model": spec.model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": spec.temperature,
        "top_p": spec.top_p,
        "seed": request.seed,
    }
    if spec.structured_outputs == "vllm":
        if output.choice is not None:
            constraint: dict[str, Any] = {"choice": list(output.choice)}
        else:
            constraint = {"json": output.schema}
        body["structured_outputs"] = constraint
    else:
        schema = choice_schema(output.choice) if output.choice is not None else output.schema
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": SCHEMA_NAME, "schema": schema, "strict": True},
        }
    if output.logprobs and spec.logprobs:
        body["logprobs"] = True
        body["top_logprobs"] = output.logprobs
    return body


def wait_before_retry(
    spec: OpenAIEngine, failure: Failure, tries: Tries, now: float
) -> float | None:
    """Seconds to wait before the next attempt, or None to give up.

    A 429 reply has a budget of its own (:func:`rate_limit_wait`); 5xx replies and
    connection errors share ``max_retries``, waiting ``Retry-After`` if the server
    sent one, else ``backoff_s * 2**(k-1)`` times a random factor in [0.5, 1.5]
    before the k-th retry."""
    if not failure.retryable:
        return None
    if failure.rate_limited:
        return rate_limit_wait(spec, failure, tries, now)
    if tries.server_retries >= spec.max_retries:
        return None
    tries.server_retries += 1
    if failure.retry_after is not None:
        return failure.retry_after
    return backoff(spec.backoff_s, tries.server_retries)


def rate_limit_wait(spec: OpenAIEngine, failure: Failure, tries: Tries, now: float) -> float | None:
    """Seconds to wait after a 429 reply, or None once ``rate_limit_timeout_s`` has
    passed since the request's first 429: ``Retry-After`` when sent, else
    ``backoff_s * 2**(k-1)`` for the request's k-th 429, at most
    :data:`MAX_RATE_LIMIT_BACKOFF_S`, times a random factor in [0.5, 1.5]."""
    tries.rate_limits += 1
    if tries.first_rate_limit is None:
        tries.first_rate_limit = now
    budget = spec.rate_limit_timeout_s
    if budget is not None and now - tries.first_rate_limit >= budget:
        tries.note = (
            f"; still rate limited {now - tries.first_rate_limit:.1f} s after the "
            f"first 429 (rate_limit_timeout_s={budget:g})"
        )
        return None
    if failure.retry_after is not None:
        return failure.retry_after
    return backoff(spec.backoff_s, tries.rate_limits, MAX_RATE_LIMIT_BACKOFF_S)


def classify(openai: Any, exc: BaseException) -> Failure:
    """The failure of an attempt that raised ``exc`` (an exception of the ``openai``
    client module ``openai``): a time-out or connection error (retried), an HTTP
    status (429 and 5xx retried, unless the quota is spent; a refused long prompt is
    ``context``), or a reply the client could not read."""
    if isinstance(exc, openai.APITimeoutError):
        return Failure(f"timed out: {describe_exception(exc)}", retryable=True, timed_out=True)
    if isinstance(exc, openai.APIConnectionError):
        return Failure(f"connection error: {describe_exception(exc)}", retryable=True)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        message = status_message(exc)
        text = f"HTTP {status}: {message}"
        retry_after = parse_retry_after(exc.response.headers)
        if status == 429 and quota_spent(exc):
            return Failure(f"{text} (the account's quota is spent; not retried)", False)
        if status == 429:
            return Failure(text, retryable=True, retry_after=retry_after, rate_limited=True)
        if status >= 500:
            return Failure(text, retryable=True, retry_after=retry_after)
        if status in (400, 413, 422) and CONTEXT_MESSAGE.search(message):
            return Failure(text, retryable=False, context=True)
        return Failure(text, retryable=False)
    return Failure(f"bad reply from the server: {describe_exception(exc)}", retryable=False)


def to_completion(spec: OpenAIEngine, reply: Any, request: EngineRequest) -> Completion:
    """The completion of a chat-completions reply body (parsed JSON) to ``request``:
    ``ok`` with the text (a choice sent as a JSON schema unwrapped), token counts and
    logprobs, or ``judge_error`` for a reply of the wrong shape or without content."""
    if not isinstance(reply, dict):
        return Completion(
            status=JUDGE_ERROR,
            error=f"bad reply from the server: not a JSON object: {reply!r:.200}",
        )
    usage = mapping(reply.get("usage"))
    prompt_tokens = token_count(usage.get("prompt_tokens"))
    completion_tokens = token_count(usage.get("completion_tokens"))
    cached = mapping(usage.get("prompt_tokens_details")).get("cached_tokens")
    cached = cached if isinstance(cached, int) and not isinstance(cached, bool) else None
    choices = reply.get("choices")
    first = mapping(choices[0]) if isinstance(choices, list) and choices else None
    if first is None:
        return Completion(
            status=JUDGE_ERROR,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_prompt_tokens=cached,
            error="bad reply from the server: no choices",
        )
    message = mapping(first.get("message"))
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
        spec.structured_outputs == "response_format"
        and request.output.choice is not None
        and finish == "stop"
    ):
        text = unwrap_choice(text)
    return Completion(
        status=OK,
        text=text,
        finish_reason=finish,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_prompt_tokens=cached,
        logprobs=token_logprobs(first) if request.output.logprobs else None,
    )
