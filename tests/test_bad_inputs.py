"""The whole job (real local Ray) on bad inputs: each either runs with exactly one cell
per (row, metric) and a per-row status, or stops before any metric runs with a
ConfigError / InputError whose message names the problem.

Reader and normalizer details are unit-tested in test_io_read.py and test_io_schema.py;
these tests check what a run does with the same inputs end to end. Cheap expression
metrics only, several bad rows per file, so each run takes a few seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragbatch.config.job import JobConfig
from ragbatch.core.errors import InputError, RunError
from ragbatch.pipeline.runner import run_job

pytestmark = pytest.mark.slow

COLUMNS = {
    "question": "q",
    "contexts": "ctx",
    "answer": "a",
    "reference": "ref",
    "latency_s": "lat",
}
METRICS = [
    {"name": "response_length", "params": {"min_chars": 1, "max_chars": 5}},
    {"name": "context_length", "params": {"max_chars": 3}},
    {"name": "latency", "params": {"target_s": 2.0}},
    {"name": "exact_match"},
]
IDS = [m["name"] for m in METRICS]


def _config(src: Path, out: Path, columns=None, metrics=None, **input_extra) -> JobConfig:
    return JobConfig.from_dict(
        {
            "run": {"name": "bad-inputs"},
            "input": {"uri": str(src), "columns": columns or COLUMNS, **input_extra},
            "output": {"uri": str(out)},
            "metrics": metrics or METRICS,
        }
    )


def _write(path: Path, data: str | bytes) -> Path:
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data, encoding="utf-8")
    return path


def _jsonl(path: Path, rows: list[dict]) -> Path:
    return _write(path, "".join(json.dumps(r) + "\n" for r in rows))


def _cells(result, n_rows: int, metric_ids: list[str]) -> dict[tuple[str, str], tuple]:
    """{(row_id, metric): (score, status, reason)} read back with DuckDB, after checking
    that every (row, metric) has exactly one cell and the run's own check agrees."""
    scores = f"read_parquet('{result.layout.root}/scores/**/*.parquet', hive_partitioning=true)"
    con = duckdb.connect()
    total, pairs, rows = con.execute(
        f"SELECT count(*), count(DISTINCT (row_id, metric)), count(DISTINCT row_id) FROM {scores} "
        f"WHERE run_id = '{result.run_id}'"
    ).fetchone()
    assert (total, pairs, rows) == (n_rows * len(metric_ids), n_rows * len(metric_ids), n_rows)
    assert result.check.n_rows == n_rows and result.check.n_cells == n_rows * len(metric_ids)
    assert Path(result.layout.manifest_path).exists()  # committed
    got = con.execute(
        f"SELECT row_id, metric, score, status, reason, details FROM {scores}"
    ).fetchall()
    assert {m for _, m, *_ in got} == set(metric_ids)
    counts: dict[str, dict[str, int]] = {}
    for _, metric, _, status, _, _ in got:
        counts.setdefault(metric, {}).setdefault(status, 0)
        counts[metric][status] += 1
    assert result.check.counts == counts
    return {(r, m): (s, st, why) for r, m, s, st, why, _ in got} | {
        ("details", r, m): json.loads(d) if d else None for r, m, _, _, _, d in got
    }


def _not_started(out: Path) -> None:
    """Nothing was staged or committed: the run stopped before any metric ran."""
    assert not out.exists() or not any(out.rglob("*.parquet"))
    assert not (out / "runs").exists()


# --------------------------------------------------------------------------- stops early


def test_unmapped_columns_stop_before_any_metric(ray_local, tmp_path):
    src = _write(tmp_path / "in.csv", "q,a\nx,y\n")
    out = tmp_path / "out"
    with pytest.raises(InputError) as info:
        run_job(_config(src, out), run_id="missing")
    assert str(info.value).splitlines() == [
        "input.columns.contexts: column 'ctx' does not exist in the input; the input has: 'q', 'a'",
        "input.columns.reference: column 'ref' does not exist in the input; the input has: 'q', 'a'",
        "input.columns.latency_s: column 'lat' does not exist in the input; the input has: 'q', 'a'",
    ]
    _not_started(out)


