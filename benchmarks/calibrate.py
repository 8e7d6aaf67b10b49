"""Time ``ragbatch calibrate`` on the shipped calibration configs and collect the agreement.

Usage::

    python benchmarks/calibrate.py [--limit 24 | --per-label N] [--configs ares,halueval,hatecheck,trec_dl]
                                   [--judge-model DIR|smollm2] [--num-gpus N] [--max-tokens N]

For each config it runs ``ragbatch calibrate jobs/calibrate_<name>.yaml`` in a fresh
process (its own local Ray, its own vLLM actor) with a fresh output root and an empty
judgment cache. The rows judged are either

* ``--limit N``: the first N input rows (pairs count once; the default, 24), or
* ``--per-label N``: a seeded stratified sample (:func:`stratified_positions`): up to N
  input rows per label value, written in the input's own format to
  ``benchmarks/_data/calibrate/<name>_sample.<ext>`` and pointed at by the config copy.
  With several label columns (ARES) a stratum is one combination of their values. With
  ``pairs`` (HaluEval) every input row is one pair holding one answer of each label, so
  N pairs are drawn (:func:`sampled_pairs`) and both answers of a pair stay together:
  N rows per label.

The judge is ``--judge-model`` (default: the tiny random test model, built into
``benchmarks/_data/tiny-judge`` when missing; ``smollm2``: SmolLM2-135M-Instruct built
or reused in ``models/smollm2`` by ``ragbatch models build``). ``--num-gpus N`` > 0 runs
the judge engine on N GPUs (:func:`judge_engine`).

Recorded per config (``--out``, default ``benchmarks/_data/calibrate.json``, and a
markdown table next to it, ``.md``): the process's wall time (seconds), the judge run's
own timings and judge calls, the time spent measuring agreement (bootstrap included),
the sample (seed, rows per stratum, input positions), and per judge, metric and measure
of the written ``agreement.parquet``: n, value and interval (low, high).

Verdicts per second = the judge run's ok score cells (one per labelled row and metric
whose verdict parsed; the run manifest's ``counts``) divided by the judge run's wall
time as the calibration recorded it (``judge_<judge>_s``: Ray start, engine load,
judging, writing and commit, all included). On a small sample the fixed start cost
dominates that figure.
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
from typing import Any

import numpy as np
import polars as pl
import yaml

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "_data"
WORK = DATA / "calibrate"
TINY_MODEL = DATA / "tiny-judge"
SMOLLM2 = ROOT / "models" / "smollm2"
CONFIGS = ("ares", "halueval", "hatecheck", "trec_dl")
RUN_ID = "bench"
SEED = 0
DEFAULT_LIMIT = 24
#: Measures shown in the table, in this order, when some row has a value for them.
MAIN_MEASURES = (
    "accuracy",
    "kappa",
    "roc_auc",
    "brier",
    "ece",
    "spearman",
    "kendall",
    "pairwise_agreement",
)


# -- the judge ---------------------------------------------------------------------------


def judge_model(choice: str | None) -> Path:
    """The judge model directory: the tiny random model (``None``), SmolLM2 (``smollm2``,
    built or reused by ``ragbatch models build``) or the directory ``choice``."""
    if choice is None:
        if not (TINY_MODEL / "config.json").exists():
            sys.path.insert(0, str(ROOT / "tests"))
            from support.judge_models import build_tiny_judge_model

            build_tiny_judge_model(TINY_MODEL)
        return TINY_MODEL
    if choice == "smollm2":
        subprocess.run(
            [sys.executable, "-m", "ragbatch", "models", "build", "smollm2", "--out", str(SMOLLM2)],
            cwd=ROOT,
            env=_env(0),
            check=True,
        )
        return SMOLLM2
    path = Path(choice).expanduser().resolve()
    if not (path / "config.json").is_file():
        raise SystemExit(
            f"--judge-model {choice}: no config.json there; give a local Hugging Face "
            "model directory, or `smollm2`"
        )
    return path


def judge_engine(
    engine: dict[str, Any],
    model: str,
    num_gpus: int,
    max_tokens: int | None,
    grammar_backend: str | None = None,
) -> dict[str, Any]:
    """A copy of one judge engine section pointed at ``model``.

    With ``num_gpus`` > 0 the engine spans that many GPUs (``num_gpus`` and
    ``tensor_parallel_size``), and the settings the shipped configs keep for the CPU demo
    model are dropped: ``engine_kwargs.enforce_eager`` (it turns CUDA graphs off, which
    slows decoding on a GPU), ``dtype: float32`` (twice the memory traffic of the model's
    own 16-bit weights) and the 128-token ``max_tokens`` cap (a real judge's replies run
    longer; a reply cut at the cap is a parse failure). ``max_tokens``, when given, is
    set in both cases. ``grammar_backend`` (``"xgrammar"`` or ``"guidance"``), when
    given, sets ``engine_kwargs.structured_outputs_config`` (compact JSON kept): on a
    CPU with a real model's vocabulary, xgrammar takes about a minute to compile each
    JSON schema whose strings have a ``maxLength``, llguidance milliseconds."""
    spec = dict(engine, model=model)
    if num_gpus > 0:
        spec.update(num_gpus=num_gpus, tensor_parallel_size=num_gpus)
        kwargs = {
            k: v for k, v in (spec.get("engine_kwargs") or {}).items() if k != "enforce_eager"
        }
        spec["engine_kwargs"] = kwargs
        if spec.get("dtype") == "float32":
            spec.pop("dtype")
        spec.pop("max_tokens", None)
    if max_tokens is not None:
        spec["max_tokens"] = max_tokens
    if grammar_backend is not None:
        spec["engine_kwargs"] = {
            **(spec.get("engine_kwargs") or {}),
            "structured_outputs_config": {
                "backend": grammar_backend,
                "disable_any_whitespace": True,
            },
        }
    return spec


# -- the stratified sample ---------------------------------------------------------------


def label_columns(config: dict[str, Any]) -> list[str]:
    """The input columns a config's labels read, in first-use order (none with ``pairs``:
    the label column is made from the pairs)."""
    if config.get("pairs"):
        return []
    return list(dict.fromkeys(spec["column"] for spec in config["labels"].values()))


def stratum_keys(frame: pl.DataFrame, columns: list[str]) -> list[str]:
    """Each row's stratum as text: its label value, or with several label columns the
    values joined by `` | `` in ``columns`` order.

    Label text is taken as written (any script), without surrounding blanks.

    Raises
    ------
    ValueError
        A column is missing, or holds null, empty or blank cells; the message names the
        column.
    """
    values = []
    for column in columns:
        if column not in frame.columns:
            raise ValueError(
                f"label column {column!r} is not in the input; its columns: {frame.columns}"
            )
        text = frame[column].cast(pl.String).str.strip_chars()
        missing = text.is_null() | (text == "")
        if missing.any():
            raise ValueError(
                f"label column {column!r} has {int(missing.sum())} null or empty cell(s), "
                f"the first at input row {int(missing.arg_max())}; every sampled row "
                "needs a label: fill or drop them"
            )
        values.append(text.to_list())
    return [" | ".join(row) for row in zip(*values)]


def stratified_positions(
    frame: pl.DataFrame, columns: list[str], per_label: int, seed: int = SEED
) -> tuple[list[int], dict[str, int]]:
    """Up to ``per_label`` rows of each stratum (:func:`stratum_keys`), drawn without
    replacement.

    The strata are taken in sorted order of their keys; each draws a random permutation
    of its row positions from one ``numpy.random.default_rng(seed)`` and keeps the first
    ``per_label``. A stratum with fewer rows keeps them all.

    Returns
    -------
    (positions, counts)
        The kept 0-based input row positions in input order, and rows kept per stratum
        key (sorted by key).
    """
    if per_label < 1:
        raise ValueError(f"per_label must be >= 1, got {per_label}")
    groups: dict[str, list[int]] = {}
    for position, key in enumerate(stratum_keys(frame, columns)):
        groups.setdefault(key, []).append(position)
    rng = np.random.default_rng(seed)
    kept: list[int] = []
    counts: dict[str, int] = {}
    for key in sorted(groups):
        chosen = rng.permutation(groups[key])[:per_label]
        kept += chosen.tolist()
        counts[key] = len(chosen)
    return sorted(kept), counts


def sampled_pairs(rows: int, per_label: int, seed: int = SEED) -> list[int]:
    """Up to ``per_label`` of ``rows`` input rows (pairs), drawn without replacement with
    ``numpy.random.default_rng(seed)``; positions in input order."""
    if per_label < 1:
        raise ValueError(f"per_label must be >= 1, got {per_label}")
    return sorted(np.random.default_rng(seed).permutation(rows)[:per_label].tolist())


def read_input(config: dict[str, Any]) -> pl.DataFrame:
    """A config's whole input, read as ``ragbatch calibrate`` reads it (every CSV/TSV cell
    text, an empty cell null)."""
    import pyarrow as pa

    from ragbatch.calibrate.config import calibration_from_dict
    from ragbatch.io.read import plan_read, read_task
    from ragbatch.io.text_formats import NONSTRING_COLUMN

    section = calibration_from_dict(config).input
    tables = [read_task(task, section) for task in plan_read(section)]
    frame = pl.from_arrow(pa.concat_tables(tables, promote_options="permissive"))
    return frame.drop(NONSTRING_COLUMN, strict=False)


def write_input(frame: pl.DataFrame, fmt: str, path: Path) -> None:
    """Write ``frame`` in input format ``fmt`` (csv, tsv, jsonl/json as JSON lines,
    parquet)."""
    if fmt in ("csv", "tsv"):
        frame.write_csv(path, separator="," if fmt == "csv" else "\t")
    elif fmt in ("jsonl", "json"):
        frame.write_ndjson(path)
    else:
        frame.write_parquet(path)


def sample_input(config: dict[str, Any], name: str, per_label: int, seed: int) -> dict[str, Any]:
    """Write the stratified sample of ``config``'s input into :data:`WORK`, point
    ``config`` at it (in place) and return what was sampled."""
    frame = read_input(config)
    columns = label_columns(config)
    if columns:
        positions, counts = stratified_positions(frame, columns, per_label, seed)
    else:
        pairs = config["pairs"]
        positions = sampled_pairs(frame.height, per_label, seed)
        counts = {f"{value:g}": len(positions) for value in pairs["answers"].values()}
    source = Path(config["input"]["uri"])
    path = WORK / f"{name}_sample{source.suffix}"
    fmt = config["input"].get("format") or source.suffix.lstrip(".")
    write_input(frame[positions], fmt, path)
    config["input"]["uri"] = str(path)
    config.pop("limit", None)
    return {
        "seed": seed,
        "per_label": per_label,
        "label_columns": columns or [config["pairs"].get("label_column", "pair_label")],
        "pairs": not columns,
        "input_rows": frame.height,
        "rows": len(positions),
        "per_stratum": counts,
        "positions": positions,
        "file": str(path),
    }


# -- the agreement table -----------------------------------------------------------------


def agreement_records(table: pl.DataFrame) -> list[dict[str, Any]]:
    """One record per (judge, metric) of a calibration's ``agreement`` table, in table
    order: ``judge``, ``metric``, ``label_column``, ``label_type``, ``n_cells``,
    ``n_ok``, ``n_labelled`` and ``measures`` (measure -> ``n``, ``value``, ``low``,
    ``high``, ``reason``; value and interval None when undefined)."""
    records: dict[tuple[str, str], dict[str, Any]] = {}
    for r in table.iter_rows(named=True):
        key = (r["judge"], r["metric"])
        if key not in records:
            records[key] = {
                k: r[k]
                for k in (
                    "judge",
                    "metric",
                    "label_column",
                    "label_type",
                    "n_cells",
                    "n_ok",
                    "n_labelled",
                )
            }
            records[key]["measures"] = {}
        records[key]["measures"][r["measure"]] = {
            "n": r["n"],
            "value": r["value"],
            "low": r["ci_low"],
            "high": r["ci_high"],
            "reason": r["reason"],
        }
    return list(records.values())


def format_measure(m: dict[str, Any] | None) -> str:
    """``value [low, high]`` to three decimals; ``value`` alone without an interval;
    ``n/a`` when undefined or absent."""
    if not m or m.get("value") is None:
        return "n/a"
    text = f"{m['value']:.3f}"
    if m.get("low") is not None and m.get("high") is not None:
        text += f" [{m['low']:.3f}, {m['high']:.3f}]"
    return text


def measures_present(rows: list[dict[str, Any]]) -> list[str]:
    """The :data:`MAIN_MEASURES` that some row has a value for, in that order."""
    return [
        name
        for name in MAIN_MEASURES
        if any((r.get("measures", {}).get(name) or {}).get("value") is not None for r in rows)
    ]


def table_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The table rows of one config's result: one per judge and metric, ``n`` the most
    rows any of its measures used, a note when some of its score cells are not ok
    (unparsed replies, refusals); the config's judge calls, verdicts per second and wall
    seconds on its first row; one row with the error when it failed."""
    if result.get("error"):
        return [
            {
                "config": result["config"],
                "metric": "",
                "note": f"error: {result['error']}",
                "wall_s": result.get("wall_s"),
            }
        ]
    records = result["agreement"]
    several = len({r["judge"] for r in records}) > 1
    rows = []
    for i, rec in enumerate(records):
        sizes = [m["n"] for m in rec["measures"].values() if m["n"] is not None]
        row = {
            "config": result["config"],
            "n": max(sizes, default=None),
            "metric": f"{rec['judge']}:{rec['metric']}" if several else rec["metric"],
            "measures": rec["measures"],
        }
        if rec["n_ok"] < rec["n_cells"]:
            row["note"] = f"{rec['n_ok']} of {rec['n_cells']} verdicts ok"
        if i == 0:
            row.update(
                judge_calls=result["judge_calls"],
                verdicts_per_s=result["verdicts_per_s"],
                wall_s=result["wall_s"],
            )
        rows.append(row)
    return rows


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """One markdown table: config, metric, n, the measures present (value [interval]),
    judge calls, verdicts/s, wall s; ``of raw vLLM`` (raw/ragbatch throughput) and
    ``note`` only when some row has one."""
    measures = measures_present(rows)
    raw = any(r.get("raw_fraction") is not None for r in rows)
    notes = any(r.get("note") for r in rows)
    head = ["config", "metric", "n", *measures, "judge calls", "verdicts/s", "wall s"]
    head += ["of raw vLLM"] * raw + ["note"] * notes
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["config"], r.get("metric", ""), _num(r.get("n"), "d")]
        cells += [
            format_measure(r.get("measures", {}).get(m)) if r.get("measures") else ""
            for m in measures
        ]
        cells += [
            _num(r.get("judge_calls"), "d"),
            _num(r.get("verdicts_per_s"), ".2f"),
            _num(r.get("wall_s"), ".1f"),
        ]
        cells += [_num(r.get("raw_fraction"), ".3f")] * raw + [r.get("note") or ""] * notes
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


