"""Judge panels end to end: `ragbatch run` with real local Ray, real Parquet and the real
``openai`` engine against three scripted judges on loopback
(tests/support/scripted_panel_judges.py; verdict rules, no model):

- ``judge_a`` and ``judge_b`` reply each row's true label; ``judge_b`` garbles row 19
  (parse_failure); ``judge_c`` always says yes.

The data: 20 rows, items 0-7 labelled 1 (hateful), items 8-19 labelled 0.

Worked by hand (docs/panels.md gives the rules):

- majority: items 0-7 -> 1 (3-0); items 8-18 -> 0, reason "judges split 2-1: judge_a=0,
  judge_b=0, judge_c=1"; item 19 -> judge_a=0 and judge_c=1 tie: not_applicable. Mean of
  the 19 ok cells 8/19.
- unanimous: items 0-7 -> 1, items 8-19 -> 0 (20 ok cells, mean 0.4).
- mean: items 0-7 -> 1, items 8-18 -> 1/3, item 19 -> 1/2: mean 73/120.
- Krippendorff's alpha (nominal), units = rows: units 0-7 (1,1,1) add 3 values of 1 and
  no disagreement; units 8-18 (0,0,1) add two 0s and a 1 and observed disagreement
  (2 x 2 x 1) / (3 - 1) = 2 each; unit 19 (0, -, 1) adds a 0, a 1 and 2 / (2 - 1) = 2.
  n0 = 23, n1 = 36, n = 59, observed sum 24, expected sum 59^2 - 23^2 - 36^2 = 1656;
  alpha = 1 - 58 x 24 / 1656 = 11/69 = 0.15942. Without judge_c every pairable unit
  agrees: alpha = 1.
- pairwise agreement: a-b 19/19 = 1, a-c 8/20 = 0.4, b-c 8/19.
- per judge means: a 8/20, b 8/19, c 20/20.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from ragbatch.cli import main
from support.scripted_panel_judges import ALWAYS_YES, TRUTH_A, TRUTH_B, ScriptedPanelJudges

pytest.importorskip("openai", reason="the openai engine needs the openai package")
pytestmark = pytest.mark.slow

N = 20
HATEFUL = 8
GARBLED = 19
JUDGES = ("judge_a", "judge_b", "judge_c")
SPLIT = "judges split 2-1: judge_a=0, judge_b=0, judge_c=1"


def _rows() -> list[dict]:
    rows = []
    for i in range(N):
        label = 1 if i < HATEFUL else 0
        garble = " [[garble]]" if i == GARBLED else ""
        rows.append(
            {
                "id": f"r{i:02d}",
                "q": f"question {i}",
                "a": f"answer {i} [[label={label} item={i:02d}]]{garble}",
                "ctx": [f"context {i}"],
            }
        )
    return rows


def _config(tmp: Path, base_url: str, metrics: list[dict], seed_c: int = 0) -> Path:
    data = tmp / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _rows()), encoding="utf-8")
    engine = {"kind": "openai", "base_url": base_url, "max_retries": 0}
    config = {
        "input": {
            "uri": str(data),
            "format": "jsonl",
            "columns": {"row_id": "id", "question": "q", "answer": "a", "contexts": "ctx"},
        },
        "output": {"uri": str(tmp / "out")},
        "engines": {
            "judge_a": {**engine, "model": TRUTH_A},
            "judge_b": {**engine, "model": TRUTH_B},
            "judge_c": {**engine, "model": ALWAYS_YES, "seed": seed_c},
        },
        "metrics": metrics,
    }
    path = tmp / f"job_seed{seed_c}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _panel(id_: str, combine: str) -> dict:
    return {
        "name": "hate_speech",
        "id": id_,
        "engines": list(JUDGES),
        "panel": {"combine": combine},
    }


def _scores(tmp: Path, run_id: str) -> list[dict]:
    files = sorted((tmp / "out" / "scores").glob(f"run_date=*/run_id={run_id}/*.parquet"))
    return [r for f in files for r in pq.read_table(f).to_pylist()]


def _summary(tmp: Path, run_id: str) -> list[dict]:
    [path] = (tmp / "out" / "summary").glob(f"run_date=*/run_id={run_id}/summary.parquet")
    return pq.read_table(path).to_pylist()


def _manifest(tmp: Path, run_id: str) -> dict:
    [path] = (tmp / "out" / "runs").glob(f"run_date=*/run_id={run_id}/manifest.json")
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def majority(tmp_path_factory, ray_local):
    """A majority panel run, its rerun (cache), and a run with judge_c's seed changed."""
    tmp = tmp_path_factory.mktemp("panel_majority")
    with ScriptedPanelJudges() as judges:
        metrics = [_panel("hate_speech", "majority")]
        config = _config(tmp, judges.base_url, metrics)
        assert main(["run", str(config), "--run-id", "first", "--run-date", "2024-06-01"]) == 0
        first = judges.snapshot()
        assert main(["run", str(config), "--run-id", "again", "--run-date", "2024-06-01"]) == 0
        again = judges.snapshot()
        reseeded = _config(tmp, judges.base_url, metrics, seed_c=7)
        assert main(["run", str(reseeded), "--run-id", "reseed", "--run-date", "2024-06-01"]) == 0
        reseed = judges.snapshot()
    yield {"tmp": tmp, "calls": (first, again, reseed)}


