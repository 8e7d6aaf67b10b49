"""The nightly entry point: run-date templates, the default night, exit codes, the report
and comparison against the previous committed night, and judgments reused across nights.

The end-to-end nights run the shipped ``jobs/nightly.yaml`` on the shipped nights
(examples/data/nightly: ARES data lines 0-15 and 8-23) through ``ragbatch nightly`` in this
process, on the session's Ray; a third night is the second night's rows with every answer
replaced by a refusal. Expected values come from the TSV and plain Python
(``support.nightly_runs.expected_answer_cells``), not from ragbatch.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
import yaml

from support.nightly_runs import expected_answer_cells, read_ares, run_cli, write_tsv
from ragbatch.config.job import JobConfig
from ragbatch.core.errors import ConfigError
from ragbatch.io.staging import Staging
from ragbatch.io.write import OutputLayout
from ragbatch.core.run_date import yesterday_utc
from ragbatch.pipeline.runner import run_date_for
from ragbatch.config.templating import fixed_prefix, render, render_config

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "jobs" / "nightly.yaml"
NIGHT1, NIGHT2, WORSE = "2026-11-27", "2026-11-28", "2026-11-29"
#: Data lines of the ARES TSV on each shipped night (examples/data/nightly/SOURCE.md).
LINES = {NIGHT1: range(0, 16), NIGHT2: range(8, 24)}
THRESHOLD = 0.05
REFUSAL = "I don't know."
METRICS = [
    "response_length",
    "context_length",
    "mentions_databricks",
    "cites_a_url",
    "mentions_spark",
    "not_a_refusal",
]


# ----------------------------------------------------------------- templates (no Ray)


@pytest.mark.parametrize(
    "template, expected",
    [
        ("s3://t/run_date={run_date}/", "s3://t/run_date=2026-03-04/"),
        ("s3://t/{run_date:%Y/%m/%d}/x.parquet", "s3://t/2026/03/04/x.parquet"),
        ("out/{run_date:%G-W%V}/{run_date:%j}", "out/2026-W10/063"),
        ("a/{{literal}}/{run_date:%Y%m%d}", "a/{literal}/20260304"),
        ("plain/path/", "plain/path/"),
        ("{run_date:%d %b %Y 100%%}", "04 Mar 2026 100%"),
    ],
)
def test_render(template, expected):
    assert render(template, dt.date(2026, 3, 4)) == expected


@pytest.mark.parametrize(
    "template, fragments",
    [
        ("x/{date}/", ["input.uri", "unknown placeholder {date}", "{run_date}", "{{"]),
        ("x/{}/", ["unknown placeholder {}"]),
        ("x/{run_date.year}/", ["unknown placeholder {run_date.year}"]),
        ("x/{run_date/", ["input.uri", "malformed braces", "expected '}'"]),
        ("x/run_date}/", ["malformed braces", "Single '}'"]),
        ("x/{run_date!r}/", ["conversion (!r)"]),
        ("x/{run_date:%H}/", ["%H, which is not a date directive"]),
        ("x/{run_date:>10}/", ["holds no strftime directive"]),
        ("x/{run_date:%Y%}/", ["ends with a lone %"]),
        ("x/{run_date:{run_date}}/", ["nests a placeholder"]),
    ],
)
def test_bad_template_names_the_field_and_the_fix(template, fragments):
    with pytest.raises(ConfigError) as caught:
        render(template, dt.date(2026, 3, 4), "input.uri")
    for fragment in fragments:
        assert fragment in str(caught.value), str(caught.value)


def _config(**sections) -> JobConfig:
    data = {
        "input": {"uri": "in/"},
        "output": {"uri": "out/"},
        "metrics": [{"name": "response_length", "params": {"min_chars": 1}}],
    }
    data.update(sections)
    return JobConfig.from_dict(data)


def test_render_config_fills_the_three_fields_and_the_run_date():
    config = _config(
        input={"uri": "s3://in/{run_date:%Y/%m/%d}/"},
        output={"uri": "s3://out/{{x}}"},
        cache={"uri": "s3://c/{run_date}"},
    )
    rendered = render_config(config, dt.date(2026, 11, 28))
    assert (rendered.input.uri, rendered.output.uri, rendered.cache.uri) == (
        "s3://in/2026/11/28/",
        "s3://out/{x}",
        "s3://c/2026-11-28",
    )
    assert rendered.run.run_date == dt.date(2026, 11, 28)
    assert config.input.uri == "s3://in/{run_date:%Y/%m/%d}/"  # the original is left alone
    assert render_config(_config(), dt.date(2026, 1, 1)).cache.uri is None


def test_every_bad_field_is_listed():
    with pytest.raises(ConfigError) as caught:
        render_config(
            _config(input={"uri": "{day}"}, cache={"uri": "c/{run_date"}), dt.date(2026, 1, 1)
        )
    assert caught.value.problems[0].startswith("input.uri: unknown placeholder {day}")
    assert caught.value.problems[1].startswith("cache.uri: malformed braces")


def test_fixed_prefix():
    assert fixed_prefix("s3://b/traces/run_date={run_date}/") == "s3://b/traces"
    assert fixed_prefix("data/{run_date:%Y}/{run_date:%m}/") == "data"
    assert fixed_prefix("{run_date}.tsv") == ""
    assert fixed_prefix("data/x.tsv") is None


def test_yesterday_is_the_utc_date_before():
    # 00:30 in UTC+2 is 22:30 the day before in UTC: yesterday is two local days back.
    assert yesterday_utc(
        dt.datetime(2026, 11, 28, 0, 30, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    ) == dt.date(2026, 11, 26)
    assert yesterday_utc(dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.timezone.utc)) == dt.date(
        2026, 2, 28
    )
    before = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=1)).date()
    assert yesterday_utc() in (before, before + dt.timedelta(days=1))


def test_the_outcome_fields_are_typed():
    import typing

    import ragbatch.cli
    import ragbatch.core.exit_codes
    from ragbatch.analysis.compare import Comparison
    from ragbatch.analysis.nightly import NightlyReport
    from ragbatch.analysis.runs import CommittedRun
    from ragbatch.ops.nightly_job import NightlyOutcome
    from ragbatch.pipeline.runner import RunResult

    names = {
        "Comparison": Comparison,
        "NightlyReport": NightlyReport,
        "pl": pl,
        "CommittedRun": CommittedRun,
        "RunResult": RunResult,
    }
    hints = typing.get_type_hints(NightlyOutcome, localns=names)
    assert typing.Any not in hints.values()
    assert (hints["result"], hints["run"], hints["baseline"]) == (
        RunResult | None,
        CommittedRun | None,
        CommittedRun | None,
    )
    assert (hints["comparison"], hints["report"], hints["regressions"]) == (
        Comparison | None,
        NightlyReport | None,
        pl.DataFrame | None,
    )
    # one definition of the exit codes, which the CLI and the nightly job both use
    assert ragbatch.cli.common.EXIT_DEGENERATE is ragbatch.core.exit_codes.EXIT_DEGENERATE
    assert sorted(ragbatch.core.exit_codes.EXIT_CODES) == [0, 1, 2, 3, 4, 5]
    assert ragbatch.core.exit_codes.EXIT_INTERRUPTED == 128 + 2


def test_a_resumed_run_keeps_its_date_and_so_its_uris(tmp_path):
    """An attempt started on 11-27 left its staging state; a retry on 11-30 without a date
    takes 11-27, unless the output root itself depends on the date."""
    config = _config(
        input={"uri": "in/run_date={run_date}/"}, output={"uri": str(tmp_path / "out")}
    )
    Staging(OutputLayout.for_run(config.output, dt.date(2026, 11, 27), "r1")).begin("fp", ["m"])
    later = dt.datetime(2026, 11, 30, 1, 0, tzinfo=dt.timezone.utc)
    assert run_date_for(config, "r1", later) == dt.date(2026, 11, 27)
    assert run_date_for(config, "r2", later) == dt.date(2026, 11, 30)
    explicit = _config(run={"run_date": "2026-11-29"}, output={"uri": str(tmp_path / "out")})
    assert run_date_for(explicit, "r1", later) == dt.date(2026, 11, 29)
    templated = _config(output={"uri": str(tmp_path / "{run_date}")})
    assert run_date_for(templated, "r1", later) == dt.date(2026, 11, 30)


# ---------------------------------------------------------- command line, no Ray needed


def test_validate_and_run_render_the_shipped_config(monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    code, out, err = run_cli(["validate", str(CONFIG), "--run-date", NIGHT2])
    assert code == 0, err
    assert f"input  examples/data/nightly/run_date={NIGHT2}/: 1 read task(s)" in out
    # `run` renders too: a night that is not shipped is a missing input (exit 2 for run).
    code, _, err = run_cli(
        ["run", str(CONFIG), "--run-date", "2026-11-30", "--output", str(tmp_path)]
    )
    assert code == 2 and "examples/data/nightly/run_date=2026-11-30/: not found" in err


def test_bad_template_exits_2(tmp_path):
    cfg = yaml.safe_load(CONFIG.read_text())
    cfg["input"]["uri"] = "examples/data/nightly/{date}/"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    code, out, err = run_cli(
        ["nightly", str(path), "--run-date", NIGHT1, "--output", str(tmp_path / "o")]
    )
    assert code == 2
    assert (
        "input.uri: unknown placeholder {date}" in err and "exit 2: config or input problem" in out
    )


def test_input_root_missing_is_a_config_problem_not_a_late_night(tmp_path):
    code, _, err = run_cli(
        [
            "nightly",
            str(CONFIG),
            "--run-date",
            NIGHT1,
            "--output",
            str(tmp_path / "o"),
            "--input",
            str(tmp_path / "no_such_root" / "run_date={run_date}") + "/",
        ]
    )
    assert code == 2 and "no_such_root/run_date=2026-11-27" in err


def test_script_defaults_to_yesterday_and_exits_4_for_a_night_not_there_yet(tmp_path):
    """``python jobs/nightly.py CONFIG`` as a scheduler starts it: the night is yesterday
    (UTC), whose folder does not exist under an existing root: exit 4, nothing written."""
    (tmp_path / "traces").mkdir()
    before = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=1)).date()
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "jobs" / "nightly.py"),
            str(CONFIG),
            "--output",
            str(tmp_path / "o"),
            "--input",
            str(tmp_path / "traces" / "run_date={run_date}") + "/",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(
            os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
        ),
    )
    after = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=1)).date()
    assert proc.returncode == 4, proc.stderr[-2000:]
    nights = {before.isoformat(), after.isoformat()}
    headline = proc.stdout.splitlines()[0]
    assert any(
        headline.startswith(f"night {n}: run nightly-{n} not started: its input is not there yet")
        for n in nights
    ), proc.stdout
    assert "exit 4: this night's input is not there yet; retry later" in proc.stdout
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------- nights end to end


def _expected_diffs(answers_before: list[str], answers_after: list[str]) -> dict[str, float]:
    """Mean paired change per answer metric, recomputed in plain Python."""
    out = {}
    for metric in (
        "response_length",
        "mentions_databricks",
        "cites_a_url",
        "mentions_spark",
        "not_a_refusal",
    ):
        diffs = [
            expected_answer_cells(b)[metric][1] - expected_answer_cells(a)[metric][1]
            for a, b in zip(answers_before, answers_after)
        ]
        out[metric] = sum(diffs) / len(diffs)
    return out


@pytest.fixture(scope="module")
def nights(ray_local, tmp_path_factory):
    """The shipped nights, then a worse one (every answer of night 2 a refusal) whose
    first report fails (a file stands where its folder goes) and which is run again."""
    base = tmp_path_factory.mktemp("nightly")
    out = base / "out"
    header, rows = read_ares()
    answer = header.index("Answer")
    worse = [list(rows[i]) for i in LINES[NIGHT2]]
    for r in worse:
        r[answer] = REFUSAL
    write_tsv(base / "worse" / f"run_date={WORSE}" / "worse.tsv", header, worse)
    common = ["--output", str(out), "--fail-on-regression", str(THRESHOLD)]
    got = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(REPO)  # the shipped config names its input relative to the repository
        # The first night without the HTML report (seconds of matplotlib): the second
        # night's and the worse night's reports are checked.
        got[NIGHT1] = run_cli(
            ["nightly", str(CONFIG), "--run-date", NIGHT1, *common, "--no-report"]
        )
        got[NIGHT2] = run_cli(["nightly", str(CONFIG), "--run-date", NIGHT2, *common])
        got["again"] = run_cli(
            ["nightly", str(CONFIG), "--run-date", NIGHT2, *common, "--no-report"]
        )
        got["missing"] = run_cli(["nightly", str(CONFIG), "--run-date", "2026-11-30", *common])
        blocker = out / "reports" / f"run_date={WORSE}"
        blocker.parent.mkdir(parents=True, exist_ok=True)
        blocker.write_text("in the way")
        worse_args = [
            "nightly",
            str(CONFIG),
            "--run-date",
            WORSE,
            *common,
            "--input",
            str(base / "worse" / "run_date={run_date}") + "/",
        ]
        got["worse_report_failed"] = run_cli(worse_args)
        blocker.unlink()
        got["worse"] = run_cli(worse_args)
    return out, got, {"answers": [rows[i][answer] for i in LINES[NIGHT2]]}


def _manifest(out: Path, night: str) -> dict:
    return json.loads(
        (
            out / "runs" / f"run_date={night}" / f"run_id=nightly-{night}" / "manifest.json"
        ).read_text()
    )


def _reports(out: Path, night: str) -> Path:
    return out / "reports" / f"run_date={night}" / f"run_id=nightly-{night}"


def test_first_night_commits_with_nothing_to_compare(nights):
    out, got, _ = nights
    code, stdout, err = got[NIGHT1]
    assert code == 0, err[-3000:]
    assert stdout.startswith(
        f"night {NIGHT1}: run nightly-{NIGHT1} committed (16 rows x 6 metrics = 96 cells)"
    )
    assert "compared:   none (the first committed run under this output root)" in stdout
    assert "exit 0: committed; no regression beyond the threshold" in stdout
    assert not (out / "reports" / f"run_date={NIGHT1}").exists()  # --no-report
    manifest = _manifest(out, NIGHT1)
    assert manifest["input"]["uri"] == f"examples/data/nightly/run_date={NIGHT1}/"
    assert manifest["config"]["input"]["uri"] == manifest["input"]["uri"]
    assert manifest["run"]["uri_templates"] == {
        "input.uri": "examples/data/nightly/run_date={run_date}/"
    }
    assert manifest["run"]["date"] == NIGHT1 and manifest["rows"]["input"] == 16


def _not_ok_block(out: Path, night: str) -> list[str]:
    """The screen's "cells not ok" lines for a committed night, runs of spaces as one,
    worked out from its score files with PyArrow (not from the summary the screen reads)."""
    scores = pq.read_table(
        out / "scores" / f"run_date={night}" / f"run_id=nightly-{night}",
        columns=["metric", "status"],
    ).to_pylist()
    order = ["not_applicable", "missing_input", "parse_failure", "judge_error", "timeout"]
    order += ["context_too_long", "error"]
    counts: dict[str, dict[str, int]] = {}
    for cell in scores:
        if cell["status"] != "ok":
            per = counts.setdefault(cell["metric"], {})
            per[cell["status"]] = per.get(cell["status"], 0) + 1
    if not counts:
        return []
    return ["cells not ok (statuses: docs/output-schema.md):"] + [
        f"{m}: " + ", ".join(f"{s}={per[s]}" for s in order if s in per)
        for m, per in counts.items()
    ]


def _collapsed(lines: list[str]) -> list[str]:
    return [" ".join(line.split()) for line in lines]


def test_the_screen_counts_the_cells_not_ok(nights):
    out, got, _ = nights
    for night in (NIGHT1, NIGHT2):
        _, stdout, _ = got[night]
        block = _not_ok_block(out, night)
        lines = stdout.splitlines()
        if not block:
            assert "cells not ok" not in stdout
            continue
        start = lines.index(block[0])
        assert sorted(_collapsed(lines[start + 1 : start + len(block)])) == sorted(block[1:])


def test_a_night_with_cells_not_ok_lists_them_under_the_table(monkeypatch, tmp_path):
    """Rows 1 and 3 have no answer, rows 2 and 3 no document: each answer metric has two
    ``missing_input`` cells, context_length two, and the ``binary`` callback's policy
    makes the two null answers ``not_applicable``."""
    header, rows = read_ares()
    answer, document = header.index("Answer"), header.index("Document")
    rows = [list(r) for r in rows[:4]]
    rows[0][answer] = rows[2][answer] = ""
    rows[1][document] = rows[2][document] = ""
    write_tsv(tmp_path / "in" / f"run_date={NIGHT1}" / "night.tsv", header, rows)
    monkeypatch.chdir(REPO)
    code, stdout, err = run_cli(
        [
            "nightly",
            str(CONFIG),
            "--run-date",
            NIGHT1,
            "--input",
            str(tmp_path / "in" / "run_date={run_date}") + "/",
            "--output",
            str(tmp_path / "out"),
            "--no-report",
        ]
    )
    assert code == 0, err[-3000:]
    expected = [
        "cells not ok (statuses: docs/output-schema.md):",
        "  response_length:     missing_input=2",
        "  context_length:      missing_input=2",
        "  mentions_databricks: missing_input=2",
        "  cites_a_url:         missing_input=2",
        "  mentions_spark:      missing_input=2",
        "  not_a_refusal:       not_applicable=2",
    ]
    lines = stdout.splitlines()
    start = lines.index(expected[0])
    assert lines[start : start + len(expected)] == expected
    assert lines[start - 1] == "" and lines[start + len(expected)] == ""
    assert _not_ok_block(tmp_path / "out", NIGHT1) == _collapsed(expected)


def test_cells_not_ok_are_listed_by_metric_in_status_order():
    from ragbatch.ops.nightly_summary import not_ok_lines

    zeros = {f"n_{s}": 0 for s in ("not_applicable", "missing_input", "judge_error")}
    rows = [
        {"metric": "faithfulness", **zeros, "n_parse_failure": 2, "n_error": 1, "n_ok": 3},
        {"metric": "response_length", **zeros, "n_parse_failure": None, "n_ok": 6},
        {"metric": "answer_relevancy_long_id", "n_ok": 0, "n_timeout": 4, "n_missing_input": 1},
    ]
    assert not_ok_lines(rows) == [
        "",
        "cells not ok (statuses: docs/output-schema.md):",
        "  faithfulness:             parse_failure=2, error=1",
        "  answer_relevancy_long_id: missing_input=1, timeout=4",
    ]
    assert not_ok_lines(rows[1:2]) == []
    assert not_ok_lines([]) == []


def test_second_night_is_compared_with_the_first(nights):
    out, got, _ = nights
    code, stdout, err = got[NIGHT2]
    assert code == 0, err[-3000:]
    assert (_reports(out, NIGHT2) / "report.html").stat().st_size > 0
    assert f"report:     {_reports(out, NIGHT2) / 'report.html'}" in stdout
    comparison = json.loads((_reports(out, NIGHT2) / "comparison.json").read_text())
    assert comparison["baseline"]["run_id"] == f"nightly-{NIGHT1}"
    assert comparison["threshold"] == THRESHOLD
    # Data lines 8-15 are on both nights under other row ids: paired by content.
    shared = len(set(LINES[NIGHT1]) & set(LINES[NIGHT2]))
    assert comparison["pairing"]["content"] == shared == 8
    overall = {m["metric"]: m for m in comparison["metrics"] if m["slice"] is None}
    assert set(overall) == set(METRICS)
    for m in overall.values():  # the same rows, the same answers: no change
        assert (m["n_pairs"], m["mean_diff"], m["change"]) == (shared, 0.0, None)
    assert (
        f"vs nightly-{NIGHT1} (paired)" in stdout
        and "+0.000 [+0.000, +0.000] over 8 pairs" in stdout
    )
    assert "exit 0: committed; no regression beyond the threshold" in stdout


def test_a_committed_night_is_not_run_again(nights):
    out, got, _ = nights
    code, stdout, err = got["again"]
    assert code == 0, err[-3000:]
    assert stdout.startswith(
        f"night {NIGHT2}: run nightly-{NIGHT2} was already committed; not run again"
    )
    assert len(list((out / "runs").glob(f"run_date={NIGHT2}/run_id=*/manifest.json"))) == 1


def test_missing_night_exits_4(nights):
    out, got, _ = nights
    code, stdout, _ = got["missing"]
    assert code == 4
    assert "examples/data/nightly/run_date=2026-11-30/" in stdout.splitlines()[0]
    assert not list(out.glob("**/run_date=2026-11-30"))


def test_report_failure_exits_1_and_the_retry_publishes_it(nights):
    out, got, _ = nights
    code, stdout, err = got["worse_report_failed"]
    assert code == 1
    assert f"run nightly-{WORSE} is committed, but its report failed" in err
    assert stdout.startswith(f"night {WORSE}: run nightly-{WORSE} committed (16 rows")
    code, stdout, _ = got["worse"]
    assert stdout.startswith(f"night {WORSE}: run nightly-{WORSE} was already committed")
    assert (_reports(out, WORSE) / "report.html").stat().st_size > 0


def test_regression_beyond_the_threshold_exits_3(nights):
    out, got, data = nights
    code, stdout, err = got["worse"]
    assert code == 3, err[-3000:]
    comparison = json.loads((_reports(out, WORSE) / "comparison.json").read_text())
    assert comparison["baseline"]["run_id"] == f"nightly-{NIGHT2}"
    assert comparison["pairing"]["content"] == 16
    overall = {m["metric"]: m for m in comparison["metrics"] if m["slice"] is None}
    expected = _expected_diffs(data["answers"], [REFUSAL] * 16)
    for metric, diff in expected.items():
        assert overall[metric]["mean_diff"] == pytest.approx(diff, abs=1e-12), metric
    # A metric regresses when its change is worse than the threshold and its interval
    # excludes 0; every non-zero change here is of 16 pairs of 0/1 scores of one sign.
    regressed = sorted(m for m, d in expected.items() if d < -THRESHOLD)
    assert regressed == ["mentions_databricks", "mentions_spark", "not_a_refusal"]
    assert sorted(m for m, r in overall.items() if r["change"] == "worse") == regressed
    assert (
        f"exit 3: committed, but a metric regressed beyond the threshold: regressed beyond "
        f"0.05 against run nightly-{NIGHT2}: " in stdout
    )
    for metric in regressed:
        assert metric in stdout.rstrip().rsplit("\n", 1)[-1]
        line = next(x for x in stdout.splitlines() if x.startswith(metric + " "))
        assert line.endswith("worse  REGRESSED (> 0.05)"), line


def test_shipped_nights_are_the_documented_lines_of_the_ares_tsv():
    """examples/data/nightly/SOURCE.md: header plus ARES data lines, byte for byte."""
    from support.nightly_runs import ARES_TSV

    lines = ARES_TSV.read_bytes().split(b"\r\n")
    source = (REPO / "examples/data/nightly/SOURCE.md").read_text()
    for night, rows in LINES.items():
        shipped = (
            REPO / "examples/data/nightly" / f"run_date={night}" / f"ares-{night}.tsv"
        ).read_bytes()
        assert shipped == b"".join(x + b"\r\n" for x in [lines[0], *(lines[1 + i] for i in rows)])
        assert hashlib.sha256(shipped).hexdigest() in source
    assert (REPO / "examples/data/nightly/LICENSE").read_bytes() == (
        ARES_TSV.parent / "LICENSE"
    ).read_bytes()


# ------------------------------------------------------------ the judgment cache, 2 nights

#: ARES data lines with short documents; the second night repeats the last two of the first.
CACHE_NIGHTS = {NIGHT1: (12, 24, 34), NIGHT2: (24, 34, 8)}


def test_second_night_reuses_the_judgments_of_repeated_rows(ray_local, vllm_base_url, tmp_path):
    header, rows = read_ares()
    for night, lines in CACHE_NIGHTS.items():
        write_tsv(
            tmp_path / "traces" / f"run_date={night}" / f"t-{night}.tsv",
            header,
            [rows[i] for i in lines],
        )
    config = {
        "run": {"name": "cache-nights"},
        "input": {
            "uri": str(tmp_path / "traces" / "run_date={run_date}") + "/",
            "format": "tsv",
            "columns": {"question": "Question", "contexts": "Document", "answer": "Answer"},
            "contexts_format": "text",
        },
        "output": {"uri": str(tmp_path / "out")},
        "engines": {
            "judge": {
                "kind": "openai",
                "base_url": vllm_base_url,
                "model": "tiny",
                "concurrency": 1,
                "batch_size": 8,
                "max_tokens": 160,
                "request_timeout_s": 300,
            }
        },
        "metrics": [{"name": "hate_speech", "engine": "judge"}],
    }
    path = tmp_path / "cache.yaml"
    path.write_text(yaml.safe_dump(config))
    for night in CACHE_NIGHTS:
        code, _, err = run_cli(["nightly", str(path), "--run-date", night, "--no-report"])
        assert code == 0, err[-3000:]

    def cells(night: str) -> dict[int, dict]:
        table = pl.from_arrow(
            pq.read_table(
                tmp_path / "out" / "scores" / f"run_date={night}" / f"run_id=nightly-{night}"
            )
        )
        by_line = {}
        for r in table.iter_rows(named=True):
            index = int(r["row_id"].rsplit(":", 1)[1])
            by_line[CACHE_NIGHTS[night][index]] = r
        return by_line

    first, second = cells(NIGHT1), cells(NIGHT2)
    shared = set(CACHE_NIGHTS[NIGHT1]) & set(CACHE_NIGHTS[NIGHT2])
    calls_of_shared = sum(first[i]["judge_calls"] for i in shared)
    assert calls_of_shared >= len(shared)
    judge = json.loads(
        (
            tmp_path
            / "out"
            / "runs"
            / f"run_date={NIGHT2}"
            / f"run_id=nightly-{NIGHT2}"
            / "manifest.json"
        ).read_text()
    )["judge"]["total"]
    assert judge["cache_hits"] == calls_of_shared
    for i in shared:  # served from the cache: no call, the first night's judgment
        assert (second[i]["judge_calls"], second[i]["cache_hits"]) == (0, first[i]["judge_calls"])
        assert (second[i]["score"], second[i]["status"], second[i]["judge_reply"]) == (
            first[i]["score"],
            first[i]["status"],
            first[i]["judge_reply"],
        )
    new = set(CACHE_NIGHTS[NIGHT2]) - shared
    assert judge["judge_calls"] == sum(second[i]["judge_calls"] for i in new) >= len(new)
    assert all(second[i]["cache_hits"] == 0 for i in new)
    # Every cache entry and touch counts for the night that used it.
    bucket_rows = pl.from_arrow(
        pq.read_table(tmp_path / "out" / "judge_cache" / "v2" / "buckets", columns=["last_run"])
    )
    assert set(bucket_rows["last_run"].to_list()) == {f"nightly-{n}" for n in CACHE_NIGHTS}
