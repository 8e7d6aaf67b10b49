"""A scripted judge: an OpenAI-compatible HTTP server on loopback whose reply to each chat
request is computed by a test's own function of the request's messages. Tests use it for
exact statistical checks through the real ``openai`` engine, where a real model's replies
could not be worked out by hand. It serves ``GET /v1/models`` (one model card) and
``POST /v1/chat/completions``; anything else is a 404.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

#: A script: the request's body (``{"model": ..., "messages": [{"role": ...,
#: "content": ...}, ...], ...}``) to the reply's text.
Script = Callable[[dict[str, Any]], str]


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # a burst of requests sent at once is not dropped


def completion(model: str, reply: str, usage: tuple[int, int] = (50, 12)) -> dict[str, Any]:
    """The body of a chat completion holding ``reply``; ``usage`` gives its prompt and
    completion token counts."""
    return {
        "id": "scripted",
        "object": "chat.completion",
        "model": model,
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": reply},
            }
        ],
        "usage": {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": sum(usage),
        },
    }


class ScriptedJudgeServer:
    """Context manager: a loopback server answering each chat request with
    ``script(body)``.

    Parameters
    ----------
    script : callable
        Request body to reply text; called on the server's threads (one per request),
        so a script that keeps state must lock it.
    served_names : str or tuple of str
        The model ids ``/v1/models`` lists (a script tells them apart by the body's
        ``model``).
    usage : (int, int)
        Prompt and completion tokens every reply reports.

    Attributes
    ----------
    base_url : str
        ``http://127.0.0.1:<port>/v1``.
    chat_calls : int
        Chat requests answered so far.
    requests : list of dict
        Every chat request's body, in arrival order.
    """

    def __init__(
        self,
        script: Script,
        served_names: str | tuple[str, ...] = "scripted",
        usage: tuple[int, int] = (50, 12),
    ) -> None:
        self.script = script
        self.served_names = (served_names,) if isinstance(served_names, str) else served_names
        self.usage = usage
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def chat_calls(self) -> int:
        with self._lock:
            return len(self.requests)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode("utf-8")
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    cards = [
                        {"id": name, "object": "model", "max_model_len": 1_000_000}
                        for name in outer.served_names
                    ]
                    self._send(200, {"object": "list", "data": cards})
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                if not self.path.endswith("/chat/completions"):
                    self._send(404, {"detail": "Not Found"})
                    return
                reply = outer.script(body)
                with outer._lock:
                    outer.requests.append(body)
                model = body.get("model") or outer.served_names[0]
                self._send(200, completion(model, reply, outer.usage))

        return Handler

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> "ScriptedJudgeServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
