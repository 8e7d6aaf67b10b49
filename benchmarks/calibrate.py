"""Time ``ragbatch calibrate`` on the shipped calibration configs with the tiny test judge.

Usage::

    python benchmarks/calibrate.py [--limit 24] [--configs ares,halueval,hatecheck,trec_dl]

For each config it runs ``ragbatch calibrate jobs/calibrate_<name>.yaml`` in a fresh
process (its own local Ray, its own vLLM actor) on the first ``--limit`` input rows, with
the judge pointed at the tiny random model (built into ``benchmarks/_data/tiny-judge``
when missing), a fresh output root and an empty judgment cache. It records the wall time,
the judge run's own timings and judge calls, and the time spent measuring agreement
(bootstrap included), and writes them to ``benchmarks/_data/calibrate.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "_data"
MODEL = DATA / "tiny-judge"


def _model() -> Path:
    if not (MODEL / "config.json").exists():
        sys.path.insert(0, str(ROOT / "tests"))
        from judge_models import build_tiny_judge_model

        build_tiny_judge_model(MODEL)
    return MODEL


def run_one(name: str, limit: int, work: Path) -> dict:
    """One timed ``ragbatch calibrate`` of ``jobs/calibrate_<name>.yaml``."""
    config = yaml.safe_load((ROOT / "jobs" / f"calibrate_{name}.yaml").read_text())
    out = work / name
    shutil.rmtree(out, ignore_errors=True)
    config["output"]["uri"] = str(out)
    config["input"]["uri"] = str(ROOT / config["input"]["uri"])
    for judge in config["judges"]:
        config["engines"][judge]["model"] = str(_model())
    path = work / f"calibrate_{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONPATH=str(ROOT))
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "ragbatch.cli", "calibrate", str(path),
                           "--limit", str(limit), "--run-id", "bench"], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    manifest = json.loads(next(out.glob("calibration/*/run_id=bench/manifest.json")).read_text())
    runs = {}
    for judge, run_id in manifest["scores_runs"].items():
        run = json.loads(next(out.glob(f"runs/*/run_id={run_id}/manifest.json")).read_text())
        runs[judge] = {"timings_s": run["timings_s"], "judge_calls": run["judge"]["total"]["judge_calls"],
                       "counts": run["counts"]}
    judged = sum(manifest["timings"][f"judge_{j}_s"] for j in manifest["scores_runs"])
    return {"config": name, "rows": manifest["labelled_input"]["rows"], "limit": limit,
            "metrics": [m["name"] for m in config["metrics"]], "wall_s": round(wall, 1),
            "judge_runs_s": round(judged, 1),
            "agreement_s": round(manifest["timings"]["total_s"] - judged, 2),
            "load_before": load, "runs": runs, "table": proc.stdout}


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=24, help="input rows per config (pairs count once)")
    p.add_argument("--configs", default="ares,halueval,hatecheck,trec_dl")
    p.add_argument("--out", type=Path, default=DATA / "calibrate.json")
    args = p.parse_args(argv)
    work = DATA / "calibrate"
    work.mkdir(parents=True, exist_ok=True)
    results = [run_one(name, args.limit, work) for name in args.configs.split(",")]
    args.out.write_text(json.dumps({"machine": platform.platform(), "cpus": os.cpu_count(),
                                    "results": results}, indent=2))
    for r in results:
        print(f"{r['config']:<10} {r['rows']:>5} rows  {len(r['metrics'])} metrics  wall {r['wall_s']:>7.1f} s  "
              f"judge runs {r['judge_runs_s']:>7.1f} s  agreement {r['agreement_s']:>5.2f} s  "
              f"(load {r['load_before']:.1f})")
    return results


if __name__ == "__main__":
    main()
