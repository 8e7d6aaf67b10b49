"""The command line: exit codes, messages for bad input, and one real run as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ragbatch.cli import main
from ragbatch.core.engine_registry import engine_names
from ragbatch.scoring.registry import all_metrics

REPO = Path(__file__).resolve().parents[1]
ARES = REPO / "examples/data/ares/datasets_v2__LLM_Judge_Test_Set_Human_Annotations.tsv"


def _write_config(tmp_path: Path, **overrides) -> Path:
    config = {
        "input": {
            "uri": str(ARES),
            "columns": {"question": "Question", "contexts": "Document", "answer": "Answer"},
        },
        "output": {"uri": str(tmp_path / "out")},
        "metrics": [{"name": "response_length", "params": {"min_chars": 1}}],
    }
    for key, value in overrides.items():
        config[key] = value
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True))
    return path


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_metrics_lists_every_metric(capsys):
    code, out, _ = _run(capsys, "metrics")
    assert code == 0
    for cls in all_metrics():
        assert f"{cls.name}  [" in out
    code, out, _ = _run(capsys, "metrics", "--json")
    assert {d["name"] for d in json.loads(out)} == {c.name for c in all_metrics()}


#: The judge engine types, from the engine registry.
JUDGES = list(engine_names("judge"))
#: The engines a metric needs, as docs/judges.md and the metric docs describe them.
ENGINES = {
    "faithfulness": (JUDGES, []),
    "context_relevancy": (JUDGES, []),
    "answer_relevancy": (JUDGES, ["embedding"]),
    "semantic_similarity": (["embedding", "cross_encoder"], []),
    "answer_contains_pii": (["presidio"], []),
    "context_contains_pii": (["presidio"], []),
    "exact_match": ([], []),
    "binary": ([], []),
    "latency": ([], []),
}


def test_metrics_says_which_engine_each_metric_needs(capsys):
    code, out, _ = _run(capsys, "metrics", "--json")
    described = {d["name"]: d for d in json.loads(out)}
    assert {
        name: (described[name]["engine"], described[name]["second_engine"]) for name in ENGINES
    } == ENGINES
    # every metric says it: judges a judge engine, expressions none
    for d in described.values():
        assert {"engine", "second_engine"} <= set(d), d["name"]
        if d["kind"] == "judge":
            assert d["engine"] == JUDGES, d["name"]
        if d["kind"] == "expression":
            assert d["engine"] == [] and d["second_engine"] == [], d["name"]
    code, out, _ = _run(capsys, "metrics")
    lines = out.splitlines()
    engine_of = {
        lines[i].split("  [", 1)[0]: lines[i + 2].strip()
        for i, line in enumerate(lines)
        if "  [" in line and not line.startswith(" ")
    }
    assert engine_of["faithfulness"] == f"engine: {' or '.join(JUDGES)}"
    assert engine_of["answer_relevancy"] == f"engine: {' or '.join(JUDGES)}, and embedding"
    assert engine_of["semantic_similarity"] == "engine: embedding or cross_encoder"
    assert engine_of["answer_contains_pii"] == "engine: presidio"
    assert engine_of["exact_match"] == "engine: none"


@pytest.mark.parametrize("job", ["ares.yaml", "tonic_paul_graham.yaml", "trulens_trace.yaml"])
def test_validate_shipped_jobs(capsys, monkeypatch, job):
    monkeypatch.chdir(REPO)
    code, out, err = _run(capsys, "validate", f"jobs/{job}")
    assert code == 0, err
    assert "stage expressions:" in out and "writable" in out


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        ({"metrics": [{"name": "exact_mach"}]}, ["metrics[0].name", "did you mean 'exact_match'"]),
        (
            {"metrics": [{"name": "regex", "params": {"pattern": "(a"}}]},
            ["metrics[0].params.pattern", "invalid regular expression"],
        ),
        (
            {"metrics": [{"name": "response_length", "params": {"min_chars": 9, "max_chars": 2}}]},
            ["metrics[0].params", "min_chars (9) is greater than max_chars (2)"],
        ),
        (
            {"metrics": [{"name": "exact_match"}]},
            ["exact_match reads `reference`", "input.columns maps nothing to reference"],
        ),
        (
            {
                "metrics": [
                    {"name": "regex", "params": {"pattern": "a"}},
                    {"name": "regex", "params": {"pattern": "b"}},
                ]
            },
            ["metrics[1]: id 'regex' is already used by metrics[0]"],
        ),
        (
            {"metrics": [{"name": "semantic_similarity", "engine": "nope"}]},
            ["metrics[0].engine: 'nope' is not defined under `engines`"],
        ),
        ({"metrics": []}, ["metrics: List should have at least 1 item"]),
        ({"outptu": {"uri": "x"}}, ["outptu: unknown field (did you mean 'output'?)"]),
    ],
)
def test_bad_config_exits_2_with_field_named(capsys, tmp_path, overrides, fragments):
    code, out, err = _run(capsys, "validate", str(_write_config(tmp_path, **overrides)))
    assert code == 2
    for fragment in fragments:
        assert fragment in err, err


def test_missing_mapped_column_lists_existing_columns(capsys, tmp_path):
    cfg = _write_config(tmp_path, input={"uri": str(ARES), "columns": {"answer": "Answr"}})
    code, _, err = _run(capsys, "validate", str(cfg))
    assert code == 2
    assert "Answr" in err and "Question" in err and "Document" in err


def test_missing_input_path(capsys, tmp_path):
    cfg = _write_config(
        tmp_path, input={"uri": str(tmp_path / "nope.tsv"), "columns": {"answer": "Answer"}}
    )
    code, _, err = _run(capsys, "run", str(cfg))
    assert code == 2 and "nope.tsv" in err


def test_missing_relative_input_names_the_working_directory(capsys, tmp_path, monkeypatch):
    """A relative input path is taken from the directory ragbatch runs in; when it is not
    there, the error says which directory that was."""
    monkeypatch.chdir(tmp_path)
    cfg = _write_config(tmp_path, input={"uri": "data/nope.csv", "columns": {"answer": "a"}})
    code, _, err = _run(capsys, "validate", str(cfg))
    assert code == 2
    assert "data/nope.csv: not found" in err
    assert f"a relative path is taken from the directory ragbatch runs in, {tmp_path}" in err
    # an absolute path gets no such note
    cfg = _write_config(
        tmp_path, input={"uri": str(tmp_path / "nope.csv"), "columns": {"answer": "a"}}
    )
    code, _, err = _run(capsys, "validate", str(cfg))
    assert code == 2 and "relative path" not in err


def test_metrics_into_a_closed_pipe_exits_0_without_a_traceback():
    """`ragbatch metrics --json | head -c 10`: the reader goes away after a few bytes."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ragbatch", "metrics", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(10) == b'[\n  {\n    '
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "BrokenPipeError" not in err


