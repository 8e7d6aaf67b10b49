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
from collections import Counter

from support.scripted_judge_server import ScriptedJudgeServer

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


class ScriptedPanelJudges(ScriptedJudgeServer):
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
        super().__init__(self._judge, MODELS, usage=(100, 10))

    def _judge(self, body: dict) -> str:
        model = body.get("model")
        prompt = "\n".join(str(m.get("content")) for m in body.get("messages", []))
        with self._lock:
            self.calls[model] += 1
        return scripted_reply(model, prompt)

    def snapshot(self) -> dict[str, int]:
        """Calls per model so far (every model listed, 0 if none)."""
        with self._lock:
            return {m: self.calls[m] for m in MODELS}
