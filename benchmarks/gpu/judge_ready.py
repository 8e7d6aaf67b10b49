"""Is a judge model ready? Its agreement with human labels and its throughput, one table.

Usage (from the repository root, on a GPU node; see ``benchmarks/gpu/README.md``)::

    python benchmarks/gpu/judge_ready.py --model /models/judge [--num-gpus 1] [--per-label 200]
    python benchmarks/gpu/judge_ready.py --cpu-smoke          # the same code paths on a CPU

Parts, each a child process, run one after the other (one failing leaves the others'
rows in the table, with the error noted):

* ``calibrate:<name>``: ``benchmarks/calibrate.py --configs <name> --per-label N
  --judge-model MODEL --num-gpus G`` for each shipped config (``ares``, ``halueval``,
  ``hatecheck``, ``trec_dl``): agreement per metric (value and bootstrap interval), the
  judge calls, verdicts per second (ok score cells over the judge run's wall time, Ray
  start and engine load included) and the process's wall seconds.
* ``throughput``: ``benchmarks/gpu/run.py --skip-similarity --judge-model MODEL
  --num-gpus G``: the judge stage against raw ``vllm.LLM.generate`` on the same ARES
  prompts. Its row gives cells per second of the stage (rows x metrics over the median
  stage pass, the engine already loaded) and ``of raw vLLM``, run.py's raw/ragbatch
  ratio: the stage's share of raw vLLM's throughput (1.0: no cost over vLLM).

Writes ``benchmarks/_data/gpu/judge_ready.json`` (every part's command, exit status,
wall time, error, results and output tail, and the table rows) and ``judge_ready.md``
(the table), and prints the table. The parts' own files, and each part's output as it
runs (``<part>.log``), are under ``benchmarks/_data/gpu/judge_ready/``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))

import calibrate as bench  # noqa: E402  (benchmarks/calibrate.py)

OUT_DIR = ROOT / "benchmarks" / "_data" / "gpu"
PARTS_DIR = OUT_DIR / "judge_ready"
#: A traceback's exception line: ``Name: message`` or ``package.Name: message``.
EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b:?")
#: Defaults of --cpu-smoke: the tiny random model, one config, a handful of rows.
SMOKE = {"configs": "hatecheck", "per_label": 1, "judge_rows": 2, "max_tokens": 16}


# -- the parts ---------------------------------------------------------------------------


def calibrate_command(args: argparse.Namespace, name: str, out: Path) -> list[str]:
    """``benchmarks/calibrate.py`` on config ``name`` with the model under test."""
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "calibrate.py"),
        "--configs",
        name,
        "--per-label",
        str(args.per_label),
        "--num-gpus",
        str(args.num_gpus),
        "--out",
        str(out),
    ]
    if args.model:
        command += ["--judge-model", args.model]
    if args.max_tokens is not None:
        command += ["--max-tokens", str(args.max_tokens)]
    return command


def throughput_command(args: argparse.Namespace, out_dir: Path) -> list[str]:
    """The judge half of ``benchmarks/gpu/run.py`` with the model under test."""
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "gpu" / "run.py"),
        "--skip-similarity",
        "--num-gpus",
        str(args.num_gpus),
        "--out-dir",
        str(out_dir),
    ]
    if args.model:
        command += ["--judge-model", args.model]
    for flag, value in (
        ("--judge-rows", args.judge_rows),
        ("--max-tokens", args.max_tokens),
        ("--judge-batch-rows", args.judge_batch_rows),
        ("--repeats", args.repeats),
    ):
        if value is not None:
            command += [flag, str(value)]
    return command


def run_part(
    part: str, command: list[str], result_json: Path, timeout_s: float | None
) -> dict[str, Any]:
    """Run one part, its output going to ``<parts dir>/<part>.log``; ``rc``, ``wall_s``
    (seconds, the whole child process), ``error`` (None when it exited 0) and ``result``
    (its JSON file, None when it wrote none)."""
    result_json.unlink(missing_ok=True)
    log = PARTS_DIR / f"{part.replace(':', '_')}.log"
    print(f"[{part}] {' '.join(command)}\n[{part}] output: {log}", flush=True)
    t0 = time.perf_counter()
    with log.open("w") as out:
        # its own session, so that a part stopped at its timeout takes its Ray and vLLM
        # processes with it
        proc = subprocess.Popen(
            command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
    wall = round(time.perf_counter() - t0, 1)
    tail = log.read_text(errors="replace")[-4000:]
    result = json.loads(result_json.read_text()) if result_json.is_file() else None
    if rc is None:
        error = f"stopped at the part timeout ({timeout_s:g} s)"
    else:
        error = None if rc == 0 else f"exit {rc}: {last_line(tail)}"[:300]
    print(f"[{part}] {'ok' if error is None else error} ({wall:.1f} s)", flush=True)
    return {
        "part": part,
        "command": command,
        "rc": rc,
        "wall_s": wall,
        "error": error,
        "result": result,
        "log": str(log),
        "log_tail": tail,
    }


def last_line(text: str) -> str:
    """The line of ``text`` that names the failure: the last exception line (``Name:
    message``) other than a wrapper's ``subprocess.CalledProcessError`` (the child's own
    exception is more telling), else the last exception line, else the last non-blank
    line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if EXCEPTION.match(line)]
    own = [line for line in errors if not line.startswith("subprocess.CalledProcessError")]
    return (own or errors or lines or [""])[-1]


