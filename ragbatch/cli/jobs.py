"""``ragbatch submit``, ``status`` and ``logs``: jobs on a Ray cluster."""

from __future__ import annotations

import argparse
import datetime as dt
import sys

from ragbatch.core.exit_codes import EXIT_OK
from ragbatch.cli.common import _RUN_ID, _add_config_args


def _add_job_parsers(sub: argparse._SubParsersAction) -> None:
    address_help = (
        "the cluster's job server, http://HEAD:8265 "
        "(default: $RAY_API_SERVER_ADDRESS, else $RAY_ADDRESS)"
    )
    p = sub.add_parser("submit", help="submit a job config to a Ray cluster as a Ray job")
    _add_config_args(p)
    p.add_argument("--address", help=address_help)
    p.add_argument(
        "--working-dir",
        metavar="DIR",
        help="a ragbatch checkout to ship and run (its jobs/run.py); it must hold the "
        "config (default: ship only the config and the callback modules next to "
        "it, and run the cluster's installed ragbatch with python -m ragbatch)",
    )
    p.add_argument(
        "--run-id",
        type=_RUN_ID,
        help="run id (default: run.run_id, else generated now; with --nightly: nightly-<run date>)",
    )
    p.add_argument(
        "--run-date",
        type=dt.date.fromisoformat,
        help="partition date YYYY-MM-DD, also for {run_date} in the URIs (default: "
        "run.run_date, else today UTC; with --nightly: yesterday UTC)",
    )
    p.add_argument(
        "--nightly", action="store_true", help="run it as the nightly job (as `ragbatch nightly`)"
    )
    p.add_argument(
        "--wait", action="store_true", help="wait for the job to end and exit with its status"
    )
    p.add_argument(
        "--follow-logs",
        action="store_true",
        help="print the job's logs as they come until it ends (implies --wait)",
    )
    p.add_argument(
        "--env",
        action="append",
        type=_env_pair,
        default=[],
        metavar="KEY=VALUE",
        help="environment variable of the job's processes (repeatable)",
    )
    p.add_argument(
        "--pip",
        action="append",
        default=[],
        metavar="PKG",
        help="package Ray installs into the job's environment (repeatable; for "
        "example 'ragbatch[s3]==VERSION' where the cluster's image lacks ragbatch)",
    )
    p.add_argument(
        "--entrypoint-num-cpus",
        type=float,
        metavar="N",
        help="CPUs reserved for the job's driver (default: Ray's, 0)",
    )
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


def cmd_submit(args: argparse.Namespace) -> int:
    from ragbatch.ops import submit as jobs

    request = jobs.prepare_job(
        args.config,
        working_dir=args.working_dir,
        input_uri=args.input_uri,
        output_uri=args.output_uri,
        run_id=args.run_id,
        run_date=args.run_date,
        nightly=args.nightly,
        env=dict(args.env),
        pip=args.pip,
    )
    client = jobs.connect(args.address)
    job_id = jobs.submit(client, request, entrypoint_num_cpus=args.entrypoint_num_cpus)
    info = jobs.job_info(client, job_id)
    print(f"submitted job {job_id} to {client.get_address()}: {info.status}")
    print(
        f"  run:       {request.run_id} (run date {request.run_date}), "
        f"config {request.metadata['ragbatch_config']}"
    )
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
        info = jobs.wait(
            client,
            job_id,
            known=info.status,
            on_change=lambda i: print(f"job {job_id}: {i.status}", flush=True),
        )
    print(f"job {job_id} {info.status}: {info.message}")
    return jobs.exit_code(info)


def _write_through(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def cmd_status(args: argparse.Namespace) -> int:
    from ragbatch.ops import submit as jobs

    client = jobs.connect(args.address)
    info = jobs.job_info(client, args.job_id)
    print(f"job {args.job_id}: {info.status} ({info.message})")
    print(f"  entrypoint: {info.entrypoint}")
    times = [
        f"{label} {_when(ms)}"
        for label, ms in (("started", info.start_time), ("ended", info.end_time))
        if ms
    ]
    if times:
        print(f"  {', '.join(times)}")
    if info.driver_exit_code is not None:
        print(f"  driver exit code: {info.driver_exit_code}")
    meta = info.metadata or {}
    if "ragbatch_run_id" in meta:
        print(
            f"  run: {meta['ragbatch_run_id']} (run date {meta.get('ragbatch_run_date')}), "
            f"config {meta.get('ragbatch_config')}, output {meta.get('ragbatch_output')}"
        )
    print(f"  dashboard: {jobs.dashboard_url(client, args.job_id)}")
    return EXIT_OK


def _when(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def cmd_logs(args: argparse.Namespace) -> int:
    from ragbatch.ops import submit as jobs

    client = jobs.connect(args.address)
    if args.follow:
        jobs.follow_logs(client, args.job_id, _write_through)
    else:
        _write_through(jobs.job_logs(client, args.job_id))
    return EXIT_OK
