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
from dataclasses import dataclass
from typing import Callable

from support.scripted_judge_server import ScriptedJudgeServer

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


class ScriptedAlignedJudge(ScriptedJudgeServer):
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
        super().__init__(self._judge, SERVED_NAME)

    def _judge(self, body: dict) -> str:
        messages = body["messages"]
        user = [m["content"] for m in messages if m["role"] == "user"][-1]
        text = "\n\n".join(m["content"] for m in messages)
        answer = _ROW_ANSWER.search(user).group(1)
        with_examples = "## Examples" in text
        with self._lock:
            self.judged.append(Judged(answer, with_examples, tuple(_EXAMPLE_ANSWER.findall(text))))
        return self.reply(scripted_verdict(answer, with_examples))
