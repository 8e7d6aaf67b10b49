"""Scale benchmark: wall time and peak memory of ``ragbatch run`` as the corpus grows.

Usage (from the repository root, in the project's virtual environment)::

    python benchmarks/scale.py --stage expression --sizes 100000,1000000,10000000
    python benchmarks/scale.py --stage similarity --sizes 1000,10000,100000

For each size it

1. writes seeded synthetic RAG traces as hive-partitioned Parquet,
   ``<workdir>/scale/<stage>_<rows>/app=<name>/part-<k>.parquet`` (default workdir
   ``benchmarks/_data``, gitignored), unless that folder is already complete. Texts are
   cut at spaces from the pseudo-English corpus of ``expression_stage.py``; their
   lengths (:data:`LENGTHS`) are short enough that the largest input fits the disk;
2. runs the real pipeline, ``ragbatch run <config> --run-id scale`` with local Ray, in a
   child process, on a generated job config: the expression stage runs the eight metrics
   of ``expression_stage.py``; the similarity stage runs ``semantic_similarity`` on the
   packaged all-MiniLM-L6-v2 (an ``embedding`` engine);
3. while it runs, samples every ``--interval`` seconds (default 0.5) the memory of the
   driver (the ``ragbatch`` process) and of every process below it (Ray's GCS, raylet,
   workers and actors: a local Ray is started by the driver, so its whole tree is
   there): RSS, and where the kernel provides it PSS (shared pages such as Ray's object
   store in /dev/shm split between the processes mapping them, so PSS sums do not count
   them twice), plus the 1-minute load average;
4. checks row conservation on the output: the scores files hold ``rows x metrics``
   rows and every input row id appears once per metric (read back with DuckDB).

A run shorter than ``--min-single-s`` (default 60 s) is repeated until it has
``--repeat`` (default 3) runs and the median is reported. Finally it fits the exponent
``b`` of ``time = a * rows ** b`` by least squares on log-log, compares the peak memory
of the largest size with the smallest, prints a table and writes
``<workdir>/scale_<stage>.json``. Speed figures belong in BENCHMARKS.md; nothing here
asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from expression_stage import METRICS, _corpus, _load, machine, versions  # noqa: E402

DEFAULT_WORKDIR = ROOT / "benchmarks" / "_data"
SEED = 20241130
ROWS_PER_FILE = 20_000
#: Inputs larger than this (and a multiple of it) are copies of this size's files.
REPLICATE_ABOVE = 1_000_000
APPS = ("support-bot", "docs-search", "sales-assist", "hr-helpdesk", "dev-copilot")
DEFAULT_SIZES = {
    "expression": [100_000, 1_000_000, 10_000_000],
    "similarity": [1_000, 10_000, 100_000],
}

#: Text lengths in bytes, [low, high) per text, cut back to the previous space; contexts
#: per row in [low, high].
LENGTHS = {
    "expression": {
        "question": (40, 121),
        "answer": (80, 321),
        "reference": (80, 321),
        "context": (150, 451),
        "contexts_per_row": (2, 3),
    },
    "similarity": {
        "question": (40, 121),
        "answer": (60, 241),
        "reference": (60, 241),
        "context": (100, 201),
        "contexts_per_row": (1, 1),
    },
}
#: No ``row_id``: ragbatch generates ``<file>:<row index>`` ids, unique in the copied
#: inputs too. ``trace_id`` is then neither an input nor a slice.
COLUMNS = {
    "question": "question",
    "contexts": "contexts",
    "answer": "answer",
    "reference": "reference",
    "latency_s": "latency_s",
}
SLICES = ["app", "model_version"]


# --------------------------------------------------------------------------- data


class _TextSource:
    """Cuts texts of given byte lengths from one corpus, vectorised (no per-row Python)."""

    def __init__(self, rng) -> None:
        import numpy as np

        self.rng = rng
        self.corpus = np.frombuffer(_corpus(rng, 2_000_000), np.uint8)
        self.spaces = np.flatnonzero(self.corpus == 32)
        self.usable = int(np.searchsorted(self.spaces, len(self.corpus) - 2000))

    def texts(self, low: int, high: int, n: int):
        """``n`` texts as a ``pyarrow.StringArray``, each starting after a space and
        ending before one, of ``[low, high)`` bytes before the cut."""
        import numpy as np
        import pyarrow as pa

        lengths = self.rng.integers(low, high, n)
        begin = self.spaces[self.rng.integers(0, self.usable, n)] + 1
        end = self.spaces[np.searchsorted(self.spaces, begin + lengths) - 1]
        end = np.maximum(end, begin)
        sizes = end - begin
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        index = np.repeat(begin - offsets[:-1], sizes) + np.arange(offsets[-1])
        data = self.corpus[index]
        array = pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))
        array.validate(full=True)
        return array.cast(pa.string())


def _chunk(src: _TextSource, stage: str, start: int, n: int, seed: int):
    """One file's rows: question, 1-3 contexts, answer (1 % a refusal, 2 % a JSON object,
    30 % with two ``[n]`` markers), reference (10 % equal to the answer), latency."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    rng, size = src.rng, LENGTHS[stage]
    question = pc.binary_join_element_wise(src.texts(*size["question"], n), "?", "")
    answer = src.texts(*size["answer"], n)
    kind = rng.random(n)
    answer = pc.if_else(
        pa.array(kind < 0.01),
        pa.scalar("I don't know."),
        pc.if_else(
            pa.array(kind < 0.03),
            pc.binary_join_element_wise('{"answer": "', answer, '"}', ""),
            pc.if_else(
                pa.array(kind < 0.33),
                pc.binary_join_element_wise(answer, " [1] and [2].", ""),
                answer,
            ),
        ),
    )
    reference = pc.if_else(pa.array(rng.random(n) < 0.10), answer, src.texts(*size["reference"], n))
    low, high = size["contexts_per_row"]
    per_row = rng.integers(low, high + 1, n)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(per_row, out=offsets[1:])
    items = src.texts(*size["context"], int(offsets[-1]))
    ids = np.char.add(
        f"s{seed % 1000:03d}-", np.char.zfill(np.arange(start, start + n).astype(str), 9)
    )
    return pa.table(
        {
            "trace_id": pa.array(ids.tolist() if n < 1000 else ids, pa.string()),
            "question": question,
            "contexts": pa.ListArray.from_arrays(pa.array(offsets), items),
            "answer": answer,
            "reference": reference,
            "latency_s": pa.array(np.round(rng.lognormal(np.log(2.0), 0.6, n), 3)),
            "model_version": pa.array(np.array(["2024-06", "2024-07"])[rng.integers(0, 2, n)]),
        }
    )


