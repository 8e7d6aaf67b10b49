"""vLLM on a CPU: the engine inside the calling process against its own processes.

The judge adapter (``ragbatch/engines/vllm.py``) runs vLLM's engine in the calling
process on machines without a GPU (``VLLM_ENABLE_V1_MULTIPROCESSING=0``); vLLM's default
puts the engine core and its worker in processes of their own. This script measures
both on the same requests: each pass is a fresh child process that loads the tiny test
model (``tests/support/judge_models.py``, built into ``benchmarks/_data/tiny-judge``), answers
an untimed warm-up, then times one ``LLM.generate`` call over ``--requests`` JSON-schema
requests of ``--prompt-tokens`` random token ids (fixed seed, so every pass sends the
same prompts) with replies capped at ``--max-tokens``; the engine's start (building
``vllm.LLM``, after the imports) is timed too. Passes alternate in mirrored
pairs (in-process, separate, separate, in-process, ...); the medians and their ratio are
printed and written to ``--out`` as JSON.

    python benchmarks/vllm_cpu_engine.py                 # 3 pairs, 1,024 requests each
    python benchmarks/vllm_cpu_engine.py --pairs 5 --threads 1

``--threads`` sets ``OMP_NUM_THREADS`` of the children (default: unset, torch's own
choice, every core); a Ray actor with ``num_cpus: 1`` gets 1. ``--bind`` sets
``VLLM_CPU_OMP_THREADS_BIND`` (default ``nobind``; vLLM's own default ``auto`` applies
only to separate processes, where it pins the worker's threads).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "_data" / "vllm_cpu_engine.json"
MODES = {"in-process": "0", "separate": "1"}
#: The shape of a judge verdict: what the adapter's JSON-schema requests look like.
SCHEMA = {
    "type": "object",
    "properties": {
        "verdict": {"type": "string", "enum": ["yes", "no"]},
        "reason": {"type": "string"},
    },
    "required": ["verdict", "reason"],
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=3, help="mirrored pairs of passes (default 3)")
    p.add_argument(
        "--requests", type=int, default=1024, help="requests timed per pass (default 1024)"
    )
    p.add_argument(
        "--prompt-tokens",
        type=int,
        default=630,
        help="prompt length in tokens (default 630, about the judge prompts of vs_peers.py)",
    )
    p.add_argument("--max-tokens", type=int, default=32, help="reply cap, in tokens (default 32)")
    p.add_argument(
        "--max-num-seqs", type=int, default=32, help="requests the engine runs at once (default 32)"
    )
    p.add_argument(
        "--bind",
        default="nobind",
        help="VLLM_CPU_OMP_THREADS_BIND of the children (default nobind; vLLM's "
        "own default is auto, which pins the worker's threads to cores)",
    )
    p.add_argument("--threads", type=int, help="OMP_NUM_THREADS of the children")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--child", choices=sorted(MODES), help=argparse.SUPPRESS)
    p.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def child(args: argparse.Namespace) -> None:
    """One pass: load the model, warm up, time one generate call, print one JSON line."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import StructuredOutputsParams

    import torch

    started = time.perf_counter()
    llm = LLM(
        model=str(args.model_dir),
        max_model_len=8192,
        max_num_seqs=args.max_num_seqs,
        enforce_eager=True,
        seed=0,
        structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace": True},
    )
    start_s = time.perf_counter() - started
    rng = random.Random(0)
    vocab = llm.get_tokenizer().vocab_size

    def batch(n: int) -> tuple[list, list]:
        prompts = [
            TokensPrompt(
                prompt_token_ids=[rng.randrange(10, vocab) for _ in range(args.prompt_tokens)]
            )
            for _ in range(n)
        ]
        params = [
            SamplingParams(
                max_tokens=args.max_tokens,
                temperature=0.0,
                seed=i,
                structured_outputs=StructuredOutputsParams(json=SCHEMA),
            )
            for i in range(n)
        ]
        return prompts, params

    llm.generate(*batch(64), use_tqdm=False)  # warm-up: grammar compiled, buffers sized
    prompts, params = batch(args.requests)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    print(
        "RESULT "
        + json.dumps(
            {
                "mode": args.child,
                "start_s": start_s,
                "seconds": seconds,
                "requests": len(outputs),
                "requests_per_s": len(outputs) / seconds,
                "completion_tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
                # of this (the calling) process; with separate processes the model runs in the
                # worker, which inherits OMP_NUM_THREADS
                "torch_threads": torch.get_num_threads(),
            }
        ),
        flush=True,
    )


