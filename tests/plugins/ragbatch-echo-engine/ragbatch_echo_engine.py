"""``echo``: a judge engine that answers every request by a fixed rule, without a model.

A reply is true when the request's text holds :data:`MARKER` and false otherwise: a
structured output of choices gets the first choice (true) or the last (false), a JSON
schema ``{"reason": ..., "verdict": true or false}``. The whole engine is this module:
its spec model, its adapter and its registration (docs/extending.md, "An engine").
"""

from __future__ import annotations

import json
from typing import Any, Literal, Sequence

from ragbatch.config.engine_spec import JudgeSettings
from ragbatch.core.engine_registry import EngineType, register_engine
from ragbatch.core.pool_sizing import NETWORK_POOL
from ragbatch.judge.protocol import Completion, EngineRequest, JudgeEngine

#: The text whose presence in a request makes its verdict true.
MARKER = "ECHO-TRUE"


class EchoEngineSpec(JudgeSettings):
    """An ``engines`` entry of type ``echo``; ``model`` is a label, ``marker`` the text
    that makes a verdict true."""

    type: Literal["echo"]
    model: str = "echo"
    marker: str = MARKER


class EchoJudge(JudgeEngine):
    """The adapter: one reply per request, in order, with status ``ok``."""

    def __init__(self, spec: EchoEngineSpec) -> None:
        self.spec = spec
        self.model_id = f"echo:{spec.model}"
        self.max_model_len = 1_000_000

    async def complete(self, requests: Sequence[EngineRequest]) -> list[Completion]:
        return [self._reply(request) for request in requests]

    def _reply(self, request: EngineRequest) -> Completion:
        text = "\n".join(m.content for m in request.messages)
        verdict = self.spec.marker in text
        if request.output.choice is not None:
            reply = request.output.choice[0 if verdict else -1]
        else:
            reason = f"{self.spec.marker} {'found' if verdict else 'not found'}"
            reply = json.dumps({"reason": reason, "verdict": verdict})
        return Completion("ok", reply, "stop", prompt_tokens=len(text) // 4)

    def sampling_key(self) -> dict[str, Any]:
        # every setting that changes a reply, and the version of this rule: the judgment
        # cache keys on them (bump the version when the rule changes)
        return {"engine": "echo", "version": 1, "marker": self.spec.marker}


register_engine(
    EngineType(
        "echo",
        EchoEngineSpec,
        "judge",
        EchoJudge,
        "pip install ragbatch-echo-engine",
        packages=("ragbatch-echo-engine",),
        local_model=False,
        pool_rule=NETWORK_POOL,
    )
)