def test_mis_encoded_input(capsys, tmp_path):
    bad = tmp_path / "latin1.csv"
    bad.write_bytes("question,answer\nq,caf\xe9\n".encode("latin-1"))
    cfg = _write_config(tmp_path, input={"uri": str(bad), "columns": {"answer": "answer"}})
    code, _, err = _run(capsys, "validate", str(cfg))
    assert code == 2 and "latin1.csv" in err and "input.encoding" in err


def test_missing_config_file(capsys, tmp_path):
    code, _, err = _run(capsys, "validate", str(tmp_path / "absent.yaml"))
    assert code == 2 and "does not exist" in err


@pytest.mark.slow
def test_run_as_a_user_would(tmp_path):
    """`ragbatch run` in a fresh process, overriding the output, as the README shows."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [
            str(Path(sys.executable).with_name("ragbatch")),
            "run",
            "jobs/ares.yaml",
            "--output",
            str(tmp_path / "out"),
            "--run-id",
            "cli-test",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "run cli-test committed (200 rows x 6 metrics = 1200 cells)" in proc.stdout
    manifest = (
        tmp_path
        / "out/runs"
        / next((tmp_path / "out/runs").iterdir()).name
        / "run_id=cli-test/manifest.json"
    )
    assert json.loads(manifest.read_text())["rows"]["input"] == 200


@pytest.mark.slow
def test_run_on_an_existing_cluster_via_address(ray_local, tmp_path):
    """`--address` connects to a running Ray cluster instead of starting one: here the
    test session's own Ray instance, which a `ragbatch run` in a fresh process joins."""
    address = ray_local.get_runtime_context().gcs_address
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [
            str(Path(sys.executable).with_name("ragbatch")),
            "run",
            "jobs/ares.yaml",
            "--output",
            str(tmp_path / "out"),
            "--run-id",
            "on-cluster",
            "--address",
            address,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Connecting to existing Ray cluster" in proc.stderr
    manifest = next((tmp_path / "out/runs").glob("run_date=*/run_id=on-cluster/manifest.json"))
    recorded = json.loads(manifest.read_text())["ray"]["address"]
    assert recorded.split(":")[-1] == address.split(":")[-1]


def test_unreachable_judge_server_fails_before_any_actor_starts(capsys, tmp_path):
    pytest.importorskip("openai")
    config = tmp_path / "job.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "input": {
                    "uri": str(
                        REPO
                        / "examples/data/ares/datasets_v2__LLM_Judge_Test_Set_Human_Annotations.tsv"
                    ),
                    "columns": {"question": "Question", "contexts": "Document", "answer": "Answer"},
                },
                "output": {"uri": str(tmp_path / "out")},
                "engines": {
                    "judge": {
                        "kind": "openai",
                        "base_url": "http://127.0.0.1:9/v1",
                        "model": "judge",
                    }
                },
                "metrics": [{"name": "hate_speech", "engine": "judge"}],
            }
        )
    )
    for command in ("validate", "run"):
        code, out, err = _run(capsys, command, str(config))
        assert code == 1, (command, out, err)
        assert "engines.judge: the openai engine cannot reach http://127.0.0.1:9/v1" in err
    assert not (tmp_path / "out").exists()
