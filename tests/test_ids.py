"""Ids that name directories cannot leave the output root, and deletes stay under the
prefix they own.

The reproduction: ``ragbatch run jobs/ares.yaml --output X/out --run-id
'../../../../../victim'`` exited 0, wrote scores, summary and manifest outside ``X/out``
and, on commit, deleted a directory outside it. Every entry point of an id (config,
each command-line flag, the API, ids ragbatch composes) is driven here with hostile ids
that hypothesis generates; the expected verdict comes from :func:`oracle`, written from
the documented rule, not from the code under test.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import string
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from ragbatch.cli import main
from ragbatch.config.job import JobConfig
from ragbatch.core.errors import ConfigError, OutputError
from ragbatch.core.ids import MAX_ID_LENGTH, check_id

REPO = Path(__file__).resolve().parents[1]
ARES = REPO / "examples/data/ares/datasets_v2__LLM_Judge_Test_Set_Human_Annotations.tsv"
SAFE = string.ascii_letters + string.digits + "-_."


def oracle(value: str) -> bool:
    """The documented rule: 1..128 characters of ASCII letters, digits, '-', '_', '.',
    not starting with '.' or '-'."""
    return (
        1 <= len(value) <= MAX_ID_LENGTH and all(c in SAFE for c in value) and value[0] not in ".-"
    )


#: Ids the issue names, and their relatives.
NAMED_HOSTILE = [
    "..",
    ".",
    "../../../../../victim",
    "a/b",
    "/abs",
    "a\\b",
    "..\\x",
    "",
    ".hidden",
    "-rf",
    "nul\x00byte",
    "tab\there",
    "line\nbreak",
    "esc\x1b[0m",
    "café",
    "ｆｕｌｌ",
    "x" * (MAX_ID_LENGTH + 1),
    "x" * 100_000,
    "run id",
    "a%2Fb",
    "run?id",
    "run*id",
    "run:id",
]

hostile_ids = st.one_of(
    st.sampled_from(NAMED_HOSTILE),
    # any text holding a character outside the alphabet
    st.tuples(
        st.text(SAFE, max_size=20),
        st.characters(blacklist_characters=SAFE, blacklist_categories=("Cs",)),
        st.text(max_size=20),
    ).map("".join),
    st.text(SAFE, min_size=MAX_ID_LENGTH + 1, max_size=MAX_ID_LENGTH + 300),
    st.tuples(st.sampled_from(".-"), st.text(SAFE, max_size=20)).map("".join),
    st.just(""),
)
QUICK = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@given(st.one_of(st.text(max_size=140), st.text(SAFE, max_size=140), hostile_ids))
@settings(max_examples=400, deadline=None)
def test_check_id_matches_the_documented_rule(value):
    if oracle(value):
        assert check_id(value, "--run-id") == value
    else:
        with pytest.raises(ConfigError) as info:
            check_id(value, "--run-id")
        text = str(info.value)
        assert text.startswith("--run-id: ") and "ASCII letters, digits" in text
        assert len(text) < 400  # a 100,000-character id is not echoed in full


@pytest.mark.parametrize(
    "value",
    ["20261129T190133Z-5a0775", "nightly-2026-11-28", "a..b", "_x", "A.b-c_1", "x" * MAX_ID_LENGTH],
)
def test_valid_ids_pass(value):
    assert check_id(value, "run id") == value


# -- config -------------------------------------------------------------------------------


def _job(**run) -> dict:
    return {
        "run": run,
        "input": {"uri": str(ARES)},
        "output": {"uri": "out"},
        "metrics": [{"name": "response_length", "params": {"min_chars": 1}}],
    }


@given(hostile_ids)
@QUICK
def test_config_refuses_hostile_run_ids(value):
    with pytest.raises(ConfigError, match=r"^run\.run_id: .*ASCII letters"):
        JobConfig.from_dict(_job(run_id=value))
    data = _job()
    data["calibration"] = {"uri": "cal", "run_id": value, "min_agreement": {"m": {"f1": 0.5}}}
    with pytest.raises(ConfigError, match=r"^calibration\.run_id: .*ASCII letters"):
        JobConfig.from_dict(data)


@given(hostile_ids)
@QUICK
def test_assignment_after_loading_is_checked(value):
    """The CLI and the templating set fields on a loaded config: a run id assigned
    there is checked as one in the file is."""
    from ragbatch.config.templating import render_config

    config = render_config(JobConfig.from_dict(_job()), dt.date(2026, 11, 28))
    with pytest.raises(ValidationError, match="ASCII letters"):
        config.run.run_id = value
    assert config.run.run_id is None


@given(hostile_ids)
@QUICK
def test_calibration_config_refuses_hostile_judge_names(value):
    from ragbatch.calibrate.config import calibration_from_dict

    data = yaml.safe_load((REPO / "jobs/calibrate_ares.yaml").read_text())
    data["engines"][value] = data["engines"].pop("judge")
    data["judges"] = [value]
    with pytest.raises(ConfigError, match=r"judges\[0\]: .*ASCII letters"):
        calibration_from_dict(data)


# -- command line -------------------------------------------------------------------------


def _argv_cases(config: str, value: str) -> list[tuple[list[str], str]]:
    """(argv, what argparse names) per run id argument; ``=`` and ``--`` keep an id that
    starts with ``-`` a value."""
    return [
        (["run", config, f"--run-id={value}"], "--run-id"),
        (["nightly", config, f"--run-id={value}"], "--run-id"),
        (["submit", config, f"--run-id={value}"], "--run-id"),
        (["calibrate", config, f"--run-id={value}"], "--run-id"),
        (["report", "--output", "out", "-o", "r.html", "--", value], "RUN_ID"),
        (["report", "--output", "out", "-o", "r.html", f"--baseline={value}", "ok"], "--baseline"),
        (["compare", "--output", "out", "--", value, "ok"], "BASELINE_RUN_ID"),
        (["compare", "--output", "out", "--", "ok", value], "CANDIDATE_RUN_ID"),
    ]


@given(hostile_ids)
@QUICK
def test_every_run_id_argument_refuses_hostile_ids_with_exit_2(tmp_path, value):
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(_job()))
    for argv, name in _argv_cases(str(config), value):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2, argv
        assert f"error: argument {name}: " in err.getvalue(), (argv, err.getvalue())
        assert "ASCII letters" in err.getvalue(), argv
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml"]


# -- API and composed ids -----------------------------------------------------------------


@given(hostile_ids)
@QUICK
def test_api_entry_points_refuse_hostile_ids_before_any_work(tmp_path, value):
    from ragbatch.calibrate.output import calibration_path
    from ragbatch.io.staging import Staging
    from ragbatch.io.write import OutputLayout
    from ragbatch.ops.nightly_job import run_nightly
    from ragbatch.pipeline.runner import run_job

    out = tmp_path / "out"
    config = JobConfig.from_dict({**_job(), "output": {"uri": str(out)}})
    with pytest.raises(ConfigError, match="^run id: "):
        run_job(config, run_id=value)
    outcome = run_nightly(config, run_id=value, run_date=dt.date(2026, 11, 28))
    assert outcome.exit_code == 2 and outcome.message.startswith("--run-id: ")
    with pytest.raises(ConfigError, match="^run id: "):
        Staging(OutputLayout.for_run(config.output, dt.date(2026, 11, 28), value))
    with pytest.raises(ConfigError, match="^calibration id: "):
        calibration_path(str(out), dt.date(2026, 11, 28), value)
    assert not out.exists()


def test_calibration_checks_each_judge_run_id_before_reading_anything(tmp_path):
    """``<calibration id>-<judge>`` is composed from two valid ids and may still be too
    long: refused before the labelled input is read or anything is written."""
    from ragbatch.calibrate.command import run_calibration
    from ragbatch.calibrate.config import calibration_from_dict

    data = yaml.safe_load((REPO / "jobs/calibrate_ares.yaml").read_text())
    data["input"]["uri"] = str(tmp_path / "missing.tsv")  # reading it would fail otherwise
    data["output"]["uri"] = str(tmp_path / "out")
    cal = calibration_from_dict(data)
    long_id = "c" * (MAX_ID_LENGTH - 3)
    with pytest.raises(ConfigError, match="judge run id of judge 'judge': .* characters long"):
        run_calibration(cal, run_id=long_id)
    with pytest.raises(ConfigError, match="^calibration id: '../x' starts with '.'"):
        run_calibration(cal, run_id="../x")
    assert list(tmp_path.iterdir()) == []


# -- deletes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "{root}",
        "{root}/",
        "{root}/..",
        "{root}/../victim",
        "{root}/run_id=x/../../victim",
        "{root}-sibling/x",
        "/",
        "{root}/./",
    ],
)
def test_delete_guard_refuses_paths_outside_the_owner(tmp_path, path):
    import fsspec

    from ragbatch.io.removal import ensure_under, remove_empty_dir, remove_under

    root = tmp_path / "out" / "_staging"
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "keep.txt").write_text("precious")
    (tmp_path / "out" / "_staging-sibling" / "x").mkdir(parents=True)
    root.mkdir(parents=True, exist_ok=True)
    target = path.format(root=root)
    fs = fsspec.filesystem("file")
    with pytest.raises(OutputError, match="refusing to delete"):
        ensure_under(str(root), target)
    with pytest.raises(OutputError, match="refusing to delete"):
        remove_under(fs, str(root), target, recursive=True)
    with pytest.raises(OutputError, match="refusing to delete"):
        remove_empty_dir(fs, str(root), target)
    assert (tmp_path / "victim" / "keep.txt").read_text() == "precious"
    assert root.is_dir() and (tmp_path / "out" / "_staging-sibling" / "x").is_dir()


def test_delete_guard_accepts_what_lies_below(tmp_path):
    import fsspec

    from ragbatch.io.removal import remove_empty_dir, remove_under

    fs = fsspec.filesystem("file")
    root = tmp_path / "_staging"
    (root / "run_id=a" / "scores").mkdir(parents=True)
    (root / "run_id=a" / "scores" / "f.parquet").write_bytes(b"x")
    (root / "run_id=b").mkdir()
    assert not remove_empty_dir(fs, str(tmp_path), str(root))  # not empty: kept
    remove_under(fs, str(root), str(root / "run_id=a"), recursive=True)
    assert sorted(p.name for p in root.iterdir()) == ["run_id=b"]
    assert not remove_empty_dir(fs, str(tmp_path), str(root))
    (root / "run_id=b").rmdir()
    assert remove_empty_dir(fs, str(tmp_path), str(root)) and not root.exists()
    assert tmp_path.is_dir()


# -- the reproduction, end to end ---------------------------------------------------------


def _ragbatch(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("ragbatch")
    return subprocess.run([str(exe), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # a `ragbatch` subprocess
def test_reproduction_exits_2_and_touches_nothing_outside_the_root(tmp_path):
    """The issue's command, with a directory where its commit used to delete: the
    staging prefix ``<out>/_staging/run_id=../../../../../victim`` is ``<out>/../../victim``
    (the scores, summary and manifest landed in ``<out>/../victim``)."""
    work = tmp_path / "a" / "b" / "c" / "d"
    work.mkdir(parents=True)
    victim = work.parent / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    run = _ragbatch(
        "run",
        str(REPO / "jobs/ares.yaml"),
        "--output",
        str(work / "out"),
        "--run-id",
        "../../../../../victim",
        cwd=REPO,
    )
    assert run.returncode == 2, run.stderr
    assert "argument --run-id: run id '../../../../../victim' starts with '.'" in run.stderr
    night = _ragbatch(
        "nightly",
        str(REPO / "jobs/ares.yaml"),
        "--output",
        str(work / "out"),
        "--run-id",
        "../../../../../victim",
        cwd=REPO,
    )
    assert night.returncode == 2, night.stderr
    config = yaml.safe_load((REPO / "jobs/ares.yaml").read_text())
    config["run"]["run_id"] = "../../../../../victim"
    config["output"]["uri"] = str(work / "out")
    config["input"]["uri"] = str(REPO / config["input"]["uri"])
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(config))
    in_file = _ragbatch("run", str(tmp_path / "job.yaml"), cwd=REPO)
    assert in_file.returncode == 2 and "run.run_id: '../../../../../victim'" in in_file.stderr
    (tmp_path / "job.yaml").unlink()
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert (victim / "keep.txt").read_text() == "precious"