def ensure_input(stage: str, rows: int, workdir: Path, seed: int = SEED) -> dict:
    """Generate (or reuse) the hive-partitioned input of ``rows`` rows; describe it.

    Files hold ``min(ROWS_PER_FILE, ceil(rows / 5))`` rows each, in one row group (so
    every size reads in tasks of the same 20,000 rows), and go round-robin into the five
    ``app=<name>`` folders. A ``_meta.json`` beside them marks
    a complete input; without it the folder is rebuilt.
    """
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    folder = workdir / "scale" / f"{stage}_{rows}"
    meta_path = folder / "_meta.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("seed") == seed and meta.get("lengths") == json.loads(
            json.dumps(LENGTHS[stage])
        ):
            return meta
    shutil.rmtree(folder, ignore_errors=True)
    if rows > REPLICATE_ABOVE and rows % REPLICATE_ABOVE == 0:
        return _replicate(stage, rows, workdir, seed)
    print(f"generating {rows:,} rows under {folder} ...", flush=True)
    t0 = time.perf_counter()
    src = _TextSource(np.random.default_rng([seed, rows]))
    per_file = min(ROWS_PER_FILE, math.ceil(rows / len(APPS)))
    chars = {"question": 0, "answer": 0, "reference": 0, "context": 0}
    n_contexts = uncompressed = 0
    for k, start in enumerate(range(0, rows, per_file)):
        n = min(per_file, rows - start)
        table = _chunk(src, stage, start, n, seed)
        for name in ("question", "answer", "reference"):
            chars[name] += pc.sum(pc.utf8_length(table[name])).as_py()
        flat = pc.list_flatten(table["contexts"])
        chars["context"] += pc.sum(pc.utf8_length(flat)).as_py()
        n_contexts += len(flat)
        uncompressed += table.nbytes
        path = folder / f"app={APPS[k % len(APPS)]}" / f"part-{k:05d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, row_group_size=n)
    files = sorted(folder.glob("app=*/*.parquet"))
    meta = {
        "path": str(folder),
        "rows": rows,
        "seed": seed,
        "lengths": LENGTHS[stage],
        "files": len(files),
        "file_bytes": sum(f.stat().st_size for f in files),
        "arrow_bytes": uncompressed,
        "mean_chars": {
            k: (v / n_contexts if k == "context" else v / rows) for k, v in chars.items()
        },
        "mean_contexts_per_row": n_contexts / rows,
        "generate_s": round(time.perf_counter() - t0, 1),
    }
    meta_path.write_text(json.dumps(meta, indent=2))
    return meta


