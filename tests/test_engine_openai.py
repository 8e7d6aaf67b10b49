"""The ``openai`` judge engine against a real ``vllm serve`` on loopback.

One vLLM server (the tiny random Llama of ``tests/support/judge_models.py``, served as
``tiny``; fixture ``vllm_base_url`` of ``tests/support/vllm_server.py``) is shared by the
test session. Failures the server never produces on
its own (rate limits, stalls, 5xx replies, a missing ``/tokenize``) come from
:class:`FaultInjector`, a small HTTP server in this file that stands between the engine
and vLLM and answers some requests itself.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("openai", reason="the openai engine needs the openai package")
pytest.importorskip("vllm", reason="these tests serve a model with vllm (ragbatch[judge-cpu])")

from ragbatch.engines.openai import OpenAIEngine  # noqa: E402
from ragbatch.engines.openai import BYTE_BOUND_MARGIN, load_openai_engine  # noqa: E402
from ragbatch.core.errors import EngineError  # noqa: E402
from ragbatch.judge.protocol import EngineRequest, Message, OutputSpec, run_sync  # noqa: E402

from support.vllm_server import MAX_MODEL_LEN, SERVED_NAME, free_port  # noqa: E402

YES_NO = OutputSpec.of_choice(["yes", "no"], max_tokens=8)
VERDICT_SCHEMA = {
    "type": "object",
    "properties": {"verdict": {"type": "string", "enum": ["supported", "unsupported"]}},
    "required": ["verdict"],
    "additionalProperties": False,
}
VERDICT = OutputSpec.of_schema(VERDICT_SCHEMA, max_tokens=48)


def _ask(text: str, output: OutputSpec = YES_NO, seed: int = 0) -> EngineRequest:
    return EngineRequest(
        messages=(Message("system", "Answer the question."), Message("user", text)),
        output=output,
        seed=seed,
    )


class FaultInjector:
    """A loopback HTTP proxy in front of the vLLM server that injects failures.

    Parameters
    ----------
    upstream : str
        Root URL of the real server (``http://127.0.0.1:<port>``).
    rate_limit_first : int
        Answer this many chat requests with HTTP 429 and ``Retry-After: 0``, then forward.
    stall_s : float
        Hold every chat request this many seconds, then drop it without forwarding.
    always_500 : bool
        Answer every chat request with HTTP 500.
    hide_tokenize : bool
        Answer ``/tokenize`` with 404, as servers other than vLLM do.
    chat_reply : tuple of (str, bytes), optional
        Answer every chat request with HTTP 200, this content type and body (a reply
        of the wrong shape, which no working server sends).

    Everything else is forwarded unchanged. ``chat_calls`` and ``tokenize_calls`` count
    chat and ``/tokenize`` requests that arrived, ``chat_bodies`` holds their JSON bodies,
    and ``peak_in_flight`` is the most
    that were open at once.
    """

    def __init__(
        self,
        upstream: str,
        *,
        rate_limit_first: int = 0,
        stall_s: float = 0.0,
        always_500: bool = False,
        hide_tokenize: bool = False,
        chat_reply: tuple[str, bytes] | None = None,
    ):
        self.upstream = upstream.rstrip("/")
        self.rate_limit_first = rate_limit_first
        self.stall_s = stall_s
        self.always_500 = always_500
        self.hide_tokenize = hide_tokenize
        self.chat_reply = chat_reply
        self.chat_calls = 0
        self.tokenize_calls = 0
        self.chat_bodies: list[dict] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        self._lock = threading.Lock()
        injector = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output quiet
                pass

            def do_GET(self):
                injector._handle(self)

            def do_POST(self):
                injector._handle(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> "FaultInjector":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else None
        if h.path.endswith("/chat/completions"):
            with self._lock:
                self.chat_calls += 1
                self.chat_bodies.append(json.loads(body or b"{}"))
                n = self.chat_calls
                self.in_flight += 1
                self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            try:
                self._chat(h, body, n)
            finally:
                with self._lock:
                    self.in_flight -= 1
            return
        if h.path.rstrip("/").endswith("/tokenize"):
            with self._lock:
                self.tokenize_calls += 1
        if self.hide_tokenize and h.path.rstrip("/").endswith("/tokenize"):
            self._reply(h, 404, {"detail": "Not Found"})
            return
        self._forward(h, body)

    def _chat(self, h: BaseHTTPRequestHandler, body: bytes | None, n: int) -> None:
        if self.chat_reply is not None:
            ctype, data = self.chat_reply
            self._send(h, 200, data, ctype)
        elif self.always_500:
            self._reply(
                h,
                500,
                {
                    "error": {
                        "message": "injected server failure",
                        "type": "server_error",
                        "code": 500,
                    }
                },
            )
        elif n <= self.rate_limit_first:
            self._reply(
                h,
                429,
                {
                    "error": {
                        "message": "injected rate limit",
                        "type": "rate_limit_error",
                        "code": 429,
                    }
                },
                headers={"Retry-After": "0"},
            )
        elif self.stall_s:
            time.sleep(self.stall_s)
            h.close_connection = True  # the client gave up long ago; drop the request
        else:
            self._forward(h, body)

    def _forward(self, h: BaseHTTPRequestHandler, body: bytes | None) -> None:
        headers = {
            k: v
            for k, v in h.headers.items()
            if k.lower() in ("content-type", "authorization", "accept")
        }
        req = urllib.request.Request(
            self.upstream + h.path, data=body, headers=headers, method=h.command
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as reply:
                status, data, ctype = (
                    reply.status,
                    reply.read(),
                    reply.headers.get("Content-Type", "application/json"),
                )
        except urllib.error.HTTPError as err:
            status, data, ctype = (
                err.code,
                err.read(),
                err.headers.get("Content-Type", "application/json"),
            )
        self._send(h, status, data, ctype)

    def _reply(self, h, status: int, payload: dict, headers: dict | None = None) -> None:
        self._send(h, status, json.dumps(payload).encode(), "application/json", headers)

    @staticmethod
    def _send(h, status: int, data: bytes, ctype: str, headers: dict | None = None) -> None:
        try:
            h.send_response(status)
            h.send_header("Content-Type", ctype)
            h.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass


def _spec(base_url: str, **overrides) -> OpenAIEngine:
    fields = dict(
        type="openai",
        base_url=base_url,
        model=SERVED_NAME,
        max_retries=2,
        backoff_s=0.05,
        request_timeout_s=60.0,
        max_concurrency=4,
    )
    fields.update(overrides)
    return OpenAIEngine(**fields)


@pytest.fixture(scope="module")
def engine(vllm_base_url):
    eng = load_openai_engine(_spec(vllm_base_url))
    yield eng
    eng.close()


def _upstream(base_url: str) -> str:
    return base_url[: -len("/v1")]


# ---------------------------------------------------------------- against the server


def test_load_reads_window_identity_and_tokenize(engine, vllm_base_url):
    assert engine.max_model_len == MAX_MODEL_LEN
    assert engine.model_id.startswith(f"{SERVED_NAME}@{vllm_base_url}#")  # + served path
    assert engine.token_counter == "server"
    assert engine.sampling_key() == {
        "engine": "openai",
        "temperature": 0.0,
        "top_p": 1.0,
        "structured_outputs": "vllm",
    }


def test_choice_and_schema_replies_follow_the_spec(engine):
    requests = [_ask(f"Is {i} even?", YES_NO, seed=i) for i in range(4)]
    requests += [_ask(f"Is claim {i} supported?", VERDICT, seed=i) for i in range(2)]
    before = engine.stats()
    out = run_sync(engine.complete(requests))
    assert [c.status for c in out] == ["ok"] * 6, [c.error for c in out]
    for c in out[:4]:
        assert c.text in ("yes", "no") and c.finish_reason == "stop"
    for c in out[4:]:
        assert c.finish_reason == "stop", c
        assert json.loads(c.text)["verdict"] in ("supported", "unsupported")
    assert all(c.prompt_tokens > 0 and c.completion_tokens > 0 for c in out)
    after = engine.stats()
    assert after["requests"] - before["requests"] == 6
    assert after["attempts"] - before["attempts"] == 6
    assert after["ok"] - before["ok"] == 6
    assert after["prompt_tokens"] > before["prompt_tokens"]


def test_response_format_mode_sends_json_schemas_and_unwraps_choices(vllm_base_url):
    with FaultInjector(_upstream(vllm_base_url)) as proxy:
        eng = load_openai_engine(_spec(proxy.base_url, structured_outputs="response_format"))
        try:
            out = run_sync(
                eng.complete([_ask("Is the sky blue?", YES_NO), _ask("Supported?", VERDICT)])
            )
        finally:
            eng.close()
    assert [c.status for c in out] == ["ok", "ok"], [c.error for c in out]
    assert [c.finish_reason for c in out] == ["stop", "stop"], out
    assert out[0].text in ("yes", "no")  # {"verdict": "yes"} unwrapped
    assert json.loads(out[1].text)["verdict"] in ("supported", "unsupported")
    choice_body, schema_body = sorted(proxy.chat_bodies, key=lambda b: b["max_tokens"])
    assert "structured_outputs" not in choice_body
    fmt = choice_body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    assert fmt["json_schema"]["schema"]["properties"]["verdict"]["enum"] == ["yes", "no"]
    assert choice_body["max_tokens"] == YES_NO.max_tokens + 16  # room for the wrapper
    assert schema_body["response_format"]["json_schema"]["schema"] == VERDICT_SCHEMA
    assert schema_body["max_tokens"] == VERDICT.max_tokens


def test_too_long_prompt_is_caught_before_sending(engine, vllm_base_url, tiny_judge_model):
    long_request = _ask("word " * (MAX_MODEL_LEN + 500))
    before = engine.stats()
    (c,) = run_sync(engine.complete([long_request]))
    assert c.status == "context_too_long"
    assert c.prompt_tokens > MAX_MODEL_LEN and c.text is None
    assert f"max_model_len={MAX_MODEL_LEN}" in c.error
    assert engine.stats()["attempts"] == before["attempts"]  # nothing was sent
    # The local tokenizer gives the same count as the server's /tokenize.
    local = load_openai_engine(_spec(vllm_base_url, tokenizer=str(tiny_judge_model)))
    try:
        assert local.token_counter == "tokenizer"
        (d,) = run_sync(local.complete([long_request]))
        (ok,) = run_sync(local.complete([_ask("short")]))
    finally:
        local.close()
    assert d.status == "context_too_long" and d.prompt_tokens == c.prompt_tokens
    assert local.stats()["attempts"] == 1 and ok.status == "ok"


#: Texts of every kind the byte bound must hold for: ASCII, CJK, emoji (with a skin tone
#: and a joiner), combining marks, Arabic, digits.
BOUND_TEXTS = [
    "The Eiffel Tower is 330 m tall.",
    "东京塔高333米。答案正确吗？",
    "👍🏽 👨‍👩‍👧 🎉" * 3,
    "e\u0301te\u0301 cafe\u0301 n\u0303",
    "برج إيفل في باريس",
    "0123456789 " * 10,
    "",
]


@pytest.mark.parametrize("text", BOUND_TEXTS, ids=range(len(BOUND_TEXTS)))
def test_byte_bound_is_never_below_the_servers_count(engine, text):
    messages = [{"role": "system", "content": "Judge."}, {"role": "user", "content": text}]
    counted = engine._loop.run(engine._server_count(messages))
    size = sum(len(m["content"].encode()) for m in messages)
    assert engine._chat_overhead > 0
    assert counted <= size + 2 * engine._chat_overhead + BYTE_BOUND_MARGIN
    # the gate says "fits" exactly when the bound leaves room for max_tokens
    room = MAX_MODEL_LEN - (size + 2 * engine._chat_overhead + BYTE_BOUND_MARGIN)
    assert engine._fits_by_bytes(messages, room) and not engine._fits_by_bytes(messages, room + 1)


def test_tokenize_is_asked_only_when_a_prompt_might_not_fit(vllm_base_url):
    with FaultInjector(_upstream(vllm_base_url)) as proxy:
        eng = load_openai_engine(_spec(proxy.base_url))
        try:
            probes = proxy.tokenize_calls
            assert probes == 2 and eng.token_counter == "server"
            (short,) = run_sync(eng.complete([_ask("Is the sky blue?")]))
            assert proxy.tokenize_calls == probes  # its bytes show it fits: not counted
            assert short.status == "ok" and short.prompt_tokens > 0  # from the reply's usage
            # multi-byte text whose bytes, not its tokens, come near the window is counted
            text = "东京塔" * (MAX_MODEL_LEN // 9 + 1)
            (near,) = run_sync(eng.complete([_ask(text)]))
            assert proxy.tokenize_calls == probes + 1
            assert near.status in ("ok", "context_too_long")
            stats = eng.stats()
        finally:
            eng.close()
    assert stats["length_checks_by_bytes"] == 1


def test_prompt_plus_max_tokens_over_window_is_too_long(engine):
    prompt = _ask("hello there")
    (ok,) = run_sync(engine.complete([prompt]))
    window_left = MAX_MODEL_LEN - ok.prompt_tokens
    (c,) = run_sync(
        engine.complete(
            [EngineRequest(prompt.messages, OutputSpec.of_choice(["yes", "no"], window_left + 1))]
        )
    )
    assert c.status == "context_too_long" and c.prompt_tokens == ok.prompt_tokens


def test_without_tokenize_the_servers_refusal_maps_to_context_too_long(vllm_base_url):
    with FaultInjector(_upstream(vllm_base_url), hide_tokenize=True) as proxy:
        eng = load_openai_engine(_spec(proxy.base_url))
        try:
            assert eng.token_counter == "none"
            out = run_sync(eng.complete([_ask("word " * (MAX_MODEL_LEN + 500)), _ask("short")]))
            stats = eng.stats()
        finally:
            eng.close()
    assert out[0].status == "context_too_long"
    assert "maximum context length" in out[0].error
    assert out[1].status == "ok"
    assert stats["attempts"] == 2 and stats["retries"] == 0  # a 400 is not retried


def test_concurrency_is_bounded_and_works_inside_an_event_loop(vllm_base_url):
    with FaultInjector(_upstream(vllm_base_url)) as proxy:
        eng = load_openai_engine(_spec(proxy.base_url, max_concurrency=2))
        try:

            async def caller():  # awaited from a running loop other than the engine's own
                return await eng.complete([_ask(f"q{i}", seed=i) for i in range(6)])

            out = asyncio.run(caller())
        finally:
            eng.close()
    assert [c.status for c in out] == ["ok"] * 6
    assert proxy.chat_calls == 6
    assert 1 <= proxy.peak_in_flight <= 2
    body = proxy.chat_bodies[0]
    assert body["structured_outputs"] == {"choice": ["yes", "no"]}
    assert body["max_tokens"] == YES_NO.max_tokens and body["temperature"] == 0.0
    assert sorted(b["seed"] for b in proxy.chat_bodies) == list(range(6))


@pytest.mark.slow
def test_engine_works_inside_a_ray_actor(ray_local, vllm_base_url):
    ray = ray_local

    @ray.remote(num_cpus=0)
    class Judge:
        def __init__(self, base_url: str):
            self.engine = load_openai_engine(_spec(base_url))

        def run(self, texts: list[str]):
            out = run_sync(self.engine.complete([_ask(t) for t in texts]))
            return [(c.status, c.text) for c in out], self.engine.stats()

    actor = Judge.remote(vllm_base_url)
    try:
        replies, stats = ray.get(actor.run.remote(["a", "b", "c"]), timeout=120)
    finally:
        ray.kill(actor)
    assert [status for status, _ in replies] == ["ok"] * 3
    assert all(text in ("yes", "no") for _, text in replies)
    assert stats["requests"] == 3 and stats["attempts"] == 3


# ------------------------------------------------------------- injected failures


def test_rate_limited_requests_are_retried_honoring_retry_after(vllm_base_url):
    with FaultInjector(_upstream(vllm_base_url), rate_limit_first=2) as proxy:
        # A long backoff that Retry-After: 0 overrides: the test would take 10+ s otherwise.
        eng = load_openai_engine(
            _spec(proxy.base_url, max_retries=3, backoff_s=5.0, max_concurrency=1)
        )
        try:
            start = time.monotonic()
            (c,) = run_sync(eng.complete([_ask("Is water wet?")]))
            elapsed = time.monotonic() - start
            stats = eng.stats()
        finally:
            eng.close()
    assert c.status == "ok" and c.text in ("yes", "no")
    assert proxy.chat_calls == 3
    assert stats["attempts"] == 3 and stats["retries"] == 2
    assert elapsed < 7.0  # backoff_s alone would wait at least 2.5 + 5 s


def test_stalled_request_times_out(vllm_base_url):
    with FaultInjector(_upstream(vllm_base_url), stall_s=3.0) as proxy:
        eng = load_openai_engine(
            _spec(proxy.base_url, request_timeout_s=0.5, max_retries=1, backoff_s=0.0)
        )
        try:
            start = time.monotonic()
            (c,) = run_sync(eng.complete([_ask("Anyone there?")]))
            elapsed = time.monotonic() - start
            stats = eng.stats()
        finally:
            eng.close()
    assert c.status == "timeout" and c.text is None
    assert "request_timeout_s=0.5" in c.error and "2 attempts" in c.error
    assert stats["timeouts"] == 1 and stats["attempts"] == 2
    assert elapsed < 2.5


def test_batch_timeout_marks_unfinished_requests(vllm_base_url):
    with FaultInjector(_upstream(vllm_base_url), stall_s=3.0) as proxy:
        eng = load_openai_engine(
            _spec(proxy.base_url, request_timeout_s=10.0, batch_timeout_s=0.5, max_retries=0)
        )
        try:
            start = time.monotonic()
            out = run_sync(eng.complete([_ask("a"), _ask("b")]))
            elapsed = time.monotonic() - start
        finally:
            eng.close()
    assert [c.status for c in out] == ["timeout", "timeout"]
    assert "batch_timeout_s=0.5" in out[0].error
    assert elapsed < 2.0


def test_server_errors_exhaust_retries_into_judge_error(vllm_base_url):
    with FaultInjector(_upstream(vllm_base_url), always_500=True) as proxy:
        eng = load_openai_engine(_spec(proxy.base_url, max_retries=2, backoff_s=0.01))
        try:
            (c,) = run_sync(eng.complete([_ask("Will this work?")]))
            stats = eng.stats()
        finally:
            eng.close()
    assert c.status == "judge_error"
    assert "HTTP 500" in c.error and "injected server failure" in c.error
    assert "3 attempts" in c.error
    assert proxy.chat_calls == 3
    assert stats["attempts"] == 3 and stats["retries"] == 2 and stats["judge_errors"] == 1


def _reply_body(**fields) -> tuple[str, bytes]:
    return "application/json", json.dumps(fields).encode()


_MESSAGE = {"role": "assistant", "content": "yes"}


@pytest.mark.parametrize(
    "reply, status, text, counts, error",
    [
        # a well-formed reply, with the cached-token count vLLM adds
        (
            _reply_body(
                choices=[{"message": _MESSAGE, "finish_reason": "stop"}],
                usage={
                    "prompt_tokens": 12,
                    "completion_tokens": 1,
                    "prompt_tokens_details": {"cached_tokens": 8},
                },
            ),
            "ok",
            "yes",
            (12, 1, 8),
            None,
        ),
        # counts of the wrong type or sign read as absent; the reply itself is used
        (
            _reply_body(
                choices=[{"message": _MESSAGE, "finish_reason": "length"}],
                usage={
                    "prompt_tokens": "12",
                    "completion_tokens": -1,
                    "prompt_tokens_details": {"cached_tokens": True},
                },
            ),
            "ok",
            "yes",
            (0, 0, None),
            None,
        ),
        (
            _reply_body(choices=[{"message": _MESSAGE}], usage="none"),
            "ok",
            "yes",
            (0, 0, None),
            None,
        ),
        (_reply_body(choices=[]), "judge_error", None, (0, 0, None), "no choices"),
        (_reply_body(choices=["yes"]), "judge_error", None, (0, 0, None), "no content"),
        (
            _reply_body(
                choices=[
                    {
                        "message": {"content": None, "refusal": "I cannot judge this"},
                        "finish_reason": "stop",
                    }
                ]
            ),
            "judge_error",
            None,
            (0, 0, None),
            "refusal: 'I cannot judge this'",
        ),
        (
            _reply_body(choices=[{"message": {"content": 7}}]),
            "judge_error",
            None,
            (0, 0, None),
            "no content",
        ),
        (("application/json", b"[1, 2]"), "judge_error", None, (0, 0, None), "not a JSON object"),
        (
            ("text/plain", "ок ✓ 好".encode()),
            "judge_error",
            None,
            (0, 0, None),
            "not a JSON object",
        ),
    ],
    ids=[
        "well-formed",
        "bad-counts",
        "usage-not-object",
        "no-choices",
        "choice-not-object",
        "refusal",
        "content-not-text",
        "json-array",
        "plain-text",
    ],
)
def test_malformed_replies_become_judge_errors(vllm_base_url, reply, status, text, counts, error):
    with FaultInjector(_upstream(vllm_base_url), chat_reply=reply) as proxy:
        eng = load_openai_engine(_spec(proxy.base_url, max_retries=2))
        try:
            (c,) = run_sync(eng.complete([_ask("Is the sky blue?")]))
        finally:
            eng.close()
    assert c.status == status
    assert c.text == text
    assert (c.prompt_tokens, c.completion_tokens, c.cached_prompt_tokens) == counts
    if error is None:
        assert c.error is None
    else:
        assert error in c.error
    assert proxy.chat_calls == 1  # a reply of the wrong shape is not retried


def test_client_errors_are_not_retried(engine):
    bad = EngineRequest(
        messages=(Message("user", "hi"),),
        output=OutputSpec(json_schema="{\"type\": \"no-such-type\"}"),
    )
    before = engine.stats()
    (c,) = run_sync(engine.complete([bad]))
    assert c.status == "judge_error" and "HTTP 400" in c.error
    assert engine.stats()["attempts"] - before["attempts"] == 1


# --------------------------------------------------------------------- loading


def test_unreachable_server_fails_fast():
    url = f"http://127.0.0.1:{free_port()}/v1"
    start = time.monotonic()
    with pytest.raises(EngineError, match="cannot reach") as err:
        load_openai_engine(_spec(url))
    assert time.monotonic() - start < 10
    assert url in str(err.value)


def test_unserved_model_is_refused(vllm_base_url):
    with pytest.raises(EngineError, match="does not serve the model 'other'.*'tiny'"):
        load_openai_engine(_spec(vllm_base_url, model="other"))


def test_missing_api_key_variable_is_named(monkeypatch):
    monkeypatch.delenv("RAGBATCH_TEST_NO_SUCH_KEY", raising=False)
    with pytest.raises(EngineError, match="RAGBATCH_TEST_NO_SUCH_KEY"):
        load_openai_engine(_spec("http://127.0.0.1:9/v1", api_key_env="RAGBATCH_TEST_NO_SUCH_KEY"))


@pytest.mark.parametrize("logprobs", [True, False])
def test_logprobs_switch_decides_what_is_asked_and_the_cache_identity(vllm_base_url, logprobs):
    # A server that rejects the logprobs field is served with `logprobs: false`: no request
    # asks for them, the reply carries none, and the sampling key (part of every judgment
    # cache key) says so, so such replies never serve an engine that asks for logprobs.
    verdict = OutputSpec(choice=("yes", "no"), logprobs=4)
    with FaultInjector(_upstream(vllm_base_url)) as proxy:
        eng = load_openai_engine(_spec(proxy.base_url, logprobs=logprobs))
        try:
            (c,) = run_sync(eng.complete([_ask("Is the sky blue?", output=verdict)]))
            key = eng.sampling_key()
        finally:
            eng.close()
    (body,) = proxy.chat_bodies
    assert c.status == "ok"
    if logprobs:
        assert body["logprobs"] is True and body["top_logprobs"] == 4
        assert c.logprobs and all(t.top for t in c.logprobs)
        assert "logprobs" not in key
    else:
        assert "logprobs" not in body and "top_logprobs" not in body
        assert c.logprobs is None
        assert key["logprobs"] is False
