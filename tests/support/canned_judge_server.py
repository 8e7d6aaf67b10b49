"""A stand-in judge: an OpenAI-compatible HTTP server on loopback that answers every chat
request with one fixed reply.

It plays the degenerate judge of issue 25 (every hate_speech reply
``{"reason":"true","verdict":true}``) in end-to-end runs through the real ``openai``
engine, Ray actors and the CLI. A real small model behaves that way too, but none is
available to these tests yet (tests/test_judge_health_model.py runs the real one when
its fixture exists). It serves ``GET /v1/models`` and ``POST /v1/chat/completions``; any
other path (``/tokenize``) gets 404, which the engine reads as "the server checks prompt
lengths itself".
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SERVED_NAME = "canned"
MAX_MODEL_LEN = 1_000_000


class CannedJudgeServer:
    """Context manager: a loopback server answering every chat with ``reply``.

    Attributes
    ----------
    base_url : str
        ``http://127.0.0.1:<port>/v1``.
    chat_calls : int
        Chat requests answered so far.
    """

    def __init__(self, reply: str):
        self.reply = reply
        self.chat_calls = 0
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

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
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

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