def _num(value: Any, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


# -- one calibration ---------------------------------------------------------------------


def _env(num_gpus: int) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(ROOT))
    if num_gpus == 0:
        env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    return env


def prepare_config(
    name: str, args: argparse.Namespace, model: Path, out: Path
) -> tuple[dict, dict | None]:
    """The config copy of ``jobs/calibrate_<name>.yaml`` (judge engines, output root,
    input) and the sample record (None with ``--limit``)."""
    config = yaml.safe_load((ROOT / "jobs" / f"calibrate_{name}.yaml").read_text())
    config["output"]["uri"] = str(out)
    config["input"]["uri"] = str(ROOT / config["input"]["uri"])
    for judge in config["judges"]:
        config["engines"][judge] = judge_engine(
            config["engines"][judge],
            str(model),
            args.num_gpus,
            args.max_tokens,
            args.grammar_backend,
        )
    sample = None
    if args.per_label is not None:
        sample = sample_input(config, name, args.per_label, args.seed)
    return config, sample


def read_results(out: Path) -> dict[str, Any]:
    """What the committed calibration under ``out`` recorded: rows, judge timings and
    calls, ok cells, and its agreement records."""
    from ragbatch.analysis.runs import find_run
    from ragbatch.calibrate.output import find_calibration

    cal = find_calibration(str(out), RUN_ID)
    manifest = cal.manifest
    runs, calls, ok, judged = {}, 0, 0, 0.0
    for judge, run_id in manifest["scores_runs"].items():
        run = find_run(str(out), run_id).manifest
        run_ok = sum(int(c.get("ok", 0)) for c in run.counts.values())
        runs[judge] = {
            "timings_s": run.timings_s,
            "judge_calls": run.judge.total.judge_calls,
            "counts": run.counts,
            "ok_cells": run_ok,
        }
        calls += runs[judge]["judge_calls"]
        ok += run_ok
        judged += manifest["timings"][f"judge_{judge}_s"]
    return {
        "rows": manifest["labelled_input"]["rows"],
        "runs": runs,
        "judge_calls": calls,
        "ok_cells": ok,
        "judge_runs_s": round(judged, 1),
        "verdicts_per_s": round(ok / judged, 3) if judged else None,
        "agreement_s": round(manifest["timings"]["total_s"] - judged, 2),
        "agreement": agreement_records(cal.table("agreement")),
    }


