"""Scripted pairwise judges: an OpenAI-compatible HTTP server on loopback whose reply to
each pairwise preference request follows a fixed rule, for exact checks of
``ragbatch pairwise``'s statistics through the real ``openai`` engine.

Rules (``rule``):

- ``"first"``: always prefers answer A, the answer shown first: a judge whose verdicts
  follow position, not content (position consistency 0, position share 1).
- ``"longer"``: prefers the longer answer (in Unicode code points), a tie when both are
  as long: a judge that reads content only (position consistency 1).
- ``"prose"``: replies in prose, never in the JSON asked for: every reply fails to parse.

It reads the two answers from the user message's ``[Answer A]`` / ``[Answer B]``
markers (:data:`ragbatch.judge.pairwise_preference.USER`). It serves ``GET /v1/models``
and ``POST /v1/chat/completions``; other paths get 404.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SERVED_NAME = "scripted-pairwise"
_ANSWER = r"\[Answer {0}\]\n(.*?)\n\[End of answer {0}\]"


def answers_of(user: str) -> tuple[str, str]:
    """The answers shown as A and B in a pairwise preference user message."""
    a = re.search(_ANSWER.format("A"), user, re.S)
    b = re.search(_ANSWER.format("B"), user, re.S)
    if a is None or b is None:
        raise ValueError("not a pairwise preference request")
    return a.group(1), b.group(1)


def verdict_of(rule: str, first: str, second: str) -> str:
    """The scripted verdict (``A``, ``B`` or ``tie``) of ``rule`` for two answers."""
    if rule == "first":
        return "A"
    if rule == "prose":
        return "prose"
    if rule == "longer":
        if len(first) == len(second):
            return "tie"
        return "A" if len(first) > len(second) else "B"
    raise ValueError(f"unknown rule {rule!r}")


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # a burst of requests sent at once is not dropped


class ScriptedPairwiseJudge:
    """Context manager: a loopback server judging pairs by ``rule``.

    Attributes
    ----------
    base_url : str
        ``http://127.0.0.1:<port>/v1``.
    chat_calls : int
        Chat requests answered so far.
    system_messages : list of str
        The system message of each chat request, in order.
    """

    def __init__(self, rule: str):
        verdict_of(rule, "", "")  # the rule is known
        self.rule = rule
        self.chat_calls = 0
        self.system_messages: list[str] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode("utf-8")
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path.rstrip("/").endswith("/models"):
                    card = {"id": SERVED_NAME, "object": "model", "max_model_len": 1_000_000}
                    self._send(200, {"object": "list", "data": [card]})
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                if not self.path.endswith("/chat/completions"):
                    self._send(404, {"detail": "Not Found"})
                    return
                user = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
                first, second = answers_of(user)
                verdict = verdict_of(outer.rule, first, second)
                reply = json.dumps({"reason": f"scripted rule {outer.rule}", "verdict": verdict})
                if verdict == "prose":
                    reply = "Answer A reads better to me."
                with outer._lock:
                    outer.chat_calls += 1
                    outer.system_messages += [
                        m["content"] for m in body["messages"] if m["role"] == "system"
                    ]
                self._send(
                    200,
                    {
                        "id": "scripted",
                        "object": "chat.completion",
                        "model": SERVED_NAME,
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "stop",
                                "message": {"role": "assistant", "content": reply},
                            }
                        ],
                        "usage": {"prompt_tokens": 50, "completion_tokens": 12, "total_tokens": 62},
                    },
                )

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> "ScriptedPairwiseJudge":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
