"""``ragbatch nightly``: one night run, reported and compared."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

from ragbatch.core.exit_codes import EXIT_FAILED, EXIT_INVALID
from ragbatch.cli.common import (
    _RUN_ID,
    _add_config_args,
    _add_degenerate_flag,
    _add_fdr_arg,
    _add_rejudge_flag,
    _load,
    _non_negative,
)


def _add_nightly_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "nightly",
        help="run one night, publish its report and comparison, "
        "exit with a code a scheduler can act on",
    )
    _add_config_args(p)
    p.add_argument(
        "--run-date",
        type=dt.date.fromisoformat,
        help="the night YYYY-MM-DD (default: run.run_date, else yesterday UTC)",
    )
    p.add_argument("--run-id", type=_RUN_ID, help="run id (default: nightly-<run date>)")
    p.add_argument("--address", help="Ray cluster address (default: $RAY_ADDRESS, else local)")
    p.add_argument(
        "--fail-on-regression",
        type=_non_negative,
        metavar="THRESHOLD",
        help="exit 3 when a metric's all-rows change against the previous committed "
        "run is significant (after --fdr control), worse, and larger than THRESHOLD "
        "in its units",
    )
    _add_fdr_arg(p)
    p.add_argument(
        "--no-report",
        dest="report",
        action="store_false",
        help="do not write report.html and the comparison files",
    )
    p.add_argument(
        "--allow-uncalibrated",
        action="store_true",
        help="run judge metrics whose agreement with human labels is missing or below "
        "calibration.min_agreement (warn instead of exiting 2)",
    )
    _add_degenerate_flag(p)
    _add_rejudge_flag(p, "parse_failure")


def cmd_nightly(args: argparse.Namespace) -> int:
    from ragbatch.ops.nightly_job import run_nightly
    from ragbatch.ops.nightly_summary import format_outcome

    outcome = run_nightly(
        _load(args),
        config_dir=Path(args.config).parent,
        run_date=args.run_date,
        run_id=args.run_id,
        address=args.address,
        fail_on_regression=args.fail_on_regression,
        report=args.report,
        allow_uncalibrated=args.allow_uncalibrated,
        fail_on_degenerate=args.fail_on_degenerate,
        fdr=args.fdr,
    )
    print(format_outcome(outcome))
    if outcome.exit_code in (EXIT_FAILED, EXIT_INVALID):
        print(f"ragbatch: error: {outcome.message}", file=sys.stderr)
    return outcome.exit_code
