"""The judge stage at its defaults against raw vLLM: whole processes, at the margin.

Usage (from the repository root, in the project's virtual environment, after
``ragbatch models build smollm2 --out models/smollm2``)::

    python benchmarks/judge_job.py                          # SmolLM2 on the CPU, 16 and 48 rows
    python benchmarks/judge_job.py --rows 24,96 --repeat 2

Two contestants, each a whole child process timed from outside, at two row counts of the
shipped ARES rows (``benchmarks/judge_stage.py``'s ``ares_rows``: past the 200 shipped rows
they repeat with a tag that keeps their prompts apart), alternating within each round:

* **ragbatch**: ``ragbatch run`` of a job with the five single-step judge metrics of
  ``benchmarks/judge_stage.py`` on ``engines: {judge: {type: vllm, model: <model>}}``,
  nothing else set (the pool rule sizes it: on a CPU one actor whose engine runs every
  core, 64 rows a call, 4 calls in flight), the judgment cache off;
* **raw**: a script that loads the same model with vLLM (through ragbatch's adapter, so
  that every engine setting is the same: structured-output backend, prefix caching,
  KV-cache size, block size, threads) and calls ``LLM.generate`` once on every request
  the stage sends for those rows (their token-id prompts and sampling parameters,
  recorded beforehand by running the stage in a process of its own, outside the clock).

The marginal rate is ``(rows_2 - rows_1) / (t_2 - t_1)``; raw's single ``generate``
over everything is the ceiling of what an engine fed all requests at once does. Results go
to ``benchmarks/_data/judge_job/judge_job.json``; figures belong in BENCHMARKS.md and
docs/benchmarks/judge-stage.md. Nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

WORKDIR = ROOT / "benchmarks" / "_data" / "judge_job"
RAGBATCH = str(Path(sys.executable).with_name("ragbatch"))


def write_rows(n: int, workdir: Path) -> Path:
    """``n`` canonical ARES rows as Parquet."""
    import pyarrow.parquet as pq
    from judge_stage import ares_rows

    out = workdir / f"ares_{n}.parquet"
    if not out.exists():
        rows = ares_rows(n)
        pq.write_table(rows.select([c for c in rows.column_names if c != "_issues"]), out)
    return out


def job_config(data: Path, model: str, metrics: list[str], workdir: Path) -> Path:
    config = {
        "run": {"name": "judge-job"},
        "input": {
            "uri": str(data),
            "format": "parquet",
            "columns": {
                "row_id": "row_id",
                "question": "question",
                "contexts": "contexts",
                "answer": "answer",
            },
        },
        "output": {"uri": str(workdir / "out" / data.stem)},
        "metrics": [{"name": m, "engine": "judge"} for m in metrics],
        "engines": {"judge": {"type": "vllm", "model": model}},
        "cache": {"enabled": False},
    }
    path = workdir / f"job_{data.stem}.yaml"
    path.write_text(json.dumps(config))
    return path


def sized_spec(config_path: Path) -> Any:
    """The judge engine's spec as a run on this machine sizes it."""
    from ragbatch.config.job import load_config
    from ragbatch.core.placement import local_nodes
    from ragbatch.pipeline.plan import build_plan

    plan = build_plan(load_config(config_path), inspect_input=False)
    plan.size_pools(local_nodes(without_ray=True))
    return next(s.engine for s in plan.stages if s.engine is not None)


def record(config_path: Path, data: Path, metrics: list[str], out: Path) -> None:
    """Run the stage in this process at the sized spec and keep every request sent."""
    import pyarrow.parquet as pq
    from judge_stage import Recorder, make_stage

    from ragbatch.engines.vllm import load_vllm_engine

    spec = sized_spec(config_path)
    engine = load_vllm_engine(spec)
    recorder = Recorder(engine)
    stage = make_stage(engine, spec.model_dump(mode="json") | {"batches_in_flight": 1}, metrics)
    rows = pq.read_table(data)
    for start in range(0, rows.num_rows, spec.batch_size):
        stage(rows.slice(start, spec.batch_size))
    requests = [r for requests, _ in recorder.take() for r in requests]
    with open(out, "wb") as fh:
        pickle.dump({"spec": spec.model_dump(mode="json"), "requests": requests}, fh)
    print(f"recorded {len(requests)} requests for {rows.num_rows} rows", flush=True)
    engine.close()


