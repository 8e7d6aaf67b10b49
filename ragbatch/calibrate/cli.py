"""The ``ragbatch calibrate`` subcommand: arguments and console output."""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path
from typing import Any

from ragbatch.core.ids import id_argument


def add_calibrate_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``calibrate CONFIG [--run-id] [--run-date] [--address] [--output] [--limit]
    [--align METRIC [--shots N] [--train-fraction F] [--seed S]]``."""
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
    align = p.add_argument_group(
        "aligning a judge metric (docs/calibration.md, \"Aligning a judge\")"
    )
    align.add_argument(
        "--align",
        metavar="METRIC",
        help="choose few-shot examples for metric id METRIC from a training split of the "
        "labelled rows, write them as an examples file, and measure the judge on the "
        "held-out rows without and with them",
    )
    align.add_argument(
        "--shots",
        type=int,
        metavar="N",
        help=f"examples to choose, balanced by label (default {ALIGN_DEFAULTS['shots']})",
    )
    align.add_argument(
        "--train-fraction",
        type=float,
        metavar="F",
        help="share of each label's rows to choose examples from, in (0, 1); the rest "
        f"are held out and measured (default {ALIGN_DEFAULTS['train_fraction']})",
    )
    align.add_argument(
        "--seed",
        type=int,
        metavar="S",
        help=f"seed of the split and of the choice of examples (default {ALIGN_DEFAULTS['seed']})",
    )


#: The defaults of ``--shots``, ``--train-fraction`` and ``--seed``
#: (:class:`ragbatch.calibrate.align_command.AlignOptions`).
ALIGN_DEFAULTS: dict[str, Any] = {"shots": 4, "train_fraction": 0.5, "seed": 0}


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Run a calibration and print where its tables went and the agreement table; with
    ``--align``, the alignment of one metric and its before/after table instead."""
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
    options = _align_options(args)
    if options is not None:
        return _cmd_align(args, cal, options)
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


def _align_options(args: argparse.Namespace) -> Any:
    """The :class:`~ragbatch.calibrate.align_command.AlignOptions` of ``--align``, or
    None without it.

    Raises
    ------
    ConfigError
        ``--shots``, ``--train-fraction`` or ``--seed`` without ``--align``.
    """
    from ragbatch.calibrate.align_command import AlignOptions
    from ragbatch.core.errors import ConfigError

    given = {k: getattr(args, k) for k in ALIGN_DEFAULTS if getattr(args, k) is not None}
    if args.align is None:
        if given:
            flags = ", ".join("--" + k.replace("_", "-") for k in given)
            raise ConfigError(f"{flags}: only with --align METRIC")
        return None
    return AlignOptions(args.align, **{**ALIGN_DEFAULTS, **given})


def _cmd_align(args: argparse.Namespace, cal: Any, options: Any) -> int:
    """Run ``--align`` and print the examples file, the split and the before/after table."""
    from ragbatch.calibrate.align_command import run_alignment
    from ragbatch.calibrate.align_measures import alignment_text
    from ragbatch.core.redact import redact_url

    result = run_alignment(
        cal,
        options,
        run_id=args.run_id,
        run_date=args.run_date,
        address=args.address,
        config_dir=Path(args.config).parent,
    )
    align = result.manifest["align"]
    split = align["split"]
    print(
        f"calibration {result.run_id} committed: {align['metric']} aligned with "
        f"{len(align['examples'])} example(s), measured on {split['held_out_rows']} held-out rows"
    )
    print(f"  examples file: {align['examples_file']}")
    print(f"  sha256:        {align['examples_sha256']}")
    print(
        f"  split:         seed {split['seed']}, train_fraction {split['train_fraction']}: "
        f"{split['train_rows']} training rows (ids sha256 {split['train_ids_sha256']}), "
        f"{split['held_out_rows']} held out (ids sha256 {split['held_out_ids_sha256']})"
    )
    print(f"  tables:        {redact_url(result.path)}/{{agreement,alignment}}.parquet")
    for judge, stages in align["runs"].items():
        print(f"  scores of judge {judge}: before {stages['before']}, after {stages['after']}")
    print()
    print(alignment_text(result.tables["alignment"], cal.bootstrap.confidence))
    return 0
