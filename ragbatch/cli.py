"""The ``ragbatch`` command line.

Commands: ``run``, ``validate``, ``metrics``, ``compare``, ``report``, ``nightly``,
``calibrate``, ``models build`` (a small real judge model, :mod:`ragbatch.models`), and
``submit``, ``status``, ``logs`` for Ray jobs. Exit status: 0 on success, 2 for a problem
in the config or input found before running (a run id that cannot name a directory, see
:mod:`ragbatch.ids`; another attempt of the same run id running now, see
:mod:`ragbatch.io.lease`; for ``compare`` and ``report``: an unknown run, root or column;
for ``status`` and ``logs``: an unknown job id), 1 for a failure while running (or an
unreachable cluster or package index), and 3 when ``compare --fail-on-regression`` finds
a metric that regresses beyond the threshold. ``run`` and ``nightly`` exit 5 when the run
committed but a judge metric's all-rows result is degenerate and ``--fail-on-degenerate``
(or ``diagnostics.fail_on_degenerate`` in the config) asks to gate on it (docs/judges.md,
"Judge health"). ``nightly`` adds 4 (the night's input is not there yet;
:mod:`ragbatch.nightly_job`). ``submit --wait`` exits with the job's own status.
Ctrl-C exits 130; a run it stops says where its staged scores are kept and how to resume.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Sequence

from ragbatch import __version__
from ragbatch.config import JobConfig, load_config
from ragbatch.errors import (
    ConfigError, InputError, JobNotFoundError, RagbatchError, RunInProgressError,
)
from ragbatch.exit_codes import (
    EXIT_DEGENERATE, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_INVALID, EXIT_OK, EXIT_REGRESSION,
)
from ragbatch.ids import id_argument
from ragbatch.redact import install_log_redaction, redact_text, redact_url
from ragbatch.run_date import choose_run_date

#: argparse ``type=`` of every run id argument: a bad id exits 2 before anything runs.
_RUN_ID = id_argument("run id")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ragbatch", description="Evaluate RAG traces at corpus scale on Ray Data."
    )
    parser.add_argument("--version", action="version", version=f"ragbatch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a job config end to end")
    _add_config_args(run)
    run.add_argument("--run-id", type=_RUN_ID, help="run id (default: generated, or run.run_id)")
    run.add_argument("--run-date", type=dt.date.fromisoformat,
                     help="partition date YYYY-MM-DD (default: run.run_date, else today UTC)")
    run.add_argument("--address", help="Ray cluster address (default: $RAY_ADDRESS, else local)")
    run.add_argument("--report", action="store_true",
                     help="after the run commits, write its HTML report and the comparison with the "
                          "previous committed run under <output>/reports/run_date=.../run_id=.../")
    run.add_argument("--dry-run", action="store_true",
                     help="print the plan (stages, actors, resources, input rows) and the judge "
                          "calls and tokens estimated on a sample, without running anything "
                          "(no Ray is started; --run-id, --run-date and --address are not used)")
    run.add_argument("--sample-rows", type=_positive_int, default=None, metavar="N",
                     help="with --dry-run: rows of the input the estimate is made on (default 200)")
    run.add_argument("--pilot-rows", type=_positive_int, default=None, metavar="N",
                     help="with --dry-run: send the earlier steps of multi-step judge metrics "
                          "for N sampled rows to the judge, and build their later prompts from "
                          "the real replies (costs those calls; default: none, assumed)")
    run.add_argument("--allow-uncalibrated", action="store_true",
                     help="run judge metrics whose agreement with human labels is missing or below "
                          "calibration.min_agreement (warn instead of refusing)")
    _add_degenerate_flag(run)

    validate = sub.add_parser("validate", help="check a config, its input and params without running")
    _add_config_args(validate)
    validate.add_argument("--run-date", type=dt.date.fromisoformat,
                          help="date for {run_date} in the URIs (default: run.run_date, else today UTC)")
    validate.add_argument("--address", help="check placement against this Ray cluster (dashboard URL "
                          "http://HEAD:8265 or HEAD:6379; default: $RAY_ADDRESS, else this machine)")

    metrics = sub.add_parser("metrics", help="list every metric with inputs, params, range and source")
    shape = metrics.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help="print JSON instead of text")
    shape.add_argument("--markdown", action="store_true",
                       help="print docs/metrics.md (the reference generated from the registry)")
    _add_compare_parser(sub)
    _add_report_parser(sub)
    _add_nightly_parser(sub)
    _add_job_parsers(sub)
    from ragbatch.calibrate.cli import add_calibrate_parser

    add_calibrate_parser(sub)
    from ragbatch.models.cli import add_models_parser

    add_models_parser(sub)
    return parser


def _add_nightly_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("nightly", help="run one night, publish its report and comparison, "
                                       "exit with a code a scheduler can act on")
    _add_config_args(p)
    p.add_argument("--run-date", type=dt.date.fromisoformat,
                   help="the night YYYY-MM-DD (default: run.run_date, else yesterday UTC)")
    p.add_argument("--run-id", type=_RUN_ID, help="run id (default: nightly-<run date>)")
    p.add_argument("--address", help="Ray cluster address (default: $RAY_ADDRESS, else local)")
    p.add_argument("--fail-on-regression", type=_non_negative, metavar="THRESHOLD",
                   help="exit 3 when a metric's all-rows change against the previous committed "
                        "run is significant, worse, and larger than THRESHOLD in its units")
    p.add_argument("--no-report", dest="report", action="store_false",
                   help="do not write report.html and the comparison files")
    p.add_argument("--allow-uncalibrated", action="store_true",
                   help="run judge metrics whose agreement with human labels is missing or below "
                        "calibration.min_agreement (warn instead of exiting 2)")
    _add_degenerate_flag(p)


def _add_degenerate_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fail-on-degenerate", action="store_true", default=None,
                   help=f"exit {EXIT_DEGENERATE} when the run commits but a judge metric's result "
                        "is degenerate (a constant judge, empty extractions, junk reasons...; "
                        "thresholds: the config's diagnostics section; default: "
                        "diagnostics.fail_on_degenerate)")


def _add_job_parsers(sub: argparse._SubParsersAction) -> None:
    address_help = ("the cluster's job server, http://HEAD:8265 "
                    "(default: $RAY_API_SERVER_ADDRESS, else $RAY_ADDRESS)")
    p = sub.add_parser("submit", help="submit a job config to a Ray cluster as a Ray job")
    _add_config_args(p)
    p.add_argument("--address", help=address_help)
    p.add_argument("--working-dir", metavar="DIR",
                   help="a ragbatch checkout to ship and run (its jobs/run.py); it must hold the "
                        "config (default: ship only the config and the callback modules next to "
                        "it, and run the cluster's installed ragbatch with python -m ragbatch)")
    p.add_argument("--run-id", type=_RUN_ID, help="run id (default: run.run_id, else generated now; "
                                    "with --nightly: nightly-<run date>)")
    p.add_argument("--run-date", type=dt.date.fromisoformat,
                   help="partition date YYYY-MM-DD, also for {run_date} in the URIs (default: "
                        "run.run_date, else today UTC; with --nightly: yesterday UTC)")
    p.add_argument("--nightly", action="store_true",
                   help="run it as the nightly job (as `ragbatch nightly`)")
    p.add_argument("--wait", action="store_true",
                   help="wait for the job to end and exit with its status")
    p.add_argument("--follow-logs", action="store_true",
                   help="print the job's logs as they come until it ends (implies --wait)")
    p.add_argument("--env", action="append", type=_env_pair, default=[], metavar="KEY=VALUE",
                   help="environment variable of the job's processes (repeatable)")
    p.add_argument("--pip", action="append", default=[], metavar="PKG",
                   help="package Ray installs into the job's environment (repeatable; for "
                        "example 'ragbatch[s3]==VERSION' where the cluster's image lacks ragbatch)")
    p.add_argument("--entrypoint-num-cpus", type=float, metavar="N",
                   help="CPUs reserved for the job's driver (default: Ray's, 0)")
    status = sub.add_parser("status", help="status of a submitted job")
    status.add_argument("job_id", metavar="JOB_ID")
    status.add_argument("--address", help=address_help)
    logs = sub.add_parser("logs", help="logs of a submitted job")
    logs.add_argument("job_id", metavar="JOB_ID")
    logs.add_argument("--address", help=address_help)
    logs.add_argument("--follow", action="store_true", help="keep printing until the job ends")


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _add_compare_parser(sub: argparse._SubParsersAction) -> None:
    from ragbatch.analysis.compare import MIN_SLICE_PAIRS
    from ragbatch.analysis.pairing import DEFAULT_MATCH_ON

    p = sub.add_parser("compare", help="compare two committed runs row by row (paired bootstrap)")
    p.add_argument("--output", dest="output_uri", required=True, metavar="URI",
                   help="output root of the baseline run (and of the candidate unless --candidate-output)")
    p.add_argument("--candidate-output", metavar="URI", help="output root of the candidate run")
    _add_storage_option_args(p, "--output", "--candidate-output")
    p.add_argument("baseline", type=_RUN_ID, metavar="BASELINE_RUN_ID")
    p.add_argument("candidate", type=_RUN_ID, metavar="CANDIDATE_RUN_ID")
    p.add_argument("--by", action="append", default=[], metavar="SLICE",
                   help="also compare per value of this slice column (repeatable)")
    p.add_argument("--min-pairs", type=_positive_int, default=MIN_SLICE_PAIRS, metavar="N",
                   help="fewest pairs a --by slice needs for its change to be flagged; fewer "
                        "pairs give too narrow an interval (default %(default)s)")
    p.add_argument("--match-on", type=_column_list, default=DEFAULT_MATCH_ON, metavar="COLS",
                   help="comma-separated columns whose content pairs rows with different row ids "
                        f"(default: {','.join(DEFAULT_MATCH_ON)})")
    p.add_argument("--fail-on-regression", type=float, metavar="THRESHOLD",
                   help=f"exit {EXIT_REGRESSION} when a metric's all-rows change is significant, "
                        "worse, and larger than THRESHOLD in the metric's units")
    p.add_argument("--confidence", type=_confidence, default=0.95, help="interval level (default 0.95)")
    p.add_argument("--top", type=_positive_int, default=10, help="rows listed per metric (default 10)")
    p.add_argument("--json", dest="json_path", metavar="FILE", help="also write the comparison as JSON")


def _add_report_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write a self-contained HTML report of a committed run")
    p.add_argument("--output", dest="output_uri", required=True, metavar="URI",
                   help="output root the run was written to")
    p.add_argument("run_id", type=_RUN_ID, metavar="RUN_ID")
    p.add_argument("--baseline", type=_RUN_ID, metavar="RUN_ID", help="compare with this committed run")
    p.add_argument("--baseline-output", metavar="URI", help="output root of the baseline (default: --output)")
    _add_storage_option_args(p, "--output", "--baseline-output")
    p.add_argument("-o", dest="report_path", required=True, metavar="FILE", help="where to write the HTML")
    p.add_argument("--top", type=_positive_int, default=10, help="rows listed per metric (default 10)")


def _add_storage_option_args(p: argparse.ArgumentParser, root_flag: str, other_flag: str) -> None:
    """``--storage-option`` for ``root_flag``'s root and ``--<other>-storage-option`` for
    ``other_flag``'s (:func:`_storage_options` reads them; docs/storage.md)."""
    form = ("repeatable; VALUE is read as YAML (anon=false is a bool), a dotted KEY nests "
            "(client_kwargs.region_name=eu-west-1); the AWS_*/GOOGLE_* environment applies "
            "to what is not given")
    p.add_argument("--storage-option", dest="storage_option", action="append", default=[],
                   type=_storage_option, metavar="KEY=VALUE",
                   help=f"fsspec storage option of the {root_flag} root ({form})")
    other = other_flag.removesuffix("-output").lstrip("-")
    p.add_argument(f"--{other}-storage-option", dest=f"{other}_storage_option", action="append",
                   default=[], type=_storage_option, metavar="KEY=VALUE",
                   help=f"storage option of the {other_flag} root, as --storage-option; only "
                        f"these apply there (default: none; without {other_flag} the "
                        f"{root_flag} root and its options are used)")


