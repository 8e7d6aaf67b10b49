"""``ragbatch run --dry-run``: the printed plan, that it does no work, and its judge
estimate against the counts a real run reports in its manifest.

The real run uses the session's ``vllm serve`` of the tiny random judge model
(``vllm_base_url``) on the first ARES rows. A random model's replies decide whether a
two-step metric reaches its second step: without a pilot only the first step of
``faithfulness`` is held to the counts; with ``pilot_rows`` covering the sample the whole
metric is held to 10 %, like the single-step metrics.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from ragbatch.config.job import JobConfig
from ragbatch.judge.assumed import assumed_statements
from ragbatch.judge.metric import Embed, JudgeMetric
from ragbatch.judge.protocol import Ask
from ragbatch.scoring.registry import all_metrics

REPO = Path(__file__).resolve().parents[1]
ARES = REPO / "examples/data/ares/datasets_v2__LLM_Judge_Test_Set_Human_Annotations.tsv"
JUDGE_METRICS = [m for m in all_metrics() if issubclass(m, JudgeMetric)]


def test_assumed_statements_are_the_sentences():
    text = 'Delta tables keep history. Is it "time travel?" Yes!\nSee  VACUUM.'
    assert assumed_statements(text) == [
        "Delta tables keep history.",
        'Is it "time travel?"',
        "Yes!",
        "See  VACUUM.",
    ]
    assert assumed_statements("東京は大きい。人が多い！本当？ 🗼 Yes") == [
        "東京は大きい。",
        "人が多い！",
        "本当？",
        "🗼 Yes",
    ]
    assert assumed_statements(None) == [] and assumed_statements(" \n ") == []
    assert len(assumed_statements("a. " * 30)) == 20  # the statements schema's maximum
    assert assumed_statements("x" * 500) == ["x" * 400]  # STATEMENT_MAX_CHARS


def _judge_steps(metric: JudgeMetric, example) -> int:
    """Steps holding judge asks when the program runs on an example's replies."""
    replies, embeddings = iter(example.replies), iter(example.embeddings)
    program = metric.program(dict(example.inputs))
    steps, values = 0, None
    while True:
        try:
            requests = next(program) if values is None else program.send(values)
        except StopIteration:
            return steps
        steps += any(isinstance(r, Ask) for r in requests)
        values = [
            r.parse(next(replies)) if isinstance(r, Ask) else np.asarray(next(embeddings))
            for r in requests
        ]


@pytest.mark.parametrize("cls", JUDGE_METRICS, ids=[m.name for m in JUDGE_METRICS])
def test_judge_steps_declared_and_assumption_builds_the_next_ask(cls):
    ok = [ex for ex in cls.judge_examples if ex.status == "ok"]
    assert ok, f"{cls.name} has no ok example"
    for ex in ok:
        assert _judge_steps(cls.from_params(ex.params), ex) == cls.judge_steps, ex.note
    if cls.judge_steps == 1:
        return
    metric = cls.from_params(ok[0].params)
    row = dict(ok[0].inputs)
    program = metric.program(row)
    first = next(program)  # one ask, or several (factual_correctness: both texts' claims)
    assumed = [metric.assumed_result(row, ask) for ask in first]
    second = program.send(assumed)
    assert len(second) == len(first)
    for ask, sentences in zip(second, assumed):
        assert isinstance(ask, Ask) and not isinstance(ask, Embed)
        prompt = ask.messages[-1].content
        assert sentences and all(sentence in prompt for sentence in sentences)


def _ares_rows(tmp_path: Path, n: int) -> Path:
    lines = ARES.read_text(encoding="utf-8").splitlines(keepends=True)
    out = tmp_path / "ares_head.tsv"
    out.write_text("".join(lines[: n + 1]), encoding="utf-8")
    return out


