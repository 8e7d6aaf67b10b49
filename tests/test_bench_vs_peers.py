"""The rows and defaults of ``benchmarks/vs_peers.py`` (the peers themselves are not
installed here; the script's own runs are recorded in docs/benchmarks/vs-peers.md)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def vs_peers():
    spec = importlib.util.spec_from_file_location("vs_peers", ROOT / "benchmarks" / "vs_peers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def documents(vs_peers):
    return [r["document"] for r in vs_peers._ares()]


def digest(table) -> str:
    text = json.dumps(table.to_pylist(), ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# Digests of the tables that the script built before it had --contexts-per-row (at
# commit b3aa7f4), which every run in docs/benchmarks/vs-peers.md up to 2026-12-01 used:
# one context per row must still give exactly those rows.
ONE_CONTEXT_DIGESTS = {50: "00b025ec70c76276", 1000: "915d111f313dc2e0"}


@pytest.mark.parametrize("n", sorted(ONE_CONTEXT_DIGESTS))
def test_one_context_rows_are_the_recorded_ones(vs_peers, n):
    assert digest(vs_peers.build_rows(n, 300, 300)) == ONE_CONTEXT_DIGESTS[n]


def test_sample_rows_take_the_next_rows_documents_as_distractors(vs_peers, documents):
    table = vs_peers.build_rows(3, 300, 40, contexts_per_row=3).to_pylist()
    assert [r["row_id"] for r in table] == ["ares-0", "ares-1", "ares-2"]
    for i, row in enumerate(table):
        assert row["contexts"] == [documents[i][:40], documents[i + 1][:40], documents[i + 2][:40]]
        assert row["reference"] == row["answer"]


def test_more_contexts_keep_each_synthetic_rows_own_parts(vs_peers, documents):
    one = vs_peers.build_rows(400, 300, 300).to_pylist()
    five = vs_peers.build_rows(400, 300, 300, contexts_per_row=5).to_pylist()
    assert len(five) == 400
    for a, b in zip(one, five):
        assert (a["row_id"], a["question"], a["answer"]) == (
            b["row_id"],
            b["question"],
            b["answer"],
        )
        assert b["contexts"][0] == a["contexts"][0]
        assert len(b["contexts"]) == 5
        for context in b["contexts"]:
            # a window of 300 characters of one document, or the whole of a shorter one
            assert any(context in d and len(context) == min(300, len(d)) for d in documents)
    # the distractors are drawn, not copies of the row's own context
    assert sum(b["contexts"][1] != b["contexts"][0] for b in five) > 390


def test_rows_are_deterministic_and_seeded(vs_peers):
    a = vs_peers.build_rows(300, 300, 300, contexts_per_row=2)
    assert digest(a) == digest(vs_peers.build_rows(300, 300, 300, contexts_per_row=2))
    assert digest(a) != digest(vs_peers.build_rows(300, 300, 300, seed=1, contexts_per_row=2))


def test_device_defaults_follow_num_gpus(vs_peers):
    cpu = vs_peers.parse_args([])
    assert (cpu.max_num_seqs, cpu.batch_size, cpu.ragbatch_concurrency) == (32, 64, 32)
    assert (cpu.ragas_workers, cpu.tonic_workers) == ("16,48", "16,64")
    # the server gets the block size ragbatch's engine takes on a CPU
    from ragbatch.engines.vllm import DEFAULT_CPU_BLOCK_SIZE

    assert cpu.block_size == DEFAULT_CPU_BLOCK_SIZE == 32
    gpu = vs_peers.parse_args(["--num-gpus", "1"])
    assert (gpu.max_num_seqs, gpu.batch_size, gpu.ragbatch_concurrency) == (None, 256, 256)
    assert gpu.block_size is None
    assert (gpu.ragas_workers, gpu.tonic_workers) == ("16,64,256", "16,64,256")
    # what is given on the command line stays
    given = vs_peers.parse_args(["--num-gpus", "1", "--batch-size", "8", "--max-num-seqs", "4"])
    assert (given.batch_size, given.max_num_seqs) == (8, 4)


def test_contexts_per_row_below_one_is_refused(vs_peers, capsys):
    with pytest.raises(SystemExit):
        vs_peers.parse_args(["--contexts-per-row", "0"])
    assert "--contexts-per-row must be 1 or more" in capsys.readouterr().err


def test_engine_settings_reach_ragbatch_vllm_job(vs_peers, tmp_path):
    cpu = vs_peers.parse_args([])
    job = vs_peers.ragbatch_config(
        "vllm",
        tmp_path / "rows.parquet",
        tmp_path / "out",
        cpu,
        "http://127.0.0.1:1/v1",
        tmp_path / "model",
    )
    assert job["engines"]["judge"]["engine_kwargs"] == {
        "enforce_eager": True,
        "max_num_seqs": 32,
        "block_size": 32,
    }
    gpu = vs_peers.parse_args(["--num-gpus", "1"])
    job = vs_peers.ragbatch_config(
        "vllm",
        tmp_path / "rows.parquet",
        tmp_path / "out",
        gpu,
        "http://127.0.0.1:1/v1",
        tmp_path / "model",
    )
    assert job["engines"]["judge"]["engine_kwargs"] == {"enforce_eager": False}


def test_grammar_backend_reaches_ragbatch_vllm_job_only_when_not_the_default(vs_peers, tmp_path):
    default = vs_peers.parse_args([])
    assert default.grammar_backend == "xgrammar"
    job = vs_peers.ragbatch_config(
        "vllm",
        tmp_path / "rows.parquet",
        tmp_path / "out",
        default,
        "http://127.0.0.1:1/v1",
        tmp_path / "model",
    )
    assert "structured_outputs_config" not in job["engines"]["judge"]["engine_kwargs"]
    guidance = vs_peers.parse_args(["--grammar-backend", "guidance"])
    job = vs_peers.ragbatch_config(
        "vllm",
        tmp_path / "rows.parquet",
        tmp_path / "out",
        guidance,
        "http://127.0.0.1:1/v1",
        tmp_path / "model",
    )
    assert job["engines"]["judge"]["engine_kwargs"]["structured_outputs_config"] == {
        "backend": "guidance",
        "disable_any_whitespace": True,
    }
    openai = vs_peers.ragbatch_config(
        "openai",
        tmp_path / "rows.parquet",
        tmp_path / "out",
        guidance,
        "http://127.0.0.1:1/v1",
        None,
    )
    assert "engine_kwargs" not in openai["engines"]["judge"]


@pytest.mark.release
def test_server_prefix_cache_is_emptied_between_runs(vs_peers, tiny_judge_model, tmp_path):
    """The script's server takes ragbatch's CPU block size and empties its prefix cache on
    request, so a repeated run of an HTTP client starts as cold as ragbatch's own engine."""
    import urllib.request

    args = vs_peers.parse_args(["--out", str(tmp_path / "out.json"), "--max-model-len", "1024"])
    proc, url = vs_peers.start_server(tiny_judge_model, args)
    try:

        def ask() -> dict[str, float]:
            body = json.dumps(
                {
                    "model": vs_peers.SERVED_NAME,
                    "max_tokens": 2,
                    "messages": [
                        {"role": "user", "content": "the same question, asked again " * 12}
                    ],
                }
            )
            request = urllib.request.Request(
                url + "/chat/completions",
                data=body.encode(),
                headers={"Content-Type": "application/json"},
            )
            before = vs_peers.server_counters(url)
            urllib.request.urlopen(request, timeout=120).read()
            after = vs_peers.server_counters(url)
            return {k: after[k] - before[k] for k in ("prompt_tokens", "prefix_cache_hits")}

        first, second = ask(), ask()
        prompt = first["prompt_tokens"]
        assert prompt > 64 and second["prompt_tokens"] == prompt
        # the second ask reuses every full 32-token block but the one holding its last token
        assert second["prefix_cache_hits"] == (prompt - 1) // 32 * 32
        assert vs_peers.reset_prefix_cache(url) is True
        assert ask()["prefix_cache_hits"] == 0
    finally:
        vs_peers.stop_server(proc)
    assert vs_peers.reset_prefix_cache(url) is False  # no server: reported, not raised


