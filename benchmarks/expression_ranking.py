"""Ranking metrics in the expression stage against ranx and a plain Python loop.

Run through ``benchmarks/expression_stage.py --retrieval`` (or this file directly)::

    python benchmarks/expression_stage.py --retrieval [--rows N] [--repeat R]

What it does:

1. Builds ``N`` (default 200,000) seeded synthetic rows: ten retrieved ids per row, no
   repeats, drawn from 50 ids per row's "query", and graded judgments for eight of them
   (grades 0..3, at least one above 0). The rows go through ragbatch's own normalizer
   (``ragbatch.io.schema.normalize``, a Parquet file with ``list<string>`` ids and a
   ``list<struct<id, grade>>`` relevance column), in batches of 100,000.
2. Times, over the same rows, in rounds that interleave the three (the machine is shared:
   each round is a fair comparison; the fastest round of each and the median of the
   per-round ratios are reported):

   * ragbatch's expression stage, ``udfs.expressions.expression_stage``, for the six
     ranking metrics at k = 10 (the "retrieval6" set), from the normalized Arrow batches
     to the batches with their cell columns (reading the scores back into Python lists
     for the comparison is not timed; the runs up to ``743ac61`` timed it too);
   * ranx 0.3 ``evaluate`` for the same six (``hit_rate@10``, ``precision@10``,
     ``recall@10``, ``mrr@10``, ``ndcg@10``, ``map@10``), Numba-compiled and parallel,
     timed twice: ``evaluate`` alone on ``Qrels``/``Run`` built beforehand, and
     including building them from Python dicts (what a user holding the rows does);
     one untimed warm-up call compiles first;
   * a plain Python loop computing the six per row from Python lists (the same
     definitions), including the conversion of the columns to Python lists;
   * the floor of the stage: the ranking metrics' shared match and per-row statistics
     alone (``ragbatch.metrics._ranking.RankedIds`` at k = 10, binary and graded) over
     the same batches already converted to Polars, without guards or cells.

3. Compares the three's scores row by row (largest absolute difference) and writes
   ``<workdir>/results_retrieval.json``, with the load average before and after every
   measurement. Nothing here asserts a speed.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from pathlib import Path
from typing import Any

K = 10
RETRIEVAL6 = [
    {"name": "hit_rate", "params": {"k": K}},
    {"name": "precision_at_k", "params": {"k": K}},
    {"name": "recall_at_k", "params": {"k": K}},
    {"name": "mrr", "params": {"k": K}},
    {"name": "ndcg_at_k", "params": {"k": K}},
    {"name": "average_precision", "params": {"k": K}},
]
RANX_NAMES = {
    "hit_rate": f"hit_rate@{K}",
    "precision_at_k": f"precision@{K}",
    "recall_at_k": f"recall@{K}",
    "mrr": f"mrr@{K}",
    "ndcg_at_k": f"ndcg@{K}",
    "average_precision": f"map@{K}",
}
SEED = 20261202
BATCH_ROWS = 100_000


def _load() -> list[float] | None:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return None


def synthetic(n_rows: int, seed: int = SEED) -> list[dict[str, Any]]:
    """``n_rows`` rows of ``ids`` (10 distinct strings) and ``grades`` (8 {id, grade})."""
    rng = random.Random(seed)
    rows = []
    for i in range(n_rows):
        pool = [f"q{i}-d{j}" for j in range(50)]
        ids = rng.sample(pool, 10)
        judged = rng.sample(ids[:6], 4) + rng.sample(pool, 4)
        judged = list(dict.fromkeys(judged))
        grades = [rng.choice((0, 0, 1, 2, 3)) for _ in judged]
        if not any(grades):
            grades[0] = 1
        rows.append(
            {
                "row_id": f"r{i}",
                "ids": ids,
                "grades": [{"id": d, "grade": float(g)} for d, g in zip(judged, grades)],
            }
        )
    return rows


def python_loop(ids: list, grades: list) -> dict[str, list[float]]:
    """The six metrics at k = 10 per row, in plain Python (binary relevance: grade > 0)."""
    out: dict[str, list[float]] = {m["name"]: [] for m in RETRIEVAL6}
    for ranking, judged in zip(ids, grades):
        gain = {e["id"]: e["grade"] for e in judged if e["grade"] > 0}
        top = ranking[:K]
        hits, first, ap, dcg, seen = 0, 0, 0.0, 0.0, set()
        for rank, doc in enumerate(top, 1):
            if doc in gain and doc not in seen:
                hits += 1
                first = first or rank
                ap += hits / rank
                dcg += gain[doc] / math.log2(rank + 1)
            seen.add(doc)
        ideal = sorted(gain.values(), reverse=True)[:K]
        idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
        out["hit_rate"].append(1.0 if hits else 0.0)
        out["precision_at_k"].append(hits / K)
        out["recall_at_k"].append(hits / len(gain))
        out["mrr"].append(1.0 / first if first else 0.0)
        out["ndcg_at_k"].append(dcg / idcg)
        out["average_precision"].append(ap / len(gain))
    return out


def _ranx_inputs(ids: list, grades: list) -> tuple[dict, dict]:
    qrels = {f"r{i}": {e["id"]: int(e["grade"]) for e in judged} for i, judged in enumerate(grades)}
    run = {
        f"r{i}": {d: float(len(ranking) - r) for r, d in enumerate(ranking)}
        for i, ranking in enumerate(ids)
    }
    return qrels, run


def measure(n_rows: int, workdir: Path, repeat: int = 3) -> dict:
    """Times and agreement as described in the module doc; returns the results dict."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from ranx import Qrels, Run, evaluate

    from ragbatch.config.job import JobConfig
    from ragbatch.core.columns import cell_column
    from ragbatch.io.read import peek_schema, plan_read, read_task
    from ragbatch.core.columns import RANKING
    from ragbatch.io.schema import normalize, slice_columns
    from ragbatch.metrics._ranking import RankedIds
    from ragbatch.pipeline.plan import build_metrics
    from udfs.expressions import expression_stage, polars_frame

    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "rankings.parquet"
    rows = synthetic(n_rows)
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=BATCH_ROWS)
    cfg = JobConfig.from_dict(
        {
            "input": {
                "uri": str(path),
                "columns": {"row_id": "row_id", "context_ids": "ids", "relevance": "grades"},
            },
            "output": {"uri": "unused"},
            "metrics": RETRIEVAL6,
        }
    )
    metrics, _, problems = build_metrics(cfg)
    assert not problems, problems
    slices = slice_columns(cfg.input, peek_schema(cfg.input))
    batches = []
    t0 = time.perf_counter()
    for task in plan_read(cfg.input):
        batches.append(normalize(read_task(task, cfg.input), cfg.input, task, slices=slices))
    read_s = time.perf_counter() - t0
    ids = [r["ids"] for r in rows]
    grades = [r["grades"] for r in rows]
    del rows
    # untimed warm-ups: ranx's Numba compilation, the stage's thread pool
    small_q, small_r = _ranx_inputs(ids[:100], grades[:100])
    evaluate(Qrels(small_q), Run(small_r), list(RANX_NAMES.values()), return_mean=False)
    expression_stage(batches[0].slice(0, 2000), metrics)

    rounds = []
    scores: dict[str, dict[str, list[float]]] = {}
    for rep in range(repeat):
        entry: dict[str, Any] = {"load_before": _load()}
        w0, c0 = time.perf_counter(), time.process_time()
        outs = [expression_stage(batch, metrics) for batch in batches]
        entry["ragbatch"] = {
            "wall_s": time.perf_counter() - w0,
            "cpu_s": time.process_time() - c0,
        }
        # the scores as Python lists, for the agreement check, outside the timing
        got: dict[str, list[float]] = {m.id: [] for m in metrics}
        for out in outs:
            for m in metrics:
                cell = out.column(cell_column(m.id))
                got[m.id].extend(pc.struct_field(cell, "score").to_pylist())
        del outs
        scores["ragbatch"] = got

        # the floor: the shared match and the per-row statistics alone (NumPy over the
        # flattened ids of the same batches, already in Polars), no guards and no cells
        frames = [polars_frame(batch, list(RANKING)) for batch in batches]
        w0, c0 = time.perf_counter(), time.process_time()
        for frame in frames:
            ranked = RankedIds(frame)
            ranked.stats(K, graded=False)
            ranked.stats(K, graded=True)
        entry["floor"] = {"wall_s": time.perf_counter() - w0, "cpu_s": time.process_time() - c0}
        del frames
        entry["load_mid_1"] = _load()

        w0, c0 = time.perf_counter(), time.process_time()
        qrels_d, run_d = _ranx_inputs(ids, grades)
        qrels, run = Qrels(qrels_d), Run(run_d)
        w1 = time.perf_counter()
        values = evaluate(qrels, run, list(RANX_NAMES.values()), return_mean=False)
        w2 = time.perf_counter()
        entry["ranx"] = {
            "build_s": w1 - w0,
            "evaluate_s": w2 - w1,
            "wall_s": w2 - w0,
            "cpu_s": time.process_time() - c0,
        }
        order = {q: i for i, q in enumerate(qrels.keys())}
        at = np.array([order[f"r{i}"] for i in range(len(ids))])
        scores["ranx"] = {n: list(np.asarray(values[r])[at]) for n, r in RANX_NAMES.items()}
        del qrels_d, run_d, qrels, run, values
        entry["load_mid_2"] = _load()

        w0, c0 = time.perf_counter(), time.process_time()
        py_ids = [v for b in batches for v in b.column("context_ids").to_pylist()]
        py_grades = [v for b in batches for v in b.column("relevance").to_pylist()]
        w1 = time.perf_counter()
        scores["loop"] = python_loop(py_ids, py_grades)
        entry["loop"] = {
            "convert_s": w1 - w0,
            "wall_s": time.perf_counter() - w0,
            "cpu_s": time.process_time() - c0,
        }
        del py_ids, py_grades
        entry["load_after"] = _load()
        rounds.append(entry)
        print(
            f"round {rep + 1}/{repeat}: ragbatch {entry['ragbatch']['wall_s']:.2f} s "
            f"(floor {entry['floor']['wall_s']:.2f} s), "
            f"ranx {entry['ranx']['wall_s']:.2f} s (evaluate {entry['ranx']['evaluate_s']:.2f} s), "
            f"loop {entry['loop']['wall_s']:.2f} s; load {entry['load_before']}",
            flush=True,
        )
    best = {
        k: min((r[k] for r in rounds), key=lambda x: x["wall_s"])
        for k in ("ragbatch", "floor", "ranx", "loop")
    }
    best_eval = min(r["ranx"]["evaluate_s"] for r in rounds)
    n = len(ids)
    ragbatch_rps = n / best["ragbatch"]["wall_s"]
    agreement = {
        name: {
            "ranx": float(
                np.max(np.abs(np.array(scores["ragbatch"][name]) - scores["ranx"][name]))
            ),
            "loop": float(
                np.max(np.abs(np.array(scores["ragbatch"][name]) - scores["loop"][name]))
            ),
        }
        for name in RANX_NAMES
    }
    per_round = [
        {
            "load_before": r["load_before"],
            "ragbatch_vs_loop": r["loop"]["wall_s"] / r["ragbatch"]["wall_s"],
            "ragbatch_vs_ranx_evaluate_only": r["ranx"]["evaluate_s"] / r["ragbatch"]["wall_s"],
            "ragbatch_vs_ranx_with_build": r["ranx"]["wall_s"] / r["ragbatch"]["wall_s"],
            "floor_vs_ranx_evaluate_only": r["ranx"]["evaluate_s"] / r["floor"]["wall_s"],
        }
        for r in rounds
    ]
    medians = {
        key: statistics.median(r[key] for r in per_round)
        for key in per_round[0]
        if key != "load_before"
    }
    return {
        "rows": n,
        "ratios_per_round": per_round,
        "median_ratio_of_rounds": medians,
        "k": K,
        "metrics": RETRIEVAL6,
        "read_normalize_s": read_s,
        "rounds": rounds,
        "best": best,
        "rows_per_s": {
            "ragbatch": ragbatch_rps,
            "floor": n / best["floor"]["wall_s"],
            "ranx_with_build": n / best["ranx"]["wall_s"],
            "ranx_evaluate_only": n / best_eval,
            "loop": n / best["loop"]["wall_s"],
        },
        "ratios": {
            "ragbatch_vs_loop": best["loop"]["wall_s"] / best["ragbatch"]["wall_s"],
            "ragbatch_vs_ranx_with_build": best["ranx"]["wall_s"] / best["ragbatch"]["wall_s"],
            "ragbatch_vs_ranx_evaluate_only": best_eval / best["ragbatch"]["wall_s"],
            "floor_vs_ranx_evaluate_only": best_eval / best["floor"]["wall_s"],
        },
        "max_abs_difference": agreement,
    }


def main(rows: int, workdir: Path, repeat: int) -> int:
    """Run :func:`measure`, print the figures, write ``results_retrieval.json``."""
    results = measure(rows, workdir, repeat)
    (workdir / "results_retrieval.json").write_text(json.dumps(results, indent=2, default=str))
    keys = ("rows_per_s", "ratios", "median_ratio_of_rounds", "ratios_per_round")
    print(json.dumps({k: results[k] for k in keys}, indent=2))
    print(json.dumps(results["max_abs_difference"], indent=2))
    print(f"results: {workdir / 'results_retrieval.json'}")
    return 0


if __name__ == "__main__":
    import argparse
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path(__file__).parent / "_data")
    args = parser.parse_args()
    raise SystemExit(main(args.rows, args.workdir.resolve(), args.repeat))
