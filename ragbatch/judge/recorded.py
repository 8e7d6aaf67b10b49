"""Replaying recorded judge replies, for worked examples and scoring-logic tests.

:class:`RecordedReplies` is a stand-in engine: it answers requests with replies written
down beforehand, in order, so a metric's prompts, parsing and scoring can be checked
against exact expected values. It is not a judge; runs use the engines under
:mod:`ragbatch.engines`.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import polars as pl

from ragbatch.judge.batch import judge_frame
from ragbatch.judge.metric import JudgeExample, JudgeMetric
from ragbatch.judge.protocol import (
    Completion,
    EngineRequest,
    JudgeEngine,
    TokenLogprob,
    run_sync,
)
from ragbatch.judge.run import Embedder, JudgeRunner
from ragbatch.core.status import JUDGE_ERROR, OK


class RecordedReplies(JudgeEngine):
    """Answers each request with the next recorded reply (``finish_reason="stop"``).

    Parameters
    ----------
    replies : sequence of str, tuple or dict
        Replies in the order requests will arrive. A reply given as
        ``("length", text)`` is returned as cut at ``max_tokens``; one given as a dict
        ``{"text": ..., "logprobs": [[token, logprob, [[alternative, logprob], ...]],
        ...]}`` (optionally with ``"finish_reason"``) comes with those token logprobs
        (:meth:`~ragbatch.judge.protocol.TokenLogprob.from_list`), returned only when
        the request asks for logprobs, as an engine does.
    max_model_len : int
        Reported window; a request whose prompt (counted as characters / 4) exceeds it
        gets ``context_too_long``.
    """

    def __init__(self, replies: Sequence[Any], max_model_len: int = 1_000_000):
        self.model_id = "recorded-replies"
        self.max_model_len = max_model_len
        self._replies = list(replies)
        self.requests: list[EngineRequest] = []

    async def complete(self, requests: Sequence[EngineRequest]) -> list[Completion]:
        """The next recorded reply per request, in order (see the class docstring)."""
        out = []
        for request in requests:
            self.requests.append(request)
            tokens = sum(len(m.content) for m in request.messages) // 4
            if tokens + request.output.max_tokens > self.max_model_len:
                out.append(
                    Completion(
                        "context_too_long",
                        prompt_tokens=tokens,
                        error=f"prompt of {tokens} tokens exceeds {self.max_model_len}",
                    )
                )
                continue
            if not self._replies:
                out.append(Completion(JUDGE_ERROR, error="no recorded reply left"))
                continue
            finish, text, logprobs = _unpack(self._replies.pop(0))
            out.append(
                Completion(
                    OK,
                    text=text,
                    finish_reason=finish,
                    prompt_tokens=tokens,
                    completion_tokens=max(1, len(text) // 4),
                    logprobs=logprobs if request.output.logprobs else None,
                )
            )
        return out

    def sampling_key(self) -> dict[str, Any]:
        return {"engine": "recorded"}

    @property
    def unused(self) -> int:
        """Replies not consumed."""
        return len(self._replies)


def _unpack(reply: Any) -> tuple[str, str, tuple[TokenLogprob, ...] | None]:
    """``(finish_reason, text, logprobs)`` of a recorded reply."""
    if isinstance(reply, dict):
        logprobs = reply.get("logprobs")
        return (
            reply.get("finish_reason", "stop"),
            reply["text"],
            None if logprobs is None else tuple(TokenLogprob.from_list(t) for t in logprobs),
        )
    if isinstance(reply, tuple):
        return reply[0], reply[1], None
    return "stop", reply, None


def run_example(
    metric_cls: type[JudgeMetric], example: JudgeExample, parse_retries: int = 1
) -> tuple[dict[str, Any], dict[str, Any], RecordedReplies]:
    """Run one worked example; return (cell dict, judge record dict, the engine)."""
    metric = metric_cls.from_params(example.params)
    assert isinstance(metric, JudgeMetric)
    engine = RecordedReplies(example.replies)
    vectors = list(example.embeddings)

    def embed(texts: list[str]) -> np.ndarray:
        return np.asarray(vectors.pop(0), dtype=np.float32)

    embedders: dict[str, Embedder] = {name: embed for name in metric.embedders()}
    runner = JudgeRunner(engine, [metric], embedders=embedders, parse_retries=parse_retries)
    row = {
        c: example.inputs.get(c) for c in ("row_id", "question", "contexts", "answer", "reference")
    }
    row["row_id"] = row["row_id"] or "example:0"
    frame = pl.DataFrame(
        [row],
        schema={
            "row_id": pl.String,
            "question": pl.String,
            "contexts": pl.List(pl.String),
            "answer": pl.String,
            "reference": pl.String,
        },
    )
    cells, records = run_sync(judge_frame(runner, frame))[metric.id]
    return cells[0], records[0], engine