# -- the table ---------------------------------------------------------------------------


def calibrate_rows(part: dict[str, Any]) -> list[dict[str, Any]]:
    """Table rows of one ``calibrate:<name>`` part: its configs' rows
    (:func:`calibrate.table_rows`), with the process's wall time; one error row when it
    wrote no result for its config."""
    name = part["part"].split(":", 1)[1]
    results = (part.get("result") or {}).get("results") or []
    if not results:
        return [
            {
                "config": name,
                "metric": "",
                "wall_s": part["wall_s"],
                "note": f"error: {part['error'] or 'no results written'}",
            }
        ]
    return [row for r in results for row in bench.table_rows(r)]


def throughput_rows(part: dict[str, Any]) -> list[dict[str, Any]]:
    """Table rows of the ``throughput`` part: one per judge batch size run.py ran."""
    runs = (part.get("result") or {}).get("judge") or []
    if not runs:
        return [
            {
                "config": "ARES, judge stage vs raw vLLM",
                "metric": "",
                "wall_s": part["wall_s"],
                "note": f"error: {part['error'] or 'no judge results written'}",
            }
        ]
    rows = []
    for i, run in enumerate(runs):
        rows.append(
            {
                "config": f"ARES, judge stage ({run['batch_rows']} rows/call) vs raw vLLM",
                "metric": ", ".join(run["metrics"]),
                "n": run["rows"],
                "judge_calls": run["requests"],
                "verdicts_per_s": round(run["rows"] * len(run["metrics"]) / run["stage_s"], 3),
                "raw_fraction": run["ratio"],
                "wall_s": part["wall_s"] if i == 0 else None,
                "note": f"error: {part['error']}" if part["error"] and i == 0 else "",
            }
        )
    return rows


def merge(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The table rows of every part, in run order."""
    rows = []
    for part in parts:
        rows += throughput_rows(part) if part["part"] == "throughput" else calibrate_rows(part)
    return rows


# -- the command -------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="judge model directory (required without --cpu-smoke)")
    p.add_argument(
        "--num-gpus",
        type=int,
        default=None,
        help="GPUs of the judge (default 1; 0 with --cpu-smoke)",
    )
    p.add_argument(
        "--per-label",
        type=int,
        default=None,
        help="calibration rows per label value (pairs: pairs) per config (default 200)",
    )
    p.add_argument("--configs", default=None, help="comma list (default: all four shipped configs)")
    p.add_argument(
        "--judge-rows", type=int, default=None, help="run.py's ARES rows (default: run.py's)"
    )
    p.add_argument(
        "--judge-batch-rows", default=None, help="run.py's rows per stage call (comma list)"
    )
    p.add_argument("--repeats", type=int, default=None, help="run.py's timed passes per side")
    p.add_argument("--max-tokens", type=int, default=None, help="judge max_tokens in every part")
    p.add_argument(
        "--part-timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds after which a part is stopped and noted as failed (default: none)",
    )
    p.add_argument("--skip-calibrate", action="store_true")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="CPU, tiny random model, hatecheck only, a few rows: checks the code paths",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=OUT_DIR / "judge_ready.json",
        help="JSON results; the markdown table goes next to it (.md)",
    )
    args = p.parse_args(argv)
    if args.cpu_smoke:
        for name, value in SMOKE.items():
            if getattr(args, name) is None:
                setattr(args, name, value)
        args.num_gpus = 0 if args.num_gpus is None else args.num_gpus
        args.repeats = 1 if args.repeats is None else args.repeats
        args.judge_batch_rows = args.judge_batch_rows or str(args.judge_rows)
    elif not args.model:
        p.error("--model is required (or --cpu-smoke)")
    args.num_gpus = 1 if args.num_gpus is None else args.num_gpus
    args.per_label = 200 if args.per_label is None else args.per_label
    args.configs = args.configs or ",".join(bench.CONFIGS)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    PARTS_DIR.mkdir(parents=True, exist_ok=True)
    parts = []
    if not args.skip_calibrate:
        for name in args.configs.split(","):
            out = PARTS_DIR / f"calibrate_{name}.json"
            parts.append(
                run_part(
                    f"calibrate:{name}", calibrate_command(args, name, out), out, args.part_timeout
                )
            )
    if not args.skip_throughput:
        parts.append(
            run_part(
                "throughput",
                throughput_command(args, PARTS_DIR),
                PARTS_DIR / "gpu_results.json",
                args.part_timeout,
            )
        )
    rows = merge(parts)
    markdown = bench.markdown_table(rows)
    report = {
        "model": args.model,
        "num_gpus": args.num_gpus,
        "per_label": args.per_label,
        "cpu_smoke": args.cpu_smoke,
        "cpus": os.cpu_count(),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "parts": parts,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    args.out.with_suffix(".md").write_text(markdown + "\n")
    print()
    print(markdown)
    print(f"\nresults: {args.out} and {args.out.with_suffix('.md')}")
    return report


if __name__ == "__main__":
    sys.exit(1 if any(p["error"] for p in main()["parts"]) else 0)
