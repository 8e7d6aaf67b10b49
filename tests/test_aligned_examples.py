"""The ``examples_file`` param of judge metrics: worked examples in the prompt, the
file's hash in the cache key, and the errors for a bad file.

The expected prompts are written out by hand below; only the metric's own task and
instruction texts are taken from its module.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from ragbatch.calibrate.agreement import prompt_version
from ragbatch.cli.main import main
from ragbatch.core.errors import ConfigError
from ragbatch.judge.aligned import parse_examples, write_examples
from ragbatch.judge.cache import JudgmentCache
from ragbatch.judge.cache_upkeep import fold_journal, open_files
from ragbatch.judge.batch import judge_frame
from ragbatch.judge.protocol import run_sync
from ragbatch.judge.recorded import RecordedReplies
from ragbatch.judge.run import JudgeRunner
from ragbatch.metrics import answer_similarity
from ragbatch.metrics.answer_similarity import AnswerSimilarity
from ragbatch.metrics.faithfulness import Faithfulness
from support.cache_rows import STATEMENTS, YES, city_rows

ROW = {
    "row_id": "r1",
    "question": "Who wrote Hamlet?",
    "contexts": ["Hamlet is a tragedy by William Shakespeare."],
    "answer": "Shakespeare.",
    "reference": "William Shakespeare.",
}
EXAMPLES = {
    "metric": "answer_similarity",
    "created_by": "cal-1",
    "seed": 0,
    "examples": [
        {
            "inputs": {
                "question": "Où est la tour Eiffel ?",
                "contexts": ["La tour Eiffel est à Paris."],
                "answer": "À Paris — en France.",
                "reference": "Paris.",
            },
            "label": 5,
            "reply": "5",
        }
    ],
}
#: How the example above appears in a prompt, written out by hand.
RENDERED = (
    "## Examples\n\n"
    "Each example below is a row like the one you judge, then the reply a careful "
    "reviewer gave to the same task. Judge the row you are given in the same way.\n\n"
    "### Example 1\n"
    "#### Retrieved contexts\n[1] La tour Eiffel est à Paris.\n\n"
    "#### Question\nOù est la tour Eiffel ?\n\n"
    "#### Answer\nÀ Paris — en France.\n\n"
    "#### Reference answer\nParis.\n\n"
    "### Reply\n5"
)
BLOCK = (
    "## Retrieved contexts\n[1] Hamlet is a tragedy by William Shakespeare.\n\n"
    "## Question\nWho wrote Hamlet?\n\n## Answer\nShakespeare."
)


def _file(tmp_path, record=EXAMPLES, name="aligned.json") -> str:
    path = str(tmp_path / name)
    write_examples(path, record)
    return path


def _messages(params: dict) -> tuple:
    metric = AnswerSimilarity.from_params(params)
    return metric.messages(ROW, metric.prompts[0], reference=ROW["reference"])


def test_row_first_shows_the_examples_before_the_task(tmp_path):
    system, user = _messages({"examples_file": _file(tmp_path)})
    task = answer_similarity.TASK.format(reference=ROW["reference"]).strip()
    assert user.content == f"{BLOCK}\n\n## Task\n{RENDERED}\n\n## Your task\n{task}"
    assert system.content == _messages({})[0].content


def test_instructions_first_shows_the_examples_in_the_instructions(tmp_path):
    params = {"examples_file": _file(tmp_path), "prompt_layout": "instructions_first"}
    system, user = _messages(params)
    own = answer_similarity.INSTRUCTIONS.strip()
    assert system.content.endswith(
        f"## Instructions: answer_similarity\n{RENDERED}\n\n## Your task\n{own}"
    )
    # the user message is the one without examples
    assert user.content == _messages({"prompt_layout": "instructions_first"})[1].content


def test_without_the_file_prompts_and_keys_are_unchanged():
    metric = AnswerSimilarity.from_params({})
    assert "examples_file" not in metric.cache_identity()["params"]
    assert "examples_sha256" not in metric.cache_identity()["params"]
    assert metric.aligned_examples() is None


def test_the_cache_key_holds_the_hash_of_the_contents_not_the_path(tmp_path):
    a = _file(tmp_path, name="a.json")
    b = _file(tmp_path, name="b.json")
    data = open(a, "rb").read()
    ident_a = AnswerSimilarity.from_params({"examples_file": a}).cache_identity()
    ident_b = AnswerSimilarity.from_params({"examples_file": b}).cache_identity()
    assert ident_a == ident_b
    assert ident_a["params"]["examples_sha256"] == hashlib.sha256(data).hexdigest()
    assert "examples_file" not in ident_a["params"]
    # and so in the calibration's prompt version
    versions = {
        prompt_version(AnswerSimilarity.from_params(p))
        for p in ({"examples_file": a}, {"examples_file": b}, {})
    }
    assert len(versions) == 2


def _judge(uri: str, path: str, replies: list[str]):
    engine = RecordedReplies(replies)
    cache = JudgmentCache(uri, {})
    metric = Faithfulness.from_params({"examples_file": path})
    runner = JudgeRunner(engine, [metric], cache=cache)
    cells, records = run_sync(judge_frame(runner, city_rows(2)))["faithfulness"]
    cache.flush()
    fold_journal(open_files(uri, {}), "run")
    return cells, engine


def test_same_file_reuses_the_cache_and_an_edited_file_asks_again(tmp_path):
    record = {
        "metric": "faithfulness",
        "examples": [{"inputs": {"question": "q", "answer": "a"}, "reply": STATEMENTS}],
    }
    path = _file(tmp_path, record)
    uri = str(tmp_path / "cache")
    cells1, engine1 = _judge(uri, path, [STATEMENTS] * 2 + [YES] * 2)
    assert len(engine1.requests) == 4
    # the examples precede the first step's task only
    assert "## Examples" in engine1.requests[0].messages[1].content
    assert "## Examples" not in engine1.requests[2].messages[1].content
    cells2, engine2 = _judge(uri, path, [])
    assert engine2.requests == [] and cells2 == cells1
    record["examples"][0]["reply"] = '{"statements": ["Paris is in Europe."]}'
    write_examples(path, record)
    _, engine3 = _judge(uri, path, [STATEMENTS] * 2 + [YES] * 2)
    assert len(engine3.requests) == 4


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not a JSON file"),
        ('{"format_version": 2, "metric": "m", "examples": []}', "format_version must be 1"),
        ('{"format_version": 1, "examples": []}', "metric must be a non-empty string"),
        ('{"format_version": 1, "metric": "m", "examples": []}', "examples must be"),
        (
            '{"format_version": 1, "metric": "m", "examples": [{"inputs": {}, "reply": ""}]}',
            "examples[0].reply must be a non-empty string",
        ),
    ],
)
def test_bad_files_are_refused_naming_the_key(tmp_path, text, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        parse_examples(text.encode())
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        AnswerSimilarity.from_params({"examples_file": str(path)})
    assert f"params.examples_file: {message}" in str(err.value)


def test_validate_exits_2_naming_the_field(tmp_path, capsys):
    config = {
        "input": {"uri": str(tmp_path / "in.parquet")},
        "output": {"uri": str(tmp_path / "out")},
        "engines": {"judge": {"kind": "openai", "base_url": "http://127.0.0.1:1/v1", "model": "j"}},
        "metrics": [
            {
                "name": "answer_similarity",
                "engine": "judge",
                "params": {"examples_file": str(tmp_path / "missing.json")},
            }
        ],
    }
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(config))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "examples_file" in err and "cannot read the examples file" in err


@pytest.mark.parametrize("layout", ["row_first", "instructions_first"])
@pytest.mark.parametrize("reasons", [True, False])
def test_verdict_steps_show_the_examples_in_both_layouts(tmp_path, layout, reasons):
    """retrieval_precision builds its one step with the verdicts ask, not messages()."""
    from ragbatch.scoring.registry import get_metric

    record = {**EXAMPLES, "metric": "retrieval_precision"}
    params = {"examples_file": _file(tmp_path, record), "prompt_layout": layout}
    metric = get_metric("retrieval_precision").from_params({**params, "reasons": reasons})
    program = metric.program(ROW)
    (ask,) = next(program)
    system, user = ask.messages
    text = system.content if layout == "instructions_first" else user.content
    assert f"{RENDERED}\n\n## Your task\n" in text
    plain = get_metric("retrieval_precision").from_params(
        {"prompt_layout": layout, "reasons": reasons}
    )
    (plain_ask,) = next(plain.program(ROW))
    without = plain_ask.messages[0] if layout == "instructions_first" else plain_ask.messages[1]
    # the same prompt, with the examples inserted after the task's heading
    own = without.content
    if layout == "row_first":
        assert text == own.replace("## Task\n", f"## Task\n{RENDERED}\n\n## Your task\n", 1)
    else:
        head = "## Instructions: retrieval_precision\n"
        assert text == own.replace(head, f"{head}{RENDERED}\n\n## Your task\n", 1)


@pytest.mark.parametrize("layout", ["row_first", "instructions_first"])
def test_a_rubric_shows_the_examples(tmp_path, layout):
    from ragbatch.metrics.rubric import Rubric

    scale = {"criteria": "The answer names the author.", "scale": {"min": 1, "max": 5}}
    record = {**EXAMPLES, "metric": "rubric"}
    with_file = Rubric.from_params(
        {**scale, "prompt_layout": layout, "examples_file": _file(tmp_path, record)}
    )
    plain = Rubric.from_params({**scale, "prompt_layout": layout})
    (ask,) = next(with_file.program(ROW))
    (plain_ask,) = next(plain.program(ROW))
    index = 0 if layout == "instructions_first" else 1
    text, own = ask.messages[index].content, plain_ask.messages[index].content
    assert f"{RENDERED}\n\n## Your task\n" in text and RENDERED not in own
    assert ask.messages[1 - index] == plain_ask.messages[1 - index]
