"""Verdict probabilities from recorded token logprobs (:mod:`ragbatch.judge.confidence`).

The judge replies and their token logprobs are written down by hand (the recorded-replies
engine, :class:`~ragbatch.judge.recorded.RecordedReplies`), so every probability, the
per-cell ``confidence`` and the probability-weighted score (``score: probability``) are
worked out here from the numbers in the recording.
"""

from __future__ import annotations

import json
import math

import polars as pl
import pytest

from ragbatch.judge.batch import judge_frame
from ragbatch.judge.cache import JudgmentCache
from ragbatch.judge.cache_upkeep import fold_journal, open_files
from ragbatch.judge.confidence import NoConfidence, locate, verdict_probabilities
from ragbatch.judge.metric import JudgeExample
from ragbatch.judge.protocol import Completion, TokenLogprob, VerdictSlots, run_sync
from ragbatch.judge.recorded import RecordedReplies, run_example
from ragbatch.judge.run import JudgeRunner
from ragbatch.metrics.answer_similarity import AnswerSimilarity
from ragbatch.metrics.faithfulness import Faithfulness
from ragbatch.metrics.hate_speech import HateSpeech

ln = math.log
ROW = {
    "question": "Who wrote Hamlet?",
    "contexts": ["Hamlet is a play by Shakespeare."],
    "answer": "Shakespeare wrote Hamlet. It was written in 1600.",
    "reference": "William Shakespeare.",
}
STATEMENTS = '{"statements":["Shakespeare wrote Hamlet.","It was written in 1600."]}'
#: Bare verdicts 1 then 0: p(1) = .6/(.6+.3) = 2/3 at the first, .2/(.8+.2) = 0.2 at the
#: second; the whitespace alternative " " continues with no verdict and is left out.
BARE = {
    "text": '{"verdicts":[1,0]}',
    "logprobs": [
        ['{"', ln(0.99), []],
        ["verd", ln(0.9), []],
        ["icts", ln(0.9), []],
        ['":[', ln(0.9), []],
        ["1", ln(0.6), [["1", ln(0.6)], ["0", ln(0.3)], [" ", ln(0.05)]]],
        [",", ln(0.99), []],
        ["0", ln(0.8), [["0", ln(0.8)], ["1", ln(0.2)]]],
        ["]}", ln(0.99), []],
    ],
}
#: A verdict inside a token that starts with the key's colon (prefix '":'): the
#: alternatives '":true' and '":t' count for true, '":false' for false, and '":' (no
#: verdict text yet) for neither: p(true) = (.5 + .1) / (.5 + .1 + .3) = 2/3.
HATE = {
    "text": '{"reason":"It insults a group.","verdict":true}',
    "logprobs": [
        ['{"reason":"', ln(0.9), []],
        ["It insults a group.", ln(0.5), []],
        ['","verdict', ln(0.9), []],
        [
            '":true',
            ln(0.5),
            [['":true', ln(0.5)], ['":false', ln(0.3)], ['":t', ln(0.1)], ['":', ln(0.05)]],
        ],
        ["}", ln(0.99), []],
    ],
}
#: A rating 4 with p(3), p(4), p(5) = .3/.9, .5/.9, .1/.9: expected rating 3.4/.9.
RATING = {
    "text": "4",
    "logprobs": [["4", ln(0.5), [["4", ln(0.5)], ["3", ln(0.3)], ["5", ln(0.1)], [" ", ln(0.05)]]]],
}


def _run(cls, replies, **params):
    return run_example(
        cls, JudgeExample(inputs=ROW, replies=tuple(replies), score=None, params=params)
    )


def test_bare_verdicts_probability_score_by_hand():
    cell, record, engine = _run(
        Faithfulness, [STATEMENTS, BARE], reasons=False, score="probability"
    )
    assert engine.unused == 0
    assert engine.requests[0].output.logprobs == 0  # the statements step holds no verdict
    assert engine.requests[1].output.logprobs == 8
    assert cell["status"] == "ok"
    assert cell["score"] == pytest.approx((2 / 3 + 0.2) / 2)
    assert record["confidence"] == pytest.approx((2 / 3 + 0.8) / 2)
    details = json.loads(cell["details"])
    assert details["verdicts"] == [1, 0]
    assert details["verdict_score"] == 0.5
    assert details["p_verdicts"] == pytest.approx([2 / 3, 0.8])


def test_hard_verdicts_keep_their_score_and_gain_a_confidence():
    cell, record, _ = _run(Faithfulness, [STATEMENTS, BARE], reasons=False)
    assert cell["score"] == 0.5
    assert record["confidence"] == pytest.approx((2 / 3 + 0.8) / 2)


