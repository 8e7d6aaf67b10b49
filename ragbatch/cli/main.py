"""The ``ragbatch`` parser, the dispatch to each command and the exit status of errors."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import shlex
import sys
from typing import Sequence

from ragbatch import __version__
from ragbatch.core.allocator import keep_freed_pages_for_polars, prefer_jemalloc
from ragbatch.core.errors import (
    ConfigError,
    InputError,
    JobNotFoundError,
    RagbatchError,
    RunInProgressError,
)
from ragbatch.core.exit_codes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_INVALID, EXIT_OK
from ragbatch.core.redact import install_log_redaction, redact_text
from ragbatch.cli.analysis import _add_compare_parser, _add_report_parser, cmd_compare, cmd_report
from ragbatch.cli.cache import _add_cache_parser, cmd_cache
from ragbatch.cli.common import (
    _RUN_ID,
    _add_config_args,
    _add_degenerate_flag,
    _add_rejudge_flag,
    _positive_int,
)
from ragbatch.cli.jobs import _add_job_parsers, cmd_logs, cmd_status, cmd_submit
from ragbatch.cli.metrics import cmd_metrics
from ragbatch.cli.nightly import _add_nightly_parser, cmd_nightly
from ragbatch.cli.pairwise import add_pairwise_parser, cmd_pairwise
from ragbatch.cli.run import cmd_run
from ragbatch.cli.validate import cmd_validate


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ragbatch", description="Evaluate RAG traces at corpus scale on Ray Data."
    )
    parser.add_argument("--version", action="version", version=f"ragbatch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a job config end to end")
    _add_config_args(run)
    run.add_argument("--run-id", type=_RUN_ID, help="run id (default: generated, or run.run_id)")
    run.add_argument(
        "--run-date",
        type=dt.date.fromisoformat,
        help="partition date YYYY-MM-DD (default: run.run_date, else today UTC)",
    )
    run.add_argument("--address", help="Ray cluster address (default: $RAY_ADDRESS, else local)")
    run.add_argument(
        "--report",
        action="store_true",
        help="after the run commits, write its HTML report and the comparison with the "
        "previous committed run under <output>/reports/run_date=.../run_id=.../",
    )
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan (stages, actors, resources, input rows) and the judge "
        "calls and tokens estimated on a sample, without running anything "
        "(no Ray is started; --run-id, --run-date and --address are not used)",
    )
    run.add_argument(
        "--sample-rows",
        type=_positive_int,
        default=None,
        metavar="N",
        help="with --dry-run: rows of the input the estimate is made on (default 200)",
    )
    run.add_argument(
        "--pilot-rows",
        type=_positive_int,
        default=None,
        metavar="N",
        help="with --dry-run: send the earlier steps of multi-step judge metrics "
        "for N sampled rows to the judge, and build their later prompts from "
        "the real replies (costs those calls; default: none, assumed)",
    )
    run.add_argument(
        "--allow-uncalibrated",
        action="store_true",
        help="run judge metrics whose agreement with human labels is missing or below "
        "calibration.min_agreement (warn instead of refusing)",
    )
    _add_degenerate_flag(run)
    _add_rejudge_flag(run, "none")

    validate = sub.add_parser(
        "validate", help="check a config, its input and params without running"
    )
    _add_config_args(validate)
    validate.add_argument(
        "--run-date",
        type=dt.date.fromisoformat,
        help="date for {run_date} in the URIs (default: run.run_date, else today UTC)",
    )
    validate.add_argument(
        "--address",
        help="check placement against this Ray cluster (dashboard URL "
        "http://HEAD:8265 or HEAD:6379; default: $RAY_ADDRESS, else this machine)",
    )

    metrics = sub.add_parser(
        "metrics", help="list every metric with inputs, params, range and source"
    )
    shape = metrics.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help="print JSON instead of text")
    shape.add_argument(
        "--markdown",
        action="store_true",
        help="print docs/metrics.md (the reference generated from the registry)",
    )
    shape.add_argument(
        "--examples",
        action="store_true",
        help="print docs/metric-examples.md (every metric's worked examples, each one a test)",
    )
    metrics.add_argument(
        "--config",
        help="list the metrics a job config defines instead: id, params and each judge "
        "step's instructions as the judge sees them (rubric metrics' prompts)",
    )
    _add_compare_parser(sub)
    _add_report_parser(sub)
    _add_nightly_parser(sub)
    _add_job_parsers(sub)
    _add_cache_parser(sub)
    add_pairwise_parser(sub)
    from ragbatch.calibrate.cli import add_calibrate_parser

    add_calibrate_parser(sub)
    from ragbatch.models.cli import add_models_parser

    add_models_parser(sub)
    return parser


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from ragbatch.calibrate.cli import cmd_calibrate

    return cmd_calibrate(args)


def _cmd_models(args: argparse.Namespace) -> int:
    from ragbatch.models.cli import cmd_models

    return cmd_models(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ragbatch`` console script; returns the exit status."""
    keep_freed_pages_for_polars()  # before anything loads Polars (the parser's defaults do)
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    install_log_redaction()
    prefer_jemalloc()
    handlers = {
        "run": cmd_run,
        "validate": cmd_validate,
        "metrics": cmd_metrics,
        "compare": cmd_compare,
        "report": cmd_report,
        "nightly": cmd_nightly,
        "submit": cmd_submit,
        "status": cmd_status,
        "logs": cmd_logs,
        "calibrate": _cmd_calibrate,
        "models": _cmd_models,
        "cache": cmd_cache,
        "pairwise": cmd_pairwise,
    }
    try:
        return handlers[args.command](args)
    except (ConfigError, InputError, JobNotFoundError, RunInProgressError) as exc:
        print(f"ragbatch: error: {redact_text(str(exc))}", file=sys.stderr)
        return EXIT_INVALID
    except RagbatchError as exc:
        print(f"ragbatch: error: {redact_text(str(exc))}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt as exc:
        print(_interrupted_text(args, exc), file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of stdout went away (`ragbatch metrics --json | head -1`): what it
        # wanted was printed. Point stdout at /dev/null so that the interpreter's final
        # flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


def _interrupted_text(args: argparse.Namespace, exc: KeyboardInterrupt) -> str:
    """What Ctrl-C left: for a run that began staging, its id, where its scores are kept,
    and the command that resumes it."""
    from ragbatch.core.errors import RunInterrupted

    if not isinstance(exc, RunInterrupted):
        return "ragbatch: interrupted"
    words = ["ragbatch", args.command, args.config]
    if args.command == "nightly":
        words += ["--run-date", exc.run_date] + (["--run-id", exc.run_id] if args.run_id else [])
    else:
        words += ["--run-id", exc.run_id] + (["--run-date", exc.run_date] if args.run_date else [])
    for flag, value in (
        ("--input", getattr(args, "input_uri", None)),
        ("--output", getattr(args, "output_uri", None)),
    ):
        words += [flag, value] if value else []
    again = shlex.join(words)
    return (
        f"ragbatch: interrupted: run {exc.run_id} was not committed.\n"
        f"  scores staged so far are kept under {exc.staging_uri}/\n"
        f"  resume it (rows already scored are not scored again): {again}"
    )


if __name__ == "__main__":
    sys.exit(main())
