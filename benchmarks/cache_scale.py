"""The judgment cache at scale: actor memory, start-up, hit rate and files per run as the
cache grows, against reading every entry into memory (how the cache worked before).

Usage (from the repository root, in the project's virtual environment)::

    python benchmarks/cache_scale.py --entries 1000000,10000000 --rows 100000

For each size it writes a synthetic cache of ``--entries`` filler entries (random
groups, reply texts of 120-900 characters, a tenth with token logprobs) straight into
the bucket layout, then judges night 1 (``--rows / 2`` rows) into it through
:class:`~ragbatch.judge.run.JudgeRunner` with an in-process stand-in judge that answers
at once (the reply :mod:`benchmarks.instant_judge` would give), and folds the journal as
a commit does. Night 2 (``--rows`` rows, the first half repeating night 1) is then
judged in a fresh process, the actor, in batches of ``--batch``, flushing after every
batch as a judge actor does; it reports peak RSS, start-up (opening the cache), wall
time, hit rate and judge calls, and the commit's fold reports the files written. The
baseline, run right after it in the same way, is a process that reads every entry's
key and reply into a dict, as each actor used to when it started.
Every figure is printed with the load average beside it; the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

#: Judge metrics of the run: faithfulness takes two steps.
METRICS = ("faithfulness", "context_relevancy", "hate_speech")


def _reset_peak() -> None:
    """Start this process's peak-RSS count afresh (a forked child inherits its parent's)."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        pass


def _peak_mib() -> float:
    """Peak RSS since :func:`_reset_peak`, in MiB (VmHWM; getrusage where there is no /proc)."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


class InstantEngine:
    """An in-process judge engine answering every request at once with the smallest
    valid reply (:func:`instant_judge.instance`), as benchmarks/instant_judge.py does."""

    model_id = "instant"
    max_model_len = 1_000_000

    def __init__(self) -> None:
        self.calls = 0

    def sampling_key(self) -> dict[str, Any]:
        return {"temperature": 0.0}

    def stats(self) -> dict[str, Any]:
        return {}

    async def complete(self, requests: Sequence[Any]) -> list[Any]:
        from instant_judge import instance

        from ragbatch.judge.protocol import Completion

        out = []
        for r in requests:
            self.calls += 1
            if r.output.choice:
                text = r.output.choice[0]
            else:
                text = json.dumps(instance(json.loads(r.output.json_schema or "{}")))
            out.append(
                Completion(
                    "ok", text=text, finish_reason="stop", prompt_tokens=100, completion_tokens=10
                )
            )
        return out


def _rows(start: int, n: int) -> list[dict[str, Any]]:
    return [
        {
            "row_id": f"r{i}",
            "question": f"What does document {i} say about topic {i % 97}?",
            "contexts": [f"Document {i}: topic {i % 97} is described at length here."],
            "answer": f"Document {i} says topic {i % 97} is described.",
            "reference": f"Topic {i % 97}.",
        }
        for i in range(start, start + n)
    ]


def write_filler(uri: str, entries: int, seed: int = 0) -> float:
    """Write ``entries`` synthetic entries into the buckets; return seconds."""
    import datetime as dt

    import pyarrow as pa

    from ragbatch.judge.cache_files import ENTRY_SCHEMA, ROW_GROUP_ROWS
    from ragbatch.judge.cache_upkeep import open_files

    t = time.perf_counter()
    rng = random.Random(seed)
    pool = "".join(rng.choice("abcdefghij klmnopqrstuvwxyz.,") for _ in range(100_000))
    logprobs = json.dumps([["1", -0.01, [["1", -0.01], ["0", -4.6]]]] * 8)
    files = open_files(uri, {})
    now = dt.datetime.now(dt.timezone.utc)
    per_bucket = entries // 256
    for b in range(256):
        n = per_bucket + (1 if b < entries % 256 else 0)
        groups = sorted(f"{b:02x}{rng.getrandbits(248):062x}" for _ in range(max(1, n // 4)))
        group_col = [groups[i * len(groups) // n] for i in range(n)]
        starts = [rng.randrange(0, 99_000) for _ in range(n)]
        texts = [pool[s : s + rng.randint(120, 900)] for s in starts]
        table = pa.table(
            {
                "group": group_col,
                "key": [f"{rng.getrandbits(256):064x}" for _ in range(n)],
                "metric": ["faithfulness"] * n,
                "text": texts,
                "finish_reason": ["stop"] * n,
                "prompt_tokens": [900] * n,
                "completion_tokens": [len(t) // 4 for t in texts],
                "model_id": ["instant"] * n,
                "logprobs": [logprobs if i % 10 == 0 else None for i in range(n)],
                "created_at": pa.array([now] * n, pa.timestamp("us", tz="UTC")),
                "last_used": pa.array([now] * n, pa.timestamp("us", tz="UTC")),
                "last_run": ["filler"] * n,
            },
            schema=ENTRY_SCHEMA,
        ).sort_by([("group", "ascending"), ("key", "ascending")])
        files.write(files.bucket_dir(f"{b:02x}"), table, ROW_GROUP_ROWS)
    return time.perf_counter() - t


def judge_night(uri: str | None, start: int, n: int, batch: int) -> dict[str, Any]:
    """Judge rows ``start .. start+n`` as one actor (without a cache when ``uri`` is
    None); the figures of the night."""
    import polars as pl

    from ragbatch.judge.batch import judge_frame
    from ragbatch.judge.protocol import run_sync
    from ragbatch.judge.cache import JudgmentCache
    from ragbatch.judge.run import JudgeRunner
    from ragbatch.scoring.registry import get_metric

    t0 = time.perf_counter()
    cache = JudgmentCache(uri, {}) if uri else None
    startup = time.perf_counter() - t0
    engine = InstantEngine()
    metrics = [get_metric(name).from_params({}) for name in METRICS]
    runner = JudgeRunner(engine, metrics, cache=cache)  # type: ignore[arg-type]
    schema = {
        "row_id": pl.String,
        "question": pl.String,
        "contexts": pl.List(pl.String),
        "answer": pl.String,
        "reference": pl.String,
    }
    hits = asked = flushes = 0
    for at in range(start, start + n, batch):
        frame = pl.DataFrame(_rows(at, min(batch, start + n - at)), schema=schema)
        run_sync(judge_frame(runner, frame))
        for tally in runner.take_tallies().values():
            hits += tally["cache_hits"]
            asked += tally["cache_hits"] + tally["judge_calls"]
        if cache is not None:
            cache.flush()
        flushes += 1
    wall = time.perf_counter() - t0
    return {
        "startup_s": round(startup, 3),
        "wall_s": round(wall, 1),
        "rows": n,
        "judge_calls": engine.calls,
        "requests": asked,
        "hit_rate": round(hits / asked, 4) if asked else None,
        "batches": flushes,
        "row_groups_read": cache.row_groups_read if cache is not None else 0,
        "peak_rss_mib": _peak_mib(),
    }


def load_everything(uri: str) -> dict[str, Any]:
    """The old start-up: every entry's key and reply read into one dict."""
    import pyarrow.parquet as pq

    from ragbatch.judge.cache_upkeep import open_files

    t0 = time.perf_counter()
    entries: dict[str, tuple] = {}
    files = open_files(uri, {})
    for paths in files.bucket_files().values():
        for path in paths:
            cols = [
                "key",
                "text",
                "finish_reason",
                "prompt_tokens",
                "completion_tokens",
                "logprobs",
            ]
            table = pq.read_table(path, columns=cols)
            for key, *rest in zip(*(table.column(c).to_pylist() for c in cols)):
                entries[key] = tuple(rest)
    return {
        "startup_s": round(time.perf_counter() - t0, 1),
        "entries": len(entries),
        "peak_rss_mib": _peak_mib(),
    }


