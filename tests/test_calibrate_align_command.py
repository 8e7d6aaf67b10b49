"""``ragbatch calibrate --align`` end to end against a scripted judge: a real
OpenAI-compatible HTTP server on loopback (tests/support/scripted_aligned_judge.py)
through the real ``openai`` engine, local Ray, Parquet and the command line.

The scripted judge says ``true`` to every row when the prompt shows no examples, and
with examples judges the answer's ``[hateful]`` marker, with one planted mistake each
way. The labelled rows are 20 (8 hateful, 12 not); seed 0 and train fraction 0.5 hold
out 4 hateful and 6 other rows (checked below), so on the held-out rows, by hand:

=========  ==========================  ===================================  =========
measure    before (every verdict 1)    after (tp 3, fn 1, fp 1, tn 5)       change
=========  ==========================  ===================================  =========
accuracy   4/10 = 0.4                  8/10 = 0.8                           +0.4
precision  4/10 = 0.4                  3/4 = 0.75                           +0.35
recall     4/4 = 1                     3/4 = 0.75                           -0.25
f1         8/14 = 0.571429             6/8 = 0.75                           +0.178571
kappa      (0.4 - 0.4)/0.6 = 0         (0.8 - 0.52)/0.48 = 0.583333         +0.583333
roc_auc    all tied: 0.5               15/24 + 4/24 = 19/24 = 0.791667      +0.291667
=========  ==========================  ===================================  =========

(kappa after: p_e = (4*4 + 6*6) / 100 = 0.52; roc_auc after: P(positive scores above a
negative) = 3/4 * 5/6, ties 3/4 * 1/6 + 1/4 * 5/6 counted half.) The intervals are
recomputed by a bootstrap loop of the test's own.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml

from ragbatch.analysis.runs import find_run, load_scores
from ragbatch.calibrate.agreement import prompt_version
from ragbatch.calibrate.align import ids_digest
from ragbatch.calibrate.output import find_calibration
from ragbatch.cli.main import main
from ragbatch.judge.aligned import load_examples
from ragbatch.metrics.hate_speech import HateSpeech
from support.scripted_aligned_judge import SERVED_NAME, ScriptedAlignedJudge

pytest.importorskip("openai", reason="the openai engine needs the openai package")

IDS = [f"r{i:02d}" for i in range(20)]
LABELS = [1] * 8 + [0] * 12
#: The split of seed 0, train fraction 0.5 (``split_rows``), written out.
TRAIN = ["r01", "r02", "r03", "r07", "r10", "r12", "r13", "r15", "r17", "r19"]
HELD_OUT = ["r00", "r04", "r05", "r06", "r08", "r09", "r11", "r14", "r16", "r18"]
#: The four examples ``choose_examples`` takes from the training rows, in order.
EXAMPLES = ["r15", "r02", "r13", "r07"]
#: Held-out rows the aligned judge gets wrong: a hateful one and another.
SUBTLE, BAIT = "r05", "r14"
RESAMPLES = 200
BOOT_SEED = 7
HAND = {
    "accuracy": (0.4, 0.8),
    "precision": (0.4, 0.75),
    "recall": (1.0, 0.75),
    "f1": (8 / 14, 0.75),
    "kappa": (0.0, 0.28 / 0.48),
    "roc_auc": (0.5, 19 / 24),
}


def _answer(row_id: str, label: int) -> str:
    marks = "[hateful]" if label else "[fine]"
    marks += " [subtle]" if row_id == SUBTLE else " [bait]" if row_id == BAIT else ""
    return f"Answer of {row_id} {marks}"


ANSWERS = {i: _answer(i, label) for i, label in zip(IDS, LABELS)}


def _input(tmp_path: Path, ids=IDS, labels=LABELS) -> Path:
    path = tmp_path / "labelled.parquet"
    pl.DataFrame(
        {
            "id": ids,
            "q": [f"Question {i}?" for i in ids],
            "text": [_answer(i, lab) for i, lab in zip(ids, labels)],
            "hateful": labels,
        }
    ).write_parquet(path)
    return path


#: A pass/fail rubric in the labels' direction, judged without reasons: its reply is the
#: bare choice.
RUBRIC = {
    "name": "rubric",
    "id": "hateful_rubric",
    "params": {
        "criteria": "The answer attacks people for who they are.",
        "inputs": ["answer"],
        "choices": ["hateful", "fine"],
        "choice_scores": {"hateful": 1, "fine": 0},
        "reasons": False,
    },
}


def _config(tmp_path: Path, base_url: str, *, extra_metrics=(), metrics=None, **input_rows) -> Path:
    if metrics is None:
        metrics = [{"name": "hate_speech"}, *({"name": m} for m in extra_metrics)]
    config = {
        "name": "scripted-align",
        "input": {
            "uri": str(_input(tmp_path, **input_rows)),
            "format": "parquet",
            "columns": {"row_id": "id", "question": "q", "answer": "text"},
        },
        "output": {"uri": str(tmp_path / "out")},
        "engines": {
            "judge": {
                "type": "openai",
                "base_url": base_url,
                "model": SERVED_NAME,
                "max_retries": 0,
            }
        },
        "judges": ["judge"],
        "metrics": metrics,
        "labels": {
            m.get("id", m["name"]): {"column": "hateful", "type": "binary"} for m in metrics
        },
        "bootstrap": {"resamples": RESAMPLES, "seed": BOOT_SEED, "confidence": 0.95},
        "top_disagreements": 3,
    }
    path = tmp_path / "calibrate.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def aligned(ray_local, tmp_path_factory):
    """One ``calibrate --align hate_speech`` through the CLI, against the scripted judge."""
    tmp = tmp_path_factory.mktemp("align")
    with ScriptedAlignedJudge() as judge:
        config = _config(tmp, judge.base_url)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = main(["calibrate", str(config), "--align", "hate_speech", "--run-id", "cal-a"])
        assert code == 0, buf.getvalue()
    root = str(tmp / "out")
    return {
        "tmp": tmp,
        "root": root,
        "text": buf.getvalue(),
        "judged": list(judge.judged),
        "cal": find_calibration(root, "cal-a"),
    }


def test_only_held_out_rows_are_judged_and_measured(aligned):
    align = aligned["cal"].manifest["align"]
    assert align["runs"] == {
        "judge": {"before": "cal-a-judge-before", "after": "cal-a-judge-after"}
    }
    for run_id in ("cal-a-judge-before", "cal-a-judge-after"):
        scores = load_scores(find_run(aligned["root"], run_id))
        assert sorted(scores["row_id"]) == HELD_OUT
        assert not set(scores["row_id"]) & set(TRAIN)
        assert (scores["status"] == "ok").all()
    # the judge saw each held-out row twice, once without and once with the examples,
    # and no training row except as one of the examples
    judged = aligned["judged"]
    seen = sorted((j.answer, j.with_examples) for j in judged)
    assert seen == sorted((ANSWERS[i], w) for i in HELD_OUT for w in (False, True))
    shown = {j.example_answers for j in judged if j.with_examples}
    assert shown == {tuple(ANSWERS[i] for i in EXAMPLES)}
    assert all(j.example_answers == () for j in judged if not j.with_examples)
    # the held-out agreement counts every held-out row, and only those
    for row in aligned["cal"].table("agreement").iter_rows(named=True):
        assert row["n"] == len(HELD_OUT) == row["n_cells"], row


def test_manifest_records_seed_split_and_examples_file(aligned):
    align = aligned["cal"].manifest["align"]
    assert (align["metric"], align["shots"], align["train_fraction"], align["seed"]) == (
        "hate_speech",
        4,
        0.5,
        0,
    )
    assert align["split"] == {
        "seed": 0,
        "train_fraction": 0.5,
        "train_rows": 10,
        "held_out_rows": 10,
        "train_ids_sha256": ids_digest(TRAIN),
        "held_out_ids_sha256": ids_digest(HELD_OUT),
    }
    # the digests are those of the parts the runs read
    held = pl.read_parquet(align["held_out_input"])
    assert align["split"]["held_out_ids_sha256"] == ids_digest(held["id"].to_list())
    assert align["examples"] == EXAMPLES
    path = Path(align["examples_file"])
    assert path == Path(aligned["root"]).resolve() / "aligned" / "hate_speech" / "cal-a.json"
    assert align["examples_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_examples_file_loads_and_a_job_using_it_validates(aligned, tmp_path):
    align = aligned["cal"].manifest["align"]
    examples = load_examples(align["examples_file"])
    assert examples.sha256 == align["examples_sha256"]
    assert examples.metric == "hate_speech" and examples.record["created_by"] == "cal-a"
    assert examples.record["split"] == align["split"]
    assert [e["row_id"] for e in examples.examples] == EXAMPLES
    assert [e["inputs"]["answer"] for e in examples.examples] == [ANSWERS[i] for i in EXAMPLES]
    labels = dict(zip(IDS, LABELS))
    for example in examples.examples:
        # hate_speech's own reply format: a boolean verdict, as the label says
        assert json.loads(example["reply"])["verdict"] is bool(labels[example["row_id"]])
    with ScriptedAlignedJudge() as judge:  # validate asks the engine for its model
        job = {
            "input": {"uri": align["held_out_input"], "format": "parquet",
                      "columns": {"row_id": "id", "question": "q", "answer": "text"}},
            "output": {"uri": str(tmp_path / "out")},
            "engines": {"judge": {"type": "openai", "base_url": judge.base_url,
                                  "model": SERVED_NAME}},
            "metrics": [{"name": "hate_speech", "engine": "judge",
                         "params": {"examples_file": align["examples_file"]}}],
        }  # fmt: skip
        path = tmp_path / "job.yaml"
        path.write_text(yaml.safe_dump(job), encoding="utf-8")
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["validate", str(path)]) == 0
        assert judge.judged == []
    # the aligned metric's prompt version is the one the "after" rows record
    version = prompt_version(HateSpeech.from_params({"examples_file": align["examples_file"]}))
    after = aligned["cal"].table("alignment")["prompt_version_after"].unique().to_list()
    assert after == [version] != [prompt_version(HateSpeech.from_params({}))]


def _verdict_measure(name):
    def value(v, h):
        tp = np.sum((v == 1) & (h == 1))
        fp = np.sum((v == 1) & (h == 0))
        fn = np.sum((v == 0) & (h == 1))
        tn = np.sum((v == 0) & (h == 0))
        n = h.size
        if name == "accuracy":
            return (tp + tn) / n
        if name == "precision":
            return tp / (tp + fp) if tp + fp else None
        if name == "recall":
            return tp / (tp + fn) if tp + fn else None
        if name == "f1":
            return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else None
        if name == "kappa":
            p_e = ((tp + fp) * (tp + fn) + (tn + fn) * (tn + fp)) / (n * n)
            return ((tp + tn) / n - p_e) / (1 - p_e) if p_e < 1 else None
        pos, neg = h == 1, h == 0
        if not pos.any() or not neg.any():
            return None
        diff = v[pos][:, None] - v[neg][None, :]
        return float(np.mean((diff > 0) + 0.5 * (diff == 0)))

    return value


def _interval(draws):
    draws = [d for d in draws if d is not None and not math.isnan(d)]
    if 2 * len(draws) < RESAMPLES:
        return None, None
    low, high = np.quantile(draws, [0.025, 0.975])
    return float(low), float(high)


def test_agreement_before_and_after_are_the_hand_worked_values(aligned):
    rows = {r["measure"]: r for r in aligned["cal"].table("alignment").iter_rows(named=True)}
    assert list(rows) == [*HAND, "brier", "ece"]
    human = np.array([float(i in ("r00", "r04", "r05", "r06")) for i in HELD_OUT])
    before = np.ones(len(HELD_OUT))
    after = np.array([1.0 if i in ("r00", "r04", "r06", BAIT) else 0.0 for i in HELD_OUT])
    index = np.random.default_rng(BOOT_SEED).integers(0, len(HELD_OUT), (RESAMPLES, 10))
    for name, (want_before, want_after) in HAND.items():
        row = rows[name]
        assert row["before"] == pytest.approx(want_before, abs=1e-12), name
        assert row["after"] == pytest.approx(want_after, abs=1e-12), name
        assert row["difference"] == pytest.approx(want_after - want_before, abs=1e-12), name
        assert row["n_before"] == row["n_after"] == row["n_paired"] == 10
        fn = _verdict_measure(name)
        b_draws = [fn(before[i], human[i]) for i in index]
        a_draws = [fn(after[i], human[i]) for i in index]
        d_draws = [a - b if None not in (a, b) else None for a, b in zip(a_draws, b_draws)]
        for key, draws in (("before", b_draws), ("after", a_draws), ("difference", d_draws)):
            low, high = _interval(draws)
            got = (row[f"{key}_low"], row[f"{key}_high"])
            if low is None:
                assert got == (None, None) and row["reason"], (name, key, row)
            else:
                assert got == (pytest.approx(low), pytest.approx(high)), (name, key)
    # hard verdicts: no Brier or ECE on either side
    assert rows["brier"]["before"] is None and rows["brier"]["difference"] is None
    # the agreement table holds both runs' rows, told apart by run and prompt version
    agreement = aligned["cal"].table("agreement").filter(pl.col("measure") == "kappa")
    assert sorted(agreement["scores_run_id"]) == ["cal-a-judge-after", "cal-a-judge-before"]
    assert agreement["prompt_version"].n_unique() == 2


def test_console_report_shows_split_file_and_changes(aligned):
    text, align = aligned["text"], aligned["cal"].manifest["align"]
    assert "calibration cal-a committed: hate_speech aligned with 4 example(s)" in text
    assert f"examples file: {align['examples_file']}" in text
    assert align["examples_sha256"] in text
    assert ids_digest(TRAIN) in text and ids_digest(HELD_OUT) in text
    assert "seed 0, train_fraction 0.5" in text
    lines = text.splitlines()
    assert any(
        ln.split()[:6] == ["judge", "kappa", "10", "0.000", "[0.000,", "0.000]"]
        and "0.583" in ln
        and "+0.583" in ln
        for ln in lines
    ), text
    assert any(
        ln.split()[:4] == ["judge", "recall", "10", "1.000"] and "-0.250" in ln for ln in lines
    )


def test_a_rubric_is_aligned_with_its_own_reply_format(ray_local, tmp_path, capsys):
    """The same scripted verdicts through a pass/fail rubric without reasons: the
    examples show the bare choices, and the numbers are the hand-worked ones above."""
    with ScriptedAlignedJudge(reply=lambda verdict: "hateful" if verdict else "fine") as judge:
        config = _config(tmp_path, judge.base_url, metrics=[RUBRIC])
        args = ["calibrate", str(config), "--align", "hateful_rubric", "--run-id", "cal-r"]
        assert main(args) == 0
        assert len(judge.judged) == 2 * len(HELD_OUT)
    capsys.readouterr()
    cal = find_calibration(str(tmp_path / "out"), "cal-r")
    align = cal.manifest["align"]
    assert (align["metric"], align["metric_name"]) == ("hateful_rubric", "rubric")
    examples = load_examples(align["examples_file"])
    assert align["examples_file"].endswith("/aligned/hateful_rubric/cal-r.json")
    labels = dict(zip(IDS, LABELS))
    assert [(e["row_id"], e["reply"]) for e in examples.examples] == [
        (i, "hateful" if labels[i] else "fine") for i in EXAMPLES
    ]
    rows = {r["measure"]: r for r in cal.table("alignment").iter_rows(named=True)}
    for name, (want_before, want_after) in HAND.items():
        assert rows[name]["before"] == pytest.approx(want_before, abs=1e-12), name
        assert rows[name]["after"] == pytest.approx(want_after, abs=1e-12), name


# ------------------------------------------------------------------ bad input, no judge work


def _refused(tmp_path, capsys, args, **config) -> str:
    path = _config(tmp_path, "http://127.0.0.1:9/v1", **config)
    assert main(["calibrate", str(path), *args]) == 2
    # nothing written: no examples file, no input copy, no judge run
    assert not (tmp_path / "out").exists()
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "config", "message"),
    [
        (
            ["--align", "hate_speeches"],
            {},
            "--align hate_speeches: no metric of the calibration config has id "
            "'hate_speeches'; its metric ids: ['hate_speech']",
        ),
        (
            ["--align", "faithfulness"],
            {},
            "add faithfulness under `metrics` and `labels` of the config",
        ),
        (
            ["--align", "exact_match"],
            {"extra_metrics": ["exact_match"]},
            "--align exact_match: 'exact_match' is not a judge metric; only judge metrics "
            "take examples",
        ),
        (
            ["--align", "faithfulness"],
            {"extra_metrics": ["faithfulness"]},
            "--align faithfulness: faithfulness cannot be aligned: its first step "
            "('faithfulness/statements') lists the statements of a text",
        ),
        (
            ["--align", "hate_speech"],
            {"ids": ["a", "b", "c", "d"], "labels": [1, 0, 0, 0]},
            "--align hate_speech: too few labelled rows to split: label 1 has 1 row; each "
            "label needs at least 2 rows",
        ),
        (
            ["--align", "hate_speech", "--train-fraction", "0.2"],
            {"ids": ["a", "b", "c", "d", "e", "f"], "labels": [1, 1, 0, 0, 0, 0]},
            "--train-fraction 0.2: 0 of the 2 rows of label 1 would be training rows; each "
            "label needs rows in both parts",
        ),
        (
            ["--align", "hate_speech", "--shots", "11"],
            {},
            "--shots 11 is more than the 10 training rows that can be examples of "
            "hate_speech (of 10 training rows): lower --shots, or raise --train-fraction",
        ),
        (["--align", "hate_speech", "--shots", "0"], {}, "--shots must be at least 1, got 0"),
        (
            ["--align", "hate_speech", "--train-fraction", "1"],
            {},
            "--train-fraction must be between 0 and 1 (exclusive), got 1.0",
        ),
        (["--shots", "2", "--seed", "3"], {}, "--shots, --seed: only with --align METRIC"),
    ],
)
def test_bad_align_input_is_refused_before_any_judge_work(tmp_path, capsys, args, config, message):
    err = _refused(tmp_path, capsys, args, **config)
    assert message in err, err