def _replicate(stage: str, rows: int, workdir: Path, seed: int) -> dict:
    """An input of ``rows`` rows made of ``rows / REPLICATE_ABOVE`` copies of the
    ``REPLICATE_ABOVE``-row input's files (byte copies, new file names in the same
    ``app=`` folders): same text statistics, distinct generated row ids (the row id is
    ``<relative path>:<row index>``), and written in seconds instead of minutes."""
    base = ensure_input(stage, REPLICATE_ABOVE, workdir, seed)
    folder = workdir / "scale" / f"{stage}_{rows}"
    print(f"copying {base['path']} {rows // REPLICATE_ABOVE} times into {folder} ...", flush=True)
    t0 = time.perf_counter()
    sources = sorted(Path(base["path"]).glob("app=*/*.parquet"))
    for copy in range(rows // REPLICATE_ABOVE):
        for k, src in enumerate(sources):
            dst = folder / src.parent.name / f"part-{copy * len(sources) + k:05d}.parquet"
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
    files = sorted(folder.glob("app=*/*.parquet"))
    meta = dict(
        base,
        path=str(folder),
        rows=rows,
        files=len(files),
        file_bytes=sum(f.stat().st_size for f in files),
        arrow_bytes=base["arrow_bytes"] * (rows // REPLICATE_ABOVE),
        replicated_from=base["path"],
        generate_s=round(time.perf_counter() - t0, 1),
    )
    (folder / "_meta.json").write_text(json.dumps(meta, indent=2))
    return meta


# --------------------------------------------------------------------------- job


def job_config(
    stage: str,
    input_path: str,
    output: str,
    batch_size: int,
    concurrency: int = 1,
    num_cpus: float = 1.0,
) -> dict:
    """The ``ragbatch run`` config of one stage (``concurrency`` similarity model actors of
    ``num_cpus`` each)."""
    config = {
        "run": {"name": f"scale-{stage}"},
        "input": {"uri": input_path, "columns": COLUMNS, "slice_columns": SLICES},
        "output": {"uri": output},
    }
    if stage == "expression":
        config["metrics"] = METRICS
    else:
        config["metrics"] = [{"name": "semantic_similarity", "engine": "minilm"}]
        config["engines"] = {
            "minilm": {
                "type": "embedding",
                "num_gpus": 0,
                "num_cpus": num_cpus,
                "concurrency": concurrency,
                "batch_size": batch_size,
            }
        }
    return config


class MemorySampler(threading.Thread):
    """Samples the memory of a process and all its descendants until stopped.

    Attributes after :meth:`stop`: ``peak`` (bytes; ``driver_rss``, ``workers_rss``,
    ``total_rss``, ``driver_pss``, ``workers_pss``, ``total_pss``, each the largest
    value seen in any one sample), ``samples`` (int), ``max_processes`` (int),
    ``load`` (list of 1-minute load averages, one per second or so) and ``timeline``
    (every ``timeline_s`` seconds: ``{"t_s", "processes": [{"pid", "title", "rss_mib",
    "pss_mib", "uss_mib"}]}`` for each process over 100 MiB RSS, to follow one actor's
    memory over a run).
    """

    def __init__(self, pid: int, interval: float = 0.5, timeline_s: float = 60.0) -> None:
        super().__init__(daemon=True)
        import psutil

        self.root = psutil.Process(pid)
        self.interval = interval
        self.timeline_s = timeline_s
        self.timeline: list[dict] = []
        self.halt = threading.Event()
        self.peak = {
            k: 0
            for k in (
                "driver_rss",
                "workers_rss",
                "total_rss",
                "driver_pss",
                "workers_pss",
                "total_pss",
            )
        }
        self.samples = 0
        self.max_processes = 0
        self.load: list[float] = []
        self.pss_available = True

    def _memory(self, proc) -> tuple[int, int, int]:
        import psutil

        try:
            if self.pss_available:
                try:
                    full = proc.memory_full_info()
                    return full.rss, full.pss, full.uss
                except (AttributeError, psutil.AccessDenied):
                    self.pss_available = False
            return proc.memory_info().rss, 0, 0
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return 0, 0, 0

    def run(self) -> None:
        import psutil

        last_load = 0.0
        start = time.monotonic()
        last_mark = start - self.timeline_s  # a first entry at once, for short runs too
        while not self.halt.is_set():
            try:
                children = self.root.children(recursive=True)
            except psutil.NoSuchProcess:
                break
            d_rss, d_pss, d_uss = self._memory(self.root)
            w = [self._memory(p) for p in children]
            if time.monotonic() - last_mark >= self.timeline_s:
                last_mark = time.monotonic()
                self._mark(last_mark - start, [self.root, *children], [(d_rss, d_pss, d_uss), *w])
            w_rss, w_pss = sum(m[0] for m in w), sum(m[1] for m in w)
            now = {
                "driver_rss": d_rss,
                "workers_rss": w_rss,
                "total_rss": d_rss + w_rss,
                "driver_pss": d_pss,
                "workers_pss": w_pss,
                "total_pss": d_pss + w_pss,
            }
            for key, value in now.items():
                self.peak[key] = max(self.peak[key], value)
            self.samples += 1
            self.max_processes = max(self.max_processes, 1 + len(children))
            if time.monotonic() - last_load >= 1.0:
                self.load.append(os.getloadavg()[0])
                last_load = time.monotonic()
            self.halt.wait(self.interval)

    def _mark(self, t_s: float, procs: list, memory: list[tuple[int, int, int]]) -> None:
        import psutil

        mib = 2**20
        row = []
        for proc, (rss, pss, uss) in zip(procs, memory):
            if rss < 100 * mib:
                continue
            try:
                title = " ".join(proc.cmdline())[:80]
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
            known = self.pss_available  # without PSS/USS (no smaps access) say so: None
            row.append(
                {
                    "pid": proc.pid,
                    "title": title,
                    "rss_mib": round(rss / mib),
                    "pss_mib": round(pss / mib) if known else None,
                    "uss_mib": round(uss / mib) if known else None,
                }
            )
        self.timeline.append({"t_s": round(t_s), "processes": row})

    def stop(self) -> None:
        self.halt.set()
        self.join()


def conservation(output: str, rows: int, metric_ids: list[str]) -> dict:
    """Read the run's scores back: total rows, distinct row ids per metric."""
    import duckdb

    glob = f"{output}/scores/run_date=*/run_id=scale/**/*.parquet"
    con = duckdb.connect()
    con.execute("SET threads TO 2")
    total = con.execute(f"SELECT count(*) FROM read_parquet('{glob}')").fetchone()[0]
    per_metric = dict(
        con.execute(
            f"SELECT metric, count(DISTINCT row_id) FROM read_parquet('{glob}') GROUP BY 1"
        ).fetchall()
    )
    ok = total == rows * len(metric_ids) and per_metric == {m: rows for m in metric_ids}
    return {"score_rows": total, "distinct_row_ids_per_metric": per_metric, "ok": ok}


_STAT_KEYS = (
    "function_body_time_s",
    "task_scheduling_time_s",
    "block_serialization_time_s",
    "task_submission_backpressure_time",
    "task_worker_completion_time_s",
    "num_tasks_finished",
)


def ray_data_stats(log_text: str) -> dict:
    """Per-operator figures from the Ray Data log of the run's Ray session.

    The session folder is read from the run's own log (Ray prints "Full logs are in
    <session>/logs/ray-data"); from each "Operator <name> completed. Operator Metrics:"
    record the values of :data:`_STAT_KEYS` (seconds, summed over the operator's tasks)
    and the largest worker USS Ray saw (``max_uss_bytes``) are kept.
    """
    import re

    found = re.search(r"Full logs are in (\S+/logs/ray-data)", log_text)
    if not found:
        return {}
    out: dict = {"log_dir": found.group(1)}
    for log in sorted(Path(found.group(1)).glob("ray-data-dataset_*.log")):
        lines = log.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines[:-1]):
            head = re.search(r"Operator (.+) completed\. Operator Metrics:", line)
            if not head or head.group(1).startswith("InputDataBuffer"):
                continue
            body, op = lines[i + 1], {}
            for key in _STAT_KEYS:
                value = re.search(rf"'{key}': ([0-9.e+-]+)", body)
                if value:
                    op[key] = float(value.group(1))
            uss = re.search(r"'max_uss_bytes': \{[^}]*'max': ([0-9.e+-]+)", body)
            if uss:
                op["max_uss_bytes"] = float(uss.group(1))
            out[head.group(1)] = op
    return out


def run_once(stage: str, meta: dict, workdir: Path, args) -> dict:
    """One ``ragbatch run`` of ``meta``'s input under the memory sampler."""
    import yaml

    rows = meta["rows"]
    output = workdir / "scale_out" / f"{stage}_{rows}"
    shutil.rmtree(output, ignore_errors=True)
    config = job_config(
        stage, meta["path"], str(output), args.batch_size, args.concurrency, args.num_cpus
    )
    config_path = workdir / "scale" / f"job_{stage}_{rows}.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    ragbatch = Path(sys.executable).with_name("ragbatch")
    command = [
        str(ragbatch) if ragbatch.exists() else "ragbatch",
        "run",
        str(config_path),
        "--run-id",
        "scale",
    ]
    profile = workdir / "scale" / f"driver_{stage}_{rows}.prof"
    if args.profile:
        command = [
            sys.executable,
            "-m",
            "cProfile",
            "-o",
            str(profile),
            "-m",
            "ragbatch",
            "run",
            str(config_path),
            "--run-id",
            "scale",
        ]
    log = workdir / "scale" / f"run_{stage}_{rows}.log"
    for attempt in range(3):
        load_start = os.getloadavg()[0]
        t0 = time.perf_counter()
        with open(log, "w") as sink:
            proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)
            sampler = MemorySampler(proc.pid, args.interval)
            sampler.start()
            code = proc.wait()
            wall = time.perf_counter() - t0
            sampler.stop()
        # On a loaded machine a local Ray may not come up in time: start it again.
        if code == 0 or "timed out during startup" not in log.read_text(errors="replace"):
            break
        print(f"  Ray did not start in time (attempt {attempt + 1}); again", flush=True)
        shutil.rmtree(output, ignore_errors=True)
    if code != 0:
        sys.stderr.write(log.read_text()[-4000:])
        raise SystemExit(f"ragbatch run failed ({code}); log: {log}")
    from ragbatch.io.manifest_model import read_manifest

    manifest = read_manifest(str(next(output.glob("runs/run_date=*/run_id=scale/manifest.json"))))
    metric_ids = [m.get("id") or m["name"] for m in config["metrics"]]
    return {
        "wall_s": wall,
        "timings_s": manifest.timings_s,
        "read_tasks": manifest.input.read_tasks,
        "peak_bytes": sampler.peak,
        "pss_available": sampler.pss_available,
        "samples": sampler.samples,
        "max_processes": sampler.max_processes,
        "timeline": sampler.timeline,
        "load_start": load_start,
        "load_mean": statistics.fmean(sampler.load) if sampler.load else load_start,
        "load_max": max(sampler.load, default=load_start),
        "conservation": conservation(str(output), rows, metric_ids),
        "ray_data": ray_data_stats(log.read_text(errors="replace")),
        "output_bytes": sum(f.stat().st_size for f in output.rglob("*.parquet")),
        "command": "ragbatch run {} --run-id scale".format(
            config_path.relative_to(ROOT) if config_path.is_relative_to(ROOT) else config_path
        ),
        "profile": str(profile) if args.profile else None,
    }


