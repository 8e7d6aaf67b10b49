"""Running a plan without Ray: the expression-only run on one machine.

A run whose metrics are all expression metrics (Polars expressions, no model, no judge,
no PII engine) has nothing to place on actors. When it also has no Ray cluster to join
(no ``--address``, no ``RAY_ADDRESS``, no Ray already started in the process), starting
a local Ray instance costs more than the work on small and medium inputs: about 5-6 s
for ``ray.init`` on a two-core machine, then a worker process per task and for Ray
Data's own actors, each importing Ray Data (about 2 CPU-s each), before the first row
is read. :func:`execute_in_process` runs the same stages in this process instead, two
read tasks at a time on two threads: the same reader and normalizer (:mod:`ragbatch.io.read`,
:mod:`ragbatch.io.schema`), the same expression stage (:mod:`udfs.expressions`) and
wide-to-long step (:mod:`udfs.scores`), and score files of the same schema in the
attempt's staging folder. Polars and PyArrow also use every core within each step.

``run.executor`` chooses (:func:`choose_executor`): ``auto`` (the default) runs in
process when the conditions above hold, ``ray`` always uses Ray, ``in_process``
requires the first two (Ray may be started: it is left alone) and says which fails.
"""

from __future__ import annotations

import os
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from ragbatch.core.errors import ConfigError
from ragbatch.core.stages import StageKind

#: Read tasks :func:`execute_in_process` works on at once, each on its own thread: while
#: one task's file is decoded, the other's rows are scored and written (NumPy, Polars,
#: PyArrow and the Parquet writer release the GIL). Measured at 3,000,000 rows on two
#: cores: 19.1 s with two against 32.7 s with one (docs/benchmarks/whole-job.md).
TASKS_IN_FLIGHT = 2


def _ray_started() -> bool:
    """Whether this process already joined or started Ray (tests, notebooks, a driver
    that runs several jobs): a run then uses it."""
    import sys

    ray = sys.modules.get("ray")
    return bool(ray is not None and getattr(ray, "is_initialized", lambda: False)())


def in_process_obstacle(plan: Any, address: str | None) -> str | None:
    """Why ``plan`` cannot run in this process, or None when it can: a stage that runs
    on Ray actor pools, or a Ray cluster named for the run.

    Parameters
    ----------
    plan : ragbatch.pipeline.plan.Plan
    address : str or None
        The Ray address the run was given (``--address``); ``RAY_ADDRESS`` counts too.
    """
    actor_stages = [s.name for s in plan.stages if s.kind is not StageKind.EXPRESSION]
    if actor_stages:
        return f"stages {', '.join(actor_stages)} run on Ray actor pools"
    if address or os.environ.get("RAY_ADDRESS"):
        return "a Ray cluster address is given (--address or RAY_ADDRESS)"
    return None


def choose_executor(plan: Any, address: str | None) -> str:
    """``"in_process"`` or ``"ray"`` for ``plan``, from ``plan.config.run.executor``.

    Raises
    ------
    ConfigError
        ``run.executor: in_process`` for a plan that needs Ray (the message says why).
    """
    wanted = plan.config.run.executor
    if wanted == "ray":
        return "ray"
    obstacle = in_process_obstacle(plan, address)
    if wanted == "in_process":
        if obstacle is not None:
            raise ConfigError(
                f"run.executor: in_process cannot run this job: {obstacle}; "
                "use run.executor: auto or ray"
            )
        return "in_process"
    # auto: a Ray instance this process already started (tests, notebooks, a driver
    # running several jobs) is used rather than left idle.
    return "ray" if obstacle is not None or _ray_started() else "in_process"


def execute_in_process(
    plan: Any, layout: Any, scores_dir: str, done_rows: set[str] | None = None
) -> Any:
    """Read, score and write every read task of ``plan`` in this process, in task order;
    return a :class:`ragbatch.pipeline.runner.Executed` (no judge totals, faults or
    placement: there are no actors).

    Up to :data:`TASKS_IN_FLIGHT` tasks run at once, on threads of this process; the
    files they write are named by task index, so they do not depend on which finishes
    first. The first task that fails stops the run: no task is started after it, the
    one still running finishes, and its error is raised.

    Each task's score rows are written as one Parquet file (split past
    :data:`ragbatch.pipeline.runner.ROWS_PER_FILE` rows) under ``scores_dir``, first
    under a temporary name and then renamed, so a run killed mid-write leaves whole
    files only, which a resumed attempt keeps; rows in ``done_rows`` are read and
    counted but not scored.

    Raises
    ------
    InputError
        A task's file cannot be read (as in the Ray path).
    """
    from ragbatch.io.read import read_task
    from ragbatch.io.schema import normalize
    from ragbatch.pipeline.runner import ROWS_PER_FILE, Executed
    from udfs.expressions import expression_stage
    from udfs.judge import JudgeLedger
    from udfs.read import drop_rows
    from udfs.scores import to_long

    cfg = plan.config.input
    done = sorted(done_rows) if done_rows else []
    token = uuid.uuid4().hex[:12]

    def run_task(index: int, task: Any) -> int:
        table = normalize(
            read_task(task, cfg), cfg, task, slices=plan.slices, quote_values=plan.quote_values
        )
        n = table.num_rows
        if done:
            table = drop_rows(table, done)
        for stage in plan.stages:
            table = expression_stage(table, metrics=stage.metrics)
        scores = to_long(table, metric_ids=plan.metric_ids, slices=plan.slice_names)
        for part, start in enumerate(range(0, scores.num_rows, ROWS_PER_FILE)):
            name = f"{scores_dir}/{token}-{index:06d}-{part:03d}.parquet"
            _write_whole(layout, name, scores.slice(start, ROWS_PER_FILE))
        return n

    n_rows = 0
    workers = max(1, min(TASKS_IN_FLIGHT, len(plan.read_tasks)))
    with ThreadPoolExecutor(workers, thread_name_prefix="ragbatch-task") as pool:
        pending: set[Future] = set()
        for index, task in enumerate(plan.read_tasks):
            n_rows += _collect(pending, leave=workers - 1)
            pending.add(pool.submit(run_task, index, task))
        n_rows += _collect(pending, leave=0)
    return Executed(n_rows, JudgeLedger().totals(), {}, {})


def _collect(pending: set[Future], leave: int) -> int:
    """Wait for tasks of ``pending`` as they end, whichever ends first, until at most
    ``leave`` are left; remove them from ``pending`` and return the sum of their results
    (rows read). A task that failed raises its error here, as soon as it has ended, so
    that no further task is started."""
    total = 0
    while len(pending) > leave:
        finished, _ = wait(pending, return_when=FIRST_COMPLETED)
        pending -= finished
        total += sum(future.result() for future in finished)
    return total


def _write_whole(layout: Any, path: str, table: Any) -> None:
    """Write ``table`` at ``path``; on local disk through a temporary name
    (``<path>.tmp``, renamed), so that the file appears whole or not at all (object
    stores write whole objects anyway)."""
    from fsspec.implementations.local import LocalFileSystem

    if not isinstance(layout.fs, LocalFileSystem):
        layout.write_table(path, table)
        return
    temporary = f"{path}.tmp"
    layout.write_table(temporary, table)
    layout.fs.mv(temporary, path)