def test_verdict_behind_a_prefix_in_its_token():
    cell, record, _ = _run(HateSpeech, [HATE], score="probability")
    assert cell["score"] == pytest.approx(2 / 3)
    assert record["confidence"] == pytest.approx(2 / 3)


def test_expected_rating_of_a_choice():
    cell, record, _ = _run(AnswerSimilarity, [RATING], score="probability")
    assert cell["score"] == pytest.approx((3 * 0.3 + 4 * 0.5 + 5 * 0.1) / 0.9)
    assert record["confidence"] == pytest.approx(0.5 / 0.9)


def test_no_logprobs_give_a_null_confidence_with_a_reason():
    cell, record, _ = _run(HateSpeech, [HATE["text"]])
    assert (cell["status"], cell["score"], record["confidence"]) == ("ok", 1.0, None)
    assert '"confidence_note": "the engine returned no token logprobs"' in cell["details"]


def test_probability_score_without_logprobs_is_a_judge_error_not_a_guess():
    cell, record, _ = _run(HateSpeech, [HATE["text"]], score="probability")
    assert (cell["status"], cell["score"], record["confidence"]) == ("judge_error", None, None)
    assert "score: probability needs the verdicts' token logprobs" in cell["reason"]


def test_probabilities_lie_in_the_unit_interval():
    slots = VerdictSlots((("0", 0.0), ("1", 1.0)), key="verdicts", items=True)
    completion = Completion(
        "ok", text=BARE["text"], logprobs=tuple(TokenLogprob.from_list(t) for t in BARE["logprobs"])
    )
    for v in verdict_probabilities(completion, slots):
        assert all(0.0 <= p <= 1.0 for p in v.p.values())
        assert math.fsum(v.p.values()) == pytest.approx(1.0)
        assert 0.0 < v.generated <= 1.0 and 0.0 <= v.expected <= 1.0


def test_tokens_that_do_not_spell_the_reply_give_no_probabilities():
    slots = VerdictSlots((("0", 0.0), ("1", 1.0)), key="verdicts", items=True)
    completion = Completion(
        "ok",
        text='{"verdicts":[0,0]}',
        logprobs=tuple(TokenLogprob.from_list(t) for t in BARE["logprobs"]),
    )
    with pytest.raises(NoConfidence, match="do not spell"):
        verdict_probabilities(completion, slots)


def test_choice_wrapped_by_a_response_format_server_is_located():
    slots = VerdictSlots(tuple((r, float(r)) for r in "012345"))
    assert locate('{"verdict":"3"}', slots) == [(12, "3")]
    assert locate(" 3", slots) == [(1, "3")]


def test_a_trailing_end_of_sequence_token_is_not_part_of_the_choice():
    """vLLM returns the logprobs of every generated token, the end-of-sequence token
    included, which the reply's text leaves out."""
    tokens = (
        TokenLogprob("4", ln(0.5), (("4", ln(0.5)), ("3", ln(0.5)))),
        TokenLogprob("</s>", ln(0.9), ()),
    )
    [v] = verdict_probabilities(
        Completion("ok", text="4", logprobs=tokens),
        VerdictSlots(tuple((r, float(r)) for r in "012345")),
    )
    assert (v.literal, v.p, v.expected) == ("4", {"4": 0.5, "3": 0.5}, 3.5)


def test_cached_rerun_reproduces_scores_and_confidence(tmp_path):
    """The judgment cache (Parquet files on disk) keeps the token logprobs."""
    frame = pl.DataFrame(
        [{"row_id": "r1", **ROW}],
        schema={
            "row_id": pl.String,
            "question": pl.String,
            "contexts": pl.List(pl.String),
            "answer": pl.String,
            "reference": pl.String,
        },
    )
    metric = HateSpeech.from_params({"score": "probability"})

    def run(replies):
        cache = JudgmentCache(str(tmp_path / "cache"), {}, [metric.name])
        engine = RecordedReplies(replies)
        runner = JudgeRunner(engine, [metric], cache=cache)
        cells, records = run_sync(judge_frame(runner, frame))[metric.id]
        cache.flush()
        fold_journal(open_files(str(tmp_path / "cache"), {}), "run-1")
        return cells[0], records[0]

    first_cell, first_record = run([HATE])
    again_cell, again_record = run([])  # no reply left: only the cache can answer
    assert again_record["cache_hits"] == 1 and again_record["judge_calls"] == 0
    assert again_cell == first_cell
    assert again_record["confidence"] == first_record["confidence"] == pytest.approx(2 / 3)
    assert again_cell["score"] == pytest.approx(2 / 3)


def test_score_param_leaves_the_cache_identity_alone():
    hard = HateSpeech.from_params({}).cache_identity()
    soft = HateSpeech.from_params({"score": "probability"}).cache_identity()
    assert hard == soft
