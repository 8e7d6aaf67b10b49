"""Running a plan without Ray: the expression-only run on one machine.

A run whose metrics are all expression metrics (Polars expressions, no model, no judge,
no PII engine) has nothing to place on actors. When it also has no Ray cluster to join
(no ``--address``, no ``RAY_ADDRESS``, no Ray already started in the process), starting
a local Ray instance costs more than the work on small and medium inputs: about 5-6 s
for ``ray.init`` on a two-core machine, then a worker process per task and for Ray
Data's own actors, each importing Ray Data (about 2 CPU-s each), before the first row
is read. :func:`execute_in_process` runs the same stages in this process instead, on
a thread per read task in flight (:func:`tasks_in_flight`): the same reader and
normalizer (:mod:`ragbatch.io.read`, :mod:`ragbatch.io.schema`), the same expression
stage (:mod:`udfs.expressions`) and wide-to-long step (:mod:`udfs.scores`), and score
files of the same schema in the attempt's staging folder. Polars and PyArrow also use
every core within each step. The text columns travel as string views from the reader
to the expression stage (:func:`view_columns`), a large task is scored in slices
(:data:`SLICE_ROWS`), and only the input columns the run uses are read
(:mod:`ragbatch.pipeline.projection`).

``run.executor`` chooses (:func:`choose_executor`): ``auto`` (the default) runs in
process when the conditions above hold, ``ray`` always uses Ray, ``in_process``
requires the first two (Ray may be started: it is left alone) and says which fails.
"""

from __future__ import annotations

import os
import uuid
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from functools import partial
from typing import Any, Callable

from ragbatch.core.errors import ConfigError
from ragbatch.core.machine import available_memory, usable_cores
from ragbatch.core.stages import StageKind

#: The fewest threads :func:`execute_in_process` works on, and read tasks it holds open
#: at once (:func:`tasks_in_flight`): while one task's file is decoded, rows already read
#: are scored and written (NumPy, Polars, PyArrow and the Parquet writer release the
#: GIL). Measured at 3,000,000 rows on two cores: 19.1 s with two against 32.7 s with
#: one (docs/benchmarks/whole-job.md).
TASKS_IN_FLIGHT = 2

#: Memory counted per read task in flight when :func:`tasks_in_flight` sizes the
#: executor to the machine. A task is about 100,000 rows; with two in flight, 1,000,000
#: rows of long, distinct texts (about 5 KB a row, the benchmark's `long` shape) peaked
#: at 2.1-2.4 GB for the whole process (docs/benchmarks/whole-job.md, round six): about
#: 1 GB a task. Twice that leaves room for rows longer still.
TASK_MEMORY_BYTES = 2 * 2**30


