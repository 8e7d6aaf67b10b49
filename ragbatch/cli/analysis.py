"""``ragbatch compare`` and ``ragbatch report``: two committed runs compared; a run's HTML report."""

from __future__ import annotations

import argparse
from pathlib import Path

from ragbatch.core.exit_codes import EXIT_OK, EXIT_REGRESSION
from ragbatch.cli.common import (
    _RUN_ID,
    _add_fdr_arg,
    _add_storage_option_args,
    _column_list,
    _confidence,
    _other_root,
    _non_negative_int,
    _positive_int,
    _storage_options,
)


def _add_compare_parser(sub: argparse._SubParsersAction) -> None:
    from ragbatch.analysis.compare import MIN_SLICE_PAIRS
    from ragbatch.analysis.pairing import DEFAULT_MATCH_ON

    p = sub.add_parser("compare", help="compare two committed runs row by row (paired bootstrap)")
    p.add_argument(
        "--output",
        dest="output_uri",
        required=True,
        metavar="URI",
        help="output root of the baseline run (and of the candidate unless --candidate-output)",
    )
    p.add_argument("--candidate-output", metavar="URI", help="output root of the candidate run")
    _add_storage_option_args(p, "--output", "--candidate-output")
    p.add_argument("baseline", type=_RUN_ID, metavar="BASELINE_RUN_ID")
    p.add_argument("candidate", type=_RUN_ID, metavar="CANDIDATE_RUN_ID")
    p.add_argument(
        "--by",
        action="append",
        default=[],
        metavar="SLICE",
        help="also compare per value of this slice column (repeatable)",
    )
    p.add_argument(
        "--min-pairs",
        type=_positive_int,
        default=MIN_SLICE_PAIRS,
        metavar="N",
        help="fewest pairs a --by slice needs for its change to be flagged; fewer "
        "pairs give too narrow an interval (default %(default)s)",
    )
    p.add_argument(
        "--match-on",
        type=_column_list,
        default=DEFAULT_MATCH_ON,
        metavar="COLS",
        help="comma-separated columns whose content pairs rows with different row ids "
        f"(default: {','.join(DEFAULT_MATCH_ON)})",
    )
    p.add_argument(
        "--fail-on-regression",
        type=float,
        metavar="THRESHOLD",
        help=f"exit {EXIT_REGRESSION} when a metric's all-rows change is significant "
        "(after --fdr control), worse, and larger than THRESHOLD in the metric's units",
    )
    p.add_argument(
        "--confidence", type=_confidence, default=0.95, help="interval level (default 0.95)"
    )
    _add_fdr_arg(p)
    p.add_argument(
        "--top", type=_positive_int, default=10, help="rows listed per metric (default 10)"
    )
    p.add_argument(
        "--json", dest="json_path", metavar="FILE", help="also write the comparison as JSON"
    )


def _add_report_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write a self-contained HTML report of a committed run")
    p.add_argument(
        "--output",
        dest="output_uri",
        required=True,
        metavar="URI",
        help="output root the run was written to",
    )
    p.add_argument("run_id", type=_RUN_ID, metavar="RUN_ID")
    p.add_argument(
        "--baseline", type=_RUN_ID, metavar="RUN_ID", help="compare with this committed run"
    )
    p.add_argument(
        "--baseline-output", metavar="URI", help="output root of the baseline (default: --output)"
    )
    _add_storage_option_args(p, "--output", "--baseline-output")
    p.add_argument(
        "--html",
        "-o",
        dest="report_path",
        required=True,
        metavar="FILE",
        help="where to write the HTML file (a local path; --output names the run's root)",
    )
    p.add_argument(
        "--top", type=_positive_int, default=10, help="rows listed per metric (default 10)"
    )
    p.add_argument(
        "--trend-nights",
        type=_non_negative_int,
        default=14,
        metavar="N",
        help="show each metric's trend over the last N committed runs under the output "
        "root, this one included, and mark shifts that lasted 3 runs; 0: no trend "
        "(default %(default)s)",
    )


def cmd_compare(args: argparse.Namespace) -> int:
    from ragbatch.analysis.compare import compare_runs
    from ragbatch.analysis.compare_text import format_comparison
    from ragbatch.analysis.runs import find_run

    candidate_root, candidate_options = _other_root(args, "candidate")
    baseline = find_run(args.output_uri, args.baseline, _storage_options(args))
    candidate = find_run(candidate_root, args.candidate, candidate_options)
    result = compare_runs(
        baseline,
        candidate,
        by=args.by,
        match_on=args.match_on,
        confidence=args.confidence,
        top=args.top,
        threshold=args.fail_on_regression,
        min_pairs=args.min_pairs,
        fdr=args.fdr,
    )
    print(format_comparison(result))
    if args.json_path:
        Path(args.json_path).write_text(result.to_json() + "\n", encoding="utf-8")
    if args.fail_on_regression is not None and result.regressions().height:
        return EXIT_REGRESSION
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    from ragbatch.analysis.report import build_report
    from ragbatch.analysis.runs import find_run
    from ragbatch.calibrate.report import calibration_section

    baseline_root, baseline_options = _other_root(args, "baseline")
    run = find_run(args.output_uri, args.run_id, _storage_options(args))
    baseline = None
    if args.baseline:
        baseline = find_run(baseline_root, args.baseline, baseline_options)
    html = build_report(
        run,
        baseline,
        top=args.top,
        calibration_section=calibration_section,
        trend_nights=args.trend_nights,
    )
    Path(args.report_path).write_text(html, encoding="utf-8")
    print(
        f"report of run {run.run_id} written to {args.report_path}"
        + (f" (compared with {baseline.run_id})" if baseline else "")
    )
    return EXIT_OK