def test_smollm2_option_serves_and_runs_it_in_float32_on_a_cpu(vs_peers, smollm2_model, tmp_path):
    cpu = vs_peers.parse_args(["--judge-model", "smollm2"])
    assert (cpu.model, cpu.dtype) == ("smollm2", "float32")
    assert vs_peers.JUDGE_MODELS["smollm2"][0]() == smollm2_model
    job = vs_peers.ragbatch_config(
        "vllm",
        tmp_path / "rows.parquet",
        tmp_path / "out",
        cpu,
        "http://127.0.0.1:1/v1",
        smollm2_model,
    )
    assert job["engines"]["judge"]["dtype"] == "float32"
    assert vs_peers.parse_args(["--judge-model", "smollm2", "--num-gpus", "1"]).dtype == "auto"
    tiny = vs_peers.parse_args([])
    assert (tiny.judge_model, tiny.model, tiny.dtype) == ("tiny", "tiny", "auto")


def test_parse_failure_rate_is_failures_over_judge_cells(vs_peers):
    run = {
        "wall_s": 10.0,
        "requests": 40,
        "prompt_tokens": 1,
        "completion_tokens": 1,
        "parse_failures": 3,
        "judged_cells": 12,
    }
    assert vs_peers.summarise([run], 2)["parse_failure_rate"] == 0.25
    assert vs_peers.summarise([run | {"judged_cells": None}], 2)["parse_failure_rate"] is None


@pytest.mark.release
@pytest.mark.slow
def test_ragbatch_side_reports_smollm2_parse_failure_rate(
    vs_peers, smollm2_model, tmp_path, monkeypatch
):
    """ragbatch's own engine on SmolLM2 over three rows (the peers are not installed here):
    the rate the script reports is the share of parse_failure cells among the judge
    metrics' cells of the written scores."""
    import polars as pl

    monkeypatch.setattr(vs_peers, "WORK", tmp_path / "work")  # rows, job and output here
    args = vs_peers.parse_args(
        [
            "--judge-model",
            "smollm2",
            "--rows",
            "3",
            "--max-tokens",
            "96",
            "--sample-context-chars",
            "400",
            "--out",
            str(tmp_path / "o.json"),
        ]
    )
    rows = vs_peers.write_rows(3, args)
    run = vs_peers.run_ragbatch("vllm", rows, 3, args, "http://127.0.0.1:1/v1", smollm2_model, "r0")
    out = vs_peers.artifact(args, "out_vllm_3")
    scores = pl.read_parquet(out / "scores" / "**" / "*.parquet", hive_partitioning=True)
    judged = scores.filter(pl.col("metric").is_in(vs_peers.JUDGE_METRICS))
    assert run["judged_cells"] == judged.height == 3 * len(vs_peers.JUDGE_METRICS)
    assert run["parse_failures"] == judged.filter(pl.col("status") == "parse_failure").height
    assert (
        vs_peers.summarise([run], 3)["parse_failure_rate"] == run["parse_failures"] / judged.height
    )
