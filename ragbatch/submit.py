"""Submit a job config to a Ray cluster as a Ray job, and follow it.

A submission ships a working directory (normally the repository root) to the cluster
through Ray's Job Submission API (:class:`ray.job_submission.JobSubmissionClient`, which
needs ``ray[default]``) and runs ``python jobs/run.py CONFIG --run-id ID --run-date D``
there (``jobs/nightly.py`` for a nightly run), with the cluster's ``python``. The config is checked here first, without touching
its input (which may be reachable from the cluster only), so that nothing is submitted
for a broken config. The run id and run date are fixed at submission, so the printed
output paths are the ones the job writes.

The address is ``--address``, else ``RAY_API_SERVER_ADDRESS``, else ``RAY_ADDRESS`` (the
variables Ray's own ``ray job`` commands read): the URL of the head node's job server,
``http://HEAD:8265``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from ragbatch.config import JobConfig, load_config
from ragbatch.errors import ClusterError, ConfigError, JobNotFoundError
from ragbatch.ids import check_id

#: Environment variables that give the job server's address, in order of precedence
#: (after ``--address``); the same ones ``ray job submit`` reads.
ADDRESS_VARS = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
#: The job entry points, relative to the working directory: a run, and a nightly run.
ENTRYPOINT_SCRIPT = "jobs/run.py"
NIGHTLY_SCRIPT = "jobs/nightly.py"
#: Never shipped, whatever the ignore files say. Ray leaves out what ``.gitignore`` and
#: ``.rayignore`` files in the working directory list (``.venv/``, ``out/``, ``models/``,
#: ``test-artifacts/``, benchmark data in this repository), but ``.git`` cannot list itself.
ALWAYS_EXCLUDED = (".git",)
#: Seconds between status polls while waiting.
POLL_S = 2.0


@dataclass(frozen=True)
class OutputPaths:
    """Where a submitted run's tables will be, as URIs (or local paths) under the
    output root; nothing is opened to compute them."""

    scores: str
    summary: str
    manifest: str


@dataclass
class JobRequest:
    """Everything a submission sends, worked out (and checked) before connecting.

    Attributes
    ----------
    entrypoint : str
        Shell command the cluster runs in the shipped working directory.
    runtime_env : dict
        ``working_dir`` (absolute path), ``excludes``, and ``env_vars`` / ``pip`` when given.
    metadata : dict of str to str
        Stored with the job (``ragbatch status`` prints it): config, run id, run date,
        output root.
    run_id, run_date, output : str, datetime.date, OutputPaths
        The run the job will write.
    config : JobConfig
        The config as checked: overrides applied, ``{run_date}`` rendered.
    """

    entrypoint: str
    runtime_env: dict[str, Any]
    metadata: dict[str, str]
    run_id: str
    run_date: dt.date
    output: OutputPaths
    config: JobConfig = field(repr=False)


def prepare_job(config_path: str | Path, *, working_dir: str | Path | None = None,
                input_uri: str | None = None, output_uri: str | None = None,
                run_id: str | None = None, run_date: dt.date | None = None,
                nightly: bool = False, env: dict[str, str] | None = None,
                pip: list[str] | None = None) -> JobRequest:
    """Check a config for submission and build the job request; contacts no cluster.

    Parameters
    ----------
    config_path : str or Path
        The job config (YAML); it must lie inside ``working_dir``.
    working_dir : str or Path, optional
        Directory shipped to the cluster (default: the current directory). It must hold
        the entry point (``jobs/run.py``, or ``jobs/nightly.py`` with ``nightly``); files
        its ``.gitignore`` / ``.rayignore`` list are not shipped.
    input_uri, output_uri : str, optional
        Overrides of ``input.uri`` and ``output.uri``, passed on to the job.
    run_id : str, optional
        Default: ``run.run_id``, else a new id (``YYYYMMDDTHHMMSSZ-xxxxxx``); with
        ``nightly``, ``nightly-<run date>`` (and ``run.run_id`` is refused).
    run_date : datetime.date, optional
        Default: ``run.run_date``, else today (UTC) at submission; with ``nightly``,
        yesterday (UTC). It also fills ``{run_date}`` in the config's URIs.
    nightly : bool
        Run the config as the nightly job (``jobs/nightly.py``, as ``ragbatch nightly``).
    env : dict of str to str, optional
        Environment variables of the job's processes (``runtime_env.env_vars``).
    pip : list of str, optional
        Packages Ray installs into the job's environment (``runtime_env.pip``).

    Returns
    -------
    JobRequest

    Raises
    ------
    ConfigError
        The config is invalid (fields, metric names and params, engines and their
        accelerator types, ``{run_date}`` placeholders; not local model directories,
        which may exist on the cluster only, nor the fit of the stages, which an
        autoscaler may provide), lies outside the working directory, the working
        directory lacks the entry point, the run id is not path-safe, or the output is a
        relative local path or ``memory://`` (on the cluster it would land in the job's
        temporary directory, or in its driver's memory, and be lost).
    """
    script = NIGHTLY_SCRIPT if nightly else ENTRYPOINT_SCRIPT
    workdir, config_file = _locate(config_path, working_dir, script)
    config = load_config(config_file)
    if input_uri:
        config.input.uri = input_uri
    if output_uri:
        config.output.uri = output_uri
    run_id, run_date = _run_naming(config, run_id, run_date, nightly)
    rendered = _checked(config, run_date, (workdir, config_file.parent))

    args = ["python", script, config_file.relative_to(workdir).as_posix(),
            "--run-id", run_id, "--run-date", run_date.isoformat()]
    if input_uri:
        args += ["--input", input_uri]
    if output_uri:
        args += ["--output", output_uri]
    runtime_env: dict[str, Any] = {"working_dir": str(workdir), "excludes": list(ALWAYS_EXCLUDED)}
    if env:
        runtime_env["env_vars"] = dict(env)
    if pip:
        runtime_env["pip"] = list(pip)
    root = rendered.output.uri
    metadata = {"ragbatch_config": args[2], "ragbatch_run_id": run_id,
                "ragbatch_run_date": run_date.isoformat(), "ragbatch_output": root}
    return JobRequest(shlex.join(args), runtime_env, metadata, run_id, run_date,
                      _output_paths(root, run_date, run_id), rendered)


def _locate(config_path: str | Path, working_dir: str | Path | None, script: str) -> tuple[Path, Path]:
    """The working dir and the config file, both absolute; the config must be inside."""
    workdir = Path(working_dir if working_dir is not None else os.getcwd()).resolve()
    if not (workdir / script).is_file():
        raise ConfigError(f"working dir {workdir} has no {script}: pass --working-dir with the "
                          "root of a ragbatch checkout (it is shipped to the cluster)")
    config_file = Path(config_path).resolve()
    if not config_file.is_relative_to(workdir):
        raise ConfigError(f"config {config_path} is outside the working dir {workdir}, so it would "
                          "not reach the cluster; move it inside, or pass a --working-dir that holds it")
    return workdir, config_file


def _run_naming(config: JobConfig, run_id: str | None, run_date: dt.date | None,
                nightly: bool) -> tuple[str, dt.date]:
    """The run id and run date the job gets, as ``ragbatch run`` / ``nightly`` choose them."""
    if nightly:
        from ragbatch.nightly_job import nightly_run_id, yesterday_utc

        if config.run.run_id and not run_id:
            raise ConfigError("run.run_id: a nightly config cannot fix the run id (every night "
                              "would reuse it); remove it (default: nightly-<run date>) or pass --run-id")
        night = run_date or config.run.run_date or yesterday_utc()
        return _checked_run_id(run_id or nightly_run_id(night)), night
    from ragbatch.runner import new_run_id

    run_date = run_date or config.run.run_date or dt.datetime.now(dt.timezone.utc).date()
    return _checked_run_id(run_id or config.run.run_id or new_run_id()), run_date


def _checked(config: JobConfig, run_date: dt.date, import_paths: tuple[Path, ...]) -> JobConfig:
    """Everything that can be checked here without the cluster; the config rendered for
    ``run_date``."""
    from ragbatch.placement import accelerator_problems
    from ragbatch.plan import build_metrics
    from ragbatch.templating import render_config

    rendered = render_config(config, run_date)
    _check_output(rendered.output.uri)
    for path in import_paths:  # metric callbacks are imported when checked
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    _, engines, problems = build_metrics(rendered)
    problems += accelerator_problems(engines)
    if problems:
        raise ConfigError(problems)
    return rendered


def _output_paths(root: str, run_date: dt.date, run_id: str) -> OutputPaths:
    """The run's tables under ``root``, without opening its filesystem (it may be
    reachable from the cluster only)."""
    from ragbatch.io.write import OutputLayout

    layout = OutputLayout(root, None, root.rstrip("/"), run_date, run_id)
    return OutputPaths(layout.scores_path + "/", layout.summary_path, layout.manifest_path)


def _check_output(uri: str) -> None:
    from fsspec.core import split_protocol

    protocol, path = split_protocol(uri)
    if protocol == "memory":
        raise ConfigError(f"output.uri {uri!r}: memory:// lives in the job's driver process and is "
                          "lost when the job ends; give object storage (s3://, gs://) with --output")
    if protocol in (None, "file", "local") and not os.path.isabs(path):
        raise ConfigError(
            f"output.uri {uri!r} is a relative local path: on the cluster it would land in the "
            "job's temporary working directory; give object storage (s3://..., gs://...) or an "
            "absolute path every node shares, with --output or in the config")


def _checked_run_id(run_id: str) -> str:
    return check_id(run_id, "--run-id")


def resolve_address(address: str | None) -> str:
    """``address``, else ``RAY_API_SERVER_ADDRESS``, else ``RAY_ADDRESS``.

    Raises
    ------
    ConfigError
        None of them is set.
    """
    for value in (address, *(os.environ.get(v) for v in ADDRESS_VARS)):
        if value:
            return value
    raise ConfigError("no Ray address: pass --address http://HEAD:8265 (the head node's job "
                      "server) or set RAY_ADDRESS")


@contextlib.contextmanager
def _address_vars_hidden() -> Iterator[None]:
    """Ray's client lets the address variables override its ``address`` argument;
    hide them while it is built, so that ``--address`` wins as documented."""
    saved = {v: os.environ.pop(v) for v in ADDRESS_VARS if v in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def connect(address: str | None) -> Any:
    """A :class:`ray.job_submission.JobSubmissionClient` for the cluster at ``address``
    (see :func:`resolve_address`); it has answered a version request.

    Raises
    ------
    ConfigError
        No address is given or set.
    ClusterError
        Nothing answers at the address, or it is not a Ray job server; the message names
        the address and how to start or find one.
    """
    resolved = resolve_address(address)
    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError as exc:
        raise ClusterError(f"Ray's job client is not installed ({exc}); "
                           "pip install 'ray[default]'") from None
    try:
        with _address_vars_hidden():
            return JobSubmissionClient(resolved)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ClusterError(
            f"cannot reach a Ray job server at {resolved}: {exc}. Start a cluster with "
            "`ray start --head` and pass its job server's URL, http://HEAD:8265 (the "
            "dashboard port, 8265 unless --dashboard-port says otherwise)") from None


def submit(client: Any, request: JobRequest, *, entrypoint_num_cpus: float | None = None) -> str:
    """Ship the working directory and start the job; return its submission id.

    Raises
    ------
    ConfigError
        The working directory is too large to ship; nothing was submitted. The job
        server takes packages up to 100 MiB (zipped) in Ray 2.60.
    ClusterError
        The job server refused the submission for another reason.
    """
    try:
        return client.submit_job(entrypoint=request.entrypoint, runtime_env=request.runtime_env,
                                 metadata=request.metadata, entrypoint_num_cpus=entrypoint_num_cpus)
    except (RuntimeError, ValueError) as exc:
        text = str(exc)
        # The job server answers 413 past its request size limit; Ray's own GCS store
        # raises ValueError past the gRPC message size.
        if "status code 413" in text or "exceeds the maximum size" in text:
            limit = re.search(r"Maximum request body size (\d+)", text)
            why = (f"its zipped package exceeds the job server's limit of "
                   f"{int(limit.group(1)) / 2**20:.0f} MiB" if limit else text.split(". ")[0])
            raise ConfigError(
                f"working dir {request.runtime_env['working_dir']} is too large to ship: {why}. "
                "List large files in its .gitignore or .rayignore (Ray leaves those out), or pass "
                "a smaller --working-dir") from None
        if isinstance(exc, ValueError):
            raise
        raise ClusterError(f"the job server at {client.get_address()} refused the job: {exc}") from None


def job_info(client: Any, job_id: str) -> Any:
    """The job's :class:`ray.job_submission.JobDetails` (status, message, metadata,
    ``driver_exit_code``, times in ms since the epoch).

    Raises
    ------
    JobNotFoundError
        The cluster has no job with this submission id (or Ray job id).
    ClusterError
        The job server does not answer.
    """
    return _ask(client, job_id, client.get_job_info)


def job_logs(client: Any, job_id: str) -> str:
    """Everything the job's driver has printed so far (stdout and stderr).

    Raises
    ------
    JobNotFoundError, ClusterError
        As :func:`job_info`.
    """
    return _ask(client, job_id, client.get_job_logs)


def _ask(client: Any, job_id: str, call: Callable[[str], Any]) -> Any:
    try:
        return call(job_id)
    except RuntimeError as exc:
        if "404" in str(exc) or "does not exist" in str(exc):
            raise JobNotFoundError(
                f"no job {job_id!r} on the Ray cluster at {client.get_address()}; "
                f"`ray job list --address {client.get_address()}` lists its jobs") from None
        raise ClusterError(f"the job server at {client.get_address()} failed: {exc}") from None
    except ConnectionError as exc:
        raise ClusterError(f"lost the job server at {client.get_address()}: {exc}") from None


def wait(client: Any, job_id: str, *, poll_s: float = POLL_S,
         on_change: Callable[[Any], None] | None = None, known: Any = None) -> Any:
    """Poll until the job reaches a terminal status (SUCCEEDED, FAILED, STOPPED); return
    its final details. ``on_change`` is called with the details whenever the status
    differs from the previous one (at first, from ``known``).

    Raises
    ------
    JobNotFoundError, ClusterError
        As :func:`job_info`.
    """
    last = known
    while True:
        info = job_info(client, job_id)
        if info.status != last and on_change is not None:
            on_change(info)
        last = info.status
        if info.status.is_terminal():
            return info
        time.sleep(poll_s)


def follow_logs(client: Any, job_id: str, write: Callable[[str], Any]) -> Any:
    """Stream the job's logs to ``write`` until the job ends; return its final details.

    Raises
    ------
    JobNotFoundError, ClusterError
        As :func:`job_info` (checked before streaming).
    """
    job_info(client, job_id)

    async def _stream() -> None:
        async for chunk in client.tail_job_logs(job_id):
            write(chunk)

    try:
        asyncio.run(_stream())
    except RuntimeError as exc:  # the stream closed before the job ended
        raise ClusterError(f"the log stream of job {job_id} from {client.get_address()} "
                           f"broke off: {exc}") from None
    return wait(client, job_id)


def exit_code(info: Any) -> int:
    """A process exit status for a finished job: 0 for SUCCEEDED; otherwise its driver's
    own exit code when Ray reports one in 1-255 (``ragbatch run``'s 2 for a config or
    input problem, ...), else 1 (stopped, killed by a signal, never started)."""
    if str(info.status) == "SUCCEEDED":
        return 0
    code = getattr(info, "driver_exit_code", None)
    return code if code is not None and 0 < code <= 255 else 1


def dashboard_url(client: Any, job_id: str) -> str:
    """The job's page on the cluster's dashboard."""
    return f"{client.get_address().rstrip('/')}/#/jobs/{job_id}"
