"""Judgment-cache lookups on local disk and on S3 on loopback: seconds and requests a batch.

Usage (from the repository root, in the project's virtual environment)::

    python benchmarks/cache_lookup.py [--entries 200000] [--batches 40] [--batch 64]
                                      [--threads 1,8] [--repeat 3] [--baseline DIR]
                                      [--order input,bucket] [--s3-server moto|moto-keepalive|s3rver]

It writes a synthetic cache of ``--entries`` entries (``cache_scale.write_filler``: 256
buckets, replies of 120-900 characters) twice: on local disk, and on an S3 endpoint on
loopback (moto in server mode, in a process of its own, as the tests use: every read a
real HTTP request, with moto's own per-request cost standing in for a store's latency).
``--s3-server`` says which: ``moto``, ``python -m moto.server``, whose server answers
every request with ``Connection: close``, so the client opens a TCP connection for each
(the reference for every figure recorded before 2026-12-04's keep-alive run); or
``moto-keepalive``, the same moto application served by ``benchmarks/moto_keepalive.py``
with HTTP/1.1 connections kept open, as a real store keeps them; or ``s3rver``, a Node.js
S3 server that keeps connections open and spends less CPU a request than moto's Python
(not a dependency: ``npm install s3rver``, then its command on PATH or in ``$S3RVER``).
Then, on each, it looks up ``--batches`` batches of ``--batch`` groups that exist in the
cache (a judge actor's lookup per batch: the groups fall in dozens of buckets), through
:class:`ragbatch.judge.cache.JudgmentCache`, with ``LOOKUP_THREADS`` set to each value of
``--threads`` in turn, interleaved over ``--repeat`` rounds. Each round is a fresh
process that opens the cache afresh, so every round reads the same footers and row
groups; its first batches read footers, the later ones find them kept.

``--order`` says how a batch's groups are drawn: ``input``, at random (rows in input order
fall in dozens of buckets); ``bucket``, consecutive groups of a block sorted by bucket, as
the judge stage receives its rows once they are ordered by cache bucket
(:mod:`udfs.cache_order`; the block is all ``--batches x --batch`` groups). Each order
is run as its own setting, interleaved with the others.

``--baseline DIR`` names a source tree of another version of ``ragbatch`` (for example
``git archive <commit> ragbatch | tar -x -C DIR``): each round then runs that version
and this one, one after the other, on the same caches and groups.

It prints, per store, version and setting: seconds per batch (median of the rounds),
the row groups read from the store a pass (and those taken from memory, kept by the
reader from an earlier batch: ``ROW_GROUP_CACHE_BYTES``), the requests a batch made to
S3 (every S3 API call s3fs makes, counted by wrapping its call, after the cache is
opened: mean over all batches, and over the last quarter, when the footers of the files
touched are kept), the TCP connections the lookups opened (counted in aiohttp's
connector, which s3fs's requests go through), and the load average before and after. For
this tree it also times the same byte ranges fetched alone, with ``fs.cat_ranges`` and
no decoding: what the requests cost by themselves. It checks that every version and
setting, on both stores, found the same entries (their number, and a digest of every
key, group and reply found, which depends neither on the store nor on the server).
Nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import logging
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: A worker process reads the ragbatch of this tree (the parent sets it for a baseline).
TREE_VARIABLE = "RAGBATCH_LOOKUP_TREE"
sys.path[:0] = [os.environ.get(TREE_VARIABLE) or str(REPO), str(REPO / "benchmarks")]


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


def _count_s3_calls() -> Counter:
    """Count every S3 API call s3fs makes from now on, by operation name."""
    import s3fs

    calls: Counter = Counter()
    original = s3fs.S3FileSystem._call_s3

    async def counted(self, method, *args, **kwargs):
        calls[getattr(method, "__name__", str(method))] += 1
        return await original(self, method, *args, **kwargs)

    s3fs.S3FileSystem._call_s3 = counted
    return calls


def _count_connections() -> list[int]:
    """Count the TCP connections aiohttp opens from now on (s3fs's requests go through
    aiohttp's connector; one taken from its pool is not counted)."""
    import aiohttp

    opened = [0]
    original = aiohttp.TCPConnector._create_connection

    async def counted(self, *args, **kwargs):
        opened[0] += 1
        return await original(self, *args, **kwargs)

    aiohttp.TCPConnector._create_connection = counted
    return opened


def _digest(entries: dict) -> str:
    """A digest of every key, group and reply found (in no order but the keys')."""
    text = json.dumps(sorted(entries.items()), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _worker(job: dict) -> dict:
    """One round of one version and setting: open the cache, look up every batch."""
    from ragbatch.judge import cache_store
    from ragbatch.judge.cache import JudgmentCache

    calls = _count_s3_calls()
    connections = _count_connections()
    ranges = _record_ranges()
    cache_store.LOOKUP_THREADS = job["threads"]
    cache = JudgmentCache(job["uri"], {})
    calls.clear()  # opening (the listing) is not a lookup's
    opened_before = connections[0]
    found, per_batch, seconds, fetched, entries = 0, [], 0.0, [], {}
    for batch in job["batches"]:
        before = sum(calls.values())
        ranges.clear()
        start = time.perf_counter()
        result = cache.lookup(batch)
        seconds += time.perf_counter() - start
        found += len(result)
        entries.update(result)
        per_batch.append(sum(calls.values()) - before)
        fetched.append(list(ranges))
    opened = connections[0] - opened_before
    by_call = dict(calls)
    bare = None
    if any(fetched):  # this tree: the same ranges again, fetched alone
        start = time.perf_counter()
        for batch_ranges in fetched:
            cache.files.fs.cat_ranges(*(list(x) for x in zip(*batch_ranges)))
        bare = (time.perf_counter() - start) / len(fetched)
    return {
        "seconds": seconds / len(job["batches"]),
        "found": found,
        "digest": _digest(entries),
        "connections": opened,
        "row_groups": cache.row_groups_read,
        # taken from memory (a version without ROW_GROUP_CACHE_BYTES keeps none)
        "row_group_hits": getattr(cache.reader, "row_group_hits", 0),
        "requests": per_batch,
        "by_call": by_call,
        "bare": bare,
    }


def _record_ranges() -> list:
    """Record the byte ranges the cache's files fetch from now on (this tree's reader;
    the list stays empty for a version without ``start_fetch``)."""
    from ragbatch.judge.cache_files import CacheFiles

    seen: list = []
    for name in ("start_fetch", "fetch"):
        original = getattr(CacheFiles, name, None)
        if original is None or not hasattr(CacheFiles, "start_fetch"):
            continue

        def recording(self, ranges, _original=original):
            seen.extend(ranges)
            return _original(self, ranges)

        setattr(CacheFiles, name, recording)
    return seen


def _round(job: dict, tree: str | None) -> dict:
    """:func:`_worker` in a fresh process reading ``tree``'s ragbatch (None: this one)."""
    env = dict(os.environ)
    env.pop(TREE_VARIABLE, None)
    if tree:
        env[TREE_VARIABLE] = tree
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(job, handle)
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--worker", handle.name],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        os.unlink(handle.name)
    return json.loads(done.stdout.strip().splitlines()[-1])


#: ``--s3-server``: the command that serves moto's S3 on a port.
S3_SERVERS = {
    # werkzeug's server, as moto runs it: every response closes its connection
    "moto": [sys.executable, "-m", "moto.server"],
    # the same application, connections kept open (HTTP/1.1 keep-alive)
    "moto-keepalive": [sys.executable, str(REPO / "benchmarks" / "moto_keepalive.py")],
    # s3rver, a Node.js S3 server keeping objects in a folder (``npm install s3rver``; not
    # a dependency of the project): its command, or the path in the environment variable
    # S3RVER. It accepts only its own access key, S3RVER.
    "s3rver": [os.environ.get("S3RVER", "s3rver")],
}

#: The access key and secret each ``--s3-server`` accepts.
S3_CREDENTIALS = {"moto": "testing", "moto-keepalive": "testing", "s3rver": "S3RVER"}


def _server_command(kind: str, port: int) -> list[str]:
    """The command line of ``S3_SERVERS[kind]`` on 127.0.0.1:``port``."""
    if kind == "s3rver":
        if shutil.which(S3_SERVERS[kind][0]) is None:
            raise SystemExit(
                f"--s3-server s3rver: no command {S3_SERVERS[kind][0]!r}; install it with "
                "`npm install s3rver` and put node_modules/.bin on PATH or its path in $S3RVER"
            )
        data = tempfile.mkdtemp(prefix="ragbatch-s3rver-")
        atexit.register(shutil.rmtree, data, True)  # after main() has stopped the server
        return [
            *S3_SERVERS[kind],
            *("-d", data, "-a", "127.0.0.1", "-p", str(port), "--silent"),
            "--allow-mismatched-signatures",  # botocore signs for the endpoint's own host
        ]
    return [*S3_SERVERS[kind], "-H", "127.0.0.1", "-p", str(port)]


def serve_s3(kind: str = "moto") -> tuple[subprocess.Popen, int]:
    """Start ``S3_SERVERS[kind]`` on a free port of 127.0.0.1 in a process of its own and
    wait (up to about 20 s) until it accepts connections; (the process, its port)."""
    port = _free_port()
    server = subprocess.Popen(
        _server_command(kind, port),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if server.poll() is not None:
                raise SystemExit(
                    f"the S3 server {kind!r} exited with status {server.returncode} before "
                    f"it listened; run it by hand to see why: {' '.join(server.args)}"
                ) from None
            time.sleep(0.1)
    return server, port


def _start_moto(kind: str = "moto") -> tuple[subprocess.Popen, int]:
    """The S3 server ``S3_SERVERS[kind]`` (:func:`serve_s3`) in its own process (in
    this one, serving each request would take the GIL from the lookups it answers); the
    endpoint and its credentials go to the environment, which botocore and the worker
    processes read."""
    server, port = serve_s3(kind)
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID=S3_CREDENTIALS[kind],
        AWS_SECRET_ACCESS_KEY=S3_CREDENTIALS[kind],
    )
    return server, port


def _report(name: str, results: dict, load: tuple, args: argparse.Namespace) -> str:
    """Print one store's lines: per version and setting, seconds and requests a batch;
    return the digest of the entries found."""
    seen = {(r["found"], r["digest"]) for rounds in results.values() for r in rounds}
    if len(seen) != 1:
        raise SystemExit(f"{name}: the versions or settings found different entries: {seen}")
    ((entries, digest),) = seen
    print(
        f"{name}: {args.batches} batches of {args.batch} groups, {entries:,} entries found "
        f"per pass (digest {digest}); load before "
        f"{tuple(round(x, 2) for x in load[0])}, after {tuple(round(x, 2) for x in load[1])}"
    )
    first = None
    for (version, threads), rounds in results.items():
        times = [r["seconds"] for r in rounds]
        median = statistics.median(times)
        first = first or median
        line = (
            f"  {version}, LOOKUP_THREADS={threads}: {median:.3f} s a batch (rounds "
            f"{', '.join(f'{t:.3f}' for t in times)}); {first / median:.2f}x the first line"
        )
        line += f"; {rounds[0]['row_groups']:,} row groups read a pass"
        if rounds[0].get("row_group_hits"):
            line += f" and {rounds[0]['row_group_hits']:,} taken from memory"
        requests = rounds[0]["requests"]
        if any(requests):
            tail = requests[-max(1, len(requests) // 4) :]
            line += (
                f"; S3 requests a batch {statistics.mean(requests):.1f} (last quarter "
                f"{statistics.mean(tail):.1f}, most {max(requests)}; "
                f"{', '.join(f'{k} {v}' for k, v in sorted(rounds[0]['by_call'].items()))})"
            )
            line += (
                f"; TCP connections opened {rounds[0]['connections']} a pass "
                f"({rounds[0]['connections'] / len(requests):.2f} a batch)"
            )
        bare = [r["bare"] for r in rounds if r.get("bare") is not None]
        if bare:
            line += f"; the same ranges fetched alone {statistics.median(bare):.3f} s a batch"
        print(line, flush=True)
    return digest


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--entries", type=int, default=200_000)
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--batch", type=int, default=64, help="groups per lookup (rows per batch)")
    p.add_argument("--threads", default="1,8", help="LOOKUP_THREADS values, comma-separated")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--baseline", help="a source tree of another ragbatch, run interleaved")
    p.add_argument("--order", default="input,bucket", help="how batches draw groups: input, bucket")
    p.add_argument(
        "--s3-server",
        choices=sorted(S3_SERVERS),
        default="moto",
        help="moto: python -m moto.server, a connection a request; moto-keepalive: the same "
        "application with connections kept open (benchmarks/moto_keepalive.py); s3rver: "
        "Node.js's s3rver (npm install s3rver; its command on PATH or in $S3RVER)",
    )
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(_worker(json.loads(Path(args.worker).read_text()))))
        return
    settings = [int(x) for x in args.threads.split(",")]
    versions = ([("baseline", str(Path(args.baseline).resolve()))] if args.baseline else []) + [
        ("this tree", None)
    ]

    import s3fs

    from cache_scale import write_filler

    from ragbatch.judge.cache_files import bucket_of

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server, _ = _start_moto(args.s3_server)
    bucket = f"lookup-{uuid.uuid4().hex[:8]}"
    s3fs.S3FileSystem().mkdir(bucket)
    local = tempfile.mkdtemp(prefix="ragbatch-lookup-")
    stores = {
        "local disk": f"{local}/cache",
        f"S3 on loopback ({args.s3_server})": f"s3://{bucket}/cache",
    }
    digests = {}
    try:
        for name, uri in stores.items():
            seconds = write_filler(uri, args.entries)
            print(f"{name}: {args.entries:,} entries written in {seconds:.1f} s", flush=True)
        for name, uri in stores.items():
            groups = _groups(uri, {}, args.batches * args.batch, seed=1)
            results: dict[tuple[str, int], list[dict]] = {}
            load_before = os.getloadavg()
            for _ in range(args.repeat):
                for order in args.order.split(","):
                    drawn = sorted(groups, key=bucket_of) if order == "bucket" else groups
                    batches = [drawn[i : i + args.batch] for i in range(0, len(drawn), args.batch)]
                    for threads in settings:
                        for version, tree in versions:
                            job = {"uri": uri, "batches": batches, "threads": threads}
                            key = (f"{version}, {order} order", threads)
                            results.setdefault(key, []).append(_round(job, tree))
            digests[name] = _report(name, results, (load_before, os.getloadavg()), args)
        if len(set(digests.values())) != 1:  # the same seed writes the same entries
            raise SystemExit(f"the stores found different entries: {digests}")
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(local, ignore_errors=True)


if __name__ == "__main__":
    main()
