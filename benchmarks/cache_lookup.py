"""Judgment-cache lookups: one bucket file at a time against several at once.

Usage (from the repository root, in the project's virtual environment)::

    python benchmarks/cache_lookup.py [--entries 200000] [--batches 40] [--batch 64]
                                      [--threads 1,8] [--repeat 3]

It writes a synthetic cache of ``--entries`` entries (``cache_scale.write_filler``: 256
buckets, replies of 120-900 characters) twice: on local disk, and on an S3 endpoint on
loopback (moto in server mode, as the tests use: every read a real HTTP request, with
moto's own per-request cost standing in for a store's latency). Then, on each, it looks
up ``--batches`` batches of ``--batch`` groups that exist in the cache (a judge actor's
lookup per batch: the groups fall in dozens of buckets), through
:class:`ragbatch.judge.cache.JudgmentCache`, with ``LOOKUP_THREADS`` set to each value of
``--threads`` in turn, interleaved over ``--repeat`` rounds. Each round opens the cache
afresh, so every round reads the same footers and row groups.

It prints seconds per batch (median of the rounds), the ratio against the first
``--threads`` value, and the load average before and after. It checks that every
setting found the same entries. Nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import socket
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from cache_scale import write_filler  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _groups(uri: str, options: dict, n: int, seed: int) -> list[str]:
    """``n`` distinct groups that exist in the cache at ``uri``, drawn with ``seed``."""
    import pyarrow.parquet as pq

    from ragbatch.judge.cache_upkeep import open_files

    files = open_files(uri, options)
    present: list[str] = []
    for paths in files.bucket_files().values():
        for path in paths:
            with files.fs.open(path, "rb") as handle:
                present += pq.read_table(handle, columns=["group"]).column(0).unique().to_pylist()
    return random.Random(seed).sample(sorted(present), n)


def _time_lookups(uri: str, options: dict, batches: list[list[str]], threads: int) -> tuple:
    """Seconds per batch and entries found, for one fresh cache opened on ``uri``."""
    from ragbatch.judge import cache_store
    from ragbatch.judge.cache import JudgmentCache

    cache_store.LOOKUP_THREADS = threads
    cache = JudgmentCache(uri, options)
    found = 0
    start = time.perf_counter()
    for batch in batches:
        found += len(cache.lookup(batch))
    return (time.perf_counter() - start) / len(batches), found, cache.row_groups_read


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--entries", type=int, default=200_000)
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--batch", type=int, default=64, help="groups per lookup (rows per batch)")
    p.add_argument("--threads", default="1,8", help="LOOKUP_THREADS values, comma-separated")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    settings = [int(x) for x in args.threads.split(",")]

    import subprocess

    import s3fs

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = _free_port()
    # moto in its own process: in this one, serving each request would take this
    # process's GIL from the lookups it answers.
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    # cache_scale.write_filler opens the cache without storage options: the endpoint and
    # moto's test credentials come from the environment (botocore reads both).
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
    )
    options: dict = {}
    bucket = f"lookup-{uuid.uuid4().hex[:8]}"
    s3fs.S3FileSystem().mkdir(bucket)
    local = tempfile.mkdtemp(prefix="ragbatch-lookup-")
    stores = {
        "local disk": (f"{local}/cache", {}),
        "S3 on loopback": (f"s3://{bucket}/cache", options),
    }
    try:
        for name, (uri, opts) in stores.items():
            seconds = write_filler(uri, args.entries)
            print(f"{name}: {args.entries:,} entries written in {seconds:.1f} s", flush=True)
        for name, (uri, opts) in stores.items():
            groups = _groups(uri, opts, args.batches * args.batch, seed=1)
            batches = [groups[i : i + args.batch] for i in range(0, len(groups), args.batch)]
            times: dict[int, list[float]] = {t: [] for t in settings}
            found: dict[int, set] = {t: set() for t in settings}
            load_before = os.getloadavg()
            for _ in range(args.repeat):
                for threads in settings:
                    per_batch, n, row_groups = _time_lookups(uri, opts, batches, threads)
                    times[threads].append(per_batch)
                    found[threads].add((n, row_groups))
            load_after = os.getloadavg()
            if len({frozenset(v) for v in found.values()}) != 1:
                raise SystemExit(f"{name}: the settings found different entries: {found}")
            (entries, row_groups) = next(iter(found[settings[0]]))
            base = statistics.median(times[settings[0]])
            print(
                f"{name}: {args.batches} batches of {args.batch} groups, {entries:,} entries "
                f"and {row_groups:,} row groups read per pass; load before "
                f"{tuple(round(x, 2) for x in load_before)}, after "
                f"{tuple(round(x, 2) for x in load_after)}"
            )
            for threads in settings:
                median = statistics.median(times[threads])
                rounds = ", ".join(f"{t:.3f}" for t in times[threads])
                print(
                    f"  LOOKUP_THREADS={threads}: {median:.3f} s a batch (rounds {rounds}); "
                    f"{base / median:.2f}x the first setting's speed"
                )
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
