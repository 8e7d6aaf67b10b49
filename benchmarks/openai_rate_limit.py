"""The ``openai`` engine against a provider's rate limit: the share of the allowed
requests it uses, with the adaptive concurrency limit and with a fixed one.

A stand-in judge server (``tests/support/canned_judge_server.py``, in a process of its
own) admits chat requests at a fixed rate through a token bucket and answers the others
HTTP 429 with ``Retry-After`` (``retry-after-ms``: the time until its next token);
every admitted request waits ``--latency-s`` before its reply, as a model's generation
would. The bucket holds ``rate x --burst-s`` requests (at least 1: a bucket of one
admits requests no closer together than ``1 / rate``, the strictest limit). For each
allowed rate, bucket and mode, one engine sends ``rate x --seconds`` requests in one
``complete`` call, and the script prints:

* ``share``: admitted requests over the requests the bucket allowed while they came
  (its size plus the rate times the seconds from the first admitted request to the
  last), from the server's own log; 1.0 uses every request allowed;
* ``429s``: the requests the server refused, and ``429/req`` per request;
* the engine's ``concurrency_min`` / ``concurrency_max`` and its time paused for
  ``Retry-After``.

Modes: ``adaptive`` (the default engine: ``adaptive_concurrency: true``), ``static``
(``adaptive_concurrency: false``: ``--max-concurrency`` in flight, each request waiting
its own ``Retry-After``), and ``adaptive-0.5`` (the adaptive limit halved on a 429, as
RFC 5681 does, instead of multiplied by 0.7; a study variant, not a setting).

Usage (from the repository root)::

    .venv/bin/python benchmarks/openai_rate_limit.py --rates 10,25,50 --burst-s 0,0.2,1 \\
        --modes adaptive,static,adaptive-0.5 --seconds 8 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "tests"):  # for tests/support when run as a script
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from ragbatch.engines.openai import OpenAIEngine  # noqa: E402
from ragbatch.engines import openai_limits  # noqa: E402
from ragbatch.engines.openai import load_openai_engine  # noqa: E402
from ragbatch.judge.protocol import EngineRequest, Message, OutputSpec, run_sync  # noqa: E402
from support.canned_judge_server import SERVED_NAME, CannedJudgeProcess  # noqa: E402

MODES = ("adaptive", "static", "adaptive-0.5")
YES_NO = OutputSpec.of_choice(["yes", "no"], max_tokens=8)


def run_once(
    mode: str, rate: float, burst: int, latency_s: float, n: int, max_concurrency: int
) -> dict[str, Any]:
    """One engine, ``n`` requests, one server admitting ``rate`` a second.

    Returns
    -------
    dict
        ``mode``, ``rate``, ``burst``, ``requests``, ``share`` (in [0, 1]), ``refused``
        (429 replies), ``not_ok`` (requests whose status is not ``ok``; 0 expected),
        ``wall_s`` (seconds of the ``complete`` call) and the engine's concurrency
        counters.
    """
    default = openai_limits.DECREASE_FACTOR
    openai_limits.DECREASE_FACTOR = 0.5 if mode == "adaptive-0.5" else default
    spec = OpenAIEngine(
        type="openai",
        base_url="http://placeholder/v1",
        model=SERVED_NAME,
        logprobs=False,
        max_concurrency=max_concurrency,
        adaptive_concurrency=mode != "static",
        max_retries=0,
    )
    requests = [EngineRequest((Message("user", f"q{i}"),), YES_NO, seed=i) for i in range(n)]
    try:
        with CannedJudgeProcess("yes", rate_per_s=rate, burst=burst, latency_s=latency_s) as srv:
            spec = spec.model_copy(update={"base_url": srv.base_url})
            with load_openai_engine(spec) as engine:
                start = time.monotonic()
                out = run_sync(engine.complete(requests))
                wall = time.monotonic() - start
                stats = engine.stats()
            log, share = srv.log(), srv.admitted_share()
    finally:
        openai_limits.DECREASE_FACTOR = default
    return {
        "mode": mode,
        "rate": rate,
        "burst": burst,
        "requests": n,
        "share": round(share, 3),
        "refused": log["refused"],
        "not_ok": sum(c.status != "ok" for c in out),
        "wall_s": round(wall, 2),
        "concurrency_min": stats["concurrency_min"],
        "concurrency_max": stats["concurrency_max"],
        "retry_after_paused_s": stats["retry_after_paused_s"],
    }


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="10,25,50", help="allowed requests/s, comma-separated")
    parser.add_argument(
        "--burst-s", default="0,0.2,1", help="bucket sizes in seconds of the rate, comma-separated"
    )
    parser.add_argument("--modes", default="adaptive,static", help=f"of {', '.join(MODES)}")
    parser.add_argument("--latency-s", type=float, default=0.1, help="reply time per request")
    parser.add_argument("--seconds", type=float, default=8.0, help="requests = rate x seconds")
    parser.add_argument("--max-concurrency", type=int, default=16)
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per setting, the modes taking turns (median)"
    )
    parser.add_argument("--json", type=Path, help="also write every run here")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"unknown mode(s) {sorted(unknown)}; choose from {', '.join(MODES)}")
    runs: list[dict[str, Any]] = []
    print(
        f"{'rate':>5} {'burst':>5} {'mode':<13} {'share':>6} {'429s':>5} {'429/req':>7} "
        f"{'conc min-max':>12} {'paused s':>8} {'wall s':>6}"
    )
    for rate in _floats(args.rates):
        for burst in [max(1, round(rate * b)) for b in _floats(args.burst_s)]:
            n = max(2, round(rate * args.seconds))
            mine: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
            for _ in range(args.repeat):  # the modes interleaved, as the load drifts
                for mode in modes:
                    run = run_once(mode, rate, burst, args.latency_s, n, args.max_concurrency)
                    mine[mode].append(run)
                    runs.append(run)
            for mode in modes:
                _print_row(mine[mode])
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    return runs


def _print_row(runs: list[dict[str, Any]]) -> None:
    """The median run of one setting (by share), with every run's share."""
    middle = sorted(runs, key=lambda r: r["share"])[(len(runs) - 1) // 2]
    shares = "/".join(f"{r['share']:.3f}" for r in runs)
    refused = statistics.median(r["refused"] for r in runs)
    bad = sum(r["not_ok"] for r in runs)
    print(
        f"{middle['rate']:>5g} {middle['burst']:>5} {middle['mode']:<13} "
        f"{middle['share']:>6.3f} {refused:>5g} {refused / middle['requests']:>7.2f} "
        f"{middle['concurrency_min']:>5}-{middle['concurrency_max']:<6} "
        f"{middle['retry_after_paused_s']:>8.2f} {middle['wall_s']:>6.2f}"
        f"  runs {shares}" + (f"  NOT OK: {bad}" if bad else "")
    )


if __name__ == "__main__":
    main()
