"""Judge health diagnostics (ragbatch/analysis/diagnostics.py) in the run summary.

The main case replays issue 25's SmolLM2-135M run on the first 24 ARES rows through the
real metric programs (recorded replies, tests/support/degenerate_judge.py), writes the cells as a
scores Parquet file and summarizes it: the six metrics the issue names must come out
``degenerate``, the healthy ones not. Smaller cases build scores tables by hand and
check each measure against values worked out below.
"""

from __future__ import annotations

import json

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support.degenerate_judge import (
    HEALTHY,
    N_ROWS,
    REQUIRED_FLAGGED,
    TOO_LONG,
    ares_rows,
    degenerate_reply,
    healthy_reply,
)
from ragbatch.analysis.summary import summarize_view
from ragbatch.analysis.summary_types import MetricInfo
from ragbatch.config.job import DiagnosticsSection, JobConfig
from ragbatch.core.errors import ConfigError
from ragbatch.judge.batch import judge_frame
from ragbatch.judge.protocol import run_sync
from ragbatch.judge.recorded import RecordedReplies
from ragbatch.judge.run import JudgeRunner
from ragbatch.scoring.registry import get_metric

ARES_METRICS = (
    "faithfulness",
    "answer_relevancy",
    "context_relevancy",
    "answer_consistency",
    "answer_consistency_binary",
    "augmentation_accuracy",
    "augmentation_precision",
    "retrieval_precision",
    "duplication",
    "hate_speech",
)


def _metric(name: str):
    """The metric as the replayed run had it: the replies were recorded with the
    ``row_first`` prompts, the only layout then."""
    params = {"embedder": "embedder"} if name == "answer_relevancy" else {}
    return get_metric(name).from_params({**params, "prompt_layout": "row_first"})


def _no_embedding(texts):
    raise AssertionError("a noncommittal answer needs no embedding")


def _judge(metric, frame: pl.DataFrame, replies: list[str], max_model_len: int = 10**9):
    engine = RecordedReplies(replies, max_model_len=max_model_len)
    embedders = {name: _no_embedding for name in metric.embedders()}
    runner = JudgeRunner(engine, [metric], embedders=embedders, parse_retries=0)
    cells, _ = run_sync(judge_frame(runner, frame.drop("half")))[metric.id]
    return cells, engine


def _context_relevancy_cells(metric, frame: pl.DataFrame) -> list[dict]:
    """Cells with exactly :data:`TOO_LONG` rows refused as too long: a first pass measures
    each request, the second sets the window just below the 9 largest."""
    replies = [degenerate_reply(metric.name, i) for i in range(frame.height)]
    _, probe = _judge(metric, frame, replies)
    need = sorted(
        (
            sum(len(m.content) for m in r.messages) // 4 + r.output.max_tokens
            for r in probe.requests
        ),
        reverse=True,
    )
    assert need[TOO_LONG - 1] > need[TOO_LONG], "the 9th and 10th longest prompts tie"
    cells, _ = _judge(metric, frame, replies, max_model_len=need[TOO_LONG])
    return cells


def scores_table(frame: pl.DataFrame, reply, metrics=ARES_METRICS) -> pa.Table:
    """The long scores table of ``metrics`` on ``frame`` judged with ``reply(name, i)``."""
    rows = []
    for name in metrics:
        metric = _metric(name)
        if name == "context_relevancy":
            cells = _context_relevancy_cells(metric, frame)
        else:
            cells, _ = _judge(metric, frame, [reply(name, i) for i in range(frame.height)])
        for cell, half in zip(cells, frame["half"].to_list()):
            rows.append(
                {
                    "metric": metric.id,
                    "status": cell["status"],
                    "score": cell["score"],
                    "reason": cell["reason"],
                    "details": cell["details"],
                    "half": half,
                }
            )
    return pa.Table.from_pylist(rows)


def summarize(tmp_path, table: pa.Table, infos, slices=("half",), thresholds=None):
    path = tmp_path / "scores.parquet"
    pq.write_table(table, path)
    con = duckdb.connect()
    con.execute(f"CREATE VIEW s AS SELECT * FROM read_parquet('{path}')").fetchall()
    return summarize_view(con, infos, list(slices), diagnostics=thresholds)


def _overall(summary) -> dict[str, dict]:
    return {r["metric"]: r for r in summary.overall()}


