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
markers (:data:`ragbatch.judge.pairwise_preference.USER`). The server is
:class:`support.scripted_judge_server.ScriptedJudgeServer`.
"""

from __future__ import annotations

import json
import re

from support.scripted_judge_server import ScriptedJudgeServer

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


class ScriptedPairwiseJudge(ScriptedJudgeServer):
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
        self.system_messages: list[str] = []
        super().__init__(self._judge, SERVED_NAME)

    def _judge(self, body: dict) -> str:
        messages = body["messages"]
        user = [m["content"] for m in messages if m["role"] == "user"][-1]
        verdict = verdict_of(self.rule, *answers_of(user))
        with self._lock:
            self.system_messages += [m["content"] for m in messages if m["role"] == "system"]
        if verdict == "prose":
            return "Answer A reads better to me."
        return json.dumps({"reason": f"scripted rule {self.rule}", "verdict": verdict})
