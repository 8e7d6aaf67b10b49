"""The ``ragbatch calibrate`` subcommand: arguments and console output."""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

from ragbatch.core.ids import id_argument


def add_calibrate_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``calibrate CONFIG [--run-id] [--run-date] [--address] [--output] [--limit]``."""
    p = sub.add_parser("calibrate", help="measure each judge metric's agreement with human labels")
    p.add_argument("config", help="path to the calibration config (YAML)")
    p.add_argument("--output", dest="output_uri", help="override output.uri")
    p.add_argument(
        "--run-id",
        type=id_argument("calibration id"),
        help="calibration id (default: generated); a failed calibration "
        "started again with its id reuses the judge runs that committed",
    )
    p.add_argument(
        "--run-date",
        type=dt.date.fromisoformat,
        help="partition date YYYY-MM-DD (default: today UTC)",
    )
    p.add_argument("--address", help="Ray cluster address (default: $RAY_ADDRESS, else local)")
    p.add_argument(
        "--limit",
        type=int,
        default=None,
        metavar="N",
        help="use the first N input rows (pairs count once); overrides `limit`",
    )


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Run a calibration and print where its tables went and the agreement table."""
    from ragbatch.calibrate.command import run_calibration
    from ragbatch.calibrate.config import load_calibration
    from ragbatch.calibrate.text import agreement_text
    from ragbatch.core.errors import ConfigError
    from ragbatch.core.redact import redact_url

    cal = load_calibration(args.config)
    if args.output_uri:
        cal.output.uri = args.output_uri
    if args.limit is not None:
        if args.limit < 1:
            raise ConfigError("--limit must be a positive number of rows")
        cal.limit = args.limit
    result = run_calibration(
        cal,
        run_id=args.run_id,
        run_date=args.run_date,
        address=args.address,
        config_dir=Path(args.config).parent,
    )
    print(
        f"calibration {result.run_id} committed ({result.manifest['labelled_input']['rows']} "
        f"labelled rows, {len(result.scores_run_ids)} judge(s))"
    )
    print(f"  tables:  {redact_url(result.path)}/{{agreement,confusion,disagreements}}.parquet")
    for judge, run_id in result.scores_run_ids.items():
        print(f"  scores of judge {judge}: run {run_id}")
    print()
    print(agreement_text(result.tables["agreement"], cal.bootstrap.confidence))
    return 0