def _child(kind: str, uri: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", kind, "--uri", uri, "--rows", str(args.rows)]
    cmd += ["--batch", str(args.batch)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--entries", default="1000000,10000000", help="filler entries, comma-separated")
    p.add_argument("--rows", type=int, default=100_000, help="rows of night 2 (night 1: half)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument(
        "--baseline-max",
        type=int,
        default=None,
        help="run the read-everything baseline only up to this many entries (default: always)",
    )
    p.add_argument("--child", choices=("night2", "nocache", "baseline"))
    p.add_argument("--uri")
    args = p.parse_args()
    if args.child:
        _reset_peak()
    if args.child in ("night2", "nocache"):
        uri = args.uri if args.child == "night2" else None
        print(json.dumps(judge_night(uri, 0, args.rows, args.batch)))
        return
    if args.child == "baseline":
        print(json.dumps(load_everything(args.uri)))
        return
    from ragbatch.judge.cache_upkeep import cache_stats, fold_journal, open_files

    results = []
    for entries in (int(e) for e in args.entries.split(",")):
        root = tempfile.mkdtemp(prefix="ragbatch-cache-bench-")
        uri = f"{root}/judge_cache"
        try:
            filler_s = write_filler(uri, entries)
            night1 = judge_night(uri, 0, args.rows // 2, args.batch)
            fold1 = fold_journal(open_files(uri, {}), "night-1")
            before = cache_stats(open_files(uri, {}))["buckets"]
            row = {"entries": entries, "filler_s": round(filler_s, 1), "load_before": _load()}
            row["night1"] = {**night1, "bucket_files_written": fold1.files_written}
            row["night2"] = _child("night2", uri, args)
            journal = len(open_files(uri, {}).journal_files())
            fold2 = fold_journal(open_files(uri, {}), "night-2")
            row["night2"].update(
                journal_files=journal,
                bucket_files_written=fold2.files_written,
                cache_entries_before=before.rows - before.touches,
                cache_bytes_before=before.bytes,
            )
            row["load_mid"] = _load()
            row["no_cache"] = _child("nocache", uri, args)
            if args.baseline_max is None or entries <= args.baseline_max:
                row["baseline"] = _child("baseline", uri, args)
            row["load_after"] = _load()
            print(json.dumps(row), flush=True)
            results.append(row)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    if len(results) > 1:
        a, b = results[0]["night2"], results[-1]["night2"]
        print(
            json.dumps(
                {
                    "memory_ratio": round(b["peak_rss_mib"] / a["peak_rss_mib"], 3),
                    "startup_ratio": round(b["startup_s"] / max(a["startup_s"], 1e-3), 2),
                    "wall_ratio": round(b["wall_s"] / a["wall_s"], 3),
                    "baseline_memory_ratio": (
                        round(
                            results[-1]["baseline"]["peak_rss_mib"]
                            / results[0]["baseline"]["peak_rss_mib"],
                            3,
                        )
                        if "baseline" in results[0] and "baseline" in results[-1]
                        else None
                    ),
                }
            )
        )


if __name__ == "__main__":
    main()