def test_contexts_column_of_numbers_stops_before_any_metric(ray_local, tmp_path):
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"q": ["x"], "ctx": [3], "a": ["y"], "ref": ["y"], "lat": ["1"]}), src)
    out = tmp_path / "out"
    with pytest.raises(InputError) as info:
        run_job(_config(src, out), run_id="types")
    assert str(info.value) == (
        "input.columns.contexts: column 'ctx' has type int64; contexts need "
        "a list of strings, a JSON-encoded list or a string"
    )
    _not_started(out)


def test_header_only_csv_stops_with_no_rows(ray_local, tmp_path):
    src = _write(tmp_path / "in.csv", "q,ctx,a,ref,lat\r\n")
    out = tmp_path / "out"
    with pytest.raises(InputError, match=r"^input .*in\.csv holds no rows; nothing to evaluate$"):
        run_job(_config(src, out), run_id="header")
    _not_started(out)


def test_empty_file_stops_before_any_metric(ray_local, tmp_path):
    src = _write(tmp_path / "in.csv", b"")
    out = tmp_path / "out"
    with pytest.raises(InputError) as info:
        run_job(_config(src, out), run_id="empty")
    assert str(info.value) == (
        f"input.uri: {src} has no columns at all (an empty file: 0 bytes, or no header line); "
        "check that it is the file you meant and that it was written completely"
    )
    _not_started(out)


def test_file_that_is_not_utf8_stops_naming_file_byte_and_line(ray_local, tmp_path):
    src = _write(tmp_path / "in.csv", b"q,ctx,a,ref,lat\nq1,ab,yes,yes,1\nq2,ab,caf\xe9,yes,1\n")
    out = tmp_path / "out"
    with pytest.raises(InputError) as info:
        run_job(_config(src, out), run_id="latin1")
    message = str(info.value)
    assert message.startswith(f"{src}: byte 0xe9 at byte offset 41 (line 3) is not valid utf-8")
    assert "set input.encoding" in message
    _not_started(out)


def test_jsonl_with_one_malformed_line_stops_naming_file_and_line(ray_local, tmp_path):
    src = _write(
        tmp_path / "in.jsonl",
        '{"q": "a", "ctx": "ab", "a": "y", "ref": "y", "lat": 1}\n{"q": "b",}\n'
        '{"q": "c", "ctx": "ab", "a": "y", "ref": "y", "lat": 1}\n',
    )
    out = tmp_path / "out"
    with pytest.raises(InputError) as info:
        run_job(_config(src, out), run_id="badline")
    message = str(info.value)
    assert message.startswith(f"{src}, line 2: not valid JSON (")
    assert message.endswith("fix or remove that line")
    _not_started(out)


# --------------------------------------------------------------------------- per-row statuses


def test_wrong_types_per_row_get_missing_input_naming_the_column(ray_local, tmp_path):
    src = _jsonl(
        tmp_path / "in.jsonl",
        [
            {
                "q": "q",
                "ctx": 7,
                "a": "yes",
                "ref": "yes",
                "lat": "fast",
            },  # contexts a number, latency text
            {
                "q": "q",
                "ctx": ["ab"],
                "a": 12,
                "ref": "yes",
                "lat": "1.5",
            },  # answer a number, latency numeric text
            {
                "q": "q",
                "ctx": '["ab"]',
                "a": "yes",
                "ref": 12,
                "lat": -1,
            },  # reference a number, latency negative
        ],
    )
    cells = _cells(run_job(_config(src, tmp_path / "out"), run_id="types"), 3, IDS)
    assert {k: v for k, v in cells.items() if k[0] != "details"} == {
        ("in.jsonl:0", "response_length"): (1.0, "ok", None),
        ("in.jsonl:0", "context_length"): (
            None,
            "missing_input",
            "contexts: expected a list or a string, got int (7)",
        ),
        ("in.jsonl:0", "latency"): (None, "missing_input", "latency_s: 'fast' is not a number"),
        ("in.jsonl:0", "exact_match"): (1.0, "ok", None),
        ("in.jsonl:1", "response_length"): (
            None,
            "missing_input",
            "answer: expected a string, got int (12)",
        ),
        ("in.jsonl:1", "context_length"): (1.0, "ok", None),
        ("in.jsonl:1", "latency"): (1.0, "ok", None),
        ("in.jsonl:1", "exact_match"): (
            None,
            "missing_input",
            "answer: expected a string, got int (12)",
        ),
        ("in.jsonl:2", "response_length"): (1.0, "ok", None),
        ("in.jsonl:2", "context_length"): (1.0, "ok", None),
        ("in.jsonl:2", "latency"): (None, "missing_input", "latency_s: -1.0 is negative"),
        ("in.jsonl:2", "exact_match"): (
            None,
            "missing_input",
            "reference: expected a string, got int (12)",
        ),
    }


