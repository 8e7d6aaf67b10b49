"""Recovery and commit integrity: what a resumed run reuses, sets aside and scores again,
and the checks that stop a run whose scores break the contract.

The runs are real (local Ray, Parquet files on disk). A first attempt is stopped before
it commits by the error budget: the ``binary`` callback
:func:`support.binary_callbacks.flaky_digit` fails the rows of one input file while a marker
file exists, the way a transient fault fails a first attempt only, and logs every row it
scores, so a test can tell which rows an attempt scored. The expected scores are worked
out here from the input, in plain Python.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support.binary_callbacks import CALLS_LOG, FIRST_ATTEMPT_MARKER
from ragbatch.config.job import JobConfig, OutputSection
from ragbatch.core.errors import ConservationError, RunError
from ragbatch.io.write import OutputLayout, verify_run
from ragbatch.pipeline.runner import run_job

N_FILES, ROWS_PER_FILE = 4, 5
FLAKY_FILE = 2  # every row of this input file fails on the first attempt
MAX_CHARS = 6
METRICS = ["digit", "response_length"]


def _answer(f: int, i: int) -> str:
    return "x" * (i + 3) + (str(f) if i % 2 == 0 else "")


def _question(f: int, i: int) -> str:
    return f"{'flaky' if f == FLAKY_FILE else 'steady'} {f}-{i}"


def write_input(root: Path) -> Path:
    """``N_FILES`` Parquet files (one read task, so one staged score file, each)."""
    src = root / "in"
    src.mkdir()
    for f in range(N_FILES):
        pq.write_table(
            pa.table(
                {
                    "id": [f"f{f}-r{i}" for i in range(ROWS_PER_FILE)],
                    "q": [_question(f, i) for i in range(ROWS_PER_FILE)],
                    "a": [_answer(f, i) for i in range(ROWS_PER_FILE)],
                    "ref": [str(root)] * ROWS_PER_FILE,
                }
            ),
            src / f"part-{f}.parquet",
        )
    return src


def expected_scores() -> list[tuple]:
    """(row_id, metric, score, status) of every cell, from the input's definition."""
    cells = []
    for f in range(N_FILES):
        for i in range(ROWS_PER_FILE):
            answer = _answer(f, i)
            digit = float(any(ch.isdigit() for ch in answer))
            length = float(1 <= len(answer) <= MAX_CHARS)
            cells += [
                (f"f{f}-r{i}", "digit", digit, "ok"),
                (f"f{f}-r{i}", "response_length", length, "ok"),
            ]
    return sorted(cells)


def job(root: Path, executor: str = "auto") -> JobConfig:
    return JobConfig.from_dict(
        {
            "run": {"name": "recovery", "executor": executor},
            "input": {
                "uri": str(root / "in"),
                "columns": {"row_id": "id", "question": "q", "answer": "a", "reference": "ref"},
            },
            "output": {"uri": str(root / "out")},
            "metrics": [
                {
                    "name": "binary",
                    "id": "digit",
                    "params": {"callback": "support.binary_callbacks:flaky_digit", "mode": "row"},
                },
                {"name": "response_length", "params": {"min_chars": 1, "max_chars": MAX_CHARS}},
            ],
        }
    )


def scored_since(root: Path, seen: int) -> tuple[list[str], int]:
    """Questions the callback scored after the first ``seen`` log lines, and the new count."""
    lines = (root / CALLS_LOG).read_text(encoding="utf-8").splitlines()
    return sorted(lines[seen:]), len(lines)


def questions(f: int) -> list[str]:
    return sorted(_question(f, i) for i in range(ROWS_PER_FILE))


def staged(root: Path, run_id: str, attempt: int) -> list[Path]:
    return sorted(
        (root / "out" / "_staging" / f"run_id={run_id}" / "scores" / f"attempt={attempt}").glob(
            "*.parquet"
        )
    )


def committed(root: Path, run_id: str) -> list[tuple]:
    return duckdb.sql(
        f"SELECT row_id, metric, score, status FROM read_parquet("
        f"'{root}/out/scores/**/*.parquet', hive_partitioning=true) "
        f"WHERE run_id = '{run_id}' ORDER BY ALL"
    ).fetchall()


