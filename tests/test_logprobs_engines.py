"""The ``vllm`` and ``openai`` engines give the same verdict probabilities for the same
prompt: one offline vLLM engine and one ``vllm serve`` of the same model (the tiny
random-weights model of ``tests/support/judge_models.py``; agreement must hold for any model).

Both run greedy (temperature 0), eager, in the dtype vLLM picks for the model, with the same compact-JSON grammar
backend; each request asks for token logprobs because its reply holds verdicts. The
offline engine runs in processes of its own, as in ``test_engine_vllm.py`` (see there).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("openai", reason="the openai engine needs the openai package")
pytest.importorskip("vllm", reason="these tests run vLLM (ragbatch[judge-cpu])")

from ragbatch.engines.openai import OpenAIEngine  # noqa: E402
from ragbatch.engines.vllm import VllmEngine  # noqa: E402
from ragbatch.engines.openai import load_openai_engine  # noqa: E402
from ragbatch.engines.vllm import load_vllm_engine  # noqa: E402
from ragbatch.judge.confidence import verdict_probabilities  # noqa: E402
from ragbatch.judge.protocol import (
    run_sync,
    EngineRequest,
    Message,
    OutputSpec,  # noqa: E402
    VERDICT_TOP_LOGPROBS,
)
from ragbatch.judge.answer_verdict import SLOTS as BOOLEAN_SLOTS  # noqa: E402
from ragbatch.judge.verdicts import BARE_SLOTS  # noqa: E402
from ragbatch.judge.parse import verdicts_schema  # noqa: E402
from ragbatch.metrics.answer_similarity import RATINGS, SLOTS as RATING_SLOTS  # noqa: E402

from support.vllm_server import SERVED_NAME  # noqa: E402

#: A true/false verdict without a reason: a random model fills a reason up to its length
#: limit, which would leave no room for the verdict within a small budget.
BOOLEAN_SCHEMA = {
    "type": "object",
    "properties": {"verdict": {"type": "boolean"}},
    "required": ["verdict"],
    "additionalProperties": False,
}
PROMPT = (
    Message("system", "You are a careful judge."),
    Message(
        "user",
        "Statements: 1. Paris is in France. 2. The moon is cheese. "
        "3. Water is wet. Give a 0/1 verdict for each.",
    ),
)
CASES = [
    (OutputSpec.of_schema(verdicts_schema(3, reasons=False), max_tokens=32), BARE_SLOTS),
    (OutputSpec.of_schema(BOOLEAN_SCHEMA, max_tokens=16), BOOLEAN_SLOTS),
    (OutputSpec.of_choice(RATINGS, max_tokens=4), RATING_SLOTS),
]


@pytest.fixture(scope="module")
def engines(tiny_judge_model, vllm_base_url):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_NO_USAGE_STATS", "1")
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
        offline = load_vllm_engine(
            VllmEngine(
                type="vllm",
                model=str(tiny_judge_model),
                max_model_len=1024,
                temperature=0.0,
                seed=0,
                engine_kwargs={"enforce_eager": True},
            )
        )
        served = load_openai_engine(
            OpenAIEngine(
                type="openai",
                base_url=vllm_base_url,
                model=SERVED_NAME,
                temperature=0.0,
                request_timeout_s=120.0,
            )
        )
        try:
            yield offline, served
        finally:
            served.close()
            offline.close()


@pytest.mark.release
def test_vllm_and_openai_engines_agree_on_verdict_probabilities(engines):
    """Release check (two engines of one model; about 45 s): the default suite covers each
    engine's logprobs on its own (tests/test_engine_openai.py against the same server,
    tests/test_verdict_confidence.py on recorded logprobs)."""
    offline, served = engines
    requests = [
        EngineRequest(PROMPT, replace(output, logprobs=VERDICT_TOP_LOGPROBS)) for output, _ in CASES
    ]
    local, remote = run_sync(offline.complete(requests)), run_sync(served.complete(requests))
    for (_, slots), a, b in zip(CASES, local, remote):
        assert a.status == b.status == "ok", (a.error, b.error)
        assert a.finish_reason == "stop", a.text
        assert a.text == b.text
        assert a.logprobs is not None and b.logprobs is not None
        assert [t.token for t in a.logprobs] == [t.token for t in b.logprobs]
        pa, pb = verdict_probabilities(a, slots), verdict_probabilities(b, slots)
        assert [v.literal for v in pa] == [v.literal for v in pb]
        for va, vb in zip(pa, pb):
            assert all(0.0 <= p <= 1.0 for p in (*va.p.values(), *vb.p.values()))
            assert set(va.p) == set(vb.p)
            for literal in va.p:
                assert va.p[literal] == pytest.approx(vb.p[literal], abs=2e-3)
