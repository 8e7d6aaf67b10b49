"""Submit a job config to a Ray cluster as a Ray job, and follow it.

A submission sends a working directory to the cluster through Ray's Job Submission API
(:class:`ray.job_submission.JobSubmissionClient`, which needs ``ray[default]``) and runs
the job there with the cluster's ``python``, in one of two ways:

* from the installed package (the default): the working directory is the config and the
  user code its metrics import (:mod:`ragbatch.ops.shipping`), put together in a temporary
  folder, and the job runs ``python -m ragbatch run CONFIG --run-id ID --run-date D``
  (``nightly`` for a nightly run). The cluster must have ragbatch installed, in its image
  or through ``--pip``.
* from a checkout (``working_dir``): the checkout is shipped as it is and the job runs its
  ``jobs/run.py`` (``jobs/nightly.py``) with the same arguments.

The config is checked here first, without touching its input (which may be reachable
from the cluster only), so that nothing is submitted for a broken config. The run id and
run date are fixed at submission, so the printed output paths are the ones the job writes.
The entry point is one shell command (Ray runs it through a shell): every argument in it
is quoted.

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
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit

from ragbatch.config.job import JobConfig, load_config
from ragbatch.core.errors import ClusterError, ConfigError, JobNotFoundError
from ragbatch.core.exit_codes import EXIT_FAILED, EXIT_OK
from ragbatch.core.ids import check_id
from ragbatch.scoring.base import Metric
from ragbatch.core.redact import redact_url
from ragbatch.core.run_date import choose_run_date

#: Environment variables that give the job server's address, in order of precedence
#: (after ``--address``); the same ones ``ray job submit`` reads.
ADDRESS_VARS = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
#: How a job starts from the installed package: ``python -m ragbatch <command>``.
PACKAGE_ENTRY = ("python", "-m", "ragbatch")
#: How a job starts in a shipped checkout: its entry script for ``run`` or ``nightly``.
CHECKOUT_SCRIPT = "jobs/{command}.py"
#: Never shipped, whatever the ignore files say. Ray leaves out what ``.gitignore`` and
#: ``.rayignore`` files in the working directory list (``.venv/``, ``out/``, ``models/``,
#: ``test-artifacts/``, benchmark data in this repository), but ``.git`` cannot list itself.
ALWAYS_EXCLUDED = (".git",)
#: Seconds between status polls while waiting.
POLL_S = 2.0


@dataclass(frozen=True)
class OutputPaths:
    """Where a submitted run's tables will be, as URIs (or local paths) under the
    output root, without credentials; nothing is opened to compute them."""

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
        ``excludes``, ``working_dir`` (absolute path) when a checkout is shipped, and
        ``env_vars`` / ``pip`` when given.
    files : dict of str to Path
        Without a checkout: the working directory to assemble at submission (name at its
        top -> local file or package folder; see :func:`ragbatch.ops.shipping.job_files`).
        Empty when a checkout is shipped.
    metadata : dict of str to str
        Stored with the job (``ragbatch status`` prints it): config, run id, run date,
        output root (without credentials).
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
    files: dict[str, Path] = field(default_factory=dict)


def prepare_job(
    config_path: str | Path,
    *,
    working_dir: str | Path | None = None,
    input_uri: str | None = None,
    output_uri: str | None = None,
    run_id: str | None = None,
    run_date: dt.date | None = None,
    nightly: bool = False,
    env: dict[str, str] | None = None,
    pip: list[str] | None = None,
) -> JobRequest:
    """Check a config for submission and build the job request; contacts no cluster.

    Parameters
    ----------
    config_path : str or Path
        The job config (YAML). Without ``working_dir`` it may be anywhere.
    working_dir : str or Path, optional
        A ragbatch checkout to ship as it is (files its ``.gitignore`` / ``.rayignore``
        list are not shipped); it must hold the entry point (``jobs/run.py``, or
        ``jobs/nightly.py`` with ``nightly``) and the config, and relative local paths
        in the config name files inside it. Default: no checkout; the config and the user
        code it imports from the config's folder or the current folder are shipped, and
        the job runs the cluster's installed ragbatch.
    input_uri, output_uri : str, optional
        Overrides of ``input.uri`` and ``output.uri``, passed on to the job.
    run_id : str, optional
        Default: ``run.run_id``, else a new id (``YYYYMMDDTHHMMSSZ-xxxxxx``); with
        ``nightly``, ``nightly-<run date>`` (and ``run.run_id`` is refused).
    run_date : datetime.date, optional
        Default: ``run.run_date``, else today (UTC) at submission; with ``nightly``,
        yesterday (UTC). It also fills ``{run_date}`` in the config's URIs.
    nightly : bool
        Run the config as the nightly job (as ``ragbatch nightly``).
    env : dict of str to str, optional
        Environment variables of the job's processes (``runtime_env.env_vars``; Ray
        stores them with the job and shows them on its dashboard).
    pip : list of str, optional
        Packages Ray installs into the job's environment (``runtime_env.pip``), for
        example ``ragbatch[s3]==0.1.0`` on a cluster whose image lacks it.

    Returns
    -------
    JobRequest

    Raises
    ------
    ConfigError
        The config is invalid (fields, metric names and params, engines and their
        accelerator types, ``{run_date}`` placeholders; not local model directories,
        which may exist on the cluster only, nor the fit of the stages, which an
        autoscaler may provide); a ``working_dir`` lacks the entry point or the config;
        the run id is not path-safe; ``--input`` / ``--output`` carry a password (it
        would be stored with the job); the output or cache is a relative local path or
        ``memory://`` (on the cluster it would land in the job's temporary directory, or
        in its driver's memory, and be lost); without a checkout, the input or the
        calibration root is a relative local path (nothing local is shipped but the
        config and its user code); two shipped modules would take one name.
    """
    command = "nightly" if nightly else "run"
    config_file = Path(config_path).resolve()
    checkout = None if working_dir is None else _checkout(working_dir, command)
    if checkout is not None:
        config_ref = _inside(config_file, checkout, config_path)
        start = ["python", CHECKOUT_SCRIPT.format(command=command)]
        search_dirs = (checkout, config_file.parent)
    else:
        config_ref = config_file.name
        start = [*PACKAGE_ENTRY, command]
        search_dirs = (Path.cwd().resolve(), config_file.parent)
    for flag, uri in (("--input", input_uri), ("--output", output_uri)):
        _refuse_password(flag, uri)
    config = load_config(config_file)
    if input_uri:
        config.input.uri = input_uri
    if output_uri:
        config.output.uri = output_uri
    run_id, run_date = _run_naming(config, run_id, run_date, nightly)
    rendered, metrics = _checked(
        config, run_date, search_dirs, ships_local_files=checkout is not None
    )

    args = [*start, config_ref, "--run-id", run_id, "--run-date", run_date.isoformat()]
    if input_uri:
        args += ["--input", input_uri]
    if output_uri:
        args += ["--output", output_uri]
    runtime_env: dict[str, Any] = {"excludes": list(ALWAYS_EXCLUDED)}
    if checkout is not None:
        runtime_env["working_dir"] = str(checkout)
    if env:
        runtime_env["env_vars"] = dict(env)
    if pip:
        runtime_env["pip"] = list(pip)
    files = {} if checkout is not None else _job_files(config_file, metrics, search_dirs)
    root = redact_url(rendered.output.uri)
    metadata = {
        "ragbatch_config": config_ref,
        "ragbatch_run_id": run_id,
        "ragbatch_run_date": run_date.isoformat(),
        "ragbatch_output": root,
    }
    return JobRequest(
        shlex.join(args),
        runtime_env,
        metadata,
        run_id,
        run_date,
        _output_paths(root, run_date, run_id),
        rendered,
        files,
    )


def _checkout(working_dir: str | Path, command: str) -> Path:
    """``working_dir``, absolute; it must hold the entry script of ``command``."""
    workdir = Path(working_dir).resolve()
    script = CHECKOUT_SCRIPT.format(command=command)
    if not (workdir / script).is_file():
        raise ConfigError(
            f"--working-dir {workdir} has no {script}, so it is not a ragbatch checkout: pass "
            "the root of one, or leave --working-dir out to ship only the config and the "
            "callback modules it names (the cluster then runs its installed ragbatch)"
        )
    return workdir


def _inside(config_file: Path, workdir: Path, config_path: str | Path) -> str:
    """The config's path relative to the shipped checkout, ``/``-separated."""
    if not config_file.is_relative_to(workdir):
        raise ConfigError(
            f"config {config_path} is outside the working dir {workdir}, so it would "
            "not reach the cluster; move it inside, pass a --working-dir that holds "
            "it, or leave --working-dir out (the config is then shipped by itself)"
        )
    return config_file.relative_to(workdir).as_posix()


