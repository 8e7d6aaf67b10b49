"""The ``ragbatch pairwise`` command: arguments and console output."""

from __future__ import annotations

import argparse
import datetime as dt
import sys

from ragbatch.core.exit_codes import EXIT_DEGENERATE, EXIT_OK
from ragbatch.core.ids import id_argument


def add_pairwise_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``pairwise CONFIG [--run-id] [--run-date] [--output] [--max-questions]``."""
    p = sub.add_parser(
        "pairwise",
        help="judge the answers of several systems in pairs (both orders) and rate them",
    )
    p.add_argument("config", help="path to the pairwise config (YAML)")
    p.add_argument("--output", dest="output_uri", help="override output.uri")
    p.add_argument(
        "--run-id", type=id_argument("pairwise run id"), help="run id (default: generated)"
    )
    p.add_argument(
        "--run-date",
        type=dt.date.fromisoformat,
        help="partition date YYYY-MM-DD (default: today UTC)",
    )
    p.add_argument(
        "--max-questions",
        type=int,
        default=None,
        metavar="N",
        help="judge the first N matched questions; overrides pairwise.max_questions",
    )
    p.add_argument(
        "--fail-on-degenerate",
        action="store_true",
        help=f"exit {EXIT_DEGENERATE} when the run is written but the judge is flagged "
        "(position_bound or inconsistent), as `run --fail-on-degenerate` does for a "
        "degenerate judge metric",
    )


def cmd_pairwise(args: argparse.Namespace) -> int:
    """Run pairwise judging; print where it went, the ratings, the judge's consistency
    and biases, and any flag on the judge (also on stderr). Returns 0, or
    ``EXIT_DEGENERATE`` with ``--fail-on-degenerate`` when the judge is flagged."""
    from ragbatch.core.errors import ConfigError
    from ragbatch.core.redact import redact_url
    from ragbatch.ops.pairwise import run_pairwise
    from ragbatch.ops.pairwise_config import load_pairwise
    from ragbatch.ops.pairwise_output import FLAG_NOTES

    cfg = load_pairwise(args.config)
    if args.output_uri:
        cfg.output.uri = args.output_uri
    if args.max_questions is not None:
        if args.max_questions < 1:
            raise ConfigError("--max-questions must be a positive number of questions")
        cfg.pairwise.max_questions = args.max_questions
    run = run_pairwise(cfg, run_id=args.run_id, run_date=args.run_date)
    s = run.summary
    c = s["counts"]
    print(
        f"pairwise {run.run_id} written: {len(s['systems'])} systems, {c['questions']} "
        f"questions, {c['pairs']} pairs x 2 orders ({c['failed']} without a verdict); "
        f"{s['judge_calls']} judge calls, {s['cache_hits']} cache hits"
    )
    if c["null_answers"]:
        print(f"  {c['null_answers']} row(s) with a null answer left out of the pairs")
    print(f"  under: {redact_url(run.path)}/")
    print()
    print(f"  {'system':<24} {'rating':>7}  {'interval':>13}  {'win rate':>8}")
    for r in run.result.ratings.iter_rows(named=True):
        low, high = r["rating_ci_low"], r["rating_ci_high"]
        interval = "" if low is None or high is None else f"{low:.0f} to {high:.0f}"
        rate = "n/a" if r["win_rate"] is None else f"{r['win_rate']:.3f}"
        print(f"  {r['system']:<24} {r['rating']:>7.0f}  {interval:>13}  {rate:>8}")
    print()
    for label, key in (
        ("position consistency", "position_consistency"),
        ("position bias (first wins)", "position_bias"),
        ("length bias (longer wins)", "length_bias"),
    ):
        v = s[key]
        value = "n/a" if v["value"] is None else f"{v['value']:.3f}"
        interval = "" if v["ci_low"] is None else f" ({v['ci_low']:.3f} to {v['ci_high']:.3f})"
        print(f"  {label:<28} {value}{interval}, n={v['n']}")
    for flag in run.result.flags:
        text = f"JUDGE FLAGGED {flag}: {FLAG_NOTES[flag]}"
        print(f"\n  {text}")
        print(f"ragbatch: warning: {text}", file=sys.stderr)
    if args.fail_on_degenerate and run.result.flags:
        return EXIT_DEGENERATE
    return EXIT_OK
