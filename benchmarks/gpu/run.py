"""GPU benchmark: ragbatch's judge and similarity stages against the raw libraries.

Usage (from the repository root, in the project's virtual environment, on a GPU
machine; see ``benchmarks/gpu/README.md``)::

    python benchmarks/gpu/run.py --judge-model /models/judge --num-gpus 1

Two comparisons, one table:

* **Judge stage vs raw vLLM**: ``benchmarks/judge_stage.py`` is run as a child process
  (its own ``vllm.LLM``, freed with the process before the similarity part starts) with
  ``--model``, ``--num-gpus``, ``--rows``, ``--max-tokens`` and ``--repeats`` passed on,
  once per value of ``--judge-batch-rows`` (rows per stage call, the engine's
  ``batch_size``); its JSON (``<out dir>/gpu_judge_b<rows>.json``) gives the median wall
  time of the stage's ``__call__`` and of raw ``LLM.generate`` on the same token prompts
  in the same groups, and of one raw ``LLM.generate`` over all of them (what cutting the
  rows into batches costs the engine).
* **Similarity stage vs raw sentence-transformers**: synthetic (answer, reference) pairs
  from ``benchmarks/scale.py``'s generator (same seed, same text lengths as its
  similarity stage). The stage is ``udfs.similarity.ModelStage`` with
  ``semantic_similarity`` on an ``embedding`` engine, called in this process on Arrow
  batches of ``--sim-batch-rows`` rows (what a Ray Data actor runs per batch; Ray's
  scheduling is not included). The raw baseline is one
  ``SentenceTransformer.encode(answers + references, batch_size=...,
  normalize_embeddings=True)`` call on all texts followed by row-wise dot products.
  Both load the same model directory on the same device. Passes alternate (stage, raw,
  raw, stage, ...) after an untimed warm-up; medians of ``--repeats`` are reported and
  the scores of the two are compared (largest absolute difference).

Without a GPU (``--num-gpus 0``, the default when torch sees none) the same code runs
on the CPU with the tiny random judge model and the packaged all-MiniLM-L6-v2: this is
how the script is checked on machines without a GPU; those figures say nothing about a
GPU. It prints the table and writes ``<out dir>/gpu_results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for extra in (ROOT, ROOT / "benchmarks"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

DEFAULT_OUT_DIR = ROOT / "benchmarks" / "_data" / "gpu"
SIM_SEED = 20241130


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:
        return 0


def _gpu_name() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        return None


def judge_part(args: argparse.Namespace, out_dir: Path, batch_rows: int) -> dict[str, Any]:
    """Run ``benchmarks/judge_stage.py`` in a child process with ``batch_rows`` rows per
    stage call; its summary."""
    out = out_dir / f"gpu_judge_b{batch_rows}.json"
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "judge_stage.py"),
        "--num-gpus",
        str(args.num_gpus),
        "--rows",
        str(args.judge_rows),
        "--max-tokens",
        str(args.max_tokens),
        "--repeats",
        str(args.repeats),
        "--batch-size",
        str(batch_rows),
        "--layout-rows",
        "0",
        "--out",
        str(out),
    ]
    if args.judge_model:
        command += ["--model", args.judge_model]
    print("judge: " + " ".join(command), flush=True)
    subprocess.run(command, check=True, cwd=ROOT)
    result = json.loads(out.read_text())
    summary = result["summary"]
    one_call = summary.get("raw_one_call") or {}
    return {
        "rows": result["rows"],
        "metrics": result["metrics"],
        "batch_rows": batch_rows,
        "raw_one_call_s": one_call.get("wall_s"),
        "model": result["engine_spec"]["model"],
        "stage_s": summary["stage"]["wall_s"],
        "raw_s": summary["raw"]["wall_s"],
        "stage_runs_s": [r["wall_s"] for r in result["stage_runs"]],
        "raw_runs_s": [r["wall_s"] for r in result["raw_runs"]],
        "requests": result["stage_runs"][0]["requests"],
        "ratio": summary["ratio_stage_over_raw"],
        "json": str(out),
    }


def similarity_rows(n: int):
    """``n`` synthetic rows (``answer``, ``reference``, ...) as a ``pyarrow.Table``."""
    import numpy as np

    from scale import _chunk, _TextSource

    return _chunk(_TextSource(np.random.default_rng([SIM_SEED, n])), "similarity", 0, n, SIM_SEED)


def similarity_part(args: argparse.Namespace) -> dict[str, Any]:
    """Time ``ModelStage`` against raw ``SentenceTransformer.encode`` on the same rows."""
    import numpy as np
    import pyarrow.compute as pc
    from sentence_transformers import SentenceTransformer

    from ragbatch.engines.sentence_transformers import choose_device, packaged_model
    from udfs.base import parse_engine_spec
    from udfs.similarity import ModelStage

    spec = {
        "type": "embedding",
        "model": args.embedding_model,
        "num_gpus": args.num_gpus,
        "concurrency": 1,
        "batch_size": args.sim_batch_size,
    }
    device = choose_device(parse_engine_spec("embedder", spec))
    path = args.embedding_model or str(packaged_model()[0])
    rows = similarity_rows(args.sim_rows)
    answers = rows["answer"].to_pylist()
    references = rows["reference"].to_pylist()
    t0 = time.perf_counter()
    stage = ModelStage(
        "embedder",
        spec,
        [{"name": "semantic_similarity", "id": "semantic_similarity", "params": {}}],
    )
    raw = SentenceTransformer(path, device=device)
    load_s = time.perf_counter() - t0

    def run_stage(table) -> tuple[float, np.ndarray]:
        start = time.perf_counter()
        parts = [
            stage(table.slice(i, args.sim_batch_rows))
            for i in range(0, table.num_rows, args.sim_batch_rows)
        ]
        wall = time.perf_counter() - start
        scores = np.concatenate(
            [
                pc.struct_field(p["cell::semantic_similarity"], "score").to_numpy(
                    zero_copy_only=False
                )
                for p in parts
            ]
        )
        return wall, scores

    def run_raw(a: list[str], r: list[str]) -> tuple[float, np.ndarray]:
        start = time.perf_counter()
        vectors = raw.encode(
            a + r,
            batch_size=args.sim_batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        cosine = np.einsum("ij,ij->i", vectors[: len(a)], vectors[len(a) :])
        wall = time.perf_counter() - start
        return wall, np.clip(cosine, 0.0, 1.0)

    warm = rows.slice(0, min(64, rows.num_rows))
    run_stage(warm)
    run_raw(answers[:64], references[:64])
    stage_s, raw_s = [], []
    stage_scores = raw_scores = None
    for r in range(args.repeats):
        for which in ("stage", "raw") if r % 2 == 0 else ("raw", "stage"):
            if which == "stage":
                wall, stage_scores = run_stage(rows)
                stage_s.append(wall)
            else:
                wall, raw_scores = run_raw(answers, references)
                raw_s.append(wall)
            print(f"  similarity {which:5s} {wall:8.2f} s", flush=True)
    assert stage_scores is not None and raw_scores is not None
    stage_med, raw_med = statistics.median(stage_s), statistics.median(raw_s)
    return {
        "rows": rows.num_rows,
        "model": path,
        "device": device,
        "load_s": load_s,
        "batch_rows": args.sim_batch_rows,
        "batch_size": args.sim_batch_size,
        "stage_s": stage_med,
        "raw_s": raw_med,
        "stage_runs_s": stage_s,
        "raw_runs_s": raw_s,
        "ratio": raw_med / stage_med,
        "max_abs_score_diff": float(np.nanmax(np.abs(stage_scores - raw_scores))),
    }


def table(results: dict[str, Any]) -> str:
    lines = [
        f"{'comparison':42s} {'rows':>7s} {'ragbatch s':>10s} {'raw s':>8s} "
        f"{'ragbatch rows/s':>15s} {'raw rows/s':>10s} {'raw/ragbatch':>12s}"
    ]

    def line(label: str, n: int, stage_s: float, raw_s: float) -> str:
        return (
            f"{label:42s} {n:7d} {stage_s:10.2f} {raw_s:8.2f} {n / stage_s:15.1f} "
            f"{n / raw_s:10.1f} {raw_s / stage_s:12.3f}"
        )

    for part in results.get("judge", []):
        b, n = part["batch_rows"], part["rows"]
        lines.append(
            line(f"judge stage ({b} rows/call) vs raw vLLM", n, part["stage_s"], part["raw_s"])
        )
        if part.get("raw_one_call_s"):
            lines.append(
                line(
                    "  same, vs one raw generate of all (1 pass)",
                    n,
                    part["stage_s"],
                    part["raw_one_call_s"],
                )
            )
    sim = results.get("similarity")
    if sim:
        lines.append(
            line(
                "similarity stage vs sentence-transformers",
                sim["rows"],
                sim["stage_s"],
                sim["raw_s"],
            )
        )
        lines.append(
            f"similarity scores, largest |ragbatch - raw|: {sim['max_abs_score_diff']:.2e}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--judge-model",
        help="vLLM judge model directory (default: the tiny "
        "random model of benchmarks/judge_stage.py)",
    )
    p.add_argument(
        "--embedding-model",
        help="sentence-transformers model directory (default: the packaged all-MiniLM-L6-v2)",
    )
    p.add_argument(
        "--num-gpus",
        type=int,
        default=None,
        help="GPUs for both stages (default: 1 if torch sees a GPU, else 0)",
    )
    p.add_argument(
        "--judge-rows",
        type=int,
        default=None,
        help="ARES rows judged (default 2000 on a GPU, 24 on the CPU)",
    )
    p.add_argument(
        "--judge-batch-rows",
        default=None,
        help="comma list of rows per judge stage call, one judge run each "
        "(default 64,256 on a GPU: the engines' default batch_size and a "
        "larger one; 64 on the CPU)",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="judge max_tokens (default 512 on a GPU, 32 on the CPU)",
    )
    p.add_argument(
        "--sim-rows",
        type=int,
        default=None,
        help="similarity rows (default 100,000 on a GPU, 512 on the CPU)",
    )
    p.add_argument(
        "--sim-batch-rows",
        type=int,
        default=None,
        help="rows per stage call (default 1024 on a GPU, 64 on the CPU)",
    )
    p.add_argument(
        "--sim-batch-size",
        type=int,
        default=None,
        help="texts per forward pass, both sides (default 256 on a GPU, 64 on the CPU)",
    )
    p.add_argument("--repeats", type=int, default=3, help="timed passes of each side (median)")
    p.add_argument("--skip-judge", action="store_true")
    p.add_argument("--skip-similarity", action="store_true")
    p.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    args = p.parse_args(argv)
    if args.num_gpus is None:
        args.num_gpus = 1 if _gpu_count() else 0
    gpu = args.num_gpus > 0
    defaults = {
        "judge_rows": (2000, 24),
        "judge_batch_rows": ("64,256", "64"),
        "max_tokens": (512, 32),
        "sim_rows": (100_000, 512),
        "sim_batch_rows": (1024, 64),
        "sim_batch_size": (256, 64),
    }
    for name, (on_gpu, on_cpu) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, on_gpu if gpu else on_cpu)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "gpu": _gpu_name(),
        "gpus": _gpu_count(),
        "cpus": os.cpu_count(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "load_at_start": os.getloadavg()[0],
    }
    if not args.skip_judge:
        results["judge"] = [
            judge_part(args, args.out_dir, int(b))
            for b in str(args.judge_batch_rows).split(",")
            if b.strip()
        ]
    if not args.skip_similarity:
        print("similarity: ModelStage vs SentenceTransformer.encode", flush=True)
        results["similarity"] = similarity_part(args)
    results["load_at_end"] = os.getloadavg()[0]
    out = args.out_dir / "gpu_results.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print()
    print(table(results))
    print(f"\nresults: {out}")
    return results


if __name__ == "__main__":
    main()