def _job_files(
    config_file: Path, metrics: list[Metric], search_dirs: tuple[Path, ...]
) -> dict[str, Path]:
    from ragbatch.ops.shipping import job_files

    return job_files(config_file, metrics, search_dirs)


def _run_naming(
    config: JobConfig, run_id: str | None, run_date: dt.date | None, nightly: bool
) -> tuple[str, dt.date]:
    """The run id and run date the job gets, as ``ragbatch run`` / ``nightly`` choose them."""
    if nightly:
        from ragbatch.ops.nightly_job import nightly_run_id

        if config.run.run_id and not run_id:
            raise ConfigError(
                "run.run_id: a nightly config cannot fix the run id (every night "
                "would reuse it); remove it (default: nightly-<run date>) or pass --run-id"
            )
        night = choose_run_date(run_date, config.run.run_date, nightly=True)
        return _checked_run_id(run_id or nightly_run_id(night)), night
    from ragbatch.pipeline.runner import new_run_id

    run_date = choose_run_date(run_date, config.run.run_date)
    return _checked_run_id(run_id or config.run.run_id or new_run_id()), run_date


def _checked(
    config: JobConfig, run_date: dt.date, import_paths: tuple[Path, ...], ships_local_files: bool
) -> tuple[JobConfig, list[Metric]]:
    """Everything that can be checked here without the cluster; the config rendered for
    ``run_date``, and its metrics."""
    from ragbatch.core.placement import accelerator_problems
    from ragbatch.pipeline.plan import build_metrics
    from ragbatch.config.templating import render_config

    rendered = render_config(config, run_date)
    location_problems = _local_uri_problems(rendered, ships_local_files)
    from ragbatch.metrics.callback_import import set_callback_dirs

    set_callback_dirs(list(import_paths))  # metric callbacks are imported when checked
    metrics, engines, problems = build_metrics(rendered)
    problems = location_problems + problems + accelerator_problems(engines)
    if problems:
        raise ConfigError(problems)
    return rendered, metrics


