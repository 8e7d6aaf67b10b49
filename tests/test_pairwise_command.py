"""``ragbatch pairwise`` end to end against scripted pairwise judges: a real
OpenAI-compatible HTTP server on loopback (tests/support/scripted_pairwise_judge.py)
through the real ``openai`` engine, the judge runner, the judgment cache and the
command line. The judges' rules are fixed, so the statistics have exact values:

- the scripted judge that always prefers the first position must come out with position
  consistency 0 and position share 1, and be flagged ``position_bound``;
- the scripted judge that prefers the longer answer must order the systems by answer
  length (in code points) with consistency 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import yaml

from ragbatch.cli.main import main
from support.scripted_pairwise_judge import SERVED_NAME, ScriptedPairwiseJudge

pytest.importorskip("openai", reason="the openai engine needs the openai package")

# Three systems; on every question `long` > `mid` > `short` in code points. The `mid`
# answers hold combining marks, emoji and CJK text, so that by UTF-8 bytes `mid` would
# be longer than `long` on the first question: the lengths must be counted in code
# points. `short` has a null answer on q4: that row is left out of the pairs.
MID_Q1 = "e\u0301\U0001f600東京"  # 5 code points, 13 UTF-8 bytes
ROWS = [
    ("q1 什么是RAG？", "long", "abcdefghij"),  # 10 code points, 10 bytes
    ("q1 什么是RAG？", "mid", MID_Q1),
    ("q1 什么是RAG？", "short", "ab"),
    ("q2 Who?", "long", "Paul Graham wrote it."),
    ("q2 Who?", "mid", "Paul 😀 Graham"),
    ("q2 Who?", "short", "PG"),
    ("q3 When?", "short", "1"),
    ("q3 When?", "mid", "in 2001"),
    ("q3 When?", "long", "in the year 2001"),
    ("q4 Where?", "long", "in Cambridge, Massachusetts"),
    ("q4 Where?", "mid", "Cambridge"),
    ("q4 Where?", "short", None),
]


def _input(tmp_path: Path, rows=ROWS) -> Path:
    path = tmp_path / "answers.parquet"
    pl.DataFrame(
        {
            "q": [r[0] for r in rows],
            "sys": [r[1] for r in rows],
            "text": [r[2] for r in rows],
        },
        schema={"q": pl.String, "sys": pl.String, "text": pl.String},
    ).write_parquet(path)
    return path


def _config(tmp_path: Path, base_url: str, **pairwise) -> Path:
    config = {
        "name": "scripted",
        "input": {
            "uri": str(_input(tmp_path)),
            "format": "parquet",
            "columns": {"question": "q", "answer": "text"},
        },
        "pairwise": {"system_column": "sys", "engine": "judge", **pairwise},
        "engines": {
            "judge": {
                "type": "openai",
                "base_url": base_url,
                "model": SERVED_NAME,
                "max_retries": 0,
            }
        },
        "output": {"uri": str(tmp_path / "out")},
        "bootstrap": {"resamples": 200},
    }
    path = tmp_path / "pairwise.yaml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    return path


def _run_dir(tmp_path: Path, run_id: str) -> Path:
    [path] = (tmp_path / "out" / "pairwise").glob(f"run_date=*/run_id={run_id}")
    return path


def test_a_judge_that_always_prefers_the_first_position_is_flagged(tmp_path, capsys):
    with ScriptedPairwiseJudge("first") as judge:
        assert main(["pairwise", str(_config(tmp_path, judge.base_url)), "--run-id", "first"]) == 0
        # 3 pairs on q1-q3, 1 on q4 (short's answer is null), each in both orders
        assert judge.chat_calls == 20
        out = capsys.readouterr()
        # the flag fails the command when asked to (exit 5, as for a degenerate judge
        # metric); the replies come from the cache
        config = _config(tmp_path, judge.base_url)
        assert main(["pairwise", str(config), "--run-id", "gate", "--fail-on-degenerate"]) == 5
        assert judge.chat_calls == 20
    assert "JUDGE FLAGGED position_bound" in out.out
    assert "ragbatch: warning: JUDGE FLAGGED position_bound" in out.err
    run = _run_dir(tmp_path, "first")
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    assert summary["flags"] == ["position_bound"]
    assert summary["position_consistency"]["value"] == 0.0
    assert summary["position_consistency"]["n"] == 10
    assert summary["position_bias"]["value"] == 1.0
    assert summary["position_bias"]["n"] == 20
    assert summary["counts"]["null_answers"] == 1
    assert summary["counts"]["pairs"] == 10
    assert summary["counts"]["failed"] == 0
    assert summary["judge_calls"] == 20 and summary["cache_hits"] == 0
    # every system wins exactly as often as it is shown first: all win rates 0.5
    ratings = pl.read_parquet(run / "ratings.parquet")
    assert ratings["win_rate"].to_list() == [0.5, 0.5, 0.5]
    assert "Judge flagged position_bound" in (run / "report.html").read_text(encoding="utf-8")


def test_a_judge_that_prefers_the_longer_answer_orders_systems_by_length(tmp_path, capsys):
    with ScriptedPairwiseJudge("longer") as judge:
        config = _config(tmp_path, judge.base_url)
        assert main(["pairwise", str(config), "--run-id", "longer"]) == 0
        assert judge.chat_calls == 20
        # a rerun with the same judge and prompts is answered by the judgment cache
        assert main(["pairwise", str(config), "--run-id", "again"]) == 0
        assert judge.chat_calls == 20
    capsys.readouterr()
    run = _run_dir(tmp_path, "longer")
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    assert summary["flags"] == []
    assert summary["position_consistency"]["value"] == 1.0
    assert summary["position_consistency"]["n"] == 10
    # the first position wins half of the decided verdicts: each pair once each way
    assert summary["position_bias"]["value"] == 0.5
    assert summary["length_bias"]["value"] == 1.0
    ratings = pl.read_parquet(run / "ratings.parquet")
    assert ratings["system"].to_list() == ["long", "mid", "short"]
    # long wins all its 14 verdicts (8 against mid on q1-q4, 6 against short on q1-q3);
    # mid wins its 6 against short and none of its 8 against long: 6 / 14
    assert ratings["win_rate"].to_list() == [1.0, pytest.approx(6 / 14), 0.0]
    assert ratings["n_verdicts"].to_list() == [14, 14, 12]
    verdicts = pl.read_parquet(run / "verdicts")
    assert verdicts.height == 20
    assert sorted(verdicts["order"].unique().to_list()) == [1, 2]
    q1 = verdicts.filter((pl.col("first") == "mid") & pl.col("question").str.starts_with("q1"))
    assert set(q1["first_chars"].to_list()) == {5}
    assert q1.filter(pl.col("second") == "long")["verdict"].to_list() == ["second"]
    assert verdicts["prompt_tokens"].to_list() == [50] * 20
    assert verdicts["reason"].to_list() == ["scripted rule longer"] * 20
    again = json.loads((_run_dir(tmp_path, "again") / "summary.json").read_text("utf-8"))
    assert again["judge_calls"] == 0 and again["cache_hits"] == 20
    assert again["position_consistency"] == summary["position_consistency"]


def test_unparseable_replies_are_null_verdicts_with_their_status_never_lost_pairs(tmp_path, capsys):
    with ScriptedPairwiseJudge("prose") as judge:
        assert main(["pairwise", str(_config(tmp_path, judge.base_url)), "--run-id", "p"]) == 0
        # each request asked once more after the unparseable reply (parse_retries: 1)
        assert judge.chat_calls == 40
    capsys.readouterr()
    run = _run_dir(tmp_path, "p")
    verdicts = pl.read_parquet(run / "verdicts")
    assert verdicts.height == 20
    assert verdicts["verdict"].null_count() == 20
    assert verdicts["status"].to_list() == ["parse_failure"] * 20
    assert verdicts["reason"].str.contains("not JSON").all()
    # the judge's replies are kept: both attempts of each request
    replies = [json.loads(r) for r in verdicts["judge_reply"].to_list()]
    assert replies == [["Answer A reads better to me."] * 2] * 20
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    assert summary["counts"]["failed"] == 20
    assert summary["statuses"] == {"parse_failure": 20}
    assert summary["position_consistency"] == {
        "value": None,
        "ci_low": None,
        "ci_high": None,
        "n": 0,
    }


def test_a_rubric_written_in_the_config_is_what_the_judge_is_asked(tmp_path, capsys):
    rubric = "Prefer the answer that names a place or a person."
    with ScriptedPairwiseJudge("longer") as judge:
        builtin = _config(tmp_path, judge.base_url)
        assert main(["pairwise", str(builtin), "--run-id", "builtin"]) == 0
        assert all("do not let the order" in m for m in judge.system_messages)
        judge.system_messages.clear()
        config = _config(tmp_path, judge.base_url, prompt={"rubric": rubric})
        assert main(["pairwise", str(config), "--run-id", "rubric"]) == 0
        # another prompt: the cached replies of the built-in one are not reused
        assert judge.chat_calls == 40
        assert len(judge.system_messages) == 20
        assert all(rubric in m and "do not let the order" not in m for m in judge.system_messages)
    capsys.readouterr()
    summary = json.loads((_run_dir(tmp_path, "rubric") / "summary.json").read_text("utf-8"))
    assert summary["prompt"] == "rubric"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"system_column": "nope"}, "pairwise.system_column: 'nope' is not a column"),
        ({"systems": ["long", "gone"]}, "pairwise.systems: ['gone'] are not systems"),
        ({"engine": "missing"}, "pairwise.engine: 'missing' is not defined under `engines`"),
        ({"colour": "red"}, "pairwise.colour"),
    ],
)
def test_a_bad_config_exits_2_before_any_judge_call(tmp_path, capsys, change, message):
    with ScriptedPairwiseJudge("first") as judge:
        assert main(["pairwise", str(_config(tmp_path, judge.base_url, **change))]) == 2
        assert judge.chat_calls == 0
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out" / "pairwise").exists()


def test_one_system_is_too_few(tmp_path, capsys):
    with ScriptedPairwiseJudge("first") as judge:
        config = _config(tmp_path, judge.base_url)
        _input(tmp_path, [r for r in ROWS if r[1] == "long"])
        assert main(["pairwise", str(config)]) == 2
        assert judge.chat_calls == 0
    assert "needs at least two systems; the input has 1: ['long']" in capsys.readouterr().err


@pytest.mark.slow
def test_committed_runs_as_the_systems(ares_nights, tmp_path, capsys):
    """Two committed runs of the ARES job (the shipped answers, and the night whose answers
    were replaced on every eighth row) compared by question, with the scripted judge that
    prefers the longer answer: identical answers tie in both orders, the others go to
    the longer one in both orders."""
    from support.nightly_runs import ALTERED_NIGHT, ORIGINAL

    with ScriptedPairwiseJudge("longer") as judge:
        config = {
            "runs": [
                {
                    "output": str(ares_nights.nightly),
                    "run_id": ares_nights.run_ids[night],
                    "system": name,
                }
                for night, name in ((ORIGINAL, "original"), (ALTERED_NIGHT, "altered"))
            ],
            "pairwise": {"engine": "judge", "max_questions": 24},
            "engines": {
                "judge": {"type": "openai", "base_url": judge.base_url, "model": SERVED_NAME}
            },
            "output": {"uri": str(tmp_path / "out")},
            "bootstrap": {"resamples": 100},
        }
        path = tmp_path / "pairwise.yaml"
        path.write_text(yaml.safe_dump(config))
        assert main(["pairwise", str(path), "--run-id", "runs"]) == 0
        calls = judge.chat_calls
    capsys.readouterr()
    run = _run_dir(tmp_path, "runs")
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    verdicts = pl.read_parquet(run / "verdicts")
    pairs = summary["counts"]["pairs"]
    assert summary["systems"] == ["altered", "original"]
    assert 0 < pairs <= 24 and verdicts.height == 2 * pairs
    # two identical answers make the same request in both orders: asked once, the
    # second order answered from the replies this run already has
    assert calls == summary["judge_calls"] < 2 * pairs
    assert summary["judge_calls"] + summary["cache_hits"] == 2 * pairs
    assert summary["position_consistency"]["value"] == 1.0
    same = verdicts.filter(pl.col("first_chars") == pl.col("second_chars"))
    assert set(same["verdict"].to_list()) <= {"tie"}
    longer = verdicts.filter(pl.col("first_chars") != pl.col("second_chars"))
    assert longer.height > 0
    won = pl.when(pl.col("first_chars") > pl.col("second_chars")).then(pl.lit("first"))
    assert (
        longer["verdict"].to_list()
        == longer.select(won.otherwise(pl.lit("second"))).to_series().to_list()
    )