def test_nulls_everywhere_give_missing_input_for_every_cell(ray_local, tmp_path):
    src = _jsonl(
        tmp_path / "in.jsonl",
        [
            {"q": None, "ctx": None, "a": None, "ref": None, "lat": None},
            {},  # every mapped key absent
        ],
    )
    cells = _cells(run_job(_config(src, tmp_path / "out"), run_id="nulls"), 2, IDS)
    reasons = {
        "response_length": "answer is null",
        "context_length": "contexts is null",
        "latency": "latency_s is null",
        "exact_match": "answer is null",
    }
    assert {k: v for k, v in cells.items() if k[0] != "details"} == {
        (f"in.jsonl:{i}", m): (None, "missing_input", why)
        for i in (0, 1)
        for m, why in reasons.items()
    }


def test_csv_with_byte_order_mark_and_crlf(ray_local, tmp_path):
    src = _write(
        tmp_path / "in.csv",
        b'\xef\xbb\xbfq,ctx,a,ref,lat\r\nq1,"[""ab""]",yes,yes,1.5\r\nq2,abcd,no,yes,3\r\n',
    )
    cells = _cells(run_job(_config(src, tmp_path / "out"), run_id="bom"), 2, IDS)
    assert {k: v for k, v in cells.items() if k[0] != "details"} == {
        ("in.csv:0", "response_length"): (1.0, "ok", None),
        ("in.csv:0", "context_length"): (1.0, "ok", None),
        ("in.csv:0", "latency"): (1.0, "ok", None),
        ("in.csv:0", "exact_match"): (1.0, "ok", None),  # no '\r' left on 'yes'
        ("in.csv:1", "response_length"): (1.0, "ok", None),
        ("in.csv:1", "context_length"): (0.0, "ok", "#0 (4 chars) outside [0, 3]"),
        ("in.csv:1", "latency"): (0.0, "ok", "3 s > target 2 s"),
        ("in.csv:1", "exact_match"): (0.0, "ok", "answer differs from reference"),
    }
    assert cells["details", "in.csv:0", "response_length"]["length"] == 3
    assert cells["details", "in.csv:1", "response_length"]["length"] == 2
    assert cells["details", "in.csv:1", "context_length"]["lengths"] == [4]


def test_huge_context_and_ten_thousand_contexts(ray_local, tmp_path):
    src = _jsonl(
        tmp_path / "in.jsonl",
        [
            {"q": "q", "ctx": ["x" * 5_000_000], "a": "yes", "ref": "yes", "lat": 1},
            {"q": "q", "ctx": ["ab"] * 10_000, "a": "yes", "ref": "yes", "lat": 1},
            {"q": "q", "ctx": ["ab"] * 9_999 + ["abcd"], "a": "yes", "ref": "yes", "lat": 1},
        ],
    )
    assert src.stat().st_size > 5_000_000
    cells = _cells(run_job(_config(src, tmp_path / "out"), run_id="big"), 3, IDS)
    assert {k: v for k, v in cells.items() if k[0] != "details" and k[1] == "context_length"} == {
        ("in.jsonl:0", "context_length"): (0.0, "ok", "#0 (5000000 chars) outside [0, 3]"),
        ("in.jsonl:1", "context_length"): (1.0, "ok", None),
        ("in.jsonl:2", "context_length"): (0.0, "ok", "#9999 (4 chars) outside [0, 3]"),
    }
    assert cells["details", "in.jsonl:1", "context_length"]["lengths"] == [2] * 10_000
    for i in range(3):
        for m in ("response_length", "latency", "exact_match"):
            assert cells[f"in.jsonl:{i}", m] == (1.0, "ok", None)