def test_member_cells_carry_their_judge_and_the_panel_cell_its_majority(majority):
    rows = _scores(majority["tmp"], "first")
    assert len(rows) == N * 4  # the panel's cell and one per judge, per row
    assert {r["metric"] for r in rows} == {"hate_speech"}
    panel = {r["row_id"]: r for r in rows if r["judge"] is None}
    members = {(r["row_id"], r["judge"]): r for r in rows if r["judge"] is not None}
    assert len(panel) == N and len(members) == 3 * N
    for i in range(N):
        rid = f"r{i:02d}"
        truth = 1.0 if i < HATEFUL else 0.0
        assert members[(rid, "judge_a")]["score"] == truth
        assert members[(rid, "judge_c")]["score"] == 1.0
        assert members[(rid, "judge_a")]["judge_calls"] == 1
        cell = panel[rid]
        assert cell["judge_reply"] is None and cell["judge_calls"] is None
        if i < HATEFUL:
            assert (cell["score"], cell["status"], cell["reason"]) == (1.0, "ok", None)
        elif i < GARBLED:
            assert (cell["score"], cell["status"], cell["reason"]) == (0.0, "ok", SPLIT)
        else:
            assert members[(rid, "judge_b")]["status"] == "parse_failure"
            assert (cell["score"], cell["status"]) == (None, "not_applicable")
            assert cell["reason"] == (
                "judges tied 1-1: judge_a=0, judge_c=1; judge_b parse_failure, not counted; "
                "a majority needs an odd count"
            )
    details = json.loads(panel["r09"]["details"])
    assert details == {
        "combine": "majority",
        "scores": {"judge_a": 0.0, "judge_b": 0.0, "judge_c": 1.0},
        "statuses": {"judge_a": "ok", "judge_b": "ok", "judge_c": "ok"},
    }


def test_summary_means_come_from_panel_cells_and_judges_have_rows_of_their_own(majority):
    overall = {
        r["metric"]: r for r in _summary(majority["tmp"], "first") if r["slice_column"] is None
    }
    assert list(overall) == [
        "hate_speech",
        "hate_speech[judge_a]",
        "hate_speech[judge_b]",
        "hate_speech[judge_c]",
    ]
    panel = overall["hate_speech"]
    assert panel["judge"] is None and panel["n_total"] == N
    assert (panel["n_ok"], panel["n_not_applicable"]) == (19, 1)
    assert panel["mean"] == pytest.approx(8 / 19)
    assert panel["degenerate"] is None  # health is per judge
    assert [overall[f"hate_speech[{j}]"]["judge"] for j in JUDGES] == list(JUDGES)
    assert overall["hate_speech[judge_a]"]["mean"] == pytest.approx(8 / 20)
    assert overall["hate_speech[judge_b]"]["n_parse_failure"] == 1
    # the always-yes judge: a constant score on 20 of 20 ok cells
    yes = overall["hate_speech[judge_c]"]
    assert yes["degenerate"] is True
    assert (yes["modal_score"], yes["modal_share"]) == (1.0, 1.0)
    assert overall["hate_speech[judge_a]"]["degenerate"] is False