def manifest(root: Path, run_id: str) -> dict:
    (path,) = (root / "out").glob(f"runs/*/run_id={run_id}/manifest.json")
    return json.loads(path.read_text())


def first_attempt(root: Path, run_id: str, executor: str = "auto") -> None:
    """Attempt 1: every row is scored, the flaky file's rows end in ``error``, and the
    error budget stops the run before it commits."""
    write_input(root)
    (root / FIRST_ATTEMPT_MARKER).touch()
    with pytest.raises(RunError, match=f"{ROWS_PER_FILE} of {N_FILES * ROWS_PER_FILE} rows"):
        run_job(job(root, executor), run_id=run_id)
    assert scored_since(root, 0)[0] == sorted(q for f in range(N_FILES) for q in questions(f))
    assert len(staged(root, run_id, 1)) == N_FILES
    assert not list((root / "out").glob("runs/**/manifest.json"))


def rows_of(path: Path) -> set[str]:
    return set(pq.read_table(path, columns=["row_id"]).column("row_id").to_pylist())


#: Both executors (ragbatch.pipeline.in_process): with the session's Ray started, ``auto``
#: runs on Ray.
EXECUTORS = ["auto", "in_process"]


@pytest.mark.slow
@pytest.mark.parametrize("executor", EXECUTORS)
def test_error_cells_are_scored_again_on_resume_and_the_rest_reused(ray_local, tmp_path, executor):
    first_attempt(tmp_path, "flaky", executor)
    _, seen = scored_since(tmp_path, 0)
    (tmp_path / FIRST_ATTEMPT_MARKER).unlink()  # the fault is gone

    result = run_job(job(tmp_path, executor), run_id="flaky")
    assert manifest(tmp_path, "flaky")["ray"]["executor"] == (
        "ray" if executor == "auto" else "in_process"
    )

    rescored, _ = scored_since(tmp_path, seen)
    assert rescored == questions(FLAKY_FILE)  # exactly the rows that had an error cell
    info = manifest(tmp_path, "flaky")["resume"]
    assert info == {
        "attempt": 2,
        "resumed": True,
        "rows_reused": (N_FILES - 1) * ROWS_PER_FILE,  # 15
        "files_reused": N_FILES - 1,
        "files_set_aside": 1,
    }
    assert committed(tmp_path, "flaky") == expected_scores()
    assert result.check.counts == {m: {"ok": N_FILES * ROWS_PER_FILE} for m in METRICS}


@pytest.mark.slow
@pytest.mark.parametrize(("first", "then"), [("in_process", "auto"), ("auto", "in_process")])
def test_a_run_stopped_on_one_executor_resumes_on_the_other(ray_local, tmp_path, first, then):
    # A run that stopped in the process (say, out of memory) is resumed on Ray, and the
    # reverse: the staged scores of the first attempt are reused, only the rows with an
    # error cell are scored again, and the run commits what an uninterrupted one would.
    first_attempt(tmp_path, "moved", first)
    _, seen = scored_since(tmp_path, 0)
    (tmp_path / FIRST_ATTEMPT_MARKER).unlink()

    run_job(job(tmp_path, then), run_id="moved")
    assert manifest(tmp_path, "moved")["ray"]["executor"] == (
        "ray" if then == "auto" else "in_process"
    )
    assert scored_since(tmp_path, seen)[0] == questions(FLAKY_FILE)
    info = manifest(tmp_path, "moved")["resume"]
    assert (info["attempt"], info["rows_reused"]) == (2, (N_FILES - 1) * ROWS_PER_FILE)
    assert committed(tmp_path, "moved") == expected_scores()