def test_dry_run_prints_the_plan_and_does_no_work(tiny_judge_model, tmp_path):
    """Two shipped configs through the CLI in a fresh process: the plan is printed, no
    output appears, and neither Ray nor torch (so no model weights) is even imported."""
    judge_cfg = yaml.safe_load((REPO / "jobs/ares_judge.yaml").read_text())
    judge_cfg["engines"]["judge"]["model"] = str(tiny_judge_model)
    judge_cfg["engines"]["judge"]["concurrency"] = [1, 3]
    judge_yaml = tmp_path / "ares_judge.yaml"
    judge_yaml.write_text(yaml.safe_dump(judge_cfg))
    out_a, out_b = tmp_path / "out_tonic", tmp_path / "out_judge"
    script = (
        "import sys\nfrom ragbatch.cli import main\n"
        f"a = main(['run', 'jobs/tonic_paul_graham.yaml', '--dry-run', '--output', {str(out_a)!r}])\n"
        f"b = main(['run', {str(judge_yaml)!r}, '--dry-run', '--sample-rows', '24',"
        f" '--output', {str(out_b)!r}])\n"
        "print('EXIT', a, b, 'IMPORTED', 'ray' in sys.modules, 'torch' in sys.modules,"
        " 'vllm' in sys.modules)\n"
    )
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    elapsed = time.perf_counter() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout
    assert "EXIT 0 0 IMPORTED False False False" in text
    assert not out_a.exists() and not out_b.exists()
    print(f"two dry runs in one process: {elapsed:.1f} s")
    flat = " ".join(text.split())  # whitespace and line wrapping aside
    # The pools are sized for this machine (no GPU), by the rule worked out in
    # tests/test_pool_sizing.py: on 2 CPUs one model actor of 2 threads reserving 1 CPU,
    # and the judge's [1, 3] actors sharing 1 CPU while its engine runs 2 threads.
    cpus = os.cpu_count() or 1
    threads = min(4, cpus)
    actors = max(1, cpus // threads)
    model_cpus = f"{min(threads, math.floor((cpus - 1) / actors * 10_000) / 10_000):g}"
    judge_cpus = f"{min(cpus, math.floor((cpus - 1) / 3 * 10_000) / 10_000):g}"

    # tonic_paul_graham: 6 CSV files, 330 rows, counted; expression tasks and a MiniLM pool
    assert (
        "input examples/data/tonic_validate_paul_graham/: 6 read task(s), 330 rows (exact, counted)"
    ) in flat
    assert (
        "1. read 6 read task(s) as Ray tasks, normalized to the canonical columns "
        "2. expressions exact_match, response_length, context_length, mentions_paul_graham, "
        "one_sentence, not_a_refusal Ray tasks, no actors (one Polars pass per batch) "
        f"3. model:minilm semantic_similarity engine minilm (embedding); actors: {actors} "
        f"(fixed) per actor: num_cpus={model_cpus}, num_gpus=0, batch_size=4096, "
        f"threads={threads} sized for this machine: {actors} actor(s) x {threads} thread(s) "
        f"on the {cpus} CPUs this stage gets, each reserving {model_cpus} CPU (1 CPU kept for "
        "the read, expression and write tasks) (chosen: concurrency, num_cpus, num_gpus, "
        "threads, batch_size) "
        f"4. write long scores table, staged under {out_a}/_staging/ and published on commit"
    ) in flat

    # ares_judge: one judge pool, autoscaling, with its embedder; 24 of 200 rows sampled
    assert (
        "input examples/data/ares/datasets_v2__LLM_Judge_Test_Set_Human_Annotations.tsv: "
        "1 read task(s), 200 rows (exact, counted)"
    ) in flat
    assert "sample the first 24 rows; judge figures are scaled to all 200 rows (x8.33)" in flat
    assert (
        "2. judge:judge faithfulness, answer_relevancy, context_relevancy, answer_consistency, "
        "answer_consistency_binary, augmentation_accuracy, augmentation_precision, "
        "retrieval_precision, duplication, hate_speech engine judge (vllm); actors: 1..3 "
        f"(autoscaling) per actor: num_cpus={judge_cpus}, num_gpus=0, batch_size=64, "
        f"threads={cpus}, batches_in_flight=4, tensor_parallel_size=1 sized for this "
        f"machine: one actor per node whose vLLM engine runs {cpus} thread(s) (the stage's "
        f"share of a node's CPUs), reserving {judge_cpus} CPU (chosen: num_cpus, threads, "
        "batches_in_flight) each actor also "
        "loads the embedding engine(s) embedder 3. write"
    ) in flat
    assert "judge engine judge prompt tokens: counted with the tokenizer of" in flat
    parts = [re.split(r"\s{2,}", line.strip()) for line in text.splitlines()]
    table = {p[0]: p[1:] for p in parts}  # label -> basis, then the figures
    # every ARES row has a question, a document and an answer: all 200 are judged, once
    # per single-step metric
    for metric in ("duplication: duplication", "retrieval_precision: verdicts"):
        assert table[metric][:3] == ["exact", "200", "200"], table[metric]
    assert table["faithfulness"][:3] == ["exact+assumed", "200", "400"]
    assert table["1 statements"][:2] == ["exact", "200"]
    assert table["2 verdicts"][:2] == ["assumed", "200"]


def _judge_config(tmp_path: Path, base_url: str, tokenizer: Path, rows: int) -> JobConfig:
    data = yaml.safe_load((REPO / "jobs/ares_judge.yaml").read_text())
    data["input"]["uri"] = str(_ares_rows(tmp_path, rows))
    data["output"]["uri"] = str(tmp_path / "out")
    data["engines"] = {
        "judge": {
            "kind": "openai",
            "base_url": base_url,
            "model": "tiny",
            "tokenizer": str(tokenizer),
            "max_model_len": 8192,
            "max_concurrency": 8,
            "concurrency": 1,
            "batch_size": rows,
            "request_timeout_s": 300,
            "max_tokens": 16,
            # first attempts only: the estimate leaves parse retries out
            "parse_retries": 0,
        }
    }
    data["metrics"] = [
        {"name": n, "engine": "judge"}
        for n in ("retrieval_precision", "duplication", "faithfulness")
    ]
    return JobConfig.from_dict(data)


@pytest.mark.release
def test_estimate_within_ten_percent_of_a_real_run(
    ray_local, vllm_base_url, tiny_judge_model, tmp_path
):
    from ragbatch.pipeline.dry_run import dry_run
    from ragbatch.pipeline.runner import run_job

    rows = 12
    config = _judge_config(tmp_path, vllm_base_url, tiny_judge_model, rows)
    started = time.perf_counter()
    before = dry_run(config, sample_rows=rows)
    dry_s = time.perf_counter() - started
    assert before.scale == 1.0 and before.input_size.exact
    [judge] = before.judges
    assert judge.token_counter == "tokenizer"
    estimate = {m.metric_id: m for m in judge.metrics}
    piloted = dry_run(config, sample_rows=rows, pilot_rows=rows).judges[0]

    result = run_job(config, run_id="real")
    real = result.manifest.to_json_dict()["judge"]["metrics"]
    errors = {}
    for mid in ("retrieval_precision", "duplication"):
        est, got = estimate[mid], real[mid]
        assert est.total("calls") == got["judge_calls"] == rows, mid
        errors[mid] = est.total("prompt_tokens") / got["prompt_tokens"] - 1
        assert abs(errors[mid]) <= 0.10, (mid, est.total("prompt_tokens"), got["prompt_tokens"])
    # faithfulness: its first step is counted, its second assumed; the random judge decides
    # which rows reach the second step, so only the first is held to the real counts.
    faith, got = estimate["faithfulness"], real["faithfulness"]
    first = faith.steps[0]
    assert first.calls == rows <= got["judge_calls"]
    assert got["prompt_tokens"] >= 0.9 * first.prompt_tokens
    errors["faithfulness"] = faith.total("prompt_tokens") / got["prompt_tokens"] - 1
    print(
        "estimate error of prompt tokens per metric:",
        json.dumps({k: f"{v:+.1%}" for k, v in errors.items()}),
        f"faithfulness calls: estimated {faith.total('calls')}, made {got['judge_calls']};",
        f"dry run {dry_s:.1f} s",
    )

    # With a pilot on every sampled row (made before the run filled the judgment cache),
    # the second step is built from the judge's real first replies: the whole of
    # faithfulness is held to 10 % too.
    assert piloted.pilot is not None and piloted.pilot.calls >= rows
    faith = {m.metric_id: m for m in piloted.metrics}["faithfulness"]
    assert [s.basis for s in faith.steps][1:] in ([], ["pilot"])
    error = faith.total("prompt_tokens") / got["prompt_tokens"] - 1
    assert abs(error) <= 0.10, (faith.total("prompt_tokens"), got["prompt_tokens"])
    assert faith.total("calls") == got["judge_calls"]
    print(
        f"faithfulness with a pilot of {rows} rows: {error:+.1%}; pilot spent "
        f"{piloted.pilot.calls} calls"
    )

    # Run again as a dry run: the judgment cache now answers every first step (the cache
    # keys are rebuilt from the server's model card), so nothing is left to pay for.
    again = dry_run(config, sample_rows=rows).judges[0]
    assert "entries checked" in again.cache_note
    for m in again.metrics:
        assert m.steps[0].calls == 0 and m.steps[0].cache_hits == rows, m.metric_id
        assert m.total("prompt_tokens") == 0


def _faithfulness_sample():
    import polars as pl

    return pl.DataFrame(
        {
            "row_id": ["a", "b", "c", "d"],
            "question": ["Where is Paris?"] * 2 + ["q3", "q4"],
            "contexts": [["Paris is in France."], ["Paris is big."], ["x"], ["東京は大きい 🗼"]],
            "answer": [
                "Paris is in France. It is big.",
                "Paris is in Japan.",
                "No idea.",
                "東京は日本にある。 Tokyo is big!",
            ],
        }
    )


def _verdict_prompt_tokens(metric, row, statements, counter) -> int:
    """Prompt tokens of the verdicts request ``metric`` builds after ``statements``."""
    program = metric.program(row)
    next(program)
    [ask] = program.send([statements])
    return counter.count([ask.messages])[0]


def test_pilot_replies_build_the_later_prompts():
    """The tiny random judge never completes a statements reply, so the replies that let
    a row reach the second step come from recorded replies (``RecordedReplies``, the
    project's named stand-in engine). Row a gets one statement, b none (no second call),
    c a reply cut at max_tokens (parse failure: no second call), d two statements."""
    from types import SimpleNamespace

    from ragbatch.judge.cache_probe import CacheProbe
    from ragbatch.judge.estimate import estimate_stage
    from ragbatch.judge.pilot import Pilot
    from ragbatch.judge.recorded import RecordedReplies
    from ragbatch.judge.tokens import PromptCounter
    from ragbatch.metrics.faithfulness import Faithfulness

    metric = Faithfulness.from_params({})
    sample = _faithfulness_sample()
    rows = sample.to_dicts()
    counter, probe = PromptCounter("chars/4", "test"), CacheProbe("off")
    spec = SimpleNamespace(max_tokens=None, batch_size=64)
    replies = [
        json.dumps({"statements": ["Paris is in France."]}),
        json.dumps({"statements": []}),
        ("length", '{"statements": ["No'),
        json.dumps({"statements": ["東京は日本にある。", "Tokyo is big."]}),
    ]

    pilot = Pilot(RecordedReplies(list(replies)), rows=4)
    [full] = estimate_stage([metric], spec, sample, counter, probe, None, pilot)
    first, second = full.steps
    assert (first.basis, first.calls, second.basis, second.calls) == ("exact", 4, "pilot", 2)
    real_a = _verdict_prompt_tokens(metric, rows[0], ["Paris is in France."], counter)
    real_d = _verdict_prompt_tokens(
        metric, rows[3], ["東京は日本にある。", "Tokyo is big."], counter
    )
    assert second.prompt_tokens == real_a + real_d
    assert pilot.calls == 4  # the last step is never sent

    # A pilot on the first 2 of 4 rows: the assumed second step (every row, its
    # sentences) times real / assumed on rows a and b.
    pilot = Pilot(RecordedReplies(list(replies)), rows=2)
    [scaled] = estimate_stage([metric], spec, sample, counter, probe, None, pilot)
    assumed = [
        _verdict_prompt_tokens(metric, r, s, counter)
        for r, s in zip(
            rows,
            (
                ["Paris is in France.", "It is big."],
                ["Paris is in Japan."],
                ["No idea."],
                ["東京は日本にある。", "Tokyo is big!"],
            ),
        )
    ]
    step = scaled.steps[1]
    assert step.basis == "pilot-scaled"
    assert step.calls == round(4 * 1 / 2)
    assert step.prompt_tokens == round(sum(assumed) * real_a / (assumed[0] + assumed[1]))
    assert scaled.steps[0] == first


def _expression_config(uri: Path, fmt: str, tmp_path: Path) -> JobConfig:
    return JobConfig.from_dict(
        {
            "input": {"uri": str(uri), "format": fmt, "columns": {"question": "q", "answer": "a"}},
            "output": {"uri": str(tmp_path / "out")},
            "metrics": [{"name": "response_length", "params": {"min_chars": 1, "max_chars": 10}}],
        }
    )


def test_input_rows_from_parquet_footers_and_estimated_from_bytes(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ragbatch.pipeline.dry_run import dry_run
    from ragbatch.io import sample

    table = pa.table({"q": [f"q{i}" for i in range(30)], "a": [f"a{i}" for i in range(30)]})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=8)
    result = dry_run(_expression_config(tmp_path / "t.parquet", "parquet", tmp_path), 5)
    assert (result.input_size.rows, result.input_size.exact) == (30, True)
    assert result.input_size.how == "Parquet footers" and result.sample_rows == 5

    # three CSV files of 4, 10 and 20 rows: the first is read for a 3-row sample; with no
    # byte budget for counting, the other two are estimated at the first one's bytes per row
    folder = tmp_path / "csv"
    folder.mkdir()
    sizes = {}
    for name, n in (("a.csv", 4), ("b.csv", 10), ("c.csv", 20)):
        text = "q,a\n" + "".join(f"question {i},answer {i}\n" for i in range(n))
        (folder / name).write_text(text)
        sizes[name] = len(text.encode())
    monkeypatch.setattr(sample, "COUNT_BYTES_LIMIT", 0)
    estimated = dry_run(_expression_config(folder, "csv", tmp_path), 3).input_size
    per_row = sizes["a.csv"] / 4
    assert not estimated.exact
    assert estimated.rows == 4 + round((sizes["b.csv"] + sizes["c.csv"]) / per_row)
    assert "2 of 3 text files estimated from their size" in estimated.how
    monkeypatch.setattr(sample, "COUNT_BYTES_LIMIT", 1 << 20)
    counted = dry_run(_expression_config(folder, "csv", tmp_path), 3).input_size
    assert (counted.rows, counted.exact, counted.how) == (34, True, "counted")
