"""A stand-in judge: an OpenAI-compatible HTTP server on loopback that answers every chat
request with one fixed reply.

It plays the degenerate judge of issue 25 (every hate_speech reply
``{"reason":"true","verdict":true}``) in end-to-end runs through the real ``openai``
engine, Ray actors and the CLI. A real small model behaves that way too, but none is
available to these tests yet (tests/test_judge_health_model.py runs the real one when
its fixture exists). It serves ``GET /v1/models`` and ``POST /v1/chat/completions``; any
other path (``/tokenize``) gets 404, which the engine reads as "the server checks prompt
lengths itself".

With ``rate_per_s`` it also plays a rate-limited provider: a token bucket
(:class:`TokenBucket`) admits chat requests at that rate, and a request that finds the
bucket empty gets HTTP 429 with ``retry-after-ms`` (the milliseconds until the next
token, as OpenAI sends it) and ``Retry-After`` (the same, rounded up to whole seconds).
``latency_s`` holds every admitted request that long before its reply, as a model's
generation would, so that the rate a client reaches depends on how many requests it
keeps in flight. The server logs when it admitted each request
(:attr:`CannedJudgeServer.admitted_at`); :meth:`CannedJudgeServer.admitted_share`
measures the share of the allowed requests a client used. :class:`CannedJudgeProcess`
runs the same server in a process of its own: a client measured against it then does
not share the server's interpreter lock, whose hand-overs on a busy machine otherwise
stall both for tenths of a second at a time.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SERVED_NAME = "canned"
MAX_MODEL_LEN = 1_000_000


class TokenBucket:
    """A token bucket (the rate limiter of most API providers): ``burst`` tokens at
    most, refilled at ``rate_per_s`` tokens a second, one token per admitted request.

    Parameters
    ----------
    rate_per_s : float
        Requests a second allowed in the long run (> 0).
    burst : int
        Tokens the bucket holds (>= 1); it starts full.
    clock : callable, default time.monotonic
        Seconds, monotonic.
    """

    def __init__(self, rate_per_s: float, burst: int, clock=time.monotonic):
        self.rate = rate_per_s
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()

    def take(self) -> float:
        """Take a token: 0.0 if one was there (the request is admitted), else the
        seconds until the next one (the request is refused)."""
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self.rate


class _Server(ThreadingHTTPServer):
    #: Connections waiting to be accepted (the standard library's 5 drops some of a
    #: burst of requests sent at once, and the client's retry of a dropped connection
    #: waits a second).
    request_queue_size = 128


class CannedJudgeServer:
    """Context manager: a loopback server answering every chat with ``reply``.

    Parameters
    ----------
    reply : str
        The content of every chat reply.
    rate_per_s : float, optional
        Admit chat requests at this rate (token bucket), answering the others 429.
        None (the default): no limit.
    burst : int, default 1
        The bucket's size: requests admitted at once after a quiet spell.
    latency_s : float, default 0.0
        Seconds every admitted chat request waits before its reply.
    retry_after_s : float, optional
        The wait every 429 reply asks for, instead of the time until the bucket's next
        token.
    refusal_code : str, default "rate_limit_exceeded"
        ``error.code`` of the 429 replies (OpenAI's ``insufficient_quota`` says the
        account's credit is spent).

    Attributes
    ----------
    base_url : str
        ``http://127.0.0.1:<port>/v1``.
    chat_calls : int
        Chat requests answered 200 so far.
    refused : int
        Chat requests answered 429 so far.
    admitted_at : list of float
        ``time.monotonic()`` when each admitted chat request arrived, in order.
    """

    def __init__(
        self,
        reply: str,
        *,
        rate_per_s: float | None = None,
        burst: int = 1,
        latency_s: float = 0.0,
        retry_after_s: float | None = None,
        refusal_code: str = "rate_limit_exceeded",
    ):
        self.reply = reply
        self.chat_calls = 0
        self.refused = 0
        self.admitted_at: list[float] = []
        self.latency_s = latency_s
        self.retry_after_s = retry_after_s
        self.refusal_code = refusal_code
        self.bucket = None if rate_per_s is None else TokenBucket(rate_per_s, burst)
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def do_GET(self):
                if self.path.rstrip("/").endswith("/models"):
                    outer._send(
                        self,
                        200,
                        {
                            "object": "list",
                            "data": [
                                {
                                    "id": SERVED_NAME,
                                    "object": "model",
                                    "max_model_len": MAX_MODEL_LEN,
                                }
                            ],
                        },
                    )
                else:
                    outer._send(self, 404, {"detail": "Not Found"})

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                if not self.path.endswith("/chat/completions"):
                    outer._send(self, 404, {"detail": "Not Found"})
                    return
                wait = outer._admit()
                if wait:
                    outer._refuse(self, wait)
                    return
                if outer.latency_s:
                    time.sleep(outer.latency_s)
                with outer._lock:
                    outer.chat_calls += 1
                outer._send(
                    self,
                    200,
                    {
                        "id": "canned",
                        "object": "chat.completion",
                        "model": SERVED_NAME,
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "stop",
                                "message": {"role": "assistant", "content": outer.reply},
                            }
                        ],
                        "usage": {
                            "prompt_tokens": 100,
                            "completion_tokens": 10,
                            "total_tokens": 110,
                        },
                    },
                )

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> "CannedJudgeServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def admitted_share(self) -> float:
        """:func:`admitted_share` of this server's log and bucket.

        Raises
        ------
        ValueError
            The server has no rate limit, or admitted fewer than two requests.
        """
        if self.bucket is None:
            raise ValueError("the server has no rate limit")
        return admitted_share(self.admitted_at, self.bucket.rate, self.bucket.burst)

    def log(self) -> dict[str, Any]:
        """``{"chat_calls", "refused", "admitted_at"}`` as they stand now."""
        with self._lock:
            return {
                "chat_calls": self.chat_calls,
                "refused": self.refused,
                "admitted_at": list(self.admitted_at),
            }

    def _admit(self) -> float:
        """0.0 when the request may be answered (logged in :attr:`admitted_at`), else
        the seconds until the bucket has a token."""
        if self.bucket is None:
            return 0.0
        with self._lock:
            wait = self.bucket.take()
            if wait:
                self.refused += 1
            else:
                self.admitted_at.append(time.monotonic())
        return wait

    def _refuse(self, handler: BaseHTTPRequestHandler, wait: float) -> None:
        if self.retry_after_s is not None:
            wait = self.retry_after_s
        millis = max(1, math.ceil(wait * 1000))
        self._send(
            handler,
            429,
            {
                "error": {
                    "message": "Rate limit reached; please try again later.",
                    "type": "requests",
                    "code": self.refusal_code,
                }
            },
            {"retry-after-ms": str(millis), "Retry-After": str(math.ceil(millis / 1000))},
        )

    @staticmethod
    def _send(
        handler: BaseHTTPRequestHandler,
        status: int,
        payload: dict,
        headers: dict[str, str] | None = None,
    ) -> None:
        data = json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(data)


def admitted_share(admitted_at: list[float], rate_per_s: float, burst: int) -> float:
    """Admitted requests over the requests a token bucket allowed while they came: its
    ``burst`` plus ``rate_per_s`` times the seconds from the first admitted request to
    the last. At most 1 (up to the clock's resolution); 1 means the client used every
    request the limit allowed.

    Raises
    ------
    ValueError
        Fewer than two admitted requests.
    """
    if len(admitted_at) < 2:
        raise ValueError("needs at least two admitted requests")
    span = admitted_at[-1] - admitted_at[0]
    return len(admitted_at) / (burst + rate_per_s * span)


def _serve(conn: Any, reply: str, options: dict[str, Any]) -> None:
    """Body of :class:`CannedJudgeProcess`'s process: serve until told to stop,
    answering each ``"log"`` with :meth:`CannedJudgeServer.log`."""
    with CannedJudgeServer(reply, **options) as server:
        conn.send(server.base_url)
        while conn.recv() == "log":
            conn.send(server.log())


class CannedJudgeProcess:
    """Context manager: a :class:`CannedJudgeServer` in a process of its own (spawned).

    Parameters
    ----------
    reply : str
        As :class:`CannedJudgeServer`.
    **options
        :class:`CannedJudgeServer`'s keyword arguments (``rate_per_s``, ``burst``,
        ``latency_s``, ...).

    Attributes
    ----------
    base_url : str
        ``http://127.0.0.1:<port>/v1``, once entered.
    """

    def __init__(self, reply: str, **options: Any):
        self.rate_per_s = options.get("rate_per_s")
        self.burst = options.get("burst", 1)
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, reply, options), daemon=True)
        self.base_url = ""

    def __enter__(self) -> "CannedJudgeProcess":
        self._process.start()
        if not self._conn.poll(60):
            self._process.kill()
            raise RuntimeError("the canned judge server did not start within 60 s")
        self.base_url = self._conn.recv()
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._conn.send("stop")
        except (BrokenPipeError, OSError):
            pass
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.kill()

    def log(self) -> dict[str, Any]:
        """The server's :meth:`CannedJudgeServer.log` now."""
        self._conn.send("log")
        return self._conn.recv()

    def admitted_share(self) -> float:
        """:func:`admitted_share` of the server's log and bucket."""
        if self.rate_per_s is None:
            raise ValueError("the server has no rate limit")
        return admitted_share(self.log()["admitted_at"], self.rate_per_s, self.burst)
