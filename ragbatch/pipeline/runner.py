"""Run a job: plan, execute on Ray Data, write, verify row conservation, commit.

With no Ray address (and no ``RAY_ADDRESS``), Ray starts locally in this process; with
one, the same plan runs on that cluster.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
import secrets
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragbatch.analysis.summary import RunSummary, summarize_run, summary_settings
from ragbatch.config.job import JobConfig
from ragbatch.core.errors import InputError, OutputError, RunInterrupted
from ragbatch.core.ids import check_id
from ragbatch.io.budget import check_error_budget
from ragbatch.io.fs import is_process_local, resolve, to_pyarrow
from ragbatch.io.probe import probe_output
from ragbatch.io.staging import Resume, Staging, run_fingerprint
from ragbatch.io.write import OutputLayout, RunCheck, verify_run
from ragbatch.judge.cache_upkeep import damaged_cache_files, settle_journal
from ragbatch.pipeline.manifest import build_manifest, pin_input_version
from ragbatch.io.manifest_model import Manifest
from ragbatch.pipeline.plan import Plan, build_plan, preflight_engines
from ragbatch.pipeline.stage_builders import StageRun, chain_stages
from ragbatch.pipeline.in_process import choose_executor, execute_in_process, tasks_in_flight
from ragbatch.pipeline.ray_paths import start_data_actors, start_local_ray, worker_pythonpath
from ragbatch.core.run_date import choose_run_date, today_utc
from ragbatch.core.stages import StageKind
from ragbatch.config.templating import placeholders, render_config, uri_templates

log = logging.getLogger("ragbatch")

#: Most rows per output Parquet file. Each read task writes its own files (one, or more
#: when its scores exceed this), so a run writes at least one file per read task.
ROWS_PER_FILE = 2_000_000


@dataclass
class RunResult:
    """What a finished run produced."""

    run_id: str
    run_date: dt.date
    layout: OutputLayout
    check: RunCheck
    #: As written to ``manifest.json`` (:meth:`Manifest.to_json_dict`).
    manifest: Manifest
    timings: dict[str, float] = field(default_factory=dict)
    summary: RunSummary | None = None
    #: The config as run: its URIs rendered for the run date (:mod:`ragbatch.config.templating`).
    config: JobConfig | None = None


def new_run_id(now: dt.datetime | None = None) -> str:
    """``YYYYMMDDTHHMMSSZ-xxxxxx``: UTC start time plus 6 random hex digits."""
    now = now or dt.datetime.now(dt.timezone.utc)
    return f"{now:%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


def run_job(
    config: JobConfig,
    *,
    run_id: str | None = None,
    address: str | None = None,
    config_dir: str | Path | None = None,
    allow_uncalibrated: bool = False,
) -> RunResult:
    """Execute a job end to end and return where its outputs are.

    Raises
    ------
    ConfigError, InputError
        Before any metric runs, for problems :func:`ragbatch.pipeline.plan.build_plan` finds, a
        URI template that is not valid (:mod:`ragbatch.config.templating`), or a judge metric
        whose recorded agreement with human labels is missing or below the config's
        ``calibration.min_agreement`` (:func:`ragbatch.calibrate.guard.check_calibration`;
        ``allow_uncalibrated`` turns that into warnings); a human label (config ``labels``)
        outside its metric's range, or a labelled run that is missing or computed the
        metric differently.
    InputNotFoundError
        (an InputError) The input location holds no files.
    OutputNotWritableError
        (a ConfigError and an OutputError) The output root cannot be written: checked
        first, with a probe object (:func:`ragbatch.io.probe.probe_output`).
    OutputError
        The run id is already committed under the output root, it was started before
        with a different config or input, or the store is unreachable.
    ConservationError
        The written scores do not hold exactly one cell per (row, metric); the run is
        then not committed (no manifest is written).
    RunError
        More rows than ``run.error_budget`` allows ended with status ``error``; the run
        is not committed (resuming it scores those rows again).
    RunInterrupted
        (a KeyboardInterrupt) Ctrl-C once the run's staging exists: not committed; the
        scores staged so far are kept, and the same run id resumes it.

    Notes
    -----
    ``{run_date}`` placeholders in ``input.uri``, ``output.uri`` and ``cache.uri`` are
    filled in first (:func:`run_date_for`); the run reads, writes and records the
    rendered URIs, and :attr:`RunResult.config` holds the config as run.

    Scores are staged (:mod:`ragbatch.io.staging`) and published when the run commits. A
    run started again with the id of an interrupted run resumes it: rows whose scores
    an earlier attempt wrote are not scored again.
    """
    started = dt.datetime.now(dt.timezone.utc)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    prepare_import_paths(config_dir)
    if run_id is None:
        run_id = config.run.run_id or new_run_id(started)
    run_id = check_id(run_id, "run id")
    templates = uri_templates(config)
    if templates:
        config = render_config(config, run_date_for(config, run_id, started))
    probe_output(config.output.uri, config.output.storage_options)
    config = pin_input_version(config, run_id, run_date_for(config, run_id, started))
    plan = build_plan(config)
    # before any engine is contacted or staging is written: in_process may refuse the job
    executor = choose_executor(plan, address)
    if config.calibration is not None:
        from ragbatch.calibrate.guard import check_calibration

        check_calibration(plan, allow=allow_uncalibrated)
    labelled_runs = _check_labels(plan)
    preflight_engines(plan)
    layout, staging, resume = _begin(plan, run_id, started)
    with _attempt(run_id, layout, staging):
        run_date = layout.run_date
        timings["plan_s"] = time.perf_counter() - t0
        log.info(
            "run %s: %d read tasks, %d metrics in %d stages -> %s",
            run_id,
            len(plan.read_tasks),
            len(plan.metrics),
            len(plan.stages),
            config.output.uri,
        )

        t1 = time.perf_counter()
        ray_info: dict[str, Any]
        set_aside: list[str] = []
        if executor == "in_process":
            workers, why = tasks_in_flight(config.run.tasks_in_flight)
            log.info("run %s in this process: %s", run_id, why)
            ray_info = {
                "executor": "in_process",
                "address": None,
                "started_locally": False,
                "tasks_in_flight": workers,
                "tasks_in_flight_reason": why,
            }
            done = execute_in_process(
                plan, layout, staging.scores_dir(), resume.done_rows, workers=workers
            )
        else:
            actors = any(stage.engine is not None for stage in plan.stages)
            ray_info = {"executor": "ray", **ensure_ray(address, data_actors_first=not actors)}
            size_pools(plan)
            check_fit(plan, started_locally=ray_info.get("started_locally", False))
            damaged_before = damaged_cache_files(plan.config, plan.stages)
            settle_journal(plan.config, run_id, plan.stages)
            done = execute(plan, layout, staging.scores_dir(), resume.done_rows)
            _stop_local_ray(ray_info)
            set_aside = _set_aside_by_this_run(plan, damaged_before)
        n_rows = done.n_rows
        timings["execute_s"] = time.perf_counter() - t1

        t2 = time.perf_counter()
        files = staging.score_files(resume)
        check = verify_run(layout, files, plan.metric_ids, n_rows)
        check_error_budget(layout, files, n_rows, config.run.error_budget)
        timings["verify_s"] = time.perf_counter() - t2
        t3 = time.perf_counter()
        summary = summarize_run(
            layout,
            files,
            plan.metrics,
            plan.summary_slice_names,
            summary_settings(config),
            diagnostics=plan.config.diagnostics,
            labels=plan.labels,
            labelled_runs=labelled_runs,
        )
        timings["summary_s"] = time.perf_counter() - t3
        timings["total_s"] = time.perf_counter() - t0
        manifest = build_manifest(
            plan,
            layout,
            check,
            started=started,
            timings=timings,
            ray_info=ray_info,
            judge={**(done.judge or {}), "cache_files_set_aside": set_aside},
            resume=resume,
            faults=done.faults,
            placement=done.placement,
            summary=summary,
            uri_templates=templates,
        )
        staging.publish(files, summary.table, manifest)
        settle_journal(plan.config, run_id, plan.stages)
        log.info(
            "run %s committed: %d rows x %d metrics in %.1f s",
            run_id,
            n_rows,
            len(plan.metrics),
            timings["total_s"],
        )
        return RunResult(run_id, run_date, layout, check, manifest, timings, summary, config)


#: Most files of the judgment cache a manifest names as set aside during its run
#: (``judge.cache_files_set_aside``), and most the driver's warning names.
SET_ASIDE_IN_MANIFEST = 1000
SET_ASIDE_IN_LOG = 10


def _set_aside_by_this_run(plan: Plan, before: set[str] | None) -> list[str]:
    """The judgment cache's files set aside while this run's stages ran (new under
    ``v2/damaged/`` since ``before``, :func:`damaged_cache_files`): files this run could
    not read, or that another process sharing the cache set aside meanwhile. Sorted, at
    most :data:`SET_ASIDE_IN_MANIFEST`, with one warning in the driver's log giving their
    number and naming the first :data:`SET_ASIDE_IN_LOG`; empty when either listing
    failed."""
    after = damaged_cache_files(plan.config, plan.stages)
    if before is None or after is None or not after - before:
        return []
    new = sorted(after - before)
    named = ", ".join(new[:SET_ASIDE_IN_LOG])
    if len(new) > SET_ASIDE_IN_LOG:
        named += f" and {len(new) - SET_ASIDE_IN_LOG} more"
    log.warning(
        "judgment cache: %d file(s) were set aside while this run's stages ran (files it "
        "could not read, or that another process sharing the cache set aside); entries "
        "they held are asked again; the manifest lists them (judge.cache_files_set_aside): "
        "%s",
        len(new),
        named,
    )
    return new[:SET_ASIDE_IN_MANIFEST]


#: Shutdowns of a local Ray under way (:func:`_stop_local_ray`).
_STOPPING: list[threading.Thread] = []


def _stop_local_ray(ray_info: dict[str, Any]) -> None:
    """Shut down the local Ray instance this run started, in a thread of its own: about a
    second of stopping processes, while the run verifies, summarizes and publishes what
    it wrote (which needs no Ray) and the command prints it. A Ray the run joined but did
    not start is left running.

    The thread is not a daemon: the interpreter waits for it before it exits (and before
    Ray's own exit hook, which then finds nothing to do), and :func:`ensure_ray` waits
    for it before it starts another instance."""
    if not ray_info.get("started_locally"):
        return
    import ray

    thread = threading.Thread(target=ray.shutdown, name="ragbatch-ray-shutdown")
    _STOPPING.append(thread)
    thread.start()


def _check_labels(plan: Plan) -> dict[str, Any]:
    """Check the config's human labels before any metric runs: every label of an input
    column in its metric's range (:func:`ragbatch.io.labels.check_label_values`), and the
    labelled run of ``labels.calibration`` (read now: its pairs' moments are returned for
    the summary, :func:`ragbatch.analysis.labelled_run.labelled_run_moments`)."""
    if plan.config.labels is None:
        return {}
    from ragbatch.analysis.labelled_run import labelled_run_moments
    from ragbatch.io.labels import check_label_values

    check_label_values(plan)
    return labelled_run_moments(plan)


@contextmanager
def _attempt(run_id: str, layout: OutputLayout, staging: Staging) -> Iterator[None]:
    """The body of one attempt of a run. The run's lease (taken by :func:`_begin`) is
    renewed until publish removes it; however the attempt ends otherwise, it is released
    so that the next attempt can start at once. A KeyboardInterrupt (Ctrl-C) becomes
    :class:`RunInterrupted`, which says where the scores staged so far are kept."""
    try:
        yield
    except KeyboardInterrupt:
        raise RunInterrupted(
            run_id, layout.run_date.isoformat(), layout.uri(staging.root)
        ) from None
    finally:
        staging.close()


def run_date_for(config: JobConfig, run_id: str, started: dt.datetime) -> dt.date:
    """The date a run of ``config`` with id ``run_id`` takes: ``run.run_date`` (which
    ``--run-date`` sets), else the date an earlier attempt of ``run_id`` recorded (a
    resumed run keeps its date, and so its URIs), else the UTC date of ``started``.

    Notes
    -----
    The earlier attempt is looked for under ``output.uri``; when that URI itself depends
    on the run date it cannot be, so a run resumed on a later day needs ``--run-date``.
    """
    recorded = None
    if config.run.run_date is None and not placeholders(config.output.uri, "output.uri"):
        recorded = Staging(
            OutputLayout.for_run(config.output, today_utc(started), run_id)
        ).run_date()
    return choose_run_date(config.run.run_date, recorded, now=started)


def _begin(plan: Plan, run_id: str, started: dt.datetime) -> tuple[OutputLayout, Staging, Resume]:
    """The run's output layout and staging, and what an earlier attempt left to reuse.
    A resumed run keeps the run date of its first attempt."""
    from ragbatch.io.read import input_fingerprint

    config = plan.config
    probe = Staging(OutputLayout.for_run(config.output, today_utc(started), run_id))
    run_date = choose_run_date(config.run.run_date, probe.run_date(), now=started)
    layout = OutputLayout.for_run(config.output, run_date, run_id)
    staging = Staging(layout)
    files = plan.input_fingerprint or input_fingerprint(config.input, plan.read_tasks)
    fingerprint = run_fingerprint(config.model_dump(mode="json"), files["sha256"])
    resume = staging.begin(fingerprint, plan.metric_ids, files.get("table"))
    if resume.resumed:
        log.info(
            "run %s: attempt %d resumes with %d rows already scored",
            run_id,
            resume.attempt,
            len(resume.done_rows),
        )
    return layout, staging, resume


def prepare_import_paths(config_dir: str | Path | None) -> tuple[str, ...]:
    """Record the folders a ``binary`` metric's callback module is looked for in: the
    working folder, then the config file's folder (:mod:`ragbatch.metrics.callback_import`).

    ``sys.path`` is left as it is, and nothing is added to the Ray workers' ``PYTHONPATH``:
    a callback module found in these folders is imported from its file under a private
    name, so a file next to the config (``secrets.py``, ``jinja2.py``) never stands in for
    a module of the same name.

    Returns
    -------
    tuple of str
        The folders, absolute.
    """
    from ragbatch.metrics.callback_import import set_callback_dirs

    return set_callback_dirs([os.getcwd(), *([config_dir] if config_dir is not None else [])])


def ensure_ray(address: str | None, data_actors_first: bool = True) -> dict[str, Any]:
    """Connect to ``address`` (or ``RAY_ADDRESS``), or start Ray locally
    (:func:`ragbatch.pipeline.ray_paths.start_local_ray`: no user folder on the workers' module
    path); return facts about the cluster for the manifest. An already initialised Ray
    is reused.

    With ``data_actors_first`` a local Ray starts Ray Data's own actors at once
    (:func:`~ragbatch.pipeline.ray_paths.start_data_actors`), so that a job of tasks
    alone runs its tasks side by side from the start. A job with actor stages passes
    False: a small machine starts two worker processes at a time, and its model actors,
    which take longest to load, would otherwise wait behind those two (seconds of fixed
    cost); Ray Data then starts them itself beside its pools."""
    import ray

    while _STOPPING:
        _STOPPING.pop().join()
    started_locally = False
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS") or None
        env = {"PYTHONPATH": worker_pythonpath()}
        for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
            if var in os.environ:
                env[var] = os.environ[var]
        runtime_env = {"env_vars": env}
        if address:
            ray.init(address=address, runtime_env=runtime_env, log_to_driver=True)
        else:
            # "local" always starts a new instance; a bare init() would join any Ray
            # cluster already running on this machine.
            start_local_ray(runtime_env, include_dashboard=False, log_to_driver=True)
            if data_actors_first:
                start_data_actors()
            started_locally = True
    ctx = ray.get_runtime_context()
    return {
        "address": getattr(ctx, "gcs_address", None),
        "started_locally": started_locally,
        "resources": {
            k: v for k, v in ray.cluster_resources().items() if not k.startswith("node:")
        },
    }


@dataclass
class Executed:
    """What :func:`execute` learned: the input row count, the judge stages' totals
    (:meth:`udfs.judge.JudgeLedger.totals`), the actor stages' fault counters
    (:meth:`udfs.ledger.RunLedger.faults`) and where their actors ran
    (:meth:`udfs.ledger.RunLedger.placement`)."""

    n_rows: int
    judge: dict[str, Any]
    faults: dict[str, Any]
    placement: dict[str, Any]


def execute(
    plan: Plan, layout: OutputLayout, scores_dir: str, done_rows: set[str] | None = None
) -> Executed:
    """Build the Ray Data pipeline and run it, writing score files into ``scores_dir``
    (a path on ``layout.fs``); rows whose id is in ``done_rows`` are read and counted but
    not scored.

    Raises
    ------
    InputError
        The input turned out to hold no rows.
    """
    import ray
    import ray.data

    from udfs.judge import JudgeLedger
    from udfs.ledger import describe_faults

    # Keep a UDF's own exception (instead of Ray Data's UserCodeException, which keeps
    # only its text), so that _own_error can find it.
    ray.data.DataContext.get_current().raise_original_map_exception = True
    _retry_storage_errors(ray.data.DataContext.get_current())
    _no_progress_limit(ray.data.DataContext.get_current())
    ledger = _run_ledger(plan, layout.run_id)
    # Each actor is a worker process of its own (seconds to start on a small machine):
    # the judge ledger only when a judge stage reports to it.
    judge_ledger = None
    if any(stage.kind is StageKind.JUDGE for stage in plan.stages):
        judge_ledger = ray.remote(num_cpus=0)(JudgeLedger).remote()
    try:
        n_rows = _run_pipeline(plan, layout, scores_dir, done_rows, ledger, judge_ledger)
        judge = (
            ray.get(judge_ledger.totals.remote())
            if judge_ledger is not None
            else JudgeLedger().totals()
        )
        faults = ray.get(ledger.faults.remote())
        placement = ray.get(ledger.placement.remote())
    finally:
        ray.kill(ledger)
        if judge_ledger is not None:
            ray.kill(judge_ledger)
    if describe_faults(faults):
        log.warning("faults survived:\n%s", describe_faults(faults))
    if n_rows == 0:
        raise InputError(f"input {plan.config.input.uri} holds no rows; nothing to evaluate")
    return Executed(n_rows, judge, faults, placement)


def size_pools(plan: Plan) -> None:
    """Size the plan's actor pools for the connected Ray cluster's nodes
    (:meth:`ragbatch.pipeline.plan.Plan.size_pools`), and log each choice."""
    from ragbatch.core.placement import cluster_nodes

    plan.size_pools(cluster_nodes())
    for stage in plan.stages:
        if stage.pool is not None and stage.pool.chosen:
            log.info("stage %s: %s", stage.name, stage.pool.rule)


def check_fit(plan: Plan, *, started_locally: bool) -> None:
    """Check that the connected Ray cluster can hold every actor stage's smallest pool
    (:func:`ragbatch.core.placement.fit_problems`) and still leaves one node a whole CPU for
    the read, expression and write tasks (:func:`ragbatch.core.placement.read_task_problem`).

    Raises
    ------
    ConfigError
        It cannot, and Ray was started locally by this run (nothing will add resources:
        Ray Data would wait forever). On a cluster the problems are logged as warnings
        instead, since an autoscaler may add the nodes.
    """
    from ragbatch.core.errors import ConfigError
    from ragbatch.core.placement import cluster_nodes, fit_problems, read_task_problem

    demands, nodes = plan.demands(), cluster_nodes()
    problems = fit_problems(demands, nodes)
    if not problems:
        starved = read_task_problem(demands, nodes)
        problems = [starved] if starved else []
    if not problems:
        return
    if started_locally:
        raise ConfigError(
            [
                *problems,
                "this machine's local Ray cannot grow; lower the "
                "engines' resources, or run on a cluster with --address",
            ]
        )
    for p in problems:
        log.warning("placement: %s (waiting for the cluster to add resources)", p)


def _run_pipeline(
    plan: Plan,
    layout: OutputLayout,
    scores_dir: str,
    done_rows: set[str] | None,
    ledger: Any,
    judge_ledger: Any,
) -> int:
    """Read, score and write; return the input row count."""
    import ray

    ds, local_rows = _source(plan, ledger)
    if done_rows:
        from udfs.read import drop_rows

        ds = ds.map_batches(
            drop_rows, batch_format="pyarrow", fn_kwargs={"row_ids": ray.put(sorted(done_rows))}
        )
    ds = chain_stages(ds, plan, StageRun(judge_ledger, ledger, layout.run_id))
    own = None
    try:
        _write(ds, layout, scores_dir)
    except Exception as exc:
        # A RagbatchError raised inside a Ray task (an input problem found while reading,
        # a model that cannot load, the error budget) arrives wrapped in Ray's task errors:
        # re-raise our own error so that the message and the CLI's exit status are the
        # ones it carries.
        own = _own_error(exc)
        if own is None:
            raise
    if own is not None:
        # Raised outside the handler and without the dataset: neither Ray's error nor a
        # frame of this function may keep the failed execution (and its actors) alive.
        del ds
        own.__context__ = own.__cause__ = None
        raise own
    return local_rows if local_rows is not None else ray.get(ledger.totals.remote())[0]


#: Substrings of storage errors that Ray Data's file writes retry with exponential backoff
#: (up to 10 attempts, at most 32 s apart), added to its defaults (which match only
#: pyarrow's own S3 client): a refused or dropped connection, a timeout, throttling and
#: 5xx replies, as raised through s3fs/gcsfs and botocore. A missing bucket, a missing
#: key or denied credentials are not among them: they fail at once.
RETRIED_STORAGE_ERRORS = (
    "Could not connect to the endpoint URL",
    "EndpointConnectionError",
    "Connection refused",
    "Connection reset",
    "ServerDisconnectedError",
    "ClientConnectorError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "SlowDown",
    "Throttling",
    "RequestTimeout",
    "ServiceUnavailable",
    "Service Unavailable",
    "InternalError",
    "Internal Server Error",
    "Please reduce your request rate",
)


def _retry_storage_errors(ctx: Any) -> None:
    """Add :data:`RETRIED_STORAGE_ERRORS` to the patterns Ray Data retries, as escaped
    regular expressions (they match the same text as substrings or as patterns). Ray
    warns about every non-default value, whatever its patterns: that warning is
    silenced here, and only here."""
    patterns = [re.escape(text) for text in RETRIED_STORAGE_ERRORS]
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=".*retried_io_errors.*substring matching", category=DeprecationWarning
        )
        ctx.retried_io_errors = list(dict.fromkeys([*ctx.retried_io_errors, *patterns]))


def _no_progress_limit(ctx: Any) -> None:
    """Turn off Ray Data's watchdog that fails a dataset when no block has moved for
    ``execution_no_progress_timeout_s`` (1,800 s in Ray 2.60).

    One call of an actor stage takes up to :data:`ACTOR_BLOCK_BATCHES` batches, and on a
    slow judge (a CPU, long prompts, a large model) that call can run past half an hour
    without any block leaving the stage: the watchdog then failed a healthy run, after
    everything it paid for. A run's time limits are the engines' own
    (``request_timeout_s``, ``batch_timeout_s``), which give the rows a status instead
    of failing the run. Ray Data versions without the setting are left as they are."""
    if hasattr(ctx, "execution_no_progress_timeout_s"):
        ctx.execution_no_progress_timeout_s = -1


def _run_ledger(plan: Plan, run_id: str) -> Any:
    """The run's :class:`udfs.ledger.RunLedger` actor, named ``ragbatch-ledger:<run id>``
    in the Ray namespace ``ragbatch``, so that one cluster never runs two attempts of a
    run at once, whichever drivers start them.

    Raises
    ------
    OutputError
        An attempt of the same run id is running on this Ray cluster now.
    """
    import ray

    from udfs.ledger import RunLedger

    name = f"{LEDGER_PREFIX}{run_id}"
    try:
        # A namespace of its own: each driver otherwise gets an anonymous one, and the
        # name would not be seen by the driver of another attempt.
        return (
            ray.remote(num_cpus=0)(RunLedger)
            .options(name=name, namespace=LEDGER_NAMESPACE)
            .remote(len(plan.read_tasks), plan.config.run.error_budget)
        )
    except ValueError as exc:
        if "already" not in str(exc):
            raise
        raise OutputError(
            f"run {run_id!r} is already running on this Ray cluster (actor {name!r}); "
            "wait for it to finish, or pass a new --run-id"
        ) from None


#: Name prefix of a run's ledger actor (followed by the run id), and its Ray namespace.
LEDGER_PREFIX = "ragbatch-ledger:"
LEDGER_NAMESPACE = "ragbatch"


def _own_error(exc: BaseException) -> Exception | None:
    """The first :class:`~ragbatch.core.errors.RagbatchError` in ``exc``'s chain of causes
    (Ray keeps the original as ``cause`` on its task errors), or None."""
    from ragbatch.core.errors import RagbatchError

    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        cause = getattr(current, "cause", None)
        if isinstance(cause, RagbatchError):
            return cause  # the original, without Ray's remote traceback in its message
        if isinstance(current, RagbatchError):
            return current
        todo += [cause, current.__cause__, current.__context__]
    return None


def _source(plan: Plan, ledger: Any) -> tuple[Any, int | None]:
    """The normalized input dataset, and its row count when read on the driver."""
    import ray.data

    from udfs.read import read_stage

    cfg = plan.config.input
    fs, _ = resolve(cfg.uri, cfg.storage_options)
    if is_process_local(fs):
        # The input lives in this process only (memory://): read it here.
        from ragbatch.io.read import read_task
        from ragbatch.io.schema import normalize

        tables = [
            normalize(read_task(t, cfg), cfg, t, slices=plan.slices, quote_values=plan.quote_values)
            for t in plan.read_tasks
        ]
        for i, table in enumerate(tables):
            ledger.record.remote(i, table.num_rows)
        return ray.data.from_arrow(tables), sum(t.num_rows for t in tables)
    items = [{"task": i} for i in range(len(plan.read_tasks))]
    ds = ray.data.from_items(items, override_num_blocks=max(1, len(items)))
    ds = ds.map_batches(
        read_stage,
        batch_size=1,
        batch_format="pyarrow",
        fn_kwargs={
            "tasks": plan.read_tasks,
            "input_cfg": cfg,
            "slices": plan.slices,
            "ledger": ledger,
            "quote_values": plan.quote_values,
        },
    )
    return ds, None


def _write(ds: Any, layout: OutputLayout, scores_dir: str) -> None:
    if layout.process_local:
        # The output lives in this process only (memory://): write it from here.
        for i, batch in enumerate(ds.iter_batches(batch_format="pyarrow", batch_size=None)):
            if batch.num_rows:
                layout.write_table(f"{scores_dir}/part-{i:05d}.parquet", batch)
        return
    # A cap, not a minimum: Ray Data fuses the write into the read/score tasks, and a
    # ``min_rows_per_file`` there makes it bundle read tasks (one input row each) until
    # that many rows, i.e. every read task into a single task on one CPU.
    ds.write_parquet(scores_dir, filesystem=to_pyarrow(layout.fs), max_rows_per_file=ROWS_PER_FILE)
