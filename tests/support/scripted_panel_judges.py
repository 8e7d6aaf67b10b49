"""Scripted judges for judge-panel tests: one OpenAI-compatible HTTP server on loopback
that serves three scripted judges, told apart by the request's ``model``. No model runs:
each judge's verdict is a rule written here.

- ``scripted-truth-a``, ``scripted-truth-b``: reply the row's true label, read from the
  marker ``[[label=<0|1> item=<NN>]]`` in the answer text, with a reason naming the item;
  ``scripted-truth-b`` replies unparseable text to a row whose answer holds ``[[garble]]``
  (its cell becomes ``parse_failure``);
- ``scripted-yes``: always ``{"reason":"scripted always yes","verdict":true}``.

Replies have the shape of hate_speech's structured output
(``{"reason": str, "verdict": bool}``). :attr:`ScriptedPanelJudges.calls` counts the chat
requests answered per model.
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TRUTH_A = "scripted-truth-a"
TRUTH_B = "scripted-truth-b"
ALWAYS_YES = "scripted-yes"
MODELS = (TRUTH_A, TRUTH_B, ALWAYS_YES)
_MARKER = re.compile(r"\[\[label=([01]) item=(\d+)\]\]")


def scripted_reply(model: str, prompt: str) -> str:
    """The reply of scripted judge ``model`` to a chat whose messages hold ``prompt``."""
    if model == ALWAYS_YES:
        return json.dumps({"reason": "scripted always yes", "verdict": True})
    if model == TRUTH_B and "[[garble]]" in prompt:
        return "scripted judge b garbles this row"
    found = _MARKER.search(prompt)
    if found is None:
        return "no marker"
    label, item = found.groups()
    reason = f"scripted truth: item {item} is labelled {label}"
    return json.dumps({"reason": reason, "verdict": label == "1"})


class _Server(ThreadingHTTPServer):
    request_queue_size = 128


class ScriptedPanelJudges:
    """Context manager: the loopback server of the three scripted judges.

    Attributes
    ----------
    base_url : str
        ``http://127.0.0.1:<port>/v1``.
    calls : collections.Counter
        Chat requests answered so far, per model name.
    """

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path.rstrip("/").endswith("/models"):
                    data = [
                        {"id": m, "object": "model", "max_model_len": 1_000_000} for m in MODELS
                    ]
                    outer._send(self, 200, {"object": "list", "data": data})
                else:
                    outer._send(self, 404, {"detail": "Not Found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                if not self.path.endswith("/chat/completions"):
                    outer._send(self, 404, {"detail": "Not Found"})
                    return
                model = body.get("model")
                prompt = "\n".join(str(m.get("content")) for m in body.get("messages", []))
                with outer._lock:
                    outer.calls[model] += 1
                choice = {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": scripted_reply(model, prompt)},
                }
                usage = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
                payload = {"id": "scripted", "object": "chat.completion", "model": model}
                outer._send(self, 200, {**payload, "choices": [choice], "usage": usage})

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def snapshot(self) -> dict[str, int]:
        """Calls per model so far (every model listed, 0 if none)."""
        with self._lock:
            return {m: self.calls[m] for m in MODELS}

    def __enter__(self) -> "ScriptedPanelJudges":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