def _output_paths(root: str, run_date: dt.date, run_id: str) -> OutputPaths:
    """The run's tables under ``root``, without opening its filesystem (it may be
    reachable from the cluster only)."""
    from ragbatch.io.write import OutputLayout

    layout = OutputLayout(root, None, root.rstrip("/"), run_date, run_id)
    return OutputPaths(layout.scores_path + "/", layout.summary_path, layout.manifest_path)


def _local_uri_problems(config: JobConfig, ships_local_files: bool) -> list[str]:
    """Locations the job could not use on the cluster: ``memory://`` and relative local
    paths where it writes (output, cache), and, when nothing local is shipped, relative
    local paths where it reads (input, calibration root)."""
    problems = []
    written = [("output.uri", config.output.uri)]
    if config.cache.enabled and config.cache.uri:
        written.append(("cache.uri", config.cache.uri))
    for where, uri in written:
        if _protocol(uri) == "memory":
            problems.append(
                f"{where} {uri!r}: memory:// lives in the job's driver process and is "
                "lost when the job ends; give object storage (s3://, gs://)"
            )
        elif _is_relative_local(uri):
            problems.append(
                f"{where} {uri!r} is a relative local path: on the cluster it would land in the "
                "job's temporary working directory; give object storage (s3://..., gs://...) or an "
                "absolute path every node shares (for output.uri: with --output or in the config)"
            )
    if ships_local_files:
        return problems
    read = [("input.uri", config.input.uri)]
    if config.calibration is not None:
        read.append(("calibration.uri", config.calibration.uri))
    for where, uri in read:
        if _is_relative_local(uri):
            problems.append(
                f"{where} {uri!r} is a relative local path: only the config and its callback "
                "modules are shipped, so on the cluster it would name the job's temporary working "
                "directory; give object storage (s3://..., gs://...) or an absolute path every node "
                "reads (for input.uri: with --input or in the config), or ship a ragbatch checkout "
                "that holds it with --working-dir"
            )
    return problems


def _protocol(uri: str) -> str | None:
    from fsspec.core import split_protocol

    return split_protocol(uri)[0]


def _is_relative_local(uri: str) -> bool:
    from fsspec.core import split_protocol

    protocol, path = split_protocol(uri)
    return protocol in (None, "file", "local") and not os.path.isabs(path)