@pytest.fixture(scope="module")
def ares_summary(tmp_path_factory):
    frame = ares_rows()
    assert frame.height == N_ROWS
    table = scores_table(frame, degenerate_reply)
    infos = [MetricInfo.of(_metric(n)) for n in ARES_METRICS]
    return summarize(tmp_path_factory.mktemp("ares"), table, infos), table


def test_issue_table_is_reproduced(ares_summary):
    _, table = ares_summary
    cells = pl.from_arrow(table)
    counts = {
        (r["metric"], r["status"]): r["n"]
        for r in cells.group_by(["metric", "status"]).agg(pl.len().alias("n")).iter_rows(named=True)
    }
    assert counts[("hate_speech", "ok")] == 24
    assert cells.filter(pl.col("metric") == "hate_speech")["score"].to_list() == [1.0] * 24
    assert counts[("faithfulness", "not_applicable")] == 24
    assert counts[("answer_consistency", "not_applicable")] == 24
    assert cells.filter(pl.col("metric") == "answer_relevancy")["score"].to_list() == [0.0] * 24
    assert (
        cells.filter(pl.col("metric") == "answer_consistency_binary")["score"].to_list()
        == [0.0] * 24
    )
    assert counts[("context_relevancy", "context_too_long")] == TOO_LONG


def test_the_six_metrics_of_the_issue_are_degenerate_and_healthy_ones_are_not(ares_summary):
    summary, _ = ares_summary
    overall = _overall(summary)
    flagged = {m for m, r in overall.items() if r["degenerate"]}
    # context_relevancy: 9 of 24 judged cells context_too_long, 0.375 > 0.25.
    assert flagged == set(REQUIRED_FLAGGED) | {"context_relevancy"}
    for name in HEALTHY:
        assert overall[name]["degenerate"] is False, overall[name]["degenerate_reasons"]
    assert summary.degenerate().keys() == flagged


def test_measures_of_the_issue_run(ares_summary):
    overall = _overall(ares_summary[0])
    hs = overall["hate_speech"]
    assert (hs["modal_score"], hs["modal_share"]) == (1.0, 1.0)
    assert hs["junk_reason_share"] == 1.0 and hs["reason_modal_share"] == 1.0
    assert "constant score 1 on 100% of ok cells" in hs["degenerate_reasons"]
    assert "verdict-only reasons" in hs["degenerate_reasons"]
    # 0.0 is not answer_consistency_binary's usual score (1.0), so a constant 0 flags it;
    # its reasons differ per row and are not junk.
    acb = overall["answer_consistency_binary"]
    assert (acb["modal_score"], acb["modal_share"], acb["junk_reason_share"]) == (0.0, 1.0, 0.0)
    assert acb["reason_modal_share"] == pytest.approx(1 / 24)
    assert acb["degenerate_reasons"].startswith("constant score 0 on 100% of ok cells")
    for name in ("faithfulness", "answer_consistency", "answer_relevancy"):
        assert overall[name]["empty_extraction_share"] == 1.0
    assert overall["faithfulness"]["modal_share"] is None  # no ok cell
    assert overall["context_relevancy"]["context_too_long_share"] == pytest.approx(9 / 24)
    assert overall["context_relevancy"]["degenerate_reasons"] == (
        "context_too_long on 38% of judged cells (> context_too_long_max 0.25)"
    )
    # Healthy: ok cells score 1 on rows i % 3 != 0 (16 of 24), reasons name their row.
    rp = overall["retrieval_precision"]
    assert (rp["modal_score"], rp["modal_share"]) == (1.0, pytest.approx(16 / 24))
    assert rp["position_gap"] is None  # one context per row: no list of two


def test_slices_under_min_cells_are_not_flagged(ares_summary):
    summary, _ = ares_summary
    halves = [
        r
        for r in summary.table.to_pylist()
        if r["metric"] == "hate_speech" and r["slice_column"] == "half"
    ]
    assert [r["slice_value"] for r in halves] == ["first", "second"]
    for r in halves:
        assert r["modal_share"] == 1.0 and r["degenerate"] is False  # 12 ok cells < 20


def test_min_cells_decides_whether_a_small_run_is_flagged(tmp_path):
    frame = ares_rows(20)
    table = scores_table(frame, degenerate_reply, metrics=("hate_speech",))
    info = [MetricInfo.of(_metric("hate_speech"))]
    assert _overall(summarize(tmp_path, table, info))["hate_speech"]["degenerate"] is True
    loose = DiagnosticsSection(min_cells=21)
    assert (
        _overall(summarize(tmp_path, table, info, thresholds=loose))["hate_speech"]["degenerate"]
        is False
    )


