"""Session fixture: committed runs of the shipped ARES job for the analysis tests.

Built once per test session with the real command line (``ragbatch run ... --report``)
on local Ray, deterministic metrics only (jobs/ares.yaml, 200 rows):

- 2026-11-26 (:data:`ORIGINAL`): the shipped TSV;
- 2026-11-27 (:data:`REEXPORTED`): the shipped rows exported again under another file
  name (so no row id matches the other nights), in a shuffled order, without the rows in
  :data:`DROPPED`, plus :data:`N_NEW` copies of rows whose question was changed (no content
  match); the answers are unchanged;
- 2026-11-28 (:data:`ALTERED_NIGHT`): a copy of the TSV under the shipped file name (so
  row ids equal the first night's) whose answers were replaced on the rows in
  :data:`ALTERED` by :func:`altered_answer`.

All three are under one output root, each run with ``--report`` (so the second and third
nights compare themselves with the night before). The notebooks, the compare and the
report tests read them.
"""

from __future__ import annotations

import csv
import random
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ARES_TSV = REPO / "examples/data/ares/datasets_v2__LLM_Judge_Test_Set_Human_Annotations.tsv"
NIGHTS = ("2026-11-26", "2026-11-27", "2026-11-28")
ORIGINAL, REEXPORTED, ALTERED_NIGHT = NIGHTS

#: Row indices (0-based, data rows) whose answer night 3 replaces.
ALTERED = tuple(range(0, 200, 8))
#: Row indices left out of the re-exported input, and how many new rows it adds.
DROPPED = (5, 17, 42, 99, 100, 101, 150, 151, 198, 199)
N_NEW = 3
#: The shipped rows the new rows copy (with a changed question).
NEW_SOURCES = (10, 11, 12)
REEXPORTED_NAME = "ares_reexported.tsv"

_REPLACEMENTS = (
    "I'm sorry, I don't know. 我不知道 🤷",
    "I cannot answer that <script>document.title='injected'</script> (cafe\u0301)",
    "As an AI, I can't help: <img src=x onerror=\"document.title='injected'\"> & more",
    "",  # an empty cell is read as null: missing_input / not_applicable
    "I do not know; ask on the forum ✉️ «here».",
)


def altered_answer(index: int) -> str:
    """The answer night 3 gives for data row ``index`` (one of :data:`ALTERED`)."""
    return _REPLACEMENTS[ALTERED.index(index) % len(_REPLACEMENTS)]


_REFUSAL = re.compile(
    r"(?i)^\s*(i'?m sorry|i am sorry|i (do not|don'?t) know|i cannot|i can'?t|as an ai)"
)


def expected_answer_cells(answer: str | None) -> dict[str, tuple[str, float | None]]:
    """(status, score) of the answer metrics of jobs/ares.yaml for ``answer``, recomputed
    in plain Python (``re`` and ``str``); an empty TSV cell is read as null."""
    if not answer:
        return {
            m: ("missing_input", None)
            for m in ("response_length", "mentions_databricks", "cites_a_url", "mentions_spark")
        } | {"not_a_refusal": ("not_applicable", None)}
    return {
        "response_length": ("ok", float(1 <= len(answer) <= 4000)),
        "mentions_databricks": ("ok", float(bool(re.search(r"(?i)databricks", answer)))),
        "cites_a_url": ("ok", float(bool(re.search(r"https?://\S+", answer)))),
        "mentions_spark": ("ok", float("spark" in answer.lower())),
        "not_a_refusal": ("ok", float(not _REFUSAL.search(answer))),
    }


def read_ares() -> tuple[list[str], list[list[str]]]:
    """Header and data rows of the shipped ARES TSV, as Python's csv module reads them."""
    with ARES_TSV.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh, delimiter="\t"))
    return rows[0], rows[1:]


def write_tsv(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, delimiter="\t", lineterminator="\r\n")
        writer.writerow(header)
        writer.writerows(rows)
    return path


def row_id(index: int, name: str = ARES_TSV.name) -> str:
    """The generated row id of data row ``index`` of a single input file ``name``."""
    return f"{name}:{index}"


@dataclass
class AresNights:
    nightly: Path  # the output root
    run_ids: dict[str, str]  # night -> run id
    reexported_order: list[int]  # re-exported data row i is shipped row order[i] (-1: new)


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``ragbatch ARGV`` in this process (sharing the session's Ray); (exit, stdout, stderr)."""
    import contextlib
    import io

    from ragbatch.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _run(argv: list[str]) -> str:
    code, out, err = run_cli(argv)
    assert code == 0, f"ragbatch {' '.join(argv)} exited {code}: {err[-2000:]}"
    first = out.splitlines()[0]
    assert first.startswith("run ") and " committed " in first, out
    return first.split()[1]


@pytest.fixture(scope="session")
def ares_nights(ray_local, tmp_path_factory) -> AresNights:
    base = tmp_path_factory.mktemp("ares_nights")
    header, rows = read_ares()
    answer = header.index("Answer")
    question = header.index("Question")
    altered = [list(r) for r in rows]
    for i in ALTERED:
        altered[i][answer] = altered_answer(i)
    altered_input = write_tsv(base / "altered" / ARES_TSV.name, header, altered)

    order = [i for i in range(len(rows)) if i not in DROPPED]
    random.Random(6).shuffle(order)
    reshuffled = [list(rows[i]) for i in order]
    for k in range(N_NEW):
        new = list(rows[NEW_SOURCES[k]])
        new[question] = f"new question {k}: {new[question]}"
        reshuffled.insert(7 * k + 3, new)
        order.insert(7 * k + 3, -1)
    reexported_input = write_tsv(base / "reexported" / REEXPORTED_NAME, header, reshuffled)

    nightly = base / "nightly"
    config = str(REPO / "jobs" / "ares.yaml")
    inputs = {ORIGINAL: ARES_TSV, REEXPORTED: reexported_input, ALTERED_NIGHT: altered_input}
    run_ids = {}
    for night in NIGHTS:
        run_ids[night] = _run(
            [
                "run",
                config,
                "--input",
                str(inputs[night]),
                "--output",
                str(nightly),
                "--run-date",
                night,
                "--report",
            ]
        )
    return AresNights(nightly, run_ids, order)