def _refuse_password(flag: str, uri: str | None) -> None:
    """A URI given on the command line goes into the job's entry point, which Ray stores
    and shows: refuse one that carries a password."""
    if uri and urlsplit(uri).password is not None:
        raise ConfigError(
            f"{flag}: the URI carries a password (user:password@...); it would be stored with "
            "the job and shown on the cluster's dashboard. Put credentials in the config's "
            "storage_options or the cluster's environment, and pass the URI without them"
        )


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
    raise ConfigError(
        "no Ray address: pass --address http://HEAD:8265 (the head node's job "
        "server) or set RAY_ADDRESS"
    )


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
        raise ClusterError(
            f"Ray's job client is not installed ({exc}); pip install 'ray[default]'"
        ) from None
    try:
        with _address_vars_hidden():
            return JobSubmissionClient(resolved)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ClusterError(
            f"cannot reach a Ray job server at {resolved}: {exc}. Start a cluster with "
            "`ray start --head` and pass its job server's URL, http://HEAD:8265 (the "
            "dashboard port, 8265 unless --dashboard-port says otherwise)"
        ) from None


def submit(client: Any, request: JobRequest, *, entrypoint_num_cpus: float | None = None) -> str:
    """Ship the working directory and start the job; return its submission id. Without
    a checkout, the working directory is assembled from ``request.files`` in a
    temporary folder, removed once Ray has uploaded it.

    Raises
    ------
    ConfigError
        The working directory is too large to ship; nothing was submitted. The job
        server takes packages up to 100 MiB (zipped) in Ray 2.60.
    ClusterError
        The job server refused the submission for another reason.
    """
    try:
        with _runtime_env(request) as runtime_env:
            return client.submit_job(
                entrypoint=request.entrypoint,
                runtime_env=runtime_env,
                metadata=request.metadata,
                entrypoint_num_cpus=entrypoint_num_cpus,
            )
    except (RuntimeError, ValueError) as exc:
        text = str(exc)
        # The job server answers 413 past its request size limit; Ray's own GCS store
        # raises ValueError past the gRPC message size.
        if "status code 413" in text or "exceeds the maximum size" in text:
            limit = re.search(r"Maximum request body size (\d+)", text)
            why = (
                f"its zipped package exceeds the job server's limit of "
                f"{int(limit.group(1)) / 2**20:.0f} MiB"
                if limit
                else text.split(". ")[0]
            )
            raise ConfigError(
                f"{_shipped(request)} too large to ship: {why}. {_smaller(request)}"
            ) from None
        if isinstance(exc, ValueError):
            raise
        raise ClusterError(
            f"the job server at {client.get_address()} refused the job: {exc}"
        ) from None


@contextlib.contextmanager
def _runtime_env(request: JobRequest) -> Iterator[dict[str, Any]]:
    """The runtime env to submit, with the working directory to ship in it."""
    if not request.files:
        yield request.runtime_env
        return
    from ragbatch.ops.shipping import assemble

    with tempfile.TemporaryDirectory(prefix="ragbatch-job-") as folder:
        assemble(request.files, Path(folder))
        yield {**request.runtime_env, "working_dir": folder}


def _shipped(request: JobRequest) -> str:
    if not request.files:
        return f"working dir {request.runtime_env['working_dir']} is"
    return f"the config and the code it ships ({', '.join(map(str, request.files.values()))}) are"


def _smaller(request: JobRequest) -> str:
    if not request.files:
        return (
            "List large files in its .gitignore or .rayignore (Ray leaves those out), or pass "
            "a smaller --working-dir"
        )
    return (
        "Install large callback packages on the cluster instead (image or --pip); "
        "code imported from outside the config's folder and the current folder is not shipped"
    )


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
                f"`ray job list --address {client.get_address()}` lists its jobs"
            ) from None
        raise ClusterError(f"the job server at {client.get_address()} failed: {exc}") from None
    except ConnectionError as exc:
        raise ClusterError(f"lost the job server at {client.get_address()}: {exc}") from None


def wait(
    client: Any,
    job_id: str,
    *,
    poll_s: float = POLL_S,
    on_change: Callable[[Any], None] | None = None,
    known: Any = None,
) -> Any:
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
        raise ClusterError(
            f"the log stream of job {job_id} from {client.get_address()} broke off: {exc}"
        ) from None
    return wait(client, job_id)


def exit_code(info: Any) -> int:
    """A process exit status for a finished job: 0 for SUCCEEDED; otherwise its driver's
    own exit code when Ray reports one in 1-255 (``ragbatch run``'s 2 for a config or
    input problem, ...), else 1 (stopped, killed by a signal, never started)."""
    if str(info.status) == "SUCCEEDED":
        return EXIT_OK
    code = getattr(info, "driver_exit_code", None)
    return code if code is not None and 0 < code <= 255 else EXIT_FAILED


def dashboard_url(client: Any, job_id: str) -> str:
    """The job's page on the cluster's dashboard."""
    return f"{client.get_address().rstrip('/')}/#/jobs/{job_id}"