def test_agreement_alpha_and_pairwise_agreement(majority):
    panels = _manifest(majority["tmp"], "first")["summary"]["panels"]
    agreement = panels["hate_speech"]
    assert agreement["alpha_level"] == "nominal"
    assert agreement["alpha"] == pytest.approx(11 / 69)
    low, high = agreement["alpha_ci_low"], agreement["alpha_ci_high"]
    assert low < 11 / 69 < high
    pairs = {tuple(p["judges"]): p for p in agreement["pairwise"]}
    assert pairs[("judge_a", "judge_b")] == {
        "judges": ["judge_a", "judge_b"],
        "n": 19,
        "agreement": 1.0,
    }
    assert pairs[("judge_a", "judge_c")]["agreement"] == pytest.approx(0.4)
    assert pairs[("judge_b", "judge_c")]["agreement"] == pytest.approx(8 / 19)
    assert agreement["judge_means"]["judge_c"] == {"mean": 1.0, "n_ok": 20}
    assert agreement["judge_means"]["judge_b"]["mean"] == pytest.approx(8 / 19)


def test_tokens_are_counted_per_judge_and_the_cache_serves_each_judge(majority):
    first, again, reseed = majority["calls"]
    # a try per row per judge, and judge_b's parse retry of the garbled row
    assert first == {TRUTH_A: N, TRUTH_B: N + 1, ALWAYS_YES: N}
    assert again == first  # the rerun: every judgment from the cache
    # judge_c's sampling seed changed: only judge_c is asked again
    assert reseed == {TRUTH_A: N, TRUTH_B: N + 1, ALWAYS_YES: 2 * N}
    judge = _manifest(majority["tmp"], "first")["judge"]["metrics"]
    assert judge["hate_speech[judge_a]"]["judge_calls"] == N
    assert judge["hate_speech[judge_c]"]["judge_calls"] == N
    assert judge["hate_speech[judge_c]"]["prompt_tokens"] == 100 * N
    cached = _manifest(majority["tmp"], "reseed")["judge"]["metrics"]
    assert cached["hate_speech[judge_a]"]["judge_calls"] == 0
    assert cached["hate_speech[judge_c]"]["judge_calls"] == N


def test_unanimous_and_mean_combine(tmp_path, ray_local):
    with ScriptedPanelJudges() as judges:
        metrics = [_panel("hs_unanimous", "unanimous"), _panel("hs_mean", "mean")]
        config = _config(tmp_path, judges.base_url, metrics)
        assert main(["run", str(config), "--run-id", "u", "--run-date", "2024-06-01"]) == 0
    rows = [r for r in _scores(tmp_path, "u") if r["judge"] is None]
    unanimous = {r["row_id"]: r for r in rows if r["metric"] == "hs_unanimous"}
    mean = {r["row_id"]: r for r in rows if r["metric"] == "hs_mean"}
    assert [unanimous[f"r{i:02d}"]["score"] for i in range(N)] == [1.0] * 8 + [0.0] * 12
    assert unanimous["r19"]["reason"] == (
        "judges split 1-1: judge_a=0, judge_c=1; judge_b parse_failure, not counted"
    )
    assert mean["r03"]["score"] == 1.0
    assert mean["r10"]["score"] == pytest.approx(1 / 3)
    assert mean["r19"]["score"] == pytest.approx(0.5)
    overall = {r["metric"]: r for r in _summary(tmp_path, "u") if r["slice_column"] is None}
    assert overall["hs_unanimous"]["mean"] == pytest.approx(0.4)
    assert overall["hs_mean"]["mean"] == pytest.approx(73 / 120)
    assert overall["hs_mean"]["pass_rate"] is None  # a mean of 0/1 verdicts is a share
    manifest = _manifest(tmp_path, "u")
    assert manifest["summary"]["panels"]["hs_mean"]["alpha"] == pytest.approx(11 / 69)
    entries = {m["id"]: m for m in manifest["metrics"]}
    assert entries["hs_mean"]["combine"] == "mean" and entries["hs_mean"]["boolean"] is False


def test_compare_and_report_use_the_panel_cells(majority, tmp_path):
    out = str(majority["tmp"] / "out")
    result = tmp_path / "comparison.json"
    assert main(["compare", "--output", out, "first", "again", "--json", str(result)]) == 0
    comparison = json.loads(result.read_text())
    overall = [m for m in comparison["metrics"] if m.get("slice_column") is None]
    assert [(m["metric"], m["n_pairs"]) for m in overall] == [("hate_speech", 19)]
    html = tmp_path / "report.html"
    assert main(["report", "--output", out, "first", "--html", str(html)]) == 0
    text = html.read_text(encoding="utf-8")
    assert "Judge panels" in text and "0.159" in text