# --------------------------------------------------------------------------- report


def fit_exponent(rows: list[int], seconds: list[float]) -> float:
    """Slope ``b`` of ``log(seconds) = log(a) + b * log(rows)`` by least squares."""
    import numpy as np

    if len(rows) < 2:
        return float("nan")
    return float(np.polyfit(np.log(rows), np.log(seconds), 1)[0])


def fit_linear(rows: list[int], seconds: list[float]) -> tuple[float, float]:
    """``(fixed_s, per_million_rows_s)`` of ``seconds = fixed + per_row * rows`` by
    least squares."""
    import numpy as np

    if len(rows) < 2:
        return float("nan"), float("nan")
    slope, intercept = np.polyfit(np.asarray(rows, float), np.asarray(seconds, float), 1)
    return float(intercept), float(slope * 1e6)


def _ratio(large: float, small: float) -> float | None:
    return large / small if small else None


def _two(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def summarize(stage: str, sizes: dict[int, dict]) -> dict:
    rows = sorted(sizes)
    medians = [sizes[n]["median_wall_s"] for n in rows]
    small, large = sizes[rows[0]]["median_peak"], sizes[rows[-1]]["median_peak"]
    key = "total_pss" if small.get("total_pss") else "total_rss"
    return {
        "stage": stage,
        "exponent_wall": fit_exponent(rows, medians),
        "exponent_execute": fit_exponent(rows, [sizes[n]["median_execute_s"] for n in rows]),
        "linear_fit_wall": dict(zip(("fixed_s", "per_million_rows_s"), fit_linear(rows, medians))),
        "memory_key": key,
        "memory_ratio_largest_smallest": large[key] / small[key],
        "driver_rss_ratio": _ratio(large["driver_rss"], small["driver_rss"]),
        # None when the smallest run had no workers (the in-process executor starts none).
        "workers_rss_ratio": _ratio(large["workers_rss"], small["workers_rss"]),
    }


def report(result: dict) -> str:
    gib = 2**30
    lines = [
        f"{'rows':>11s} {'runs':>4s} {'wall s':>8s} {'exec s':>8s} {'rows/s':>9s} "
        f"{'drv RSS':>8s} {'wrk RSS':>8s} {'tot RSS':>8s} {'tot PSS':>8s} "
        f"{'load':>5s} {'rows ok':>7s}"
    ]
    for n, s in sorted(result["sizes"].items(), key=lambda kv: int(kv[0])):
        p = s["median_peak"]
        lines.append(
            f"{int(n):11,d} {len(s['runs']):4d} {s['median_wall_s']:8.1f} "
            f"{s['median_execute_s']:8.1f} {int(n) / s['median_wall_s']:9,.0f} "
            f"{p['driver_rss'] / gib:8.2f} {p['workers_rss'] / gib:8.2f} "
            f"{p['total_rss'] / gib:8.2f} {p['total_pss'] / gib:8.2f} "
            f"{statistics.fmean(r['load_mean'] for r in s['runs']):5.1f} "
            f"{str(all(r['conservation']['ok'] for r in s['runs'])):>7s}"
        )
    sm = result["summary"]
    lines += [
        "",
        f"fitted exponent of wall time vs rows: {sm['exponent_wall']:.3f} "
        f"(execute phase only: {sm['exponent_execute']:.3f}); linear fit: "
        f"{sm['linear_fit_wall']['fixed_s']:.1f} s + "
        f"{sm['linear_fit_wall']['per_million_rows_s']:.1f} s per million rows",
        f"peak memory, largest / smallest size ({sm['memory_key']}): "
        f"{sm['memory_ratio_largest_smallest']:.2f} (target <= 1.5); driver RSS "
        f"{_two(sm['driver_rss_ratio'])}, workers RSS {_two(sm['workers_rss_ratio'])}",
    ]
    return "\n".join(lines)


def measure_size(stage: str, rows: int, workdir: Path, args) -> dict:
    meta = ensure_input(stage, rows, workdir)
    runs = []
    while True:
        print(f"{stage}: ragbatch run on {rows:,} rows ({len(runs) + 1}) ...", flush=True)
        runs.append(run_once(stage, meta, workdir, args))
        r = runs[-1]
        print(
            f"  {r['wall_s']:.1f} s, peak total RSS {r['peak_bytes']['total_rss'] / 2**30:.2f} GiB,"
            f" load {r['load_mean']:.1f}, rows conserved: {r['conservation']['ok']}",
            flush=True,
        )
        if r["wall_s"] >= args.min_single_s or len(runs) >= args.repeat:
            break
    peaks = {k: statistics.median(r["peak_bytes"][k] for r in runs) for k in runs[0]["peak_bytes"]}
    return {
        "input": meta,
        "runs": runs,
        "median_wall_s": statistics.median(r["wall_s"] for r in runs),
        "median_execute_s": statistics.median(r["timings_s"]["execute_s"] for r in runs),
        "median_peak": peaks,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", choices=sorted(DEFAULT_SIZES), required=True)
    parser.add_argument("--sizes", help="comma-separated row counts (default: the stage's three)")
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs of a size whose first run is shorter than --min-single-s",
    )
    parser.add_argument("--min-single-s", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=0.5, help="memory sampling period, s")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=64,
        help="similarity engine batch_size (rows per model call)",
    )
    parser.add_argument(
        "--concurrency", type=int, default=1, help="similarity engine concurrency (model actors)"
    )
    parser.add_argument(
        "--num-cpus",
        type=float,
        default=1.0,
        help="similarity engine num_cpus per actor (two 1-CPU actors on a "
        "2-CPU machine leave none for the read tasks: use 0.5)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run the driver under cProfile (<workdir>/scale/driver_*.prof)",
    )
    parser.add_argument("--generate-only", action="store_true")
    parser.add_argument("--tag", default="", help="suffix of the results file name")
    args = parser.parse_args(argv)
    workdir = args.workdir.resolve()
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else DEFAULT_SIZES[args.stage]
    if args.generate_only:
        for n in sizes:
            print(json.dumps(ensure_input(args.stage, n, workdir)), flush=True)
        return 0
    results_path = workdir / f"scale_{args.stage}{args.tag}.json"
    result = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "versions": versions(),
        "load_at_start": _load(),
        "sizes": {},
    }
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    result["commit"] = commit
    for n in sizes:
        result["sizes"][n] = measure_size(args.stage, n, workdir, args)
        if len(result["sizes"]) > 1:
            result["summary"] = summarize(args.stage, result["sizes"])
        results_path.write_text(json.dumps(result, indent=2, default=str))
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    results_path.write_text(json.dumps(result, indent=2, default=str))
    if "summary" in result:
        print()
        print(report(result))
    print(f"\nresults: {results_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
