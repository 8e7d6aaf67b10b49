"""Judge health end to end: `ragbatch run` and `ragbatch nightly` on 24 ARES rows, with
real local Ray and the real ``openai`` engine against a stand-in judge that answers every
hate_speech request ``{"reason":"true","verdict":true}`` (tests/support/canned_judge_server.py),
as SmolLM2-135M did in issue 25.

Checked: summary.parquet's health columns, the manifest's ``diagnostics`` section, the
console table, the HTML report, and exit 5 with ``--fail-on-degenerate`` or
``diagnostics.fail_on_degenerate`` (0 without either).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from support.canned_judge_server import SERVED_NAME, CannedJudgeServer
from support.degenerate_judge import CONSTANT_TRUE, N_ROWS, ares_tsv_input
from ragbatch.cli import main
from ragbatch.core.exit_codes import EXIT_CODES, EXIT_DEGENERATE

pytest.importorskip("openai", reason="the openai engine needs the openai package")
pytestmark = pytest.mark.slow

NIGHT = "2024-06-02"


def _config(tmp_path: Path, base_url: str, **diagnostics) -> Path:
    config = {
        "input": ares_tsv_input(tmp_path, N_ROWS, "ares_24.tsv"),
        "output": {"uri": str(tmp_path / "out")},
        "engines": {
            "judge": {
                "kind": "openai",
                "base_url": base_url,
                "model": SERVED_NAME,
                "max_retries": 0,
            }
        },
        "metrics": [
            {"name": "hate_speech", "engine": "judge"},
            {"name": "response_length", "params": {"min_chars": 1}},
        ],
        "diagnostics": diagnostics,
    }
    path = tmp_path / f"job{'_gated' if diagnostics else ''}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def judged(tmp_path_factory, ray_local):
    """One gated run (exit 5), its outputs, and the stand-in server still up."""
    tmp_path = tmp_path_factory.mktemp("health_run")
    with CannedJudgeServer(CONSTANT_TRUE) as server:
        config = _config(tmp_path, server.base_url)
        code = main(
            [
                "run",
                str(config),
                "--run-id",
                "r1",
                "--run-date",
                NIGHT,
                "--report",
                "--fail-on-degenerate",
            ]
        )
        yield {"code": code, "config": config, "tmp": tmp_path, "server": server}


def _captured(capsys):
    return capsys.readouterr()


def test_run_gated_on_a_degenerate_judge_exits_5(judged):
    assert judged["code"] == EXIT_DEGENERATE == 5
    assert judged["server"].chat_calls == N_ROWS


def test_summary_marks_the_judge_metric_only(judged):
    out = judged["tmp"] / "out"
    [path] = (out / "summary").glob("run_date=*/run_id=r1/summary.parquet")
    rows = {r["metric"]: r for r in pq.read_table(path).to_pylist() if r["slice_column"] is None}
    hs = rows["hate_speech"]
    assert hs["degenerate"] is True
    assert (hs["modal_score"], hs["modal_share"], hs["junk_reason_share"]) == (1.0, 1.0, 1.0)
    assert hs["degenerate_reasons"].split("; ") == [
        "constant score 1 on 100% of ok cells (> modal_share_max 0.95)",
        "empty or verdict-only reasons on 100% of ok cells (> junk_reason_max 0.5)",
        "one reason repeated on 100% of ok cells (> reason_modal_share_max 0.9)",
    ]
    assert rows["response_length"]["degenerate"] is None


def test_manifest_records_thresholds_and_flags(judged):
    out = judged["tmp"] / "out"
    [path] = (out / "runs").glob("run_date=*/run_id=r1/manifest.json")
    diagnostics = json.loads(path.read_text())["diagnostics"]
    assert diagnostics["thresholds"]["min_cells"] == 20
    assert list(diagnostics["metrics"]) == ["hate_speech"]
    assert diagnostics["metrics"]["hate_speech"]["degenerate"] is True
    assert len(diagnostics["metrics"]["hate_speech"]["reasons"]) == 3


def test_report_warns_about_the_degenerate_metric(judged):
    out = judged["tmp"] / "out"
    [report] = (out / "reports").glob("run_date=*/run_id=r1/report.html")
    html = report.read_text(encoding="utf-8")
    warning = html.split('id="degenerate-warning"', 1)[1].split("</p>", 1)[0]
    assert "<code>hate_speech</code>" in warning and "response_length" not in warning
    assert "degenerate: constant score 1 on 100% of ok cells" in html


def test_nightly_exit_code_follows_the_gate(judged, capsys):
    config, gated = (
        judged["config"],
        _config(judged["tmp"], judged["server"].base_url, fail_on_degenerate=True),
    )
    _captured(capsys)
    argv = ["--run-date", NIGHT, "--no-report"]
    code = main(["nightly", str(config), *argv, "--fail-on-degenerate"])
    out = _captured(capsys).out
    assert code == EXIT_DEGENERATE, out
    assert f"exit 5: {EXIT_CODES[5]}: degenerate judge results: hate_speech" in out
    assert "DEGENERATE: constant score 1" in out
    # The night is committed now: running it again recomputes only the exit code.
    assert main(["nightly", str(config), *argv]) == 0
    assert main(["nightly", str(gated), *argv]) == EXIT_DEGENERATE


def test_console_table_marks_degenerate(judged, capsys):
    _captured(capsys)
    code = main(["run", str(judged["config"]), "--run-id", "r2", "--run-date", NIGHT])
    out = _captured(capsys).out
    assert code == 0  # not gated
    line = next(x for x in out.splitlines() if x.startswith("hate_speech "))
    assert line.endswith("DEGENERATE")
    assert "  hate_speech: constant score 1 on 100% of ok cells" in out
    assert not next(x for x in out.splitlines() if x.startswith("response_length ")).endswith(
        "DEGENERATE"
    )
