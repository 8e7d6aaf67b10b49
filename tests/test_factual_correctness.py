"""``factual_correctness``: the counts and the three modes worked out by hand, the
degenerate rows, text the judge must see verbatim (CJK, emoji, combining marks),
duplicate claims and rows, the requests each mode makes and the judgment cache across
modes. The judge is :class:`RecordedReplies` (replies written down here); the worked
examples on the class and the recorded Tonic rows run in test_judge_metrics.py."""

from __future__ import annotations

import json
import math
from typing import Any

import polars as pl
import pytest

from ragbatch.core.errors import ConfigError
from ragbatch.judge.batch import judge_frame
from ragbatch.judge.cache import JudgmentCache
from ragbatch.judge.cache_upkeep import fold_journal, open_files
from ragbatch.judge.metric import JudgeExample
from ragbatch.judge.protocol import Completion, run_sync
from ragbatch.judge.recorded import RecordedReplies, run_example
from ragbatch.judge.run import JudgeRunner
from ragbatch.metrics.factual_correctness import FactualCorrectness, counts_score

ROW = {
    "row_id": "r1",
    "question": "Who wrote Hamlet, and when?",
    "contexts": ["Hamlet is a tragedy."],
    "answer": "Shakespeare wrote Hamlet in 1750. He lived in London.",
    "reference": "William Shakespeare wrote Hamlet around 1600.",
}


def _statements(*items: str) -> str:
    return json.dumps({"statements": list(items)}, ensure_ascii=False)


def _verdicts(*values: int) -> str:
    return json.dumps({"verdicts": [{"reason": "r", "verdict": v} for v in values]})


#: The answer: three claims, the reference supports the first only (TP 1, FP 2). The
#: reference: two claims, the answer supports the first only (FN 1).
A_CLAIMS = _statements(
    "Shakespeare wrote Hamlet.", "Hamlet was written in 1750.", "Shakespeare lived in London."
)
R_CLAIMS = _statements("William Shakespeare wrote Hamlet.", "Hamlet was written around 1600.")
A_VERDICTS = _verdicts(1, 0, 0)
R_VERDICTS = _verdicts(1, 0)


def _run(replies, row=ROW, **params):
    example = JudgeExample(inputs=row, replies=tuple(replies), score=None, params=params)
    cell, record, engine = run_example(FactualCorrectness, example)
    details = json.loads(cell["details"]) if cell["details"] else {}
    return cell, details, record, engine


def _frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    schema = {
        "row_id": pl.String,
        "question": pl.String,
        "contexts": pl.List(pl.String),
        "answer": pl.String,
        "reference": pl.String,
    }
    return pl.DataFrame([{k: r.get(k) for k in schema} for r in rows], schema=schema)


# Scores by hand: precision = TP / (TP + FP), recall = TP / (TP + FN), f1 their harmonic mean.
@pytest.mark.parametrize(
    ("mode", "replies", "score"),
    [
        ("precision", [A_CLAIMS, A_VERDICTS], 1 / 3),
        ("recall", [A_CLAIMS, R_CLAIMS, A_VERDICTS, R_VERDICTS], 1 / 2),  # 1 / (1 + 1)
        ("f1", [A_CLAIMS, R_CLAIMS, A_VERDICTS, R_VERDICTS], 0.4),  # 2 (1/3)(1/2) / (5/6)
    ],
)
def test_each_mode_by_hand(mode, replies, score):
    cell, details, record, engine = _run(replies, mode=mode)
    assert cell["status"] == "ok" and cell["score"] == pytest.approx(score)
    assert engine.unused == 0 and record["judge_calls"] == len(replies)
    assert details["answer_claims"][1] == "Hamlet was written in 1750."
    assert details["answer_verdicts"] == [1, 0, 0]
    assert (details["tp"], details["fp"]) == (1, 2)
    if mode == "precision":
        assert "reference_claims" not in details and "fn" not in details
        assert cell["reason"] == "2 of 3 answer claims not supported by the reference"
    else:
        assert details["reference_verdicts"] == [1, 0] and details["fn"] == 1
    if mode == "recall":
        assert cell["reason"] == "1 reference claims not supported by the answer"


def test_counts_score_table():
    # (tp, fp, fn) -> (precision, recall, f1), each worked out by hand
    table = {
        (2, 0, 0): (1.0, 1.0, 1.0),
        (1, 1, 0): (0.5, 1.0, 2 / 3),
        (3, 1, 2): (0.75, 0.6, 2 * 0.75 * 0.6 / 1.35),
        (0, 2, 1): (0.0, 0.0, 0.0),
        (0, 2, 0): (0.0, 0.0, 0.0),  # TP 0 and nothing missed: Ragas's epsilon gives 0 too
        (0, 0, 3): (0.0, 0.0, 0.0),
    }
    for (tp, fp, fn), expected in table.items():
        got = tuple(counts_score(m, tp, fp, fn) for m in ("precision", "recall", "f1"))
        assert got == pytest.approx(expected), (tp, fp, fn)