def _storage_option(text: str) -> tuple[tuple[str, ...], object]:
    from ragbatch.io.options import parse_storage_option

    try:
        return parse_storage_option(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _storage_options(args: argparse.Namespace, other: str | None = None) -> dict:
    """The storage options the flags give: of the main root (``--storage-option``), or of
    the ``other`` root (``--<other>-storage-option``, e.g. ``candidate``).

    Raises
    ------
    ConfigError
        A key is given twice or both as a value and as a parent of nested keys; or
        ``--<other>-storage-option`` is given without ``--<other>-output``.
    """
    from ragbatch.io.options import storage_options_from

    if other is None:
        return storage_options_from(args.storage_option, "--storage-option")
    pairs = getattr(args, f"{other}_storage_option")
    if pairs and not getattr(args, f"{other}_output"):
        raise ConfigError(f"--{other}-storage-option applies to the --{other}-output root; "
                          f"add --{other}-output, or give the options with --storage-option")
    return storage_options_from(pairs, f"--{other}-storage-option")


def _other_root(args: argparse.Namespace, other: str) -> tuple[str, dict]:
    """The root and options of ``--<other>-output``, defaulting to ``--output``'s."""
    options = _storage_options(args, other)
    if getattr(args, f"{other}_output"):
        return getattr(args, f"{other}_output"), options
    return args.output_uri, _storage_options(args)


def _column_list(text: str) -> tuple[str, ...]:
    return tuple(c.strip() for c in text.split(",") if c.strip())


def _confidence(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be strictly between 0 and 1, got {text}")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0.0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (in the metric's units), got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="path to the job config (YAML)")
    p.add_argument("--input", dest="input_uri", help="override input.uri")
    p.add_argument("--output", dest="output_uri", help="override output.uri")


def _load(args: argparse.Namespace) -> JobConfig:
    config = load_config(args.config)
    if args.input_uri:
        config.input.uri = args.input_uri
    if args.output_uri:
        config.output.uri = args.output_uri
    if getattr(args, "run_date", None):
        config.run.run_date = args.run_date
    return config


def cmd_run(args: argparse.Namespace) -> int:
    from ragbatch.query_hint import query_hint
    from ragbatch.runner import run_job

    if args.dry_run:
        if args.report:
            raise ConfigError("--report needs a committed run; leave out --dry-run or --report")
        return cmd_dry_run(args)
    for flag, value in (("--sample-rows", args.sample_rows), ("--pilot-rows", args.pilot_rows)):
        if value is not None:
            raise ConfigError(f"{flag} applies only with --dry-run; add --dry-run or leave it out")
    config = _load(args)
    result = run_job(config, run_id=args.run_id, address=args.address,
                     config_dir=Path(args.config).parent,
                     allow_uncalibrated=args.allow_uncalibrated)
    layout = result.layout
    print(f"run {result.run_id} committed ({result.check.n_rows} rows x "
          f"{len(config.metrics)} metrics = {result.check.n_cells} cells)")
    print(f"  scores:   {redact_url(layout.uri(layout.scores_path))}/")
    print(f"  summary:  {redact_url(layout.uri(layout.summary_path))}")
    print(f"  manifest: {redact_url(layout.uri(layout.manifest_path))}")
    print()
    print(_summary_text(result.summary.table.to_pylist(), result.summary.settings.confidence))
    judge = result.manifest.judge
    if judge.metrics:
        t = judge.total
        print(f"judge: {t.judge_calls} calls, {t.cache_hits} cache hits, "
              f"{t.prompt_tokens} prompt + {t.completion_tokens} completion tokens")
        if t.refused_too_long:
            print(f"  {t.refused_too_long} requests refused as context_too_long (not sent "
                  f"to the model; {t.refused_prompt_tokens} prompt tokens)")
        for name, stats in judge.engines.items():
            if stats.get("prefix_cache_hit_rate") is not None:
                print(f"  engine {name}: prefix-cache hit rate {stats['prefix_cache_hit_rate']:.1%}")
    hint = query_hint(layout, (result.config or config).output.storage_options)
    if hint:
        print()
        print("\n".join(hint))
    if args.report:
        _write_run_report(result.config or config, result.run_id)
    gate = args.fail_on_degenerate or config.diagnostics.fail_on_degenerate
    if gate and result.summary.degenerate():
        names = ", ".join(result.summary.degenerate())
        print(f"ragbatch: run {result.run_id} committed, but these judge metrics are degenerate: "
              f"{names}", file=sys.stderr)
        return EXIT_DEGENERATE
    return EXIT_OK


def cmd_nightly(args: argparse.Namespace) -> int:
    from ragbatch.nightly_job import run_nightly
    from ragbatch.nightly_summary import format_outcome

    outcome = run_nightly(_load(args), config_dir=Path(args.config).parent, run_date=args.run_date,
                          run_id=args.run_id, address=args.address,
                          fail_on_regression=args.fail_on_regression, report=args.report,
                          allow_uncalibrated=args.allow_uncalibrated,
                          fail_on_degenerate=args.fail_on_degenerate)
    print(format_outcome(outcome))
    if outcome.exit_code in (EXIT_FAILED, EXIT_INVALID):
        print(f"ragbatch: error: {outcome.message}", file=sys.stderr)
    return outcome.exit_code


def cmd_dry_run(args: argparse.Namespace) -> int:
    """``run --dry-run``: print the plan and the estimated judge cost; run nothing."""
    from ragbatch.dry_run import DEFAULT_SAMPLE_ROWS, dry_run
    from ragbatch.dry_run_text import format_dry_run
    from ragbatch.runner import prepare_import_paths
    from ragbatch.templating import render_config, uri_templates

    config = _load(args)
    templates = uri_templates(config)
    if templates:
        config = render_config(config, choose_run_date(config.run.run_date))
    prepare_import_paths(Path(args.config).parent)
    result = dry_run(config, sample_rows=args.sample_rows or DEFAULT_SAMPLE_ROWS,
                     pilot_rows=args.pilot_rows or 0)
    print(format_dry_run(result))
    return EXIT_OK


def _write_run_report(config: JobConfig, run_id: str) -> None:
    """``run --report``: the report and the comparison with the previous committed run."""
    from ragbatch.analysis.nightly import write_run_report
    from ragbatch.calibrate.report import calibration_section
    from ragbatch.nightly_job import calibration_options

    try:
        written = write_run_report(config.output.uri, run_id, config.output.storage_options,
                                   calibration_options=calibration_options(config),
                                   calibration_section=calibration_section)
    except Exception as exc:  # noqa: BLE001 - the run is committed; say so with the cause
        raise RagbatchError(f"run {run_id} committed, but its report could not be written: "
                            f"{type(exc).__name__}: {exc}") from exc
    print()
    print(f"report:     {written.report}")
    if written.comparison is None:
        print("comparison: none (no earlier committed run under this output root)")
        return
    print(f"comparison: {written.comparison_text} (with {written.baseline.describe()})")
    changed = written.comparison.metrics.filter(written.comparison.metrics["slice"].is_null()
                                                & written.comparison.metrics["significant"])
    for r in changed.iter_rows(named=True):
        print(f"  {r['metric']}: {r['change']} by {r['mean_diff']:+.3f} "
              f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]")


def _summary_text(rows: list[dict], confidence: float) -> str:
    """The overall summary rows (``slice_column`` null) as a text table: cells, ok cells,
    mean over ok cells with its confidence interval, and the non-zero other statuses; a
    judge metric whose result is degenerate is marked ``DEGENERATE`` and its reasons are
    listed under the table."""
    from ragbatch.status import OK, STATUSES

    width = max([28, *(len(r["metric"]) for r in rows)])
    ci = f"{confidence:.0%} CI"
    header = f"{'metric':<{width}} {'n':>7} {'ok':>7} {'mean':>7}  {ci:<16}  other statuses"
    lines = [header, "-" * len(header)]
    for r in rows:
        if r["slice_column"] is not None:
            continue
        other = ", ".join(f"{s}={r[f'n_{s}']}" for s in STATUSES if s != OK and r[f"n_{s}"])
        if r["mean"] is None:
            mean, interval = "-", "-"
        else:
            mean = f"{r['mean']:.3f}"
            interval = f"[{r['mean_ci_low']:.3f}, {r['mean_ci_high']:.3f}]"
        flag = "  DEGENERATE" if r.get("degenerate") else ""
        lines.append(f"{r['metric']:<{width}} {r['n_total']:>7} {r['n_ok']:>7} {mean:>7}  "
                     f"{interval:<16}  {other}".rstrip() + flag)
    flagged = [r for r in rows if r["slice_column"] is None and r.get("degenerate")]
    if flagged:
        lines += ["", "degenerate judge results: the means above say little about the data "
                      "(docs/judges.md, \"Judge health\"):"]
        lines += [f"  {r['metric']}: {r['degenerate_reasons']}" for r in flagged]
    from ragbatch.analysis.corrected import corrected_lines

    return "\n".join(lines + corrected_lines(rows, confidence))


def cmd_validate(args: argparse.Namespace) -> int:
    from ragbatch.plan import build_plan, preflight_engines
    from ragbatch.runner import prepare_import_paths
    from ragbatch.templating import render_config, uri_templates

    config = _load(args)
    templates = uri_templates(config)
    if templates:
        run_date = choose_run_date(config.run.run_date)
        config = render_config(config, run_date)
        print(f"run date {run_date.isoformat()} fills in {', '.join(templates)}")
    prepare_import_paths(Path(args.config).parent)
    plan = build_plan(config)
    preflight_engines(plan)
    _check_output_writable(config)
    schema = plan.input_schema
    print(f"config {args.config}: ok")
    print(f"input  {redact_url(config.input.uri)}: {len(plan.read_tasks)} read task(s); "
          f"columns: {', '.join(schema.names) if schema is not None else '?'}")
    mapping = {k: v for k, v in config.input.columns.model_dump().items() if v}
    print(f"mapping: {json.dumps(mapping, ensure_ascii=False)}")
    print(f"slice columns: {', '.join(o for _, o in plan.slices) or '(none)'}")
    for stage in plan.stages:
        desc = stage.describe()
        extra = f" on engine {desc['engine']} ({desc['engine_spec']['type']})" if "engine" in desc else ""
        print(f"stage {stage.name}{extra}: {', '.join(desc['metrics'])}")
    from ragbatch.stages import StageKind

    for stage in plan.stages:
        if stage.kind is StageKind.PII:
            from ragbatch.engines.presidio import validate_note

            print(f"  engine {stage.engine_name} {validate_note(stage.engine)}")
    for m in plan.metrics:
        for note in m.validate_notes():
            print(f"  {m.id}: {note}")
    print(f"output {redact_url(config.output.uri)}: writable (a probe object was written and deleted)")
    return _print_placement(plan, args.address or os.environ.get("RAY_ADDRESS"))


def _print_placement(plan, address: str | None) -> int:
    """The actor stages' resources and whether they fit the cluster (or this machine)."""
    from ragbatch.placement import (
        fit_problems, free_cpus_after, local_nodes, nodes_at, read_task_problem,
    )

    demands = plan.demands()
    if not demands:
        return EXIT_OK
    nodes = nodes_at(address) if address else local_nodes()
    where = f"the cluster at {address}" if address else "this machine (local Ray)"
    for d in demands:
        pool = f"{d.min_actors}" if d.min_actors == d.max_actors else f"{d.min_actors}..{d.max_actors}"
        bundles = " + ".join("{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(b.items())) + "}"
                             for b in d.bundles)
        print(f"placement {d.stage}: {pool} actor(s), each {bundles}")
    problems = fit_problems(demands, nodes)
    if problems:
        print(f"placement on {where} ({len(nodes)} node(s)): will not fit", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        return EXIT_INVALID
    starved = read_task_problem(demands, nodes)
    if starved:
        # a local Ray cannot grow (`ragbatch run` stops too); a cluster's autoscaler may
        verdict = "will not run" if not address else "would wait for more nodes"
        print(f"placement on {where} ({len(nodes)} node(s)): {verdict}", file=sys.stderr)
        print(f"  {starved}", file=sys.stderr)
        return EXIT_OK if address else EXIT_INVALID
    spare = free_cpus_after(demands, nodes)
    print(f"placement on {where} ({len(nodes)} node(s)): fits; {spare:g} CPU(s) left for read "
          "and expression tasks")
    return EXIT_OK


def _check_output_writable(config: JobConfig) -> None:
    """Write and delete a probe object under the output root (:mod:`ragbatch.io.probe`)."""
    from ragbatch.io.probe import probe_output

    probe_output(config.output.uri, config.output.storage_options)


def cmd_metrics(args: argparse.Namespace) -> int:
    from ragbatch.registry import all_metrics

    if args.markdown:
        from ragbatch.metrics_doc import render_markdown

        sys.stdout.write(render_markdown())
        return EXIT_OK
    described = [cls.describe() for cls in all_metrics()]
    if args.json:
        print(json.dumps(described, indent=2, default=str))
        return EXIT_OK
    for d in described:
        print(f"{d['name']}  [{d['kind']}]  range {d['range']}"
              f"{' boolean' if d['boolean'] else ''}, "
              f"{'higher' if d['higher_is_better'] else 'lower'} is better")
        print(f"    {d['summary']}")
        print(f"    engine: {_engine_text(d)}")
        print(f"    inputs: {', '.join(d['inputs']) or '(all canonical columns)'}")
        for pname, p in d["params"].items():
            req = "required" if p["required"] else f"default {p['default']!r}"
            print(f"    param {pname} ({req}): {p['description']}")
        print(f"    source: {d['source']}")
    return EXIT_OK


def _engine_text(described: dict) -> str:
    """The engine types a metric runs on, for ``ragbatch metrics``: "vllm or openai",
    "vllm or openai, and embedding", or "none"."""
    text = " or ".join(described["engine"]) or "none"
    if described["second_engine"]:
        text += f", and {' or '.join(described['second_engine'])}"
    return text


def cmd_compare(args: argparse.Namespace) -> int:
    from ragbatch.analysis.compare import compare_runs
    from ragbatch.analysis.compare_text import format_comparison
    from ragbatch.analysis.runs import find_run

    candidate_root, candidate_options = _other_root(args, "candidate")
    baseline = find_run(args.output_uri, args.baseline, _storage_options(args))
    candidate = find_run(candidate_root, args.candidate, candidate_options)
    result = compare_runs(baseline, candidate, by=args.by, match_on=args.match_on,
                          confidence=args.confidence, top=args.top,
                          threshold=args.fail_on_regression, min_pairs=args.min_pairs)
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
    html = build_report(run, baseline, top=args.top, calibration_section=calibration_section)
    Path(args.report_path).write_text(html, encoding="utf-8")
    print(f"report of run {run.run_id} written to {args.report_path}"
          + (f" (compared with {baseline.run_id})" if baseline else ""))
    return EXIT_OK


def cmd_submit(args: argparse.Namespace) -> int:
    from ragbatch import submit as jobs

    request = jobs.prepare_job(args.config, working_dir=args.working_dir, input_uri=args.input_uri,
                               output_uri=args.output_uri, run_id=args.run_id,
                               run_date=args.run_date, nightly=args.nightly, env=dict(args.env),
                               pip=args.pip)
    client = jobs.connect(args.address)
    job_id = jobs.submit(client, request, entrypoint_num_cpus=args.entrypoint_num_cpus)
    info = jobs.job_info(client, job_id)
    print(f"submitted job {job_id} to {client.get_address()}: {info.status}")
    print(f"  run:       {request.run_id} (run date {request.run_date}), "
          f"config {request.metadata['ragbatch_config']}")
    print(f"  scores:    {request.output.scores}")
    print(f"  summary:   {request.output.summary}")
    print(f"  manifest:  {request.output.manifest}")
    print(f"  dashboard: {jobs.dashboard_url(client, job_id)}")
    if not (args.wait or args.follow_logs):
        print(f"follow it with: ragbatch logs {job_id} --follow --address {client.get_address()}")
        return EXIT_OK
    sys.stdout.flush()
    if args.follow_logs:
        info = jobs.follow_logs(client, job_id, _write_through)
    else:
        info = jobs.wait(client, job_id, known=info.status,
                         on_change=lambda i: print(f"job {job_id}: {i.status}", flush=True))
    print(f"job {job_id} {info.status}: {info.message}")
    return jobs.exit_code(info)


def _write_through(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def cmd_status(args: argparse.Namespace) -> int:
    from ragbatch import submit as jobs

    client = jobs.connect(args.address)
    info = jobs.job_info(client, args.job_id)
    print(f"job {args.job_id}: {info.status} ({info.message})")
    print(f"  entrypoint: {info.entrypoint}")
    times = [f"{label} {_when(ms)}" for label, ms in (("started", info.start_time),
                                                      ("ended", info.end_time)) if ms]
    if times:
        print(f"  {', '.join(times)}")
    if info.driver_exit_code is not None:
        print(f"  driver exit code: {info.driver_exit_code}")
    meta = info.metadata or {}
    if "ragbatch_run_id" in meta:
        print(f"  run: {meta['ragbatch_run_id']} (run date {meta.get('ragbatch_run_date')}), "
              f"config {meta.get('ragbatch_config')}, output {meta.get('ragbatch_output')}")
    print(f"  dashboard: {jobs.dashboard_url(client, args.job_id)}")
    return EXIT_OK


def _when(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def cmd_logs(args: argparse.Namespace) -> int:
    from ragbatch import submit as jobs

    client = jobs.connect(args.address)
    if args.follow:
        jobs.follow_logs(client, args.job_id, _write_through)
    else:
        _write_through(jobs.job_logs(client, args.job_id))
    return EXIT_OK


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from ragbatch.calibrate.cli import cmd_calibrate

    return cmd_calibrate(args)


def _cmd_models(args: argparse.Namespace) -> int:
    from ragbatch.models.cli import cmd_models

    return cmd_models(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ragbatch`` console script; returns the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    install_log_redaction()
    handlers = {"run": cmd_run, "validate": cmd_validate, "metrics": cmd_metrics,
                "compare": cmd_compare, "report": cmd_report, "nightly": cmd_nightly,
                "submit": cmd_submit, "status": cmd_status, "logs": cmd_logs,
                "calibrate": _cmd_calibrate, "models": _cmd_models}
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


def _interrupted_text(args: argparse.Namespace, exc: KeyboardInterrupt) -> str:
    """What Ctrl-C left: for a run that began staging, its id, where its scores are kept,
    and the command that resumes it."""
    from ragbatch.errors import RunInterrupted

    if not isinstance(exc, RunInterrupted):
        return "ragbatch: interrupted"
    words = ["ragbatch", args.command, args.config]
    if args.command == "nightly":
        words += ["--run-date", exc.run_date] + (["--run-id", exc.run_id] if args.run_id else [])
    else:
        words += ["--run-id", exc.run_id] + (["--run-date", exc.run_date] if args.run_date else [])
    for flag, value in (("--input", getattr(args, "input_uri", None)),
                        ("--output", getattr(args, "output_uri", None))):
        words += [flag, value] if value else []
    again = shlex.join(words)
    return (f"ragbatch: interrupted: run {exc.run_id} was not committed.\n"
            f"  scores staged so far are kept under {exc.staging_uri}/\n"
            f"  resume it (rows already scored are not scored again): {again}")


if __name__ == "__main__":
    sys.exit(main())