def test_exact_duplicate_rows_each_get_their_own_cells(ray_local, tmp_path):
    src = _write(
        tmp_path / "in.csv", "q,ctx,a,ref,lat\nx,ab,yes,yes,1\nx,ab,yes,yes,1\nx,ab,yes,yes,1\n"
    )
    cells = _cells(run_job(_config(src, tmp_path / "out"), run_id="dups"), 3, IDS)
    assert {k: v for k, v in cells.items() if k[0] != "details"} == {
        (f"in.csv:{i}", m): (1.0, "ok", None) for i in range(3) for m in IDS
    }


def test_binary_callback_raising_on_some_rows(ray_local, tmp_path):
    src = _write(tmp_path / "in.csv", "a,ref\nok,x\nboom,x\n,x\nfine,x\nboom again,x\n")
    config = _config(
        src,
        tmp_path / "out",
        columns={"answer": "a", "reference": "ref"},
        metrics=[
            {
                "name": "binary",
                "params": {"callback": "support.bad_input_callbacks:raises_on_boom", "mode": "row"},
            }
        ],
    )
    where = str(Path(__file__).with_name("support") / "bad_input_callbacks.py")
    # 2 of 5 rows with an error are over the default error budget (1 %): not committed.
    with pytest.raises(RunError) as info:
        run_job(config, run_id="binary")
    assert (
        "2 of 5 rows (40.0%) have status error on some metric, over run.error_budget = 0.01"
        in str(info.value)
    )
    assert (
        f"2 x binary: callback raised RuntimeError: cannot score in.csv:1 at {where}:10 "
        "(e.g. row in.csv:1)"
    ) not in str(info.value)  # reasons differ per row: listed apart
    assert (
        f"1 x binary: callback raised RuntimeError: cannot score in.csv:1 at {where}:10 "
        "(e.g. row in.csv:1)"
    ) in str(info.value)
    assert not list((tmp_path / "out").glob("runs/**/manifest.json"))
    # With the budget raised, the same run id resumes and commits the errors as cells.
    config.run.error_budget = 0.4
    cells = _cells(run_job(config, run_id="binary"), 5, ["binary"])
    got = {k: v for k, v in cells.items() if k[0] != "details"}
    assert got == {
        ("in.csv:0", "binary"): (1.0, "ok", None),
        ("in.csv:1", "binary"): (
            None,
            "error",
            f"callback raised RuntimeError: cannot score in.csv:1 at {where}:10",
        ),
        ("in.csv:2", "binary"): (0.0, "ok", None),  # null answer passed to the callback unchanged
        ("in.csv:3", "binary"): (1.0, "ok", None),
        ("in.csv:4", "binary"): (
            None,
            "error",
            f"callback raised RuntimeError: cannot score in.csv:4 at {where}:10",
        ),
    }