def test_precision_makes_only_the_answer_requests():
    _, _, _, engine = _run([A_CLAIMS, A_VERDICTS], mode="precision")
    assert len(engine.requests) == 2
    users = [r.messages[1].content for r in engine.requests]
    assert (
        "Break the answer" in users[0] and "statements taken from the system's answer" in users[1]
    )
    assert not any("Split the reference answer" in u for u in users)


# Degenerate rows -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "replies", "status", "score", "reason"),
    [
        # the answer makes no claims
        ("precision", [_statements()], "not_applicable", None, "the answer makes no claims"),
        ("recall", [_statements(), R_CLAIMS], "ok", 0.0, "none of the reference's 2 is stated"),
        ("f1", [_statements(), R_CLAIMS], "ok", 0.0, "none of the reference's 2 is stated"),
        # the reference makes no claims (precision does not split it)
        ("recall", [A_CLAIMS, _statements()], "not_applicable", None, "the reference makes no"),
        ("f1", [A_CLAIMS, _statements()], "not_applicable", None, "the reference makes no"),
        ("precision", [A_CLAIMS, _verdicts(0, 0, 0)], "ok", 0.0, "3 of 3 answer claims"),
        # neither makes claims
        ("f1", [_statements(), _statements()], "not_applicable", None, "neither the answer"),
        ("recall", [_statements(), _statements()], "not_applicable", None, "neither the answer"),
    ],
)
def test_no_claims_on_either_side(mode, replies, status, score, reason):
    cell, _, record, engine = _run(replies, mode=mode)
    assert (cell["status"], cell["score"]) == (status, score)
    assert reason in cell["reason"]
    assert engine.unused == 0 and len(engine.requests) == len(replies)


def test_tp_zero_is_zero_in_every_mode_even_with_nothing_missed():
    for mode in ("recall", "f1"):
        cell, details, _, _ = _run(
            [A_CLAIMS, R_CLAIMS, _verdicts(0, 0, 0), _verdicts(1, 1)], mode=mode
        )
        assert cell["score"] == 0.0 and details["fn"] == 0, mode
    cell, _, _, _ = _run([A_CLAIMS, R_CLAIMS, _verdicts(0, 0, 0), _verdicts(1, 1)], mode="recall")
    assert cell["reason"] == "no answer claim supported by the reference"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"answer": None}, "answer is null"),
        ({"answer": " \t\n"}, "answer is empty"),
        ({"reference": None}, "reference is null"),
        ({"reference": "\u3000"}, "reference is empty"),  # an ideographic space only
    ],
)
def test_missing_inputs_make_no_call(change, reason):
    for mode in ("precision", "f1"):
        cell, _, record, engine = _run([], row={**ROW, **change}, mode=mode)
        assert (cell["status"], cell["reason"]) == ("missing_input", reason)
        assert engine.requests == [] and record["judge_calls"] is None


def test_question_and_contexts_are_optional():
    row = {**ROW, "question": None, "contexts": None}
    cell, _, _, engine = _run([A_CLAIMS, A_VERDICTS], row=row, mode="precision")
    assert cell["score"] == pytest.approx(1 / 3)
    assert "## Question\n(not given)" in engine.requests[0].messages[1].content


def test_a_parse_failure_is_the_row_status_with_the_raw_reply():
    # the reference's verdicts: prose, then one verdict for two claims (one retry)
    replies = [A_CLAIMS, R_CLAIMS, A_VERDICTS, "Both hold.", _verdicts(1)]
    cell, _, record, engine = _run(replies, mode="f1")
    assert cell["status"] == "parse_failure" and cell["score"] is None
    assert "reference_verdicts" in cell["reason"] and "expected 2 verdicts, got 1" in cell["reason"]
    assert engine.unused == 0 and "Both hold." in record["judge_reply"]


# Text the judge sees as it is --------------------------------------------------------------

#: CJK, an emoji with a skin-tone modifier and a ZWJ sequence, a combining acute accent
#: (e + U+0301, not the precomposed é) and a right-to-left name.
UNICODE_ROW = {
    "row_id": "u1",
    "question": "誰が『ハムレット』を書いた？",
    "contexts": ["🎭"],
    "answer": "シェイクスピアが書いた 👍🏽。Cafe\u0301 👩\u200d💻 は無関係。",
    "reference": "ウィリアム・シェイクスピアが『ハムレット』を書いた。مرحبا",
}