def tasks_in_flight(
    setting: int | None, cores: int | None = None, available: int | None = None
) -> tuple[int, str]:
    """Read tasks :func:`execute_in_process` holds open at once, which is also the
    threads it works on, and a sentence saying why (for the log and the manifest).

    ``setting`` (``run.tasks_in_flight``) is kept as written. Unset, it is one per core
    this process may use, as far as the memory available allows
    :data:`TASK_MEMORY_BYTES` a task, and never fewer than :data:`TASKS_IN_FLIGHT`: on
    two cores two, on sixteen cores with 128 GiB available sixteen, on sixteen cores
    with 12 GiB available six. The reading, scoring and writing of a task run mostly on
    one core each (Polars decodes one column chunk on one thread), so tasks are what
    spread a run over a larger machine.

    Parameters
    ----------
    setting : int or None
        ``run.tasks_in_flight`` (at least 1), or None to size to the machine.
    cores, available : int, optional
        The cores this process may use and the bytes of memory it may still take, a
        container's CPU quota and memory limit counted
        (:func:`ragbatch.core.machine.usable_cores`,
        :func:`ragbatch.core.machine.available_memory`) when not given.
    """
    if setting is not None:
        return setting, f"{setting} read tasks at a time, as run.tasks_in_flight sets"
    try:
        cores = usable_cores() if cores is None else cores
        available = available_memory() if available is None else available
    except Exception as exc:  # noqa: BLE001 - a sandbox that hides the machine
        return TASKS_IN_FLIGHT, (
            f"{TASKS_IN_FLIGHT} read tasks at a time: the cores and memory of this machine "
            f"could not be read ({type(exc).__name__}: {exc}); run.tasks_in_flight sets it"
        )
    by_memory = available // TASK_MEMORY_BYTES
    n = max(TASKS_IN_FLIGHT, min(cores, by_memory))
    gib = available / 2**30
    return n, (
        f"{n} read tasks at a time: {cores} core{'' if cores == 1 else 's'}, "
        f"{gib:.1f} GiB of memory available "
        f"({TASK_MEMORY_BYTES // 2**30} GiB counted a task, at least {TASKS_IN_FLIGHT}; "
        "run.tasks_in_flight sets it)"
    )


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
    plan: Any,
    layout: Any,
    scores_dir: str,
    done_rows: set[str] | None = None,
    workers: int = TASKS_IN_FLIGHT,
) -> Any:
    """Read, score and write every read task of ``plan`` in this process, in task order;
    return a :class:`ragbatch.pipeline.runner.Executed` (no judge totals, faults or
    placement: there are no actors).

    The work runs on ``workers`` threads of this process (the runner passes
    :func:`tasks_in_flight`'s choice). A task's rows are read in one piece, then scored
    and written whole or, when large, in slices (:func:`_slices`), each slice on
    whichever thread is free: slices of a read task go before the next read, and at most
    ``workers`` tasks are open (read, or being read, and not yet written) at once. The
    files are named by task and slice, so they do not depend on which finishes first.
    The first failure stops the run: no task is read after it, the slices of the tasks
    already read are finished, and the error of the earliest task (in task order) that
    failed is raised.

    Each slice's score rows are written as one Parquet file (split past
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
    from ragbatch.io.schema import check_row_ids, normalize
    from ragbatch.pipeline.projection import project_input
    from ragbatch.pipeline.runner import ROWS_PER_FILE, Executed
    from udfs.expressions import expression_stage
    from udfs.judge import JudgeLedger
    from udfs.read import drop_rows
    from udfs.scores import to_long

    projection = project_input(plan)
    cfg = projection.input
    done = sorted(done_rows) if done_rows else []
    token = uuid.uuid4().hex[:12]
    # A resumed run filters rows by id, which pyarrow cannot do on string views.
    views = frozenset() if done else view_columns(plan)

    def read(index: int, task: Any) -> tuple[int, list[Callable[[], None]]]:
        raw = read_task(task, plan.config.input, views, projection.columns)
        pieces = _slices(raw, task)
        units: list[Callable[[], None]] = [
            partial(score, index, part, *piece) for part, piece in enumerate(pieces)
        ]
        if len(pieces) > 1:
            # Row ids repeated within the task (in two slices), null or of a type that
            # cannot be a string are refused as the task's normalization refuses them;
            # checked beside the slices, on another thread.
            units.insert(0, partial(check_row_ids, raw, cfg, task))
        return raw.num_rows, units

    def score(index: int, part: int, raw: Any, task: Any) -> None:
        table = normalize(
            raw, cfg, task, slices=plan.slices, quote_values=plan.quote_values, views=bool(views)
        )
        if done:
            table = drop_rows(table, done)
        for stage in plan.stages:
            table = expression_stage(table, metrics=stage.metrics)
        scores = to_long(
            table, metric_ids=plan.metric_ids, slices=plan.slice_names, judges=plan.member_judges
        )
        for piece, start in enumerate(range(0, scores.num_rows, ROWS_PER_FILE)):
            name = f"{scores_dir}/{token}-{index:06d}-{part:04d}-{piece:03d}.parquet"
            _write_whole(layout, name, scores.slice(start, ROWS_PER_FILE))

    with ThreadPoolExecutor(workers, thread_name_prefix="ragbatch-task") as pool:
        n_rows = _Schedule(pool, workers, read).run(list(plan.read_tasks))
    return Executed(n_rows, JudgeLedger().totals(), {}, {})


#: Rows of the slices a large read task is scored and written in
#: (:func:`execute_in_process`): a task of more than twice this many rows (one large
#: Parquet row group, a large text file) is cut into as few slices of about equal size
#: as keep each within it, so that its slices are scored on several threads and its memory
#: is not held three times over (raw, normalized, scored). Smaller tasks stay whole:
#: each slice costs a fixed share of work (the stage's queries, a file, the check of
#: the task's row ids), and tasks of 125,000 rows took 3.4-3.6 s whole against
#: 4.1-4.5 s in two slices (1,000,000 rows; docs/benchmarks/whole-job.md, round four).
SLICE_ROWS = 100_000


def _slices(raw: Any, task: Any) -> list[tuple[Any, Any]]:
    """``raw`` (a task's rows) whole, or past ``2 * SLICE_ROWS`` rows as ``(rows, task)``
    pieces of about equal size, at most :data:`SLICE_ROWS` rows each; each piece's task is
    ``task`` with the ``row_offset`` of its first row (generated row ids and messages
    count rows from it)."""
    import dataclasses

    n = raw.num_rows
    if n <= 2 * SLICE_ROWS:
        return [(raw, task)]
    count = -(-n // SLICE_ROWS)
    size = -(-n // count)
    return [
        (raw.slice(start, size), dataclasses.replace(task, row_offset=task.row_offset + start))
        for start in range(0, n, size)
    ]


class _Schedule:
    """The order in which :func:`execute_in_process` reads tasks and scores slices.

    ``read(index, task)`` reads a task and returns its rows and its units of work (the
    scoring of each slice, and any check of the whole task), each a call without
    arguments. Up to ``workers`` calls run at once on ``pool``; a free thread takes a
    unit of a task already read before it reads another task, and a task is read only
    while fewer than ``workers`` tasks are open (read or being read, with units left).
    """

    def __init__(self, pool: ThreadPoolExecutor, workers: int, read: Callable) -> None:
        self.pool, self.workers, self.read = pool, workers, read
        self.ready: deque[tuple[int, Callable[[], None]]] = deque()
        self.left: dict[int, int] = {}  # task index -> units not yet done (1: its read)
        self.pending: dict[Future, tuple[int, bool]] = {}  # -> task index, is a read
        self.failure: BaseException | None = None
        self.failure_index = -1  # the task whose failure is kept
        self.n_rows = 0

    def run(self, tasks: list[Any]) -> int:
        """Read and score every task; the rows read. Raises the earliest task's failure,
        once the units of the tasks already read are done."""
        queue = deque(enumerate(tasks))
        while True:
            while len(self.pending) < self.workers:
                if self.ready:
                    index, unit = self.ready.popleft()
                    self.pending[self.pool.submit(unit)] = (index, False)
                elif self.failure is None and queue and len(self.left) < self.workers:
                    index, task = queue.popleft()
                    self.left[index] = 1
                    self.pending[self.pool.submit(self.read, index, task)] = (index, True)
                else:
                    break
            if not self.pending:
                break
            finished, _ = wait(self.pending, return_when=FIRST_COMPLETED)
            for future in finished:
                self._finished(future, *self.pending.pop(future))
        if self.failure is not None:
            raise self.failure
        return self.n_rows

    def _finished(self, future: Future, index: int, is_read: bool) -> None:
        try:
            value = future.result()
        except BaseException as exc:  # noqa: BLE001 - raised by run, once the rest is done
            # The earliest task's failure, whichever ends first among those in flight.
            if self.failure is None or index < self.failure_index:
                self.failure, self.failure_index = exc, index
            is_read = False
        if is_read:
            n_rows, units = value
            self.n_rows += n_rows
            self.left[index] += len(units)
            self.ready.extend((index, unit) for unit in units)
        self.left[index] -= 1
        if self.left[index] == 0:
            del self.left[index]


def view_columns(plan: Any) -> frozenset[str]:
    """The input columns the in-process executor reads as string views: those mapped to
    ``question``, ``contexts``, ``answer`` or ``reference``, unless one also passes through
    as a slice or label column (those keep their own type in the scores table).

    The expression stage reads these columns as Polars' string views; read as views
    (:func:`ragbatch.io.read.read_task`) and normalized as views
    (:func:`ragbatch.io.schema.normalize`), their strings are not copied on the way, and
    texts that many rows share stay one copy (docs/benchmarks/whole-job.md, round four).
    """
    from ragbatch.core import columns as C

    mapping = plan.config.input.columns
    mapped = {getattr(mapping, c) for c in (C.QUESTION, C.CONTEXTS, C.ANSWER, C.REFERENCE)}
    passed = {source for source, _ in plan.slices}
    return frozenset(mapped - {None} - passed)


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