RAW = """
import pickle, sys
sys.path.insert(0, {root!r})
from vllm.inputs import TokensPrompt
from ragbatch.engines.vllm import load_vllm_engine
from udfs.base import parse_engine_spec
saved = pickle.load(open(sys.argv[1], "rb"))
engine = load_vllm_engine(parse_engine_spec("judge", saved["spec"]))
fits = [r for r in saved["requests"]
        if len(engine.prompt_token_ids(r)) + r.output.max_tokens <= engine.max_model_len]
prompts = [TokensPrompt(prompt_token_ids=engine.prompt_token_ids(r)) for r in fits]
params = [engine._sampling_params(r) for r in fits]
outputs = engine._llm.generate(prompts, params, use_tqdm=False)
print("generated", len(outputs))
engine.close()
"""


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{command[:3]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return took


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from judge_stage import DEFAULT_METRICS

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="16,48")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--model", default=str(ROOT / "models" / "smollm2"))
    parser.add_argument("--metrics", default=",".join(DEFAULT_METRICS))
    parser.add_argument("--workdir", type=Path, default=WORKDIR)
    parser.add_argument("--record", nargs=3, metavar=("CONFIG", "DATA", "OUT"), default=None)
    args = parser.parse_args(argv)
    metrics = [m for m in args.metrics.split(",") if m]
    if args.record:
        record(Path(args.record[0]), Path(args.record[1]), metrics, Path(args.record[2]))
        return {}
    args.workdir.mkdir(parents=True, exist_ok=True)
    sizes = [int(x) for x in args.rows.split(",")]
    commands: dict[int, dict[str, list[str]]] = {}
    for n in sizes:
        data = write_rows(n, args.workdir)
        config = job_config(data, args.model, metrics, args.workdir)
        saved = args.workdir / f"requests_{n}.pkl"
        if not saved.exists():
            subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--record",
                    str(config),
                    str(data),
                    str(saved),
                    "--metrics",
                    args.metrics,
                ],
                check=True,
                cwd=ROOT,
            )
        commands[n] = {
            "ragbatch": [RAGBATCH, "run", str(config)],
            "raw": [sys.executable, "-c", RAW.format(root=str(ROOT)), str(saved)],
        }
    times: dict[str, dict[int, list[float]]] = {}
    for r in range(args.repeat):
        for n in sizes:
            entries = list(commands[n].items())
            if r % 2:
                entries.reverse()
            for name, command in entries:
                took = timed(command)
                times.setdefault(name, {}).setdefault(n, []).append(took)
                print(
                    f"round {r} {name:>8} {n:>5} rows {took:8.2f} s load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
    low, high = sizes[0], sizes[-1]
    result: dict[str, Any] = {"sizes": sizes, "times": times, "margin": {}}
    for name, by_size in times.items():
        best = {n: min(ts) for n, ts in by_size.items()}
        rate = (high - low) / (best[high] - best[low])
        result["margin"][name] = {"rows_per_s": rate, "fixed_s": best[low] - low / rate}
        print(f"{name:>8}: {rate:.3f} rows/s at the margin, fixed {best[low] - low / rate:.1f} s")
    ratio = result["margin"]["ragbatch"]["rows_per_s"] / result["margin"]["raw"]["rows_per_s"]
    result["ratio"] = ratio
    print(f"ragbatch / raw at the margin: {ratio:.3f}")
    (args.workdir / "judge_job.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