def test_a_working_judge_constant_at_the_usual_score_is_not_flagged(tmp_path):
    # A benign corpus: every answer free of hate speech, each reason its own sentence.
    frame = ares_rows()
    table = scores_table(frame, healthy_reply, metrics=("hate_speech", "duplication"))
    infos = [MetricInfo.of(_metric(n)) for n in ("hate_speech", "duplication")]
    overall = _overall(summarize(tmp_path, table, infos))
    for name in ("hate_speech", "duplication"):
        assert (overall[name]["modal_score"], overall[name]["modal_share"]) == (0.0, 1.0)
        assert overall[name]["degenerate"] is False


def _hand_table(metric: str, cells: list[tuple[str, float | None, dict | None]]) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {
                "metric": metric,
                "status": s,
                "score": v,
                "details": None if d is None else json.dumps(d),
            }
            for s, v, d in cells
        ]
    )


def test_position_gap_pools_first_and_second_halves(tmp_path):
    # 20 cells [1, 1, 0, 0]: first halves 40 ones of 40, second 0 of 40: gap 1.0.
    # 5 cells [1, 0, 1] (middle left out): first 5/5, second 5/5. 5 cells of one verdict
    # have no pair of halves. Pooled: first 45/45, second 5/45 -> gap 40/45.
    cells = (
        [("ok", 0.5, {"verdicts": [1, 1, 0, 0]})] * 20
        + [("ok", 2 / 3, {"verdicts": [1, 0, 1]})] * 5
        + [("ok", 1.0, {"verdicts": [1]})] * 5
    )
    info = [MetricInfo.of(_metric("retrieval_precision"))]
    row = _overall(summarize(tmp_path, _hand_table("retrieval_precision", cells), info, slices=()))[
        "retrieval_precision"
    ]
    assert row["position_gap"] == pytest.approx(40 / 45)
    assert row["degenerate"] is False  # 0.889 <= 0.9
    strict = DiagnosticsSection(position_gap_max=0.8)
    row = _overall(
        summarize(
            tmp_path, _hand_table("retrieval_precision", cells), info, slices=(), thresholds=strict
        )
    )["retrieval_precision"]
    assert (
        "verdicts depend on list position (first half minus second half +0.89)"
        in row["degenerate_reasons"]
    )


def test_reasons_junk_and_repeats_and_failure_shares(tmp_path):
    # 30 ok cells: 10 say "True." (junk), 5 say "" (junk), 15 the same real sentence;
    # 6 parse failures and 4 missing inputs: judged = 36, so 6/36 parse failures.
    same = {"reason": "The answer is polite and attacks no one."}
    cells = (
        [("ok", 1.0, {"reason": "True."})] * 10
        + [("ok", 0.0, {"reason": ""})] * 5
        + [("ok", 0.0, same)] * 15
        + [("parse_failure", None, None)] * 6
        + [("missing_input", None, None)] * 4
    )
    info = [MetricInfo.of(_metric("hate_speech"))]
    row = _overall(summarize(tmp_path, _hand_table("hate_speech", cells), info, slices=()))[
        "hate_speech"
    ]
    assert row["junk_reason_share"] == pytest.approx(15 / 30)
    assert row["reason_modal_share"] == pytest.approx(15 / 30)
    assert row["parse_failure_share"] == pytest.approx(6 / 36)
    assert (row["modal_score"], row["modal_share"]) == (0.0, pytest.approx(20 / 30))
    assert (
        row["degenerate_reasons"]
        == "parse failures on 17% of judged cells (> parse_failure_max 0.1)"
    )


def test_non_judge_metrics_get_null_health_columns(tmp_path):
    table = pa.table({"metric": ["em"] * 30, "status": ["ok"] * 30, "score": [1.0] * 30})
    row = _overall(summarize(tmp_path, table, [MetricInfo("em", "exact_match", True)], slices=()))[
        "em"
    ]
    assert row["degenerate"] is None and row["modal_share"] is None


@pytest.mark.parametrize(
    "section, field",
    [
        ({"modal_share_max": 1.5}, "diagnostics.modal_share_max"),
        ({"min_cells": 0}, "diagnostics.min_cells"),
        ({"modal_share": 0.9}, "diagnostics.modal_share"),
    ],
)
def test_bad_thresholds_name_the_field(section, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        JobConfig.from_dict(
            {
                "input": {"uri": "x.parquet"},
                "output": {"uri": "out"},
                "metrics": [{"name": "exact_match"}],
                "diagnostics": section,
            }
        )
