"""The small tools of ``benchmarks/``: the instant stand-in judge's replies, the
prompt-token accounting's prefix cache, and the calibration benchmark's sample and
agreement table (all feed figures in BENCHMARKS.md)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from ragbatch.judge.parse import (
    parse_statements,
    parse_verdicts,
    statements_schema,
    verdicts_schema,
)

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(
        name.replace("/", "_"), ROOT / "benchmarks" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def instant():
    return _load("instant_judge")


@pytest.fixture(scope="module")
def accounting():
    return _load("prompt_accounting")


@pytest.mark.parametrize("n, reasons", [(1, True), (3, True), (5, False)])
def test_instant_verdicts_parse_as_all_ones(instant, n, reasons):
    body = {"structured_outputs": {"json": verdicts_schema(n, reasons)}}
    assert parse_verdicts(instant.reply_text(body), n, reasons) == [1] * n


def test_instant_replies_follow_each_request_form(instant):
    assert parse_statements(
        instant.reply_text({"structured_outputs": {"json": statements_schema()}})
    ) == ["ok"]
    assert instant.reply_text({"structured_outputs": {"choice": ["3", "4"]}}) == "3"
    fmt = {
        "type": "json_schema",
        "json_schema": {
            "name": "x",
            "schema": {
                "type": "object",
                "properties": {
                    "score": {"type": "number", "minimum": 0.5},
                    "ok": {"type": "boolean"},
                },
                "required": ["score", "ok"],
            },
        },
    }
    assert json.loads(instant.reply_text({"response_format": fmt})) == {"score": 0.5, "ok": True}
    # Tonic Validate's free-text prompts: a score for answer similarity, else true
    tonic = lambda text: {"messages": [{"role": "user", "content": text}]}  # noqa: E731
    assert instant.reply_text(tonic("...\nREFERENCE ANSWER: 42\nNEW ANSWER: 42\n")) == "4"
    assert instant.reply_text(tonic("...\nQUESTION: 问题 👍\nCONTEXT: é\n")) == "true"


def test_instance_of_arrays_objects_and_choices(instant):
    schema = {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": 2,
                "items": {"anyOf": [{"type": "integer", "minimum": 3}]},
            },
            "label": {"enum": ["a", "b"]},
            "note": {"type": "string"},
        },
        "required": ["items", "label"],
    }
    assert instant.instance(schema) == {"items": [3, 3], "label": "b"}


def test_prefix_cache_reuses_whole_blocks_of_the_longest_seen_prefix(accounting):
    cache = accounting.PrefixCache(4)
    assert cache.served(list(range(10))) == 0  # nothing seen yet
    assert cache.served(list(range(9)) + [99]) == 8  # 9 shared -> 2 blocks
    assert cache.served(list(range(8))) == 4  # never its last token
    assert cache.served(list(range(3)) + [7, 7, 7, 7, 7]) == 0  # first block differs
    assert cache.served([0, 1, 2, 7, 7, 7, 7, 7, 1]) == 8  # the line above is cached now


def test_tonic_chats_are_one_plus_two_per_context(accounting):
    templates = {"sim": "SIM", "rel": "REL", "contains": "CON"}
    row = {"question": "q?", "reference": "r", "answer": "a", "contexts": ["c1", "c2", "c3"]}
    chats = accounting.tonic_chats(row, templates)
    assert len(chats) == 1 + 2 * 3
    users = [c[1]["content"] for c in chats]
    assert users[0].startswith("SIM\nQUESTION: q?\nREFERENCE ANSWER: r\nNEW ANSWER: a")
    assert users[1:4] == [f"REL\nQUESTION: q?\nCONTEXT: {c}\n" for c in row["contexts"]]
    assert users[4:] == [f"CON\nANSWER: a\nCONTEXT: {c}\n" for c in row["contexts"]]
    assert all(c[0] == {"role": "system", "content": accounting.TONIC_SYSTEM} for c in chats)


def test_task_tokens_count_what_follows_the_shared_block(accounting):
    def encode(chat):  # one token per character of the messages, in order
        return [ord(ch) for m in chat for ch in m["content"]]

    chat = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "## Question\n问题 é\n\n## Task\nRate it 👍"},
    ]
    assert accounting.task_tokens(chat, encode) == len("\n\n## Task\nRate it 👍")
    tonic = [{"role": "user", "content": "REL\nQUESTION: q\n"}]
    assert accounting.task_tokens(tonic, encode) == 0


# -- benchmarks/calibrate.py and benchmarks/gpu/judge_ready.py -----------------------------


@pytest.fixture(scope="module")
def calib():
    return _load("calibrate")


@pytest.fixture(scope="module")
def ready():
    return _load("gpu/judge_ready")


def test_stratified_sample_keeps_up_to_n_rows_per_label_in_input_order(calib):
    import polars as pl

    frame = pl.DataFrame({"gold": ["a", "b", "a", "a", "b", "c", "a"]})
    positions, counts = calib.stratified_positions(frame, ["gold"], 2, seed=0)
    assert counts == {"a": 2, "b": 2, "c": 1}  # c has one row: kept alone
    assert positions == sorted(positions) and len(positions) == 5
    assert {1, 4, 5} <= set(positions)  # every b and c row
    assert set(positions) - {1, 4, 5} <= {0, 2, 3, 6}  # two of the four a rows
    assert calib.stratified_positions(frame, ["gold"], 2, seed=0) == (positions, counts)
    assert calib.stratified_positions(frame, ["gold"], 4) == (
        list(range(7)),
        {"a": 4, "b": 2, "c": 1},
    )


def test_several_label_columns_make_one_stratum_per_combination(calib):
    import polars as pl

    frame = pl.DataFrame({"f": [1, 1, 0, 1], "r": ["1", "0", "1", "1"]})
    assert calib.stratum_keys(frame, ["f", "r"]) == ["1 | 1", "1 | 0", "0 | 1", "1 | 1"]
    positions, counts = calib.stratified_positions(frame, ["f", "r"], 1, seed=3)
    assert counts == {"0 | 1": 1, "1 | 0": 1, "1 | 1": 1}
    assert positions in ([0, 1, 2], [1, 2, 3])  # one of the two "1 | 1" rows


def test_unicode_labels_are_strata_as_written(calib):
    import polars as pl

    frame = pl.DataFrame({"étiquette": ["仇恨", "haineux", " 仇恨 ", "non-haineux 👍"]})
    positions, counts = calib.stratified_positions(frame, ["étiquette"], 5)
    assert counts == {"haineux": 1, "non-haineux 👍": 1, "仇恨": 2}
    assert positions == [0, 1, 2, 3]


@pytest.mark.parametrize("cells", [["x", None, "y"], ["x", "  ", "y"]])
def test_a_missing_label_is_an_error_naming_the_column(calib, cells):
    import polars as pl

    frame = pl.DataFrame({"label_gold": cells})
    with pytest.raises(
        ValueError,
        match=r"label column 'label_gold' has 1 null or empty cell\(s\), "
        r"the first at input row 1",
    ):
        calib.stratified_positions(frame, ["label_gold"], 2)
    with pytest.raises(ValueError, match="label column 'gold' is not in the input"):
        calib.stratified_positions(frame, ["gold"], 2)


def test_pairs_are_drawn_whole(calib):
    picked = calib.sampled_pairs(10, 3, seed=0)
    assert len(picked) == 3 == len(set(picked)) and picked == sorted(picked)
    assert all(0 <= p < 10 for p in picked)
    assert calib.sampled_pairs(4, 9) == [0, 1, 2, 3]


def test_sample_is_written_in_the_input_format_and_the_config_points_at_it(
    calib, tmp_path, monkeypatch
):
    monkeypatch.setattr(calib, "WORK", tmp_path)
    source = tmp_path / "cases.csv"
    source.write_text(
        'test_case,label_gold\n"two\nlines, é",hateful\nb,non-hateful\nc,hateful\nd,non-hateful\n',
        encoding="utf-8",
    )
    config = {
        "input": {"uri": str(source), "format": "csv", "columns": {"answer": "test_case"}},
        "limit": 3,
        "output": {"uri": str(tmp_path / "out")},
        "engines": {"judge": {"kind": "vllm", "model": "m"}},
        "judges": ["judge"],
        "metrics": [{"name": "hate_speech"}],
        "labels": {
            "hate_speech": {
                "column": "label_gold",
                "type": "binary",
                "values": {"hateful": 1, "non-hateful": 0},
            }
        },
    }
    record = calib.sample_input(config, "hc", 5, seed=0)
    assert config["input"]["uri"] == str(tmp_path / "hc_sample.csv") and "limit" not in config
    assert record["per_stratum"] == {"hateful": 2, "non-hateful": 2}
    assert record["positions"] == [0, 1, 2, 3] and record["input_rows"] == 4
    back = calib.read_input(config)
    assert back["test_case"].to_list() == ["two\nlines, é", "b", "c", "d"]

    pairs = tmp_path / "qa.jsonl"
    pairs.write_text(
        "".join(
            json.dumps(
                {
                    "question": f"q{i}",
                    "knowledge": "k",
                    "right_answer": "r",
                    "hallucinated_answer": "h",
                }
            )
            + "\n"
            for i in range(5)
        )
    )
    config = {
        "input": {
            "uri": str(pairs),
            "format": "jsonl",
            "columns": {"question": "question", "contexts": "knowledge"},
        },
        "pairs": {
            "answers": {"right_answer": 1, "hallucinated_answer": 0},
            "label_column": "faithful",
        },
        "output": {"uri": str(tmp_path / "out")},
        "engines": {"judge": {"kind": "vllm", "model": "m"}},
        "judges": ["judge"],
        "metrics": [{"name": "faithfulness"}],
        "labels": {"faithfulness": {"column": "faithful", "type": "binary"}},
    }
    record = calib.sample_input(config, "qa", 2, seed=0)
    assert record["pairs"] and record["rows"] == 2 and record["per_stratum"] == {"1": 2, "0": 2}
    back = calib.read_input(config)
    assert back["question"].to_list() == [f"q{p}" for p in record["positions"]]


def test_gpu_engine_drops_the_cpu_demo_settings(calib):
    cpu = {
        "kind": "vllm",
        "model": "models/smollm2",
        "num_gpus": 0,
        "batch_size": 64,
        "engine_kwargs": {"enforce_eager": True, "max_num_seqs": 8},
        "max_tokens": 128,
    }
    assert calib.judge_engine(cpu, "/m", 0, None) == {**cpu, "model": "/m"}
    assert calib.judge_engine(cpu, "/m", 0, 32)["max_tokens"] == 32
    gpu = calib.judge_engine({**cpu, "dtype": "float32"}, "/m", 2, None)
    assert gpu == {
        "kind": "vllm",
        "model": "/m",
        "num_gpus": 2,
        "tensor_parallel_size": 2,
        "batch_size": 64,
        "engine_kwargs": {"max_num_seqs": 8},
    }
    assert cpu["engine_kwargs"] == {"enforce_eager": True, "max_num_seqs": 8}  # not changed


def test_grammar_backend_is_set_in_the_engine_kwargs(calib):
    cpu = {"kind": "vllm", "model": "models/smollm2", "engine_kwargs": {"enforce_eager": True}}
    spec = calib.judge_engine(cpu, "/m", 0, None, "guidance")
    assert spec["engine_kwargs"] == {
        "enforce_eager": True,
        "structured_outputs_config": {"backend": "guidance", "disable_any_whitespace": True},
    }
    assert cpu["engine_kwargs"] == {"enforce_eager": True}  # not changed
    assert (
        "structured_outputs_config" not in calib.judge_engine(cpu, "/m", 0, None)["engine_kwargs"]
    )


def _agreement_table():
    """An ``agreement.parquet`` as ``ragbatch calibrate`` writes it, values set by hand."""
    import polars as pl
    import pyarrow as pa

    from ragbatch.calibrate.output import SCHEMAS

    base = {
        "judge": "judge",
        "model": "m",
        "metric": "hate_speech",
        "metric_name": "hate_speech",
        "metric_version": 1,
        "prompt_version": "p",
        "label_column": "label_gold",
        "label_type": "binary",
        "scores_run_id": "bench-judge",
        "n_cells": 6,
        "n_ok": 5,
        "n_labelled": 6,
    }
    rows = [
        ("accuracy", 5, 0.6, 0.2, 1.0, None),
        ("kappa", 5, 0.2, -0.5, 1.0, None),
        ("roc_auc", 5, 0.5833333, 0.25, 0.9166667, None),
        ("brier", 5, None, None, None, "hard verdicts"),
        ("ece", 5, None, None, None, "hard verdicts"),
    ]
    return pl.from_arrow(
        pa.Table.from_pylist(
            [
                {
                    **base,
                    "measure": m,
                    "n": n,
                    "value": v,
                    "ci_low": lo,
                    "ci_high": hi,
                    "reason": why,
                }
                for m, n, v, lo, hi, why in rows
            ],
            schema=SCHEMAS["agreement"],
        )
    )


def test_agreement_records_and_their_table(calib):
    records = calib.agreement_records(_agreement_table())
    assert len(records) == 1
    rec = records[0]
    assert (rec["metric"], rec["n_cells"], rec["n_ok"]) == ("hate_speech", 6, 5)
    assert rec["measures"]["accuracy"] == {
        "n": 5,
        "value": 0.6,
        "low": 0.2,
        "high": 1.0,
        "reason": None,
    }
    assert calib.format_measure(rec["measures"]["roc_auc"]) == "0.583 [0.250, 0.917]"
    assert calib.format_measure(rec["measures"]["brier"]) == "n/a"
    assert calib.format_measure({"value": 0.5, "low": None, "high": None}) == "0.500"
    result = {
        "config": "hatecheck",
        "agreement": records,
        "judge_calls": 6,
        "verdicts_per_s": 0.04,
        "wall_s": 151.27,
    }
    rows = calib.table_rows(result)
    assert calib.measures_present(rows) == ["accuracy", "kappa", "roc_auc"]  # brier/ece undefined
    assert calib.markdown_table(rows).splitlines() == [
        "| config | metric | n | accuracy | kappa | roc_auc | judge calls | verdicts/s | wall s | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
        "| hatecheck | hate_speech | 5 | 0.600 [0.200, 1.000] | 0.200 [-0.500, 1.000] "
        "| 0.583 [0.250, 0.917] | 6 | 0.04 | 151.3 | 5 of 6 verdicts ok |",
    ]
    failed = calib.table_rows({"config": "ares", "error": "exit 1: InputError: x|y", "wall_s": 9.0})
    assert (
        calib.markdown_table(failed).splitlines()[-1]
        == "| ares |  |  |  |  | 9.0 | error: exit 1: InputError: x/y |"
    )


def test_judge_ready_merges_the_parts_it_has(ready, calib):
    records = calib.agreement_records(_agreement_table())
    cal_ok = {
        "part": "calibrate:hatecheck",
        "wall_s": 160.0,
        "error": None,
        "result": {
            "results": [
                {
                    "config": "hatecheck",
                    "agreement": records,
                    "judge_calls": 6,
                    "verdicts_per_s": 0.04,
                    "wall_s": 151.3,
                }
            ]
        },
    }
    cal_dead = {
        "part": "calibrate:ares",
        "wall_s": 3.5,
        "error": "exit 1: ImportError: vllm",
        "result": None,
    }
    throughput = {
        "part": "throughput",
        "wall_s": 420.0,
        "error": None,
        "result": {
            "judge": [
                {
                    "batch_rows": 64,
                    "rows": 200,
                    "metrics": ["a", "b"],
                    "requests": 400,
                    "stage_s": 20.0,
                    "raw_s": 19.0,
                    "ratio": 0.95,
                }
            ]
        },
    }
    rows = ready.merge([cal_ok, cal_dead, throughput])
    assert [r["config"] for r in rows] == [
        "hatecheck",
        "ares",
        "ARES, judge stage (64 rows/call) vs raw vLLM",
    ]
    assert rows[1]["note"] == "error: exit 1: ImportError: vllm"
    assert (rows[2]["verdicts_per_s"], rows[2]["raw_fraction"], rows[2]["n"]) == (20.0, 0.95, 200)
    lines = calib.markdown_table(rows).splitlines()
    assert lines[0].endswith("| judge calls | verdicts/s | wall s | of raw vLLM | note |")
    assert lines[2].endswith("| 0.583 [0.250, 0.917] | 6 | 0.04 | 151.3 |  | 5 of 6 verdicts ok |")
    assert lines[4] == (
        "| ARES, judge stage (64 rows/call) vs raw vLLM | a, b | 200 |  |  |  "
        "| 400 | 20.00 | 420.0 | 0.950 |  |"
    )
    no_run = ready.merge(
        [{"part": "throughput", "wall_s": 1.0, "error": "exit 1: x", "result": None}]
    )
    assert no_run[0]["note"] == "error: exit 1: x"


def test_judge_ready_names_the_child_failure_not_the_wrapper(ready):
    text = (
        "Traceback (most recent call last):\n  File x\nValueError: bad model dir\n\n"
        "Traceback (most recent call last):\nsubprocess.CalledProcessError: Command 'x' "
        "returned non-zero exit status 1.\n"
    )
    assert ready.last_line(text) == "ValueError: bad model dir"
    assert ready.last_line("warning\nKilled\n") == "Killed"
    assert ready.last_line("") == ""


def test_judge_ready_commands(ready):
    smoke = ready.parse_args(["--cpu-smoke"])
    assert (smoke.num_gpus, smoke.per_label, smoke.configs, smoke.model) == (
        0,
        1,
        "hatecheck",
        None,
    )
    command = ready.throughput_command(smoke, Path("/o"))
    assert command[2:] == [
        "--skip-similarity",
        "--num-gpus",
        "0",
        "--out-dir",
        "/o",
        "--judge-rows",
        "2",
        "--max-tokens",
        "16",
        "--judge-batch-rows",
        "2",
        "--repeats",
        "1",
    ]
    gpu = ready.parse_args(["--model", "/models/j"])
    assert (gpu.num_gpus, gpu.per_label, gpu.configs) == (1, 200, "ares,halueval,hatecheck,trec_dl")
    assert ready.calibrate_command(gpu, "ares", Path("/o/c.json"))[2:] == [
        "--configs",
        "ares",
        "--per-label",
        "200",
        "--num-gpus",
        "1",
        "--out",
        "/o/c.json",
        "--judge-model",
        "/models/j",
    ]
    with pytest.raises(SystemExit):
        ready.parse_args([])


def test_judge_ready_table_of_recorded_parts(ready, calib):
    """Parts recorded from real runs (tests/data/bench/judge_ready_parts.json)."""
    parts = json.loads((ROOT / "tests" / "data" / "bench" / "judge_ready_parts.json").read_text())[
        "parts"
    ]
    rows = ready.merge(parts)
    assert [(r["config"], r.get("n")) for r in rows] == [
        ("hatecheck", 6),
        ("ares", None),
        ("ARES, judge stage (2 rows/call) vs raw vLLM", 2),
    ]
    assert rows[0]["measures"]["accuracy"]["value"] == 0.5 and rows[0]["judge_calls"] == 6
    assert rows[1]["note"].startswith("error: exit 1: --judge-model /models/missing")
    lines = calib.markdown_table(rows).splitlines()
    assert lines[0] == (
        "| config | metric | n | accuracy | kappa | roc_auc | judge calls | verdicts/s "
        "| wall s | of raw vLLM | note |"
    )
    assert lines[2] == (
        "| hatecheck | hate_speech | 6 | 0.500 [0.167, 0.833] | 0.000 [0.000, 0.000] "
        "| 0.500 [0.500, 0.500] | 6 | 0.04 | 176.9 |  |  |"
    )
    assert lines[4].endswith("| 2 |  |  |  | 10 | 2.40 | 67.1 | 0.946 |  |")


# -- the model stage's GPU script, run on the CPU at a tiny size so that it does not rot --


@pytest.mark.slow
def test_gpu_model_stage_script_runs_on_cpu(tmp_path):
    """benchmarks/gpu/model_stage.py on 24 distinct Paul Graham rows in calls of 8 rows:
    the stage's scores equal raw sentence-transformers' (the same model, the same texts),
    and the instant stand-in takes a smaller share of the stage's time than the model;
    its sweeps and its cross-encoder half run too (the cross-encoder's scores equal raw
    ``CrossEncoder.predict``'s)."""
    script = _load("gpu/model_stage")
    result = script.main(
        [
            "--rows",
            "24",
            "--batch-rows",
            "8",
            "--repeat",
            "1",
            "--device",
            "cpu",
            "--cross-rows",
            "8",
            "--sweep-encode",
            "4",
            "--sweep-rows",
            "4",
            "--sweep-size",
            "8",
            "--out",
            str(tmp_path),
        ]
    )
    saved = json.loads((tmp_path / "model_stage_gpu.json").read_text())
    # the sweeps: raw and the stage at 4 texts a pass, then the stage at 4 rows a call
    assert [
        (s["batch_rows"], s["encode_batch"], "raw_rows_per_s" in s) for s in saved["sweep"]
    ] == [
        (8, 4, True),
        (4, 8, False),
    ]
    cross = saved["cross_encoder"]  # the cross-encoder half on the first 8 rows
    assert cross["rows"] == 8 and cross["max_abs_score_diff"] < 1e-6
    assert saved["rows"] == result["rows"] == 24 and saved["batch_rows"] == 8
    from ragbatch.engines.sentence_transformers import CPU_ENCODE_BATCH

    assert saved["encode_batch"] == CPU_ENCODE_BATCH == 8  # the model stage's CPU default
    assert saved["max_abs_score_diff"] < 1e-5
    assert set(saved["rows_per_s"]) == {"raw", "stage", "instant"}
    assert 0 < saved["overhead_share"] < 1
    assert saved["stage_over_raw"] > 0


def test_instant_model_stand_in_gives_unit_vectors_from_lengths():
    module = _load("instant_model")
    vectors = module.InstantEncoder().encode(["", "ab", "abcd", "\u4f60\u597d"])
    import numpy as np

    # two numbers per text, cos and sin of len / 50: unit vectors whatever the text
    assert vectors.shape == (4, 2)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0)
    assert np.allclose(vectors[1], [np.cos(2 / 50), np.sin(2 / 50)])
    assert np.allclose(vectors[3], vectors[1])  # two characters each, CJK included