@pytest.mark.slow
@pytest.mark.parametrize("executor", EXECUTORS)
def test_staged_file_without_footer_is_set_aside_and_its_rows_scored_again(
    ray_local, tmp_path, executor
):
    first_attempt(tmp_path, "cut", executor)
    _, seen = scored_since(tmp_path, 0)
    # Cut the footer off a staged file of steady rows, as a crash while writing it would.
    steady = next(p for p in staged(tmp_path, "cut", 1) if "f0-r0" in rows_of(p))
    assert rows_of(steady) == {f"f0-r{i}" for i in range(ROWS_PER_FILE)}
    data = steady.read_bytes()
    steady.write_bytes(data[: len(data) // 2])

    # Attempt 2, with the fault still there: it stops again, and shows what it did.
    with pytest.raises(RunError):
        run_job(job(tmp_path, executor), run_id="cut")
    assert not steady.exists(), "the truncated staged file was not set aside"
    rescored, seen = scored_since(tmp_path, seen)
    assert rescored == sorted(questions(0) + questions(FLAKY_FILE))
    (second,) = [p for p in staged(tmp_path, "cut", 2) if "f0-r0" in rows_of(p)]
    redone = pq.read_table(second, columns=["row_id", "status"]).to_pylist()
    assert {r["row_id"] for r in redone} == rows_of_ids(0)
    assert {r["status"] for r in redone} == {"ok"}

    # Attempt 3, the fault gone: only the flaky rows are scored again; the run commits
    # every cell once, with the scores an uninterrupted run gives.
    (tmp_path / FIRST_ATTEMPT_MARKER).unlink()
    run_job(job(tmp_path, executor), run_id="cut")
    assert scored_since(tmp_path, seen)[0] == questions(FLAKY_FILE)
    assert committed(tmp_path, "cut") == expected_scores()
    info = manifest(tmp_path, "cut")["resume"]
    assert info["attempt"] == 3 and info["rows_reused"] == (N_FILES - 1) * ROWS_PER_FILE
    assert not (tmp_path / "out" / "_staging" / "run_id=cut").exists()


def rows_of_ids(f: int) -> set[str]:
    return {f"f{f}-r{i}" for i in range(ROWS_PER_FILE)}


# -- verify_run: statuses and scores that break the contract ------------------------------------


@pytest.fixture
def layout(tmp_path):
    return OutputLayout.for_run(OutputSection(uri=str(tmp_path / "out")), dt.date(2026, 1, 2), "r1")


def _scores(path: Path, scores: list[float | None], statuses: list[str | None]) -> str:
    """A real score file: rows r0.. of metric m1 with the given scores and statuses."""
    n = len(scores)
    pq.write_table(
        pa.table(
            {
                "row_id": [f"r{i}" for i in range(n)],
                "metric": ["m1"] * n,
                "score": pa.array(scores, pa.float64()),
                "status": pa.array(statuses, pa.string()),
                "model": pa.nulls(n, pa.string()),
            }
        ),
        path,
    )
    return str(path)


def test_verify_run_accepts_scores_that_agree_with_their_status(layout, tmp_path):
    path = _scores(
        tmp_path / "good.parquet", [1.0, 0.0, None, None], ["ok", "ok", "not_applicable", "error"]
    )
    check = verify_run(layout, [path], ["m1"], 4)
    assert check.counts == {"m1": {"error": 1, "not_applicable": 1, "ok": 2}}


@pytest.mark.parametrize("status", ["fine", "OK", "", None])
def test_verify_run_refuses_a_status_outside_the_vocabulary(layout, tmp_path, status):
    path = _scores(tmp_path / "s.parquet", [1.0, None], ["ok", status])
    with pytest.raises(
        ConservationError,
        match="statuses outside the vocabulary: "
        + repr([status]).replace("[", r"\[").replace("]", r"\]"),
    ):
        verify_run(layout, [path], ["m1"], 2)


@pytest.mark.parametrize(
    "scores, statuses, n_bad",
    [
        ([1.0, 0.0, 1.0], ["ok", "error", "ok"], 1),  # a score on a failed cell
        ([1.0, None, None], ["ok", "ok", "parse_failure"], 1),  # ok without a score
        ([0.0, None, 1.0], ["judge_error", "ok", "ok"], 2),  # both at once
    ],
)
def test_verify_run_refuses_a_score_that_disagrees_with_its_status(
    layout, tmp_path, scores, statuses, n_bad
):
    path = _scores(tmp_path / "s.parquet", scores, statuses)
    with pytest.raises(ConservationError) as err:
        verify_run(layout, [path], ["m1"], 3)
    assert f"{n_bad} cells have a score without status ok, or ok without a score" in str(err.value)
    assert "the run is not committed" in str(err.value)