def run_pass(mode: str, model_dir: Path, args: argparse.Namespace) -> dict:
    from vs_peers import vllm_env

    env = vllm_env(VLLM_ENABLE_V1_MULTIPROCESSING=MODES[mode], VLLM_CPU_OMP_THREADS_BIND=args.bind)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    command = [
        sys.executable,
        __file__,
        "--child",
        mode,
        "--model-dir",
        str(model_dir),
        "--requests",
        str(args.requests),
        "--prompt-tokens",
        str(args.prompt_tokens),
        "--max-tokens",
        str(args.max_tokens),
        "--max-num-seqs",
        str(args.max_num_seqs),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stdout[-2000:] + done.stderr[-3000:])
        raise SystemExit(f"the {mode} pass failed ({done.returncode})")
    return json.loads(lines[-1].removeprefix("RESULT "))


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    for name in ("pairs", "requests", "prompt_tokens", "max_tokens", "max_num_seqs"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1")
    if args.child:
        child(args)
        return {}
    sys.path.insert(0, str(HERE))
    from vs_peers import DEFAULT_MODEL_DIR, build_tiny_model, machine

    model_dir = build_tiny_model(DEFAULT_MODEL_DIR)
    order = []
    for i in range(args.pairs):
        order += ["in-process", "separate"] if i % 2 == 0 else ["separate", "in-process"]
    passes = []
    for mode in order:
        result = run_pass(mode, model_dir, args) | {"load_average_1m": os.getloadavg()[0]}
        passes.append(result)
        print(
            f"{mode:10s} {result['requests_per_s']:7.1f} requests/s "
            f"({result['seconds']:.2f} s, engine start {result['start_s']:.1f} s, "
            f"{result['completion_tokens']} completion tokens, "
            f"{result['torch_threads']} torch threads, load {result['load_average_1m']:.2f})",
            flush=True,
        )
    medians = {
        mode: statistics.median(p["requests_per_s"] for p in passes if p["mode"] == mode)
        for mode in MODES
    }
    starts = {
        mode: statistics.median(p["start_s"] for p in passes if p["mode"] == mode) for mode in MODES
    }
    ratio = medians["in-process"] / medians["separate"]
    # each mirrored pair's own ratio, which cancels drift of the machine between pairs
    pair_ratios = []
    for i in range(0, len(passes) - 1, 2):
        rate = {p["mode"]: p["requests_per_s"] for p in passes[i : i + 2]}
        pair_ratios.append(rate["in-process"] / rate["separate"])
    print(
        f"median requests/s: in-process {medians['in-process']:.1f}, separate "
        f"{medians['separate']:.1f}; in-process / separate {ratio:.2f} (median of the "
        f"pairs' ratios {statistics.median(pair_ratios):.2f}); median engine "
        f"start: in-process {starts['in-process']:.1f} s, separate "
        f"{starts['separate']:.1f} s",
        flush=True,
    )
    results = {
        "args": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if v is not None
        },
        "machine": machine(),
        "passes": passes,
        "median_requests_per_s": medians,
        "median_start_s": starts,
        "pair_ratios": pair_ratios,
        "in_process_over_separate": ratio,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}", flush=True)
    return results


if __name__ == "__main__":
    main()
