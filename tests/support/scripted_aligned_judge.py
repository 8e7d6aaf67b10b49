"""A scripted judge for the aligned-judge tests: an OpenAI-compatible HTTP server on
loopback whose verdict depends on whether the prompt shows aligned examples, for exact
checks of ``ragbatch calibrate --align`` through the real ``openai`` engine.

The judged rows' answers carry markers that script the verdicts (the judge reads the
row's own ``## Answer`` section, never the examples'):

- without ``## Examples`` in the prompt the judge says ``true`` to every row;
- with them it says ``true`` exactly when the answer holds ``[hateful]``, except that
  ``[subtle]`` turns a ``true`` into ``false`` and ``[bait]`` a ``false`` into ``true``
  (one mistake each way, so that the aligned judge is good but not perfect).

The reply is by default that of a one-verdict answer metric (``hate_speech``):
``{"reason": ..., "verdict": true | false}``; ``reply`` gives another format (a rubric's
bare choice). Every request is logged: the answer judged, whether examples were shown,
and the answers of the examples shown.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SERVED_NAME = "scripted-aligned"
#: The judged row's answer in a ``row_first`` user message: the shared block's answer.
_ROW_ANSWER = re.compile(r"^## Answer\n(.*?)\n\n## ", re.S | re.M)
#: The answer of each example, as :meth:`AlignedExamples.render` shows it.
_EXAMPLE_ANSWER = re.compile(r"^#### Answer\n(.*?)\n\n###", re.S | re.M)


def verdict_json(verdict: bool) -> str:
    """A one-verdict answer metric's reply: ``{"reason": ..., "verdict": <verdict>}``."""
    return json.dumps({"reason": "scripted", "verdict": verdict})


def scripted_verdict(answer: str, with_examples: bool) -> bool:
    """The scripted judge's verdict for a row's answer (see the module's notes)."""
    if not with_examples:
        return True
    verdict = "[hateful]" in answer
    if "[subtle]" in answer:
        verdict = False
    if "[bait]" in answer:
        verdict = True
    return verdict


@dataclass(frozen=True)
class Judged:
    """One logged request: the judged answer, whether examples were shown, and the
    answers of the examples shown (in prompt order)."""

    answer: str
    with_examples: bool
    example_answers: tuple[str, ...]


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # a burst of requests sent at once is not dropped


class ScriptedAlignedJudge:
    """Context manager: a loopback server judging by :func:`scripted_verdict`.

    Parameters
    ----------
    reply : callable, default verdict_json
        The reply text for a verdict.

    Attributes
    ----------
    base_url : str
        ``http://127.0.0.1:<port>/v1``.
    judged : list of Judged
        Every chat request, in arrival order.
    """

    def __init__(self, reply: Callable[[bool], str] = verdict_json) -> None:
        self.reply = reply
        self.judged: list[Judged] = []
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
                self._send(200, outer._reply(body["messages"]))

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _reply(self, messages: list[dict]) -> dict:
        user = [m["content"] for m in messages if m["role"] == "user"][-1]
        text = "\n\n".join(m["content"] for m in messages)
        answer = _ROW_ANSWER.search(user).group(1)
        with_examples = "## Examples" in text
        verdict = scripted_verdict(answer, with_examples)
        with self._lock:
            self.judged.append(Judged(answer, with_examples, tuple(_EXAMPLE_ANSWER.findall(text))))
        reply = self.reply(verdict)
        return {
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
        }

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> "ScriptedAlignedJudge":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
