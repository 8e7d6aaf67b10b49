"""Parse rates of a real judge under both prompt layouts, on shipped rows, in one process.

Usage (from the repository root, in the project's virtual environment)::

    python benchmarks/prompt_layouts.py                      # SmolLM2 in models/smollm2, 6 ARES rows
    python benchmarks/prompt_layouts.py --rows 12 --data tonic --model /models/judge

The judge engine is loaded once (vLLM, in this process: no Ray) and the stage's judge
metrics (``--metrics``; default: the ten of ``jobs/ares_judge.yaml``, or for
``--data tonic`` those that read a reference answer as well) judge the first ``--rows``
rows of ``--data`` (``ares``: the ARES Databricks triples, one context each; ``tonic``:
the Tonic Validate Paul Graham rows of cohere, a system that kept its contexts: five each) with ``prompt_layout:
row_first`` and with ``instructions_first``, in ``--rounds`` alternating rounds
(``row_first`` first in odd rounds, last in even ones), with the judgment cache off and
vLLM's prefix cache emptied before each pass. ``answer_relevancy`` embeds with the
packaged all-MiniLM-L6-v2.

For each layout and metric it records the cells per status (``parse_failure`` is a reply
of the wrong shape on the first try and on the one retry) and the judge's prompt tokens,
prompt tokens served by vLLM's prefix cache and completion tokens; the parse rate is
``1 - parse_failure / judged`` with a Wilson 95 % interval, where judged = cells that
reached the judge (not settled by a guard). On ARES rows, for the five metrics
``jobs/calibrate_ares.yaml`` calibrates, it also counts the ok cells whose score (0.5 and
above read as 1) equals the row's human label. The load average is recorded beside the
wall times. Output: ``--out`` (default ``benchmarks/_data/prompt_layouts.json``).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

ARES = ROOT / "examples/data/ares/datasets_v2__LLM_Judge_Test_Set_Human_Annotations.tsv"
TONIC = (
    ROOT
    / "examples/data/tonic_validate_paul_graham/system=cohere/examples__titan_vs_cohere__cohere_run.csv"
)
ARES_METRICS = (
    "faithfulness",
    "answer_relevancy",
    "context_relevancy",
    "answer_consistency",
    "answer_consistency_binary",
    "augmentation_accuracy",
    "augmentation_precision",
    "retrieval_precision",
    "duplication",
    "hate_speech",
)
REFERENCE_METRICS = ("answer_similarity", "context_precision", "context_recall")
#: ARES's human labels for the metrics ``jobs/calibrate_ares.yaml`` calibrates.
ARES_LABELS = {
    "faithfulness": "Answer_Faithfulness_Label",
    "answer_consistency_binary": "Answer_Faithfulness_Label",
    "answer_relevancy": "Answer_Relevance_Label",
    "context_relevancy": "Context_Relevance_Label",
    "retrieval_precision": "Context_Relevance_Label",
}
LAYOUTS = ("row_first", "instructions_first")


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float | None, float | None]:
    """Wilson score interval of a proportion ``k / n`` (None, None for n = 0)."""
    if n == 0:
        return None, None
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def load_rows(data: str, n: int) -> list[dict[str, Any]]:
    """The first ``n`` rows of a shipped data set as canonical row dicts."""
    if data == "ares":
        with ARES.open(encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f, delimiter="\t")
            raw = [r for _, r in zip(range(n), reader)]
        return [
            {
                "row_id": f"ares:{i}",
                "question": r["Question"],
                "contexts": [r["Document"]],
                "answer": r["Answer"],
                "reference": None,
                "labels": {m: int(r[c]) for m, c in ARES_LABELS.items() if r.get(c, "").strip()},
            }
            for i, r in enumerate(raw)
        ]
    import polars as pl

    frame = pl.read_csv(TONIC).head(n)
    return [
        {
            "row_id": f"tonic:{i}",
            "question": r["reference_question"],
            "contexts": json.loads(r["llm_context"]) if r.get("llm_context") else None,
            "answer": r["llm_answer"],
            "reference": r["reference_answer"],
        }
        for i, r in enumerate(frame.to_dicts())
    ]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(ROOT / "models" / "smollm2"))
    p.add_argument("--data", choices=("ares", "tonic"), default="ares")
    p.add_argument("--rows", type=int, default=6)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument(
        "--layouts",
        default=",".join(LAYOUTS),
        help="comma-separated, in the order of the first round (default both)",
    )
    p.add_argument("--metrics", default="")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--out", type=Path, default=HERE / "_data" / "prompt_layouts.json")
    args = p.parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

    import polars as pl

    from ragbatch.engines.sentence_transformers import EmbeddingEngine
    from ragbatch.engines.vllm import VllmEngine
    from ragbatch.scoring.registry import get_metric
    from ragbatch.engines import load_judge_engine
    from ragbatch.engines.sentence_transformers import load_model
    from ragbatch.judge.batch import judge_frame
    from ragbatch.judge.protocol import run_sync
    from ragbatch.judge.run import JudgeRunner

    names = [m for m in args.metrics.split(",") if m] or list(
        ARES_METRICS + (REFERENCE_METRICS if args.data == "tonic" else ())
    )
    rows = load_rows(args.data, args.rows)
    frame = pl.DataFrame(
        [{k: v for k, v in r.items() if k != "labels"} for r in rows],
        schema={
            "row_id": pl.String,
            "question": pl.String,
            "contexts": pl.List(pl.String),
            "answer": pl.String,
            "reference": pl.String,
        },
    )
    spec = VllmEngine(
        type="vllm",
        model=args.model,
        max_model_len=8192,
        dtype="float32",
        engine_kwargs={"enforce_eager": True},
        max_tokens=args.max_tokens,
    )
    started = time.perf_counter()
    engine = load_judge_engine(spec)
    embed = load_model(EmbeddingEngine(type="embedding")).embed
    print(f"engine loaded in {time.perf_counter() - started:.0f} s", flush=True)

    results: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "metrics": names,
        "passes": [],
    }
    for round_ in range(args.rounds):
        chosen = tuple(x for x in args.layouts.split(",") if x)
        order = chosen if round_ % 2 == 0 else chosen[::-1]
        for layout in order:
            metrics = [
                get_metric(n).from_params(
                    {"prompt_layout": layout}
                    | ({"embedder": "embedder"} if n == "answer_relevancy" else {}),
                    metric_id=n,
                    engine="judge",
                )
                for n in names
            ]
            runner = JudgeRunner(
                engine, metrics, embedders={"embedder": embed}, parse_retries=1, seed=0
            )
            getattr(getattr(engine, "_llm", None), "reset_prefix_cache", lambda: None)()
            load_before = os.getloadavg()
            t0 = time.perf_counter()
            judged = run_sync(judge_frame(runner, frame))
            wall = time.perf_counter() - t0
            tallies = runner.take_tallies()
            per_metric = {}
            for m in metrics:
                cells, records = judged[m.id]
                statuses: dict[str, int] = {}
                for cell, record in zip(cells, records):
                    if record.get("judge_calls") or record.get("cache_hits"):
                        statuses[cell["status"]] = statuses.get(cell["status"], 0) + 1
                labels = [r.get("labels", {}).get(m.name) for r in rows]
                pairs = [
                    (cell["score"], label)
                    for cell, label in zip(cells, labels)
                    if label is not None and cell["status"] == "ok"
                ]
                agree = sum((score >= 0.5) == bool(label) for score, label in pairs)
                per_metric[m.id] = {
                    "statuses": statuses,
                    "scores": [c["score"] for c in cells],
                    "agreement": [agree, len(pairs)] if pairs else None,
                    **tallies[m.id],
                }
            n_judged = sum(sum(v["statuses"].values()) for v in per_metric.values())
            n_fail = sum(v["statuses"].get("parse_failure", 0) for v in per_metric.values())
            low, high = wilson(n_judged - n_fail, n_judged)
            entry = {
                "round": round_,
                "layout": layout,
                "wall_s": wall,
                "loadavg_before": load_before,
                "loadavg_after": os.getloadavg(),
                "judged_cells": n_judged,
                "parse_failures": n_fail,
                "parse_rate": (n_judged - n_fail) / n_judged if n_judged else None,
                "parse_rate_ci95": [low, high],
                "prompt_tokens": sum(v["prompt_tokens"] for v in per_metric.values()),
                "cached_prompt_tokens": sum(v["cached_prompt_tokens"] for v in per_metric.values()),
                "completion_tokens": sum(v["completion_tokens"] for v in per_metric.values()),
                "metrics": per_metric,
            }
            results["passes"].append(entry)
            print(
                f"round {round_} {layout:18s} {wall:7.0f} s  load {load_before[0]:.1f}  "
                f"parsed {n_judged - n_fail}/{n_judged} "
                f"[{low:.2f}, {high:.2f}]  prompt tokens {entry['prompt_tokens']}, "
                f"of which cached {entry['cached_prompt_tokens']}",
                flush=True,
            )
            for mid, v in per_metric.items():
                agreed = v["agreement"]
                print(
                    f"    {mid:28s} {v['statuses']}"
                    + (f"  agrees with the label {agreed[0]}/{agreed[1]}" if agreed else ""),
                    flush=True,
                )
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