def test_nested_quantifier_regex_engines(ray_local, tmp_path):
    # `(a+)+\Z` translates to Polars' Rust engine (no backtracking, so a long 'aaa...b'
    # is cheap); `(a+)+$` falls back to Python re, which backtracks exponentially on
    # 'a' * n + 'b' (n = 18 here: well under a second; n = 40 would take hours).
    src = _jsonl(
        tmp_path / "in.jsonl", [{"a": "a" * 18 + "b"}, {"a": "aaa\n"}, {"a": "aaa"}, {"a": None}]
    )
    config = _config(
        src,
        tmp_path / "out",
        columns={"answer": "a"},
        metrics=[
            {"name": "regex", "id": "rust", "params": {"pattern": r"(a+)+\Z"}},
            {"name": "regex", "id": "python", "params": {"pattern": "(a+)+$"}},
            # Exponential on Python re for 'a' * 40 + 'b' (2^40 ways to split the a's).
            {"name": "regex", "id": "stuck", "params": {"pattern": "(a|a)+$", "timeout_s": 1.0}},
        ],
    )
    src.write_text(src.read_text() + json.dumps({"a": "a" * 40 + "b"}) + "\n")
    result = run_job(config, run_id="regex")
    cells = _cells(result, 5, ["rust", "python", "stuck"])
    stuck = {k[0]: v for k, v in cells.items() if k[1] == "stuck"}
    limit = (
        "Python re ran past timeout_s=1 s on this answer (catastrophic backtracking?); "
        "rewrite the pattern or raise timeout_s"
    )
    assert stuck == {
        "in.jsonl:0": (0.0, "ok", "no match"),  # 2^18 splits: ~0.1 s, under the limit
        "in.jsonl:1": (1.0, "ok", None),
        "in.jsonl:2": (1.0, "ok", None),
        "in.jsonl:3": (None, "missing_input", "answer is null"),
        "in.jsonl:4": (None, "timeout", limit),
    }
    cells = {k: v for k, v in cells.items() if k[1] != "stuck" and k[0] != "in.jsonl:4"}
    assert {k: v for k, v in cells.items() if k[0] != "details"} == {
        ("in.jsonl:0", "rust"): (0.0, "ok", "no match"),
        ("in.jsonl:1", "rust"): (0.0, "ok", "no match"),  # \Z is the very end
        ("in.jsonl:2", "rust"): (1.0, "ok", None),
        ("in.jsonl:3", "rust"): (None, "missing_input", "answer is null"),
        ("in.jsonl:0", "python"): (0.0, "ok", "no match"),
        ("in.jsonl:1", "python"): (1.0, "ok", None),  # $ matches before a final newline
        ("in.jsonl:2", "python"): (1.0, "ok", None),
        ("in.jsonl:3", "python"): (None, "missing_input", "answer is null"),
    }
    engines = {m["id"]: m["regex_engine"] for m in result.manifest.metrics}
    assert engines == {"rust": "polars", "python": "python-re", "stuck": "python-re"}
    python = next(m for m in result.manifest.metrics if m["id"] == "python")
    assert "'$' without MULTILINE" in python["regex_fallback_reason"]


def test_long_input_on_rust_regex_engine_is_linear(ray_local, tmp_path):
    src = _jsonl(tmp_path / "in.jsonl", [{"a": "a" * 50_000 + "b"}, {"a": "a" * 50_000}])
    config = _config(
        src,
        tmp_path / "out",
        columns={"answer": "a"},
        metrics=[{"name": "regex", "params": {"pattern": r"(a+)+\Z"}}],
    )
    result = run_job(config, run_id="regex-long")
    cells = _cells(result, 2, ["regex"])
    assert cells["in.jsonl:0", "regex"] == (0.0, "ok", "no match")
    assert cells["in.jsonl:1", "regex"] == (1.0, "ok", None)
    assert result.manifest.metrics[0]["regex_engine"] == "polars"


def test_row_id_column_repeating_within_a_file_is_an_input_error(ray_local, tmp_path):
    # Found while reading (inside a Ray task); the run reports the reader's InputError,
    # not Ray's wrapper, so the CLI exits 2 with the message.
    src = tmp_path / "di.csv"
    src.write_text("id,q,ctx,a,ref,lat\n1,x,ab,yes,yes,1\n1,y,ab,no,yes,1\n", encoding="utf-8")
    with pytest.raises(InputError) as info:
        run_job(
            _config(src, tmp_path / "out", columns={**COLUMNS, "row_id": "id"}), run_id="dup-id"
        )
    assert "the row_id column 'id' repeats 1 value(s) (e.g. '1')" in str(info.value)
    assert not list((tmp_path / "out").glob("runs/**/manifest.json"))