def test_unicode_claims_reach_the_judge_verbatim():
    a_claims = ["シェイクスピアが『ハムレット』を書いた 👍🏽。", "Cafe\u0301 👩\u200d💻 は無関係。"]
    r_claims = ["ウィリアム・シェイクスピアが『ハムレット』を書いた。", "مرحبا"]
    replies = [_statements(*a_claims), _statements(*r_claims), _verdicts(1, 0), _verdicts(1, 1)]
    for layout in ("row_first", "instructions_first"):
        cell, details, _, engine = _run(replies, row=UNICODE_ROW, prompt_layout=layout)
        # TP 1, FP 1, FN 0: precision 1/2, recall 1, f1 2/3
        assert cell["score"] == pytest.approx(2 / 3), layout
        assert details["answer_claims"] == a_claims and details["reference_claims"] == r_claims
        a_verdicts, r_verdicts = (r.messages[1].content for r in engine.requests[2:])
        assert "[1] シェイクスピアが『ハムレット』を書いた 👍🏽。" in a_verdicts
        assert "[2] Cafe\u0301 👩\u200d💻 は無関係。" in a_verdicts  # not normalised to é
        assert "[2] مرحبا" in r_verdicts
        assert UNICODE_ROW["reference"] in a_verdicts  # the premise of the answer's claims


def test_a_claim_listed_twice_counts_twice():
    replies = [
        _statements(
            "Shakespeare wrote Hamlet.", "Shakespeare wrote Hamlet.", "Hamlet is from 1750."
        ),
        _verdicts(1, 1, 0),
    ]
    cell, details, _, _ = _run(replies, mode="precision")
    assert cell["score"] == pytest.approx(2 / 3) and details["tp"] == 2


def test_duplicate_rows_share_every_request():
    engine = RecordedReplies([A_CLAIMS, R_CLAIMS, A_VERDICTS, R_VERDICTS])
    runner = JudgeRunner(engine, [FactualCorrectness.from_params({})])
    rows = [ROW, {**ROW, "row_id": "r2"}]
    cells, records = run_sync(judge_frame(runner, _frame(rows)))["factual_correctness"]
    assert [c["score"] for c in cells] == pytest.approx([0.4, 0.4])
    assert [(r["judge_calls"], r["cache_hits"]) for r in records] == [(4, 0), (0, 4)]
    assert engine.unused == 0 and len(engine.requests) == 4


# Params, cache keys and modes ----------------------------------------------------------------


def test_mode_param():
    assert FactualCorrectness.from_params({}).mode == "f1"
    with pytest.raises(ConfigError, match=r"metrics\[0\]\.params\.mode"):
        FactualCorrectness.from_params({"mode": "accuracy"}, where="metrics[0].params")
    described = FactualCorrectness.describe()["params"]["mode"]
    assert described["default"] == "f1"


def test_cache_identity_leaves_the_mode_out():
    identities = [
        FactualCorrectness.from_params({"mode": m}).cache_identity()
        for m in ("precision", "recall", "f1")
    ]
    assert identities[0] == identities[1] == identities[2]
    assert identities[0]["params"] == {}
    bare = FactualCorrectness.from_params({"mode": "precision", "reasons": False})
    assert bare.cache_identity()["params"] == {"reasons": False}


def test_calibration_identity_keeps_the_mode_and_the_score():
    """A calibration holds for one way of scoring: the prompt version differs by mode
    and by ``score``, and at the defaults (f1, verdict) it is the hash of the cache
    identity alone, as before the distinction (worked out here from its definition)."""
    import hashlib
    import json

    from ragbatch.calibrate.agreement import prompt_version

    def version(params):
        return prompt_version(FactualCorrectness.from_params(params))

    default = FactualCorrectness.from_params({})
    digest = hashlib.sha256(
        json.dumps(
            {"metric": "factual_correctness", "version": default.version, "params": {}},
            sort_keys=True,
        ).encode()
    ).hexdigest()[:12]
    assert version({}) == version({"mode": "f1", "score": "verdict"})
    assert version({}) == f"factual_correctness/v{default.version}/{digest}"
    versions = {
        version({"mode": "precision"}),
        version({"mode": "recall"}),
        version({}),
        version({"score": "probability"}),
    }
    assert len(versions) == 4
    assert FactualCorrectness.from_params({"mode": "recall"}).calibration_identity()["scoring"] == {
        "mode": "recall"
    }


@pytest.mark.parametrize("layout", ["row_first", "instructions_first"])
def test_precision_requests_are_the_first_of_f1s(layout):
    """The requests precision makes are byte-identical to two of f1's, in both layouts
    (instructions_first shows every step's instructions whatever the mode)."""
    _, _, _, precision = _run([A_CLAIMS, A_VERDICTS], mode="precision", prompt_layout=layout)
    _, _, _, f1 = _run(
        [A_CLAIMS, R_CLAIMS, A_VERDICTS, R_VERDICTS], mode="f1", prompt_layout=layout
    )
    assert precision.requests == [f1.requests[0], f1.requests[2]]


