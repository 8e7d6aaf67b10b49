"""The ``rubric`` metric: scores of recorded replies on several rubrics (scale, choices,
probability from written-down token logprobs), the rubric's text in the cache key and
the calibration's prompt version, config text taken as data (braces, quotes, unicode,
the longest criteria), ``validate``'s errors and ``ragbatch metrics --config``.

The contract tests of tests/test_judge_metrics.py replay the metric's worked examples
and the recorded cases of tests/data/judge_replies/rubric.json; the rubric runs on the
real SmolLM2 judge in tests/test_judge_e2e.py with the other judge metrics.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml

from ragbatch.calibrate.agreement import prompt_version
from ragbatch.cli import main
from ragbatch.core.errors import ConfigError
from ragbatch.judge.batch import judge_frame
from ragbatch.judge.protocol import run_sync
from ragbatch.judge.cache import JudgmentCache
from ragbatch.judge.cache_upkeep import fold_journal, open_files
from ragbatch.judge.metric import JudgeExample, bind_instructions
from ragbatch.judge.recorded import RecordedReplies, run_example
from ragbatch.judge.run import JudgeRunner
from ragbatch.metrics._rubric_params import CRITERIA_MAX_CHARS
from ragbatch.metrics.rubric import Rubric

REPO = Path(__file__).resolve().parents[1]
ARES = REPO / "examples/data/ares/datasets_v2__LLM_Judge_Test_Set_Human_Annotations.tsv"

ROW = {
    "question": "When did Apollo 11 land?",
    "contexts": ["Apollo 11 landed on the Moon on 20 July 1969."],
    "answer": "On 20 July 1969.",
    "reference": "20 July 1969.",
}
SCALE = {"criteria": "The answer gives the date.", "scale": {"min": 1, "max": 5}}
CHOICES = {
    "criteria": "The answer is supported by the contexts.",
    "inputs": ["contexts", "answer"],
    "choices": ["supported", "unsupported"],
    "choice_scores": {"supported": 1, "unsupported": 0},
    "reasons": False,
}


def _cell(params: dict[str, Any], *replies: Any, row: dict[str, Any] = ROW) -> dict[str, Any]:
    cell, _, engine = run_example(Rubric, JudgeExample(row, tuple(replies), None, params=params))
    assert engine.unused == 0
    return cell


# scores worked out by hand -------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "reply", "score", "verdict"),
    [
        # (7 - 0) / (10 - 0)
        ({**SCALE, "scale": {"min": 0, "max": 10}}, '{"reason": "r", "score": 7}', 0.7, 7),
        # bare rating: (2 - 1) / (3 - 1)
        ({**SCALE, "scale": {"min": 1, "max": 3}, "reasons": False}, "2", 0.5, 2),
        # lowest and highest of the scale
        (SCALE, '{"reason": "r", "score": 1}', 0.0, 1),
        (SCALE, '{"reason": "r", "score": 5}', 1.0, 5),
        # a choice with a reason, scored by its mapping
        (
            {
                **CHOICES,
                "choices": ["yes", "partly", "no"],
                "choice_scores": {"yes": 1, "partly": 0.3, "no": 0},
                "reasons": True,
            },
            '{"reason": "r", "verdict": "partly"}',
            0.3,
            "partly",
        ),
        (CHOICES, "unsupported", 0.0, "unsupported"),
    ],
)
def test_recorded_replies_give_the_normalized_score(params, reply, score, verdict):
    cell = _cell(params, reply)
    assert cell["status"] == "ok" and cell["score"] == pytest.approx(score)
    assert json.loads(cell["details"])["verdict"] == verdict


def _tokens(*pieces: tuple[str, dict[str, float]]) -> list[Any]:
    """Token logprobs as the recorded engine takes them: each piece is the generated
    token and the probabilities of its top alternatives (the token among them)."""
    return [
        [token, math.log(top[token]), [[t, math.log(p)] for t, p in top.items()]]
        for token, top in pieces
    ]


def test_probability_of_a_bare_rating_is_its_expected_normalized_score():
    # valid alternatives 4: .5, 3: .3, 5: .1 (the space is no rating): normalized over .9,
    # worth (4-1)/4, (3-1)/4, (5-1)/4 -> (.5 * .75 + .3 * .5 + .1 * 1) / .9
    reply = {"text": "4", "logprobs": _tokens(("4", {"4": 0.5, "3": 0.3, "5": 0.1, " ": 0.05}))}
    cell = _cell({**SCALE, "reasons": False, "score": "probability"}, reply)
    assert cell["score"] == pytest.approx((0.5 * 0.75 + 0.3 * 0.5 + 0.1 * 1.0) / 0.9)
    details = json.loads(cell["details"])
    assert details["verdict_score"] == 0.75 and details["p_verdicts"] == [pytest.approx(0.5 / 0.9)]


def test_probability_of_a_rating_after_its_reason():
    # the rating's token is " 2" after `"score":`; alternatives " 2" .6, " 1" .2, " 3" .2
    # -> .6 * (2-1)/4 + .2 * 0 + .2 * (3-1)/4
    text = '{"reason": "ok", "score": 2}'
    pieces = [(t, {t: 1.0}) for t in ('{"', "reason", '":', ' "', "ok", '",', ' "', "score", '":')]
    pieces += [(" 2", {" 2": 0.6, " 1": 0.2, " 3": 0.2}), ("}", {"}": 1.0})]
    cell = _cell({**SCALE, "score": "probability"}, {"text": text, "logprobs": _tokens(*pieces)})
    assert cell["status"] == "ok" and cell["score"] == pytest.approx(0.6 * 0.25 + 0.2 * 0.5)


def test_probability_of_a_choice_is_the_expected_mapped_score():
    top = {"unsupported": 0.7, "supported": 0.2, "maybe": 0.1}
    reply = {"text": "unsupported", "logprobs": _tokens(("unsupported", top))}
    cell = _cell({**CHOICES, "score": "probability"}, reply)
    assert cell["score"] == pytest.approx(0.2 / 0.9)  # p(supported) x 1 + p(unsupported) x 0


def test_probability_without_logprobs_is_a_judge_error():
    cell = _cell({**SCALE, "reasons": False, "score": "probability"}, "4")
    assert cell["status"] == "judge_error" and cell["score"] is None
    assert "needs the verdicts' token logprobs" in cell["reason"]


# the rubric is the prompt's version ------------------------------------------------------

CHANGES = {
    "criteria": {"criteria": "The answer gives the day."},
    "inputs": {"inputs": ["question", "answer"]},
    "scale": {"scale": {"min": 1, "max": 4}},
    "examples": {
        "examples": [
            {
                "inputs": {"question": "q", "contexts": ["c"], "answer": "a"},
                "score": 2,
                "reason": "r",
            }
        ]
    },
    "reasons": {"reasons": False},
    "choices": {**CHOICES, "criteria": SCALE["criteria"], "scale": None},
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_every_part_of_the_rubric_enters_the_cache_key_and_the_prompt_version(change):
    base = Rubric.from_params(SCALE)
    changed = Rubric.from_params({**SCALE, **CHANGES[change]})
    assert changed.cache_identity() != base.cache_identity()
    assert prompt_version(changed) != prompt_version(base)


def test_the_id_the_score_mode_and_the_choice_scores_keep_the_judgments():
    base = Rubric.from_params(SCALE)
    renamed = Rubric.from_params(SCALE, metric_id="dates")
    weighted = Rubric.from_params({**SCALE, "score": "probability"})
    assert renamed.cache_identity() == base.cache_identity() == weighted.cache_identity()
    assert prompt_version(renamed) == prompt_version(base)
    # scoring another way keeps the replies but needs its own calibration
    assert prompt_version(weighted) != prompt_version(base)
    strict = Rubric.from_params({**CHOICES, "choice_scores": {"supported": 0.9, "unsupported": 0}})
    choices = Rubric.from_params(CHOICES)
    assert strict.cache_identity() == choices.cache_identity()
    assert prompt_version(strict) != prompt_version(choices)


def test_changed_criteria_are_judged_again_not_served_from_the_cache(tmp_path):
    uri = str(tmp_path / "cache")
    frame = pl.DataFrame([{"row_id": "r0", **ROW}])

    def judge(params: dict[str, Any], replies: list[str]):
        engine = RecordedReplies(replies)
        cache = JudgmentCache(uri, {})
        cells, records = run_sync(
            judge_frame(JudgeRunner(engine, [Rubric.from_params(params)], cache=cache), frame)
        )["rubric"]
        cache.flush()
        fold_journal(open_files(uri, {}), f"run-{len(replies)}-{params['criteria']}")
        return cells[0], records[0], engine

    first, _, _ = judge(SCALE, ['{"reason": "r", "score": 5}'])
    again, record, engine = judge(SCALE, [])
    assert engine.requests == [] and record["cache_hits"] == 1 and again == first
    other, record, engine = judge(
        {**SCALE, "criteria": "The answer gives the year."}, ['{"reason": "r", "score": 2}']
    )
    assert len(engine.requests) == 1 and record["cache_hits"] == 0 and other["score"] == 0.25


# config text is data ------------------------------------------------------------------------

HOSTILE = (
    'Use {reference} and {0} and {{x}} and {__class__.__mro__} and %s and $name; "quoted" '
    "and 'single' and a back\\slash; ünïcödé, 東京, 🗼, right-to-left \u05e9\u05dc\u05d5\u05dd."
)


@pytest.mark.parametrize("layout", ["row_first", "instructions_first"])
def test_braces_quotes_and_unicode_reach_the_judge_as_written(layout):
    params = {
        **SCALE,
        "criteria": HOSTILE,
        "inputs": ["question", "answer", "reference"],
        "prompt_layout": layout,
        "examples": [
            {
                "inputs": {"question": "{question}?", "answer": 'a "{b}"', "reference": "{}"},
                "score": 3,
                "reason": "{reason} \"x\"",
            }
        ],
    }
    row = {**ROW, "answer": "It was {answer} on 1969-07-20 {0}.", "reference": "{reference}"}
    cell, _, engine = run_example(
        Rubric, JudgeExample(row, ('{"reason": "ok", "score": 4}',), 0.75, params=params)
    )
    assert cell["status"] == "ok" and cell["score"] == 0.75
    text = "\n".join(m.content for m in engine.requests[0].messages)
    assert HOSTILE in text
    assert 'Answer: a "{b}"' in text and 'Reply: {"reason": "{reason} \\"x\\"", "score": 3}' in text
    assert "It was {answer} on 1969-07-20 {0}." in text and "{reference}" in text


def test_the_longest_criteria_is_accepted_and_one_more_character_is_not():
    longest = ("Judge ü {x} " * CRITERIA_MAX_CHARS)[:CRITERIA_MAX_CHARS]
    metric = Rubric.from_params({**SCALE, "criteria": longest})
    assert longest.strip() in metric.step_prompts()[0].instructions
    with pytest.raises(ConfigError, match=r"params\.criteria: String should have at most 4000"):
        Rubric.from_params({**SCALE, "criteria": longest + "x"})
    with pytest.raises(
        ConfigError, match=r"params\.criteria: criteria holds control characters \(U\+0007\)"
    ):
        Rubric.from_params({**SCALE, "criteria": "ring \a the bell"})


def test_two_rubrics_of_a_stage_each_have_their_instructions():
    a = Rubric.from_params({**SCALE, "prompt_layout": "instructions_first"}, metric_id="dates")
    b = Rubric.from_params({**CHOICES, "prompt_layout": "instructions_first"}, metric_id="support")
    block = bind_instructions([a, b])
    assert block is not None and [h for h, _ in block.sets] == ["rubric: dates", "rubric: support"]
    engine = RecordedReplies(['{"reason": "r", "score": 3}', "supported"])
    frame = pl.DataFrame([{"row_id": "r0", **ROW}])
    cells = run_sync(judge_frame(JudgeRunner(engine, [a, b]), frame))
    assert cells["dates"][0][0]["score"] == 0.5 and cells["support"][0][0]["score"] == 1.0
    systems = {r.messages[0].content for r in engine.requests}
    assert len(systems) == 1  # one instruction block for the stage, computed once
    asks = [r.messages[1].content.split("## Task\n", 1)[1] for r in engine.requests]
    assert asks == [
        'Follow the instructions "rubric: dates".',
        'Follow the instructions "rubric: support".',
    ]


# validate and metrics --config ---------------------------------------------------------------


def _config(tmp_path: Path, metrics: list[dict[str, Any]]) -> Path:
    config = {
        "input": {
            "uri": str(ARES),
            "format": "tsv",
            "columns": {"question": "Question", "contexts": "Document", "answer": "Answer"},
            "contexts_format": "text",
        },
        "output": {"uri": str(tmp_path / "out")},
        "engines": {"judge": {"kind": "vllm", "model": str(tmp_path)}},
        "metrics": metrics,
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    return path


def _rubric(mid: str, **params: Any) -> dict[str, Any]:
    return {"name": "rubric", "id": mid, "engine": "judge", "params": {**SCALE, **params}}


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        (
            {"scale": {"min": 3, "max": 2}},
            "metrics[1].params.scale: min 3, max 2: need 0 <= min < max <= 10",
        ),
        ({"scale": None}, "metrics[1].params.scale: neither of `scale` and `choices` given"),
        (
            {"scale": {"min": 1, "max": 5.5}},
            "metrics[1].params.scale.max: Input should be a valid integer",
        ),
        ({"inputs": ["answer", "row_id"]}, "metrics[1].params.inputs: 'row_id' cannot be judged"),
        (
            {"scale": None, "choices": ["pass", "fail"], "choice_scores": {"pass": 1}},
            "metrics[1].params.choice_scores: no score for `fail`; add {fail: <score in [0, 1]>}",
        ),
        (
            {"scale": None, "choices": ["pass", "fail"], "choice_scores": {"pass": 1, "fail": 2}},
            "metrics[1].params.choice_scores.fail: Input should be less than or equal to 1",
        ),
        ({"scale": None, "choices": []}, "metrics[1].params.choices: 0 choice(s); give 2 to 10"),
        (
            {"examples": [{"inputs": {"answer": "a"}, "score": 9, "reason": "r"}]},
            "metrics[1].params.examples[0].score: 9 is not on the scale; give an integer from 1 to 5",
        ),
        (
            {"examples": [{"inputs": {"answer": "a"}, "score": 2, "reason": "r"}]},
            "metrics[1].params.examples[0].inputs: lacks question, contexts",
        ),
        ({"criteria": " \n "}, "metrics[1].params.criteria: criteria is blank"),
        (
            {"inputs": ["answer", "reference"]},
            "bad reads `reference` but input.columns maps nothing to reference",
        ),
    ],
)
def test_validate_names_the_field_and_the_fix(tmp_path, capsys, params, fragment):
    path = _config(tmp_path, [_rubric("good"), _rubric("bad", **params)])
    code = main(["validate", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err, err


def test_validate_reports_every_problem_of_the_config_at_once(tmp_path, capsys):
    """An unmapped input and a bad scale, in two rubrics: one run of validate names
    both, and a broken scale is not followed by a check of the examples against it."""
    path = _config(
        tmp_path,
        [
            _rubric("reads_reference", inputs=["answer", "reference"]),
            _rubric(
                "flat",
                scale={"min": 5, "max": 5},
                examples=[
                    {
                        "inputs": {"question": "q", "contexts": ["c"], "answer": "a"},
                        "score": 3,
                        "reason": "r",
                    }
                ],
            ),
        ],
    )
    code = main(["validate", str(path)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "metrics[1].params.scale: min 5, max 5: need 0 <= min < max <= 10" in err
    assert (
        "metrics[0]: reads_reference reads `reference` but input.columns maps nothing to "
        "reference; add `reference: <input column>` under input.columns, or remove it from "
        "params.inputs"
    ) in err
    assert "examples[0].score" not in err


def test_metrics_config_prints_each_rubric_prompt(tmp_path, capsys):
    path = _config(
        tmp_path,
        [
            _rubric("dates"),
            {"name": "rubric", "id": "support", "params": CHOICES, "engine": "judge"},
        ],
    )
    assert main(["metrics", "--config", str(path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(m["id"], m["inputs"]) for m in shown] == [
        ("dates", ["question", "contexts", "answer"]),
        ("support", ["contexts", "answer"]),
    ]
    [step] = shown[0]["prompts"]
    assert step["name"] == "rubric: dates" and SCALE["criteria"] in step["instructions"]
    assert main(["metrics", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert (
        'instructions "rubric: support":' in out
        and "Reply with one of supported, unsupported" in out
    )
    path = _config(tmp_path, [_rubric("bad", scale={"min": 2, "max": 2})])
    assert main(["metrics", "--config", str(path)]) == 2
    assert "metrics[0].params.scale: min 2, max 2" in capsys.readouterr().err


def test_shipped_rubric_configs_define_sound_rubrics(monkeypatch):
    from ragbatch.calibrate.config import load_calibration
    from ragbatch.cli.metrics import configured_metrics

    monkeypatch.chdir(REPO)
    shown = configured_metrics("jobs/rubric_ares.yaml")
    assert [m["id"] for m in shown] == ["grounded_in_docs", "answers_the_question"]
    cal = load_calibration(REPO / "jobs" / "calibrate_rubric.yaml")
    built = [Rubric.from_params(m.params, metric_id=m.metric_id) for m in cal.metrics]
    assert [m.probability_score for m in built] == [True, False]
