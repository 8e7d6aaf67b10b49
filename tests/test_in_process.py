"""Where a run executes (:mod:`ragbatch.pipeline.in_process`): the choice of executor, and
a fresh ``ragbatch run`` of expression metrics that runs without starting Ray and writes
the same scores as the same job on Ray.

The end-to-end checks of the in-process path on local disk, S3 and resume are the
``in_process`` cases of tests/test_e2e.py and tests/test_recovery.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from ragbatch.config.job import JobConfig
from ragbatch.core.errors import ConfigError
from ragbatch.pipeline.in_process import choose_executor
from ragbatch.pipeline.plan import build_plan

EXPRESSION_METRICS = [
    {"name": "exact_match"},
    {"name": "response_length", "params": {"min_chars": 1, "max_chars": 5}},
    {"name": "contains_text", "id": "cjk", "params": {"text": ["数据"]}},
    {"name": "contains_text", "id": "combining", "params": {"text": ["E\u0301"]}},
]


def _config(tmp_path: Path, metrics: list, executor: str = "auto") -> JobConfig:
    src = tmp_path / "in.parquet"
    if not src.exists():
        pq.write_table(
            pa.table(
                {
                    "q": ["q1", "q1", "问题", None],
                    "a": ["yes", "yes", "数据🚀", "e\u0301"],
                    "ref": ["yes", "yes", "数据", None],
                    "team": ["a", "a", "b", "b"],
                }
            ),
            src,
        )
    return JobConfig.from_dict(
        {
            "run": {"name": "where", "executor": executor},
            "input": {
                "uri": str(src),
                "columns": {"question": "q", "answer": "a", "reference": "ref"},
            },
            "output": {"uri": str(tmp_path / "out")},
            "engines": {
                "judge": {"type": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}
            },
            "metrics": metrics,
        }
    )


JUDGE = {"name": "hate_speech", "engine": "judge"}


@pytest.mark.parametrize(
    ("executor", "metrics", "address", "chosen"),
    [
        ("auto", EXPRESSION_METRICS, None, "in_process"),
        ("auto", EXPRESSION_METRICS, "127.0.0.1:6379", "ray"),
        ("auto", [*EXPRESSION_METRICS, JUDGE], None, "ray"),
        ("ray", EXPRESSION_METRICS, None, "ray"),
        ("in_process", EXPRESSION_METRICS, None, "in_process"),
    ],
)
def test_choose_executor(tmp_path, monkeypatch, executor, metrics, address, chosen):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    plan = build_plan(_config(tmp_path, metrics, executor))
    if executor == "auto" and chosen == "in_process":
        # auto runs on a Ray instance the process already started (as this test session
        # may have): only judge the rest here.
        from ragbatch.pipeline import in_process

        monkeypatch.setattr(in_process, "_ray_started", lambda: False)
    assert choose_executor(plan, address) == chosen


def test_ray_address_in_the_environment_means_ray(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert choose_executor(build_plan(_config(tmp_path, EXPRESSION_METRICS)), None) == "ray"


@pytest.mark.parametrize(
    ("metrics", "address", "why"),
    [
        ([*EXPRESSION_METRICS, JUDGE], None, "stages judge:judge run on Ray actor pools"),
        (EXPRESSION_METRICS, "127.0.0.1:6379", "a Ray cluster address is given"),
    ],
)
def test_in_process_refuses_what_needs_ray(tmp_path, monkeypatch, metrics, address, why):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    plan = build_plan(_config(tmp_path, metrics, "in_process"))
    with pytest.raises(ConfigError, match="run.executor: in_process cannot run this job") as info:
        choose_executor(plan, address)
    assert why in str(info.value) and "use run.executor: auto or ray" in str(info.value)


def test_executor_is_checked_in_the_config(tmp_path):
    with pytest.raises(ConfigError, match="run.executor: Input should be 'auto', 'ray' or"):
        _config(tmp_path, EXPRESSION_METRICS, "threads")


def _run_cli(config: JobConfig, path: Path, run_id: str) -> dict:
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", exclude_none=True)))
    proc = subprocess.run(
        [sys.executable, "-m", "ragbatch", "run", str(path), "--run-id", run_id],
        capture_output=True,
        text=True,
        timeout=600,
        env={k: v for k, v in __import__("os").environ.items() if k != "RAY_ADDRESS"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (manifest,) = (path.parent / "out" / "runs").glob(f"*/run_id={run_id}/manifest.json")
    return {"manifest": json.loads(manifest.read_text()), "stderr": proc.stderr}


#: (row, metric) -> (score, status), worked out by hand from the rows of :func:`_config`:
#: row 3 has no reference; its answer is "e" and a combining acute accent (2 code points),
#: which the needle "E" + accent matches once lowercased; row 2's answer holds 数据.
EXPECTED = {
    **{(r, "exact_match"): (1.0, "ok") for r in (0, 1)},
    (2, "exact_match"): (0.0, "ok"),
    (3, "exact_match"): (None, "missing_input"),
    **{(r, "response_length"): (1.0, "ok") for r in range(4)},
    **{(r, "cjk"): (float(r == 2), "ok") for r in range(4)},
    **{(r, "combining"): (float(r == 3), "ok") for r in range(4)},
}


def test_a_fresh_run_of_expression_metrics_runs_without_ray(tmp_path):
    """The default (``auto``) in a new process, as a user runs it: no Ray starts, the
    manifest says where it ran, and every cell has its hand-worked value (the same rows
    run on Ray in tests/test_e2e.py and tests/test_recovery.py, both executors)."""
    done = _run_cli(_config(tmp_path, EXPRESSION_METRICS), tmp_path / "auto.yaml", "here")
    ray = done["manifest"]["ray"]
    n = ray.pop("tasks_in_flight")
    assert ray.pop("tasks_in_flight_reason").startswith(f"{n} read tasks at a time: ")
    assert n >= 2
    assert ray == {"executor": "in_process", "address": None, "started_locally": False}
    assert "Ray" not in done["stderr"]
    got = duckdb.sql(
        f"SELECT row_id, metric, score, status, team FROM read_parquet("
        f"'{tmp_path}/out/scores/**/*.parquet', hive_partitioning=true) ORDER BY ALL"
    ).fetchall()
    team = ["a", "a", "b", "b"]
    want = sorted(
        (f"in.parquet:{r}", m, score, status, team[r])
        for (r, m), (score, status) in EXPECTED.items()
    )
    assert got == want


def _corrupt_column(path: Path, index: int) -> None:
    """Overwrite the compressed pages of the file's column ``index`` with 0xff, keeping
    the footer: the plan reads the file's schema and row count as usual, and decoding the
    column fails when the task reads it (a real fault, not a stand-in)."""
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(index)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(path.read_bytes())
    data[start + 20 : start + chunk.total_compressed_size - 5] = b"\xff" * (
        chunk.total_compressed_size - 25
    )
    path.write_bytes(bytes(data))


def _many_files(tmp_path: Path, n_files: int, tasks_in_flight: int | None = None) -> JobConfig:
    """``n_files`` input files of 3 rows each (one read task per file): file k, row i
    answers ``"x" * (k + i)`` (empty for k + i = 0), so response_length (1-5 characters)
    is 1 exactly when 1 <= k + i <= 5, and contains_text "数据" hits row 2 of every file."""
    src = tmp_path / "many"
    src.mkdir()
    for k in range(n_files):
        pq.write_table(
            pa.table(
                {
                    "q": [f"q{k}-{i}" for i in range(3)],
                    "a": ["x" * (k + i) if i < 2 else "数据" + "x" * k for i in range(3)],
                    "pad": ["padding " * 20] * 3,
                }
            ),
            src / f"f{k:02d}.parquet",
            compression="snappy",
        )
    return JobConfig.from_dict(
        {
            "run": {"name": "many", "executor": "in_process", "tasks_in_flight": tasks_in_flight},
            "input": {"uri": str(src), "columns": {"question": "q", "answer": "a"}},
            "output": {"uri": str(tmp_path / "out")},
            "metrics": [
                {"name": "response_length", "params": {"min_chars": 1, "max_chars": 5}},
                {"name": "contains_text", "id": "cjk", "params": {"text": ["数据"]}},
            ],
        }
    )


@pytest.mark.parametrize("in_flight", [None, 1, 3, 9])
def test_read_tasks_in_flight_together_write_every_row_once(tmp_path, in_flight):
    # 7 files, read up to in_flight at a time (unset: sized to this machine, at least
    # two): every row scored once, by hand.
    from ragbatch.pipeline.runner import run_job

    result = run_job(_many_files(tmp_path, 7, in_flight), run_id="many")
    assert result.manifest.ray["executor"] == "in_process"
    if in_flight is not None:
        assert result.manifest.ray["tasks_in_flight"] == in_flight
        assert "as run.tasks_in_flight sets" in result.manifest.ray["tasks_in_flight_reason"]
    else:
        assert result.manifest.ray["tasks_in_flight"] >= 2
    got = duckdb.sql(
        f"SELECT row_id, metric, score FROM read_parquet("
        f"'{tmp_path}/out/scores/**/*.parquet', hive_partitioning=true) ORDER BY ALL"
    ).fetchall()
    want = []
    for k in range(7):
        for i in range(3):
            length = k + i if i < 2 else 2 + k
            row = f"f{k:02d}.parquet:{i}"
            want.append((row, "cjk", float(i == 2)))
            want.append((row, "response_length", float(1 <= length <= 5)))
    assert got == sorted(want)


def test_a_task_that_fails_stops_the_run_and_names_its_file(tmp_path):
    # File 3 of 7 has corrupt pages behind a sound footer in the answers, which the
    # metrics read: the run fails with the reader's error naming that file, and nothing
    # is committed.
    from ragbatch.core.errors import InputError
    from ragbatch.pipeline.runner import run_job

    config = _many_files(tmp_path, 7)
    _corrupt_column(tmp_path / "many" / "f03.parquet", 1)
    with pytest.raises(InputError, match="f03.parquet"):
        run_job(config, run_id="broken")
    assert not list((tmp_path / "out").glob("runs/*/run_id=broken/manifest.json"))


def test_with_many_tasks_failing_the_earliest_is_reported(tmp_path):
    # Files 2 and 5 of 7 are corrupt and all seven are read at once: whichever fails
    # first, the error raised names file 2, every time.
    from ragbatch.core.errors import InputError
    from ragbatch.pipeline.runner import run_job

    config = _many_files(tmp_path, 7, tasks_in_flight=9)
    for k in (2, 5):
        _corrupt_column(tmp_path / "many" / f"f{k:02d}.parquet", 1)
    for attempt in range(4):
        with pytest.raises(InputError, match="f02.parquet"):
            run_job(config, run_id=f"broken{attempt}")


def test_a_machine_that_cannot_be_read_gets_two_tasks(monkeypatch):
    # A fault stand-in: the operating system refuses to say how many cores there are.
    import ragbatch.pipeline.in_process as in_process

    def refused() -> int:
        raise PermissionError("sched_getaffinity refused by the sandbox")

    monkeypatch.setattr(in_process, "usable_cores", refused)
    n, why = in_process.tasks_in_flight(None)
    assert n == 2
    assert "could not be read (PermissionError: sched_getaffinity refused" in why
    assert in_process.tasks_in_flight(5) == (
        5,
        "5 read tasks at a time, as run.tasks_in_flight sets",
    )


def test_a_corrupt_column_that_no_metric_reads_is_not_read(tmp_path):
    # The questions of file 3 are corrupt, and neither metric reads a question: the
    # column is not decoded (ragbatch.pipeline.projection), and every row is scored.
    from ragbatch.pipeline.runner import run_job

    config = _many_files(tmp_path, 7)
    _corrupt_column(tmp_path / "many" / "f03.parquet", 0)
    with pytest.raises(Exception):
        pq.read_table(tmp_path / "many" / "f03.parquet")
    result = run_job(config, run_id="unread")
    assert result.manifest.ray["executor"] == "in_process"
    (n,) = duckdb.sql(
        f"SELECT count(*) FROM read_parquet('{tmp_path}/out/scores/**/*.parquet', "
        "hive_partitioning=true) WHERE status = 'ok'"
    ).fetchall()[0]
    assert n == 7 * 3 * 2


def _one_group(tmp_path: Path, ids: list[str] | None = None) -> JobConfig:
    """One file of 10 rows in one row group (one read task): row i answers ``"x" * i``
    and holds the JSON contexts ``["c<i % 2>", "dd"]`` (two distinct values, repeated);
    ``ids``, when given, are its row ids."""
    src = tmp_path / "one"
    src.mkdir()
    columns = {
        "a": ["x" * i for i in range(10)],
        "c": [json.dumps([f"c{i % 2}", "dd"]) for i in range(10)],
        "team": ["t", "u"] * 5,
    }
    mapping = {"answer": "a", "contexts": "c"}
    if ids is not None:
        columns["id"] = ids
        mapping["row_id"] = "id"
    pq.write_table(pa.table(columns), src / "f.parquet")
    return JobConfig.from_dict(
        {
            "run": {"name": "sliced", "executor": "in_process"},
            "input": {"uri": str(src), "columns": mapping},
            "output": {"uri": str(tmp_path / "out")},
            "metrics": [
                {"name": "response_length", "params": {"min_chars": 1, "max_chars": 5}},
                {"name": "context_length", "params": {"min_chars": 2, "max_chars": 2}},
            ],
        }
    )


def test_a_large_task_is_scored_in_slices_with_the_rows_of_a_whole_one(tmp_path, monkeypatch):
    # Slices of at most 4 rows, for tasks past 8: the task's 10 rows are 3 slices (4, 4,
    # 2), one file each, two scored at a time. Generated row ids count from the task's first row, and every
    # cell is as worked out by hand.
    from ragbatch.pipeline import in_process
    from ragbatch.pipeline.runner import run_job

    monkeypatch.setattr(in_process, "SLICE_ROWS", 4)
    result = run_job(_one_group(tmp_path), run_id="sliced")
    assert result.manifest.ray["executor"] == "in_process"
    files = sorted((tmp_path / "out").glob("scores/*/run_id=sliced/*.parquet"))
    assert [pq.read_metadata(f).num_rows for f in files] == [8, 8, 4]
    got = duckdb.sql(
        f"SELECT row_id, metric, score, status, team FROM read_parquet("
        f"'{tmp_path}/out/scores/**/*.parquet', hive_partitioning=true) ORDER BY ALL"
    ).fetchall()
    want = []
    for i in range(10):
        row, team = f"f.parquet:{i}", "tu"[i % 2]
        want.append((row, "context_length", 1.0, "ok", team))
        want.append((row, "response_length", float(1 <= i <= 5), "ok", team))
    assert got == sorted(want)


def test_a_row_id_repeated_in_two_slices_of_a_task_is_refused_as_in_a_whole_one(
    tmp_path, monkeypatch
):
    # Row id r1 at rows 1 and 5: slices 0 and 1 of 4 rows each. The run refuses it with
    # the message that normalizing the whole task gives, and commits nothing.
    from ragbatch.core.errors import InputError
    from ragbatch.io import normalize, plan_read, read_task
    from ragbatch.pipeline import in_process
    from ragbatch.pipeline.runner import run_job

    ids = [f"r{i}" for i in range(10)]
    ids[5] = "r1"
    config = _one_group(tmp_path, ids)
    (task,) = plan_read(config.input)
    with pytest.raises(InputError) as whole:
        normalize(read_task(task, config.input), config.input, task)
    monkeypatch.setattr(in_process, "SLICE_ROWS", 4)
    with pytest.raises(InputError) as sliced:
        run_job(config, run_id="twice")
    assert str(sliced.value) == str(whole.value)
    assert "repeats 1 value(s) (e.g. 'r1')" in str(sliced.value)
    assert not list((tmp_path / "out").glob("runs/*/run_id=twice/manifest.json"))


GIB = 2**30


@pytest.mark.parametrize(
    ("cores", "available", "expected"),
    [
        (2, 24 * GIB, 2),  # this machine: as before the rule
        (4, 24 * GIB, 4),
        (16, 128 * GIB, 16),  # one per core
        (16, 12 * GIB, 6),  # memory allows 6 tasks of 2 GiB
        (16, 13 * GIB - 1, 6),
        (64, 64 * GIB, 32),
        (1, 1 * GIB, 2),  # never fewer than two
        (8, 3 * GIB, 2),
    ],
)
def test_tasks_in_flight_fill_the_machine_as_memory_allows(cores, available, expected):
    from ragbatch.pipeline.in_process import TASK_MEMORY_BYTES, tasks_in_flight

    assert TASK_MEMORY_BYTES == 2 * GIB
    n, why = tasks_in_flight(None, cores=cores, available=available)
    assert n == expected
    core_word = "core" if cores == 1 else "cores"
    assert why.startswith(f"{expected} read tasks at a time: {cores} {core_word}, ")
    assert f"{available / GIB:.1f} GiB of memory available" in why


@pytest.mark.parametrize("setting", [1, 2, 5, 40])
def test_tasks_in_flight_set_in_the_config_are_kept(setting):
    from ragbatch.pipeline.in_process import tasks_in_flight

    n, why = tasks_in_flight(setting, cores=16, available=1 * GIB)
    assert (n, why) == (setting, f"{setting} read tasks at a time, as run.tasks_in_flight sets")


def test_tasks_in_flight_read_from_this_machine():
    from ragbatch.core.machine import available_memory, usable_cores
    from ragbatch.pipeline.in_process import TASK_MEMORY_BYTES, tasks_in_flight

    cores = usable_cores()
    n, _ = tasks_in_flight(None)
    by_memory = available_memory() // TASK_MEMORY_BYTES
    # Memory moves between the two reads; the count is one of its neighbours' choices.
    assert n in {max(2, min(cores, m)) for m in (by_memory - 1, by_memory, by_memory + 1)}


@pytest.mark.parametrize("bad", [0, -1, "many", 1.5, True, "4", 4.0, 1025])
def test_tasks_in_flight_is_checked_in_the_config(tmp_path, bad):
    with pytest.raises(ConfigError, match="tasks_in_flight"):
        JobConfig.from_dict(
            {
                "run": {"tasks_in_flight": bad},
                "input": {"uri": str(tmp_path / "x.parquet")},
                "output": {"uri": str(tmp_path / "out")},
                "metrics": [{"name": "exact_match"}],
            }
        )