def test_f1_after_precision_pays_only_for_the_reference(tmp_path):
    uri = str(tmp_path / "cache")
    names = ["factual_correctness"]
    first = RecordedReplies([A_CLAIMS, A_VERDICTS])
    runner = JudgeRunner(
        first,
        [FactualCorrectness.from_params({"mode": "precision"})],
        cache=JudgmentCache(uri, {}, names),
    )
    cells, _ = run_sync(judge_frame(runner, _frame([ROW])))["factual_correctness"]
    assert cells[0]["score"] == pytest.approx(1 / 3)
    assert runner.cache is not None and runner.cache.flush() == 2
    fold_journal(open_files(uri, {}), "run-1")

    second = RecordedReplies([R_CLAIMS, R_VERDICTS])  # only what precision did not ask
    metric = FactualCorrectness.from_params({"mode": "f1"})
    runner = JudgeRunner(second, [metric], cache=JudgmentCache(uri, {}, names))
    cells, records = run_sync(judge_frame(runner, _frame([ROW])))["factual_correctness"]
    assert cells[0]["score"] == pytest.approx(0.4)
    assert (records[0]["judge_calls"], records[0]["cache_hits"]) == (2, 2)
    assert second.unused == 0 and len(second.requests) == 2
    assert "Split the reference answer" in second.requests[0].messages[1].content


# score: probability ------------------------------------------------------------------------

ln = math.log


def _bare(ps: list[float]) -> dict[str, Any]:
    """A bare-verdict reply whose i-th verdict is 1 when ``ps[i] >= 0.5``, its token
    giving p(1) = ps[i] and p(0) = 1 - ps[i]."""
    tokens: list[Any] = [['{"', ln(0.99), []], ["verdicts", ln(0.9), []], ['":[', ln(0.9), []]]
    for i, p in enumerate(ps):
        v = "1" if p >= 0.5 else "0"
        tokens.append([v, ln(max(p, 1 - p)), [["1", ln(p)], ["0", ln(1 - p)]]])
        tokens.append(["," if i < len(ps) - 1 else "]}", ln(0.99), []])
    text = '{"verdicts":[' + ",".join("1" if p >= 0.5 else "0" for p in ps) + "]}"
    return {"text": text, "logprobs": tokens}


def test_probability_score_counts_expected_claims_in_request_order():
    """The answer's verdicts fail to parse on the first try and are answered after the
    reference's; the expected counts still take the answer's probabilities as TP."""
    a_claims = _statements("Shakespeare wrote Hamlet.", "Hamlet is from 1750.")
    r_claims = _statements("William Shakespeare wrote Hamlet.")
    replies = [a_claims, r_claims, "no JSON", _bare([0.9]), _bare([0.8, 0.3])]
    cell, details, _, engine = _run(replies, reasons=False, score="probability")
    assert engine.unused == 0 and cell["status"] == "ok"
    # by hand: TP = 0.8 + 0.3 = 1.1, FP = 2 - 1.1 = 0.9, FN = 1 - 0.9 = 0.1;
    # precision 0.55, recall 1.1 / 1.2, f1 2 P R / (P + R)
    p, r = 0.55, 1.1 / 1.2
    assert cell["score"] == pytest.approx(2 * p * r / (p + r))
    assert details["verdict_score"] == pytest.approx(2 / 3)  # hard: TP 1, FP 1, FN 0
    assert details["p_verdicts"] == pytest.approx([0.8, 0.7, 0.9])  # answer's, then reference's


class _FailsTheAnswerSide(RecordedReplies):
    """Recorded replies, except that the request splitting the answer fails as an
    engine failure would (a fault the recorded engine cannot produce by itself)."""

    async def complete(self, requests):
        out = []
        for request in requests:
            if "Break the answer" in request.messages[1].content:
                self.requests.append(request)
                out.append(Completion("judge_error", error="engine fault"))
            else:
                out.extend(await super().complete([request]))
        return out


def test_a_failed_request_settles_the_row_and_its_sibling_is_still_accounted():
    engine = _FailsTheAnswerSide([R_CLAIMS])  # the first request fails, the second is served
    runner = JudgeRunner(engine, [FactualCorrectness.from_params({})])
    cells, records = run_sync(judge_frame(runner, _frame([ROW])))["factual_correctness"]
    assert cells[0]["status"] == "judge_error" and "answer_claims" in cells[0]["reason"]
    # both requests were sent: each is a call of the cell and of the metric's totals
    assert records[0]["judge_calls"] == 2
    assert runner.take_tallies()["factual_correctness"]["judge_calls"] == 2
    assert R_CLAIMS in records[0]["judge_reply"]  # the sibling's reply is kept
    assert engine.unused == 0 and len(engine.requests) == 2