def run_one(name: str, args: argparse.Namespace, model: Path) -> dict[str, Any]:
    """One timed ``ragbatch calibrate`` of ``jobs/calibrate_<name>.yaml``; a failure is
    recorded (``error``: the last line of its stderr) rather than raised."""
    out = WORK / name
    shutil.rmtree(out, ignore_errors=True)
    config, sample = prepare_config(name, args, model, out)
    path = WORK / f"calibrate_{name}.yaml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True))
    command = [sys.executable, "-m", "ragbatch", "calibrate", str(path), "--run-id", RUN_ID]
    if sample is None:
        command += ["--limit", str(args.limit)]
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(
        command, cwd=ROOT, env=_env(args.num_gpus), capture_output=True, text=True
    )
    wall = round(time.perf_counter() - t0, 1)
    result = {
        "config": name,
        "limit": None if sample else args.limit,
        "sample": sample,
        "metrics": [m["name"] for m in config["metrics"]],
        "wall_s": wall,
        "load_before": load,
    }
    if proc.returncode != 0:
        lines = [x for x in proc.stderr.strip().splitlines() if x.strip()]
        return {
            **result,
            "error": f"exit {proc.returncode}: {lines[-1] if lines else ''}"[:300],
            "stderr_tail": proc.stderr[-3000:],
        }
    return {**result, **read_results(out), "stdout_tail": proc.stdout[-3000:]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    rows = p.add_mutually_exclusive_group()
    rows.add_argument(
        "--limit",
        type=int,
        default=None,
        help=f"first N input rows per config (pairs count once; default {DEFAULT_LIMIT})",
    )
    rows.add_argument(
        "--per-label",
        type=int,
        default=None,
        metavar="N",
        help="seeded stratified sample: up to N input rows per label value (pairs: N pairs)",
    )
    p.add_argument("--seed", type=int, default=SEED, help="seed of --per-label's sample")
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument(
        "--judge-model",
        default=None,
        help="judge model directory, or `smollm2` (default: the tiny random test model)",
    )
    p.add_argument("--num-gpus", type=int, default=0, help="GPUs of the judge engine (0: CPU)")
    p.add_argument("--max-tokens", type=int, default=None, help="override the engines' max_tokens")
    p.add_argument(
        "--grammar-backend",
        choices=("xgrammar", "guidance"),
        default=None,
        help="structured-output backend of the judge engines (default: the config's, xgrammar)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=DATA / "calibrate.json",
        help="JSON results; the markdown table goes next to it (.md)",
    )
    args = p.parse_args(argv)
    if args.per_label is None and args.limit is None:
        args.limit = DEFAULT_LIMIT
    return args


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    WORK.mkdir(parents=True, exist_ok=True)
    model = judge_model(args.judge_model)
    results = [run_one(name, args, model) for name in args.configs.split(",") if name]
    rows = [row for r in results for row in table_rows(r)]
    markdown = markdown_table(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "machine": platform.platform(),
                "cpus": os.cpu_count(),
                "judge_model": str(model),
                "num_gpus": args.num_gpus,
                "max_tokens": args.max_tokens,
                "grammar_backend": args.grammar_backend,
                "limit": args.limit,
                "per_label": args.per_label,
                "seed": args.seed,
                "results": results,
                "rows": rows,
            },
            indent=2,
            ensure_ascii=False,
        )
        + "\n"
    )
    args.out.with_suffix(".md").write_text(markdown + "\n")
    for r in results:
        if r.get("error"):
            print(f"{r['config']:<10} FAILED after {r['wall_s']:.1f} s: {r['error']}")
            continue
        print(
            f"{r['config']:<10} {r['rows']:>5} rows  {len(r['metrics'])} metrics  "
            f"wall {r['wall_s']:>7.1f} s  "
            f"judge runs {r['judge_runs_s']:>7.1f} s  agreement {r['agreement_s']:>5.2f} s  "
            f"(load {r['load_before']:.1f})"
        )
    print()
    print(markdown)
    print(f"\nresults: {args.out} and {args.out.with_suffix('.md')}")
    return results


if __name__ == "__main__":
    sys.exit(1 if any(r.get("error") for r in main()) else 0)
