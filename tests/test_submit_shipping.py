"""What ``ragbatch submit`` ships without a checkout, and the entry point it builds.

No cluster here: :func:`ragbatch.ops.submit.prepare_job` contacts none, and
:func:`ragbatch.ops.shipping.assemble` writes the working directory Ray would upload.
``tests/test_cluster_submit.py`` submits such a directory to a real cluster.
"""

from __future__ import annotations

import datetime as dt
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ragbatch.cli import main
from ragbatch.core.errors import ConfigError
from ragbatch.ops.shipping import assemble
from ragbatch.ops.submit import prepare_job

REPO = Path(__file__).resolve().parents[1]
DAY = dt.date(2026, 11, 28)
CALLBACK = "import polars as pl\n\ndef long_enough(batch):\n    return batch['answer'].str.len_chars() > 3\n"


@pytest.fixture(autouse=True)
def _isolated_imports(monkeypatch, tmp_path):
    """Each test imports its own callback modules: restore ``sys.path`` and forget the
    modules it imported; run in an empty folder of its own."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("shipcb"):
            del sys.modules[name]


def _config(folder: Path, callback: str | None = None, name: str = "job.yaml", **sections) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    metrics = [{"name": "exact_match"}]
    if callback:
        metrics.append({"name": "binary", "params": {"callback": callback}})
    config = {
        "input": {
            "uri": str(folder / "data.csv"),
            "format": "csv",
            "columns": {"answer": "a", "reference": "r"},
        },
        "output": {"uri": str(folder / "out")},
        "metrics": metrics,
        **sections,
    }
    path = folder / name
    path.write_text(yaml.safe_dump(config))
    return path


def _tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_the_config_and_its_callback_module_go_and_nothing_else(tmp_path):
    """A config outside the current folder, a callback module next to it, and files
    that must stay home: a data file, a module named like a standard one, a folder."""
    cfg = tmp_path / "project"
    config = _config(cfg, "shipcb_rows:long_enough")
    (cfg / "shipcb_rows.py").write_text(CALLBACK)
    (cfg / "data.csv").write_text("a,r\nx,x\n")
    (cfg / "secrets.py").write_text("TOKEN = 'keep me home'\n")
    (cfg / "notes").mkdir()
    (cfg / "notes" / "todo.txt").write_text("nothing\n")

    request = prepare_job(config, run_id="r1", run_date=DAY)
    assert request.files == {"job.yaml": config, "shipcb_rows.py": cfg / "shipcb_rows.py"}
    assert request.entrypoint == "python -m ragbatch run job.yaml --run-id r1 --run-date 2026-11-28"
    assert "working_dir" not in request.runtime_env
    assert request.metadata == {
        "ragbatch_config": "job.yaml",
        "ragbatch_run_id": "r1",
        "ragbatch_run_date": "2026-11-28",
        "ragbatch_output": str(cfg / "out"),
    }

    shipped = tmp_path / "shipped"
    shipped.mkdir()
    assemble(request.files, shipped)
    assert _tree(shipped) == {"job.yaml": config.read_bytes(), "shipcb_rows.py": CALLBACK.encode()}


def test_a_callback_package_goes_whole_without_its_bytecode(tmp_path):
    cfg = tmp_path / "project"
    config = _config(cfg, "shipcb_pkg.checks:long_enough")
    package = cfg / "shipcb_pkg"
    (package / "__pycache__").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "checks.py").write_text(CALLBACK)
    (package / "__pycache__" / "checks.cpython-311.pyc").write_bytes(b"\0stale")

    request = prepare_job(config, run_id="r1", run_date=DAY)
    assert request.files == {"job.yaml": config, "shipcb_pkg": package}
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    assemble(request.files, shipped)
    assert set(_tree(shipped)) == {"job.yaml", "shipcb_pkg/__init__.py", "shipcb_pkg/checks.py"}


def test_a_callback_in_the_current_folder_goes_one_from_elsewhere_does_not(tmp_path):
    """The folders a run looks in are the config's and the current one; code imported
    from anywhere else (here the standard library) must be on the cluster already."""
    (Path.cwd() / "shipcb_here.py").write_text(CALLBACK)
    config = _config(tmp_path / "project", "shipcb_here:long_enough")
    assert prepare_job(config, run_id="r1", run_date=DAY).files == {
        "job.yaml": config,
        "shipcb_here.py": Path.cwd() / "shipcb_here.py",
    }

    config = _config(tmp_path / "other", "string:capwords")
    assert prepare_job(config, run_id="r1", run_date=DAY).files == {"job.yaml": config}


def test_two_sources_with_one_name_are_refused(tmp_path):
    """A config file named like the callback package in the current folder: one would
    replace the other in the shipped folder."""
    package = Path.cwd() / "shipcb_clash"
    package.mkdir()
    (package / "__init__.py").write_text(CALLBACK)
    config = _config(tmp_path / "project", "shipcb_clash:long_enough", name="shipcb_clash")
    with pytest.raises(ConfigError, match="would both be shipped as 'shipcb_clash'"):
        prepare_job(config, run_id="r1", run_date=DAY)


@pytest.mark.parametrize("nightly, command", [(False, "run"), (True, "nightly")])
def test_every_argument_of_the_entry_point_is_quoted(tmp_path, nightly, command):
    """Ray runs the entry point through a shell: a config name, an input and an output
    full of shell syntax come back as the same single arguments."""
    config = _config(tmp_path / "project", name="my job; touch pwned $(id).yaml")
    hostile_in = str(tmp_path / "in dir/$(touch pwned)`id`;rm -rf x 'q\"/")
    hostile_out = str(tmp_path / "out|tee x&&echo $HOME")
    request = prepare_job(
        config,
        input_uri=hostile_in,
        output_uri=hostile_out,
        run_id="r1",
        run_date=DAY,
        nightly=nightly,
    )
    assert shlex.split(request.entrypoint) == [
        "python",
        "-m",
        "ragbatch",
        command,
        "my job; touch pwned $(id).yaml",
        "--run-id",
        "r1",
        "--run-date",
        "2026-11-28",
        "--input",
        hostile_in,
        "--output",
        hostile_out,
    ]


@pytest.mark.parametrize("run_id", ["a;touch pwned", "a b", "$(id)", "a`id`", "x|y", "a&&b"])
def test_a_run_id_with_shell_syntax_is_refused(tmp_path, run_id):
    with pytest.raises(ConfigError, match="--run-id"):
        prepare_job(_config(tmp_path / "project"), run_id=run_id, run_date=DAY)


def test_relative_local_inputs_need_a_checkout(tmp_path):
    """Nothing local but the config and its code is shipped: a relative input or
    calibration root would name the job's temporary folder. A checkout ships them."""
    config = _config(tmp_path / "project")
    with pytest.raises(
        ConfigError, match=r"input.uri 'data/' is a relative local path.*--working-dir"
    ):
        prepare_job(config, input_uri="data/", run_id="r1", run_date=DAY)
    calibrated = _config(
        tmp_path / "calibrated",
        calibration={"uri": "calib/", "min_agreement": {"exact_match": {"accuracy": 0.5}}},
    )
    with pytest.raises(ConfigError, match="calibration.uri 'calib/' is a relative local path"):
        prepare_job(calibrated, run_id="r1", run_date=DAY)

    checkout = tmp_path / "checkout"
    (checkout / "jobs").mkdir(parents=True)
    (checkout / "jobs" / "run.py").write_text("")
    inside = _config(checkout / "configs")
    request = prepare_job(
        inside, working_dir=checkout, input_uri="data/", run_id="r1", run_date=DAY
    )
    assert request.entrypoint == (
        "python jobs/run.py configs/job.yaml --run-id r1 --run-date 2026-11-28 --input data/"
    )
    assert request.files == {}
    assert request.runtime_env == {"excludes": [".git"], "working_dir": str(checkout)}


def test_written_locations_must_outlive_the_job(tmp_path):
    config = _config(tmp_path / "project", cache={"uri": "cache/"})
    with pytest.raises(ConfigError, match="cache.uri 'cache/' is a relative local path"):
        prepare_job(config, run_id="r1", run_date=DAY)
    with pytest.raises(ConfigError, match="output.uri 'memory://out'"):
        prepare_job(_config(tmp_path / "p2"), output_uri="memory://out", run_id="r1", run_date=DAY)


def test_a_folder_that_is_not_a_checkout_is_refused_as_working_dir(tmp_path):
    config = _config(tmp_path / "project")
    with pytest.raises(
        ConfigError,
        match="has no jobs/run.py, so it is not a ragbatch checkout.*leave --working-dir out",
    ):
        prepare_job(config, working_dir=tmp_path / "project", run_id="r1", run_date=DAY)


def test_credentials_stay_out_of_the_entry_point_metadata_and_printed_paths(tmp_path):
    with pytest.raises(ConfigError, match="--output: the URI carries a password"):
        prepare_job(
            _config(tmp_path / "p1"),
            output_uri="s3://AKIAX:s3cr3t@bucket/evals",
            run_id="r1",
            run_date=DAY,
        )
    with pytest.raises(ConfigError, match="--input: the URI carries a password"):
        prepare_job(
            _config(tmp_path / "p2"),
            input_uri="https://me:s3cr3t@host/traces.csv",
            run_id="r1",
            run_date=DAY,
        )

    config = _config(
        tmp_path / "p3",
        output={"uri": "s3://AKIAX:s3cr3t@bucket/evals", "storage_options": {"secret": "s3cr3t"}},
    )
    request = prepare_job(config, run_id="r1", run_date=DAY)
    shown = " ".join(
        [
            request.entrypoint,
            *request.metadata.values(),
            *vars(request.output).values(),
            repr(request.runtime_env),
        ]
    )
    assert "s3cr3t" not in shown and "AKIAX" not in shown
    assert request.metadata["ragbatch_output"] == "s3://bucket/evals"
    assert (
        request.output.manifest
        == "s3://bucket/evals/runs/run_date=2026-11-28/run_id=r1/manifest.json"
    )


def test_cli_exits_2_before_connecting(tmp_path, capsys):
    config = _config(tmp_path / "project")
    code = main(["submit", str(config), "--input", "data/", "--address", "http://127.0.0.1:9"])
    assert code == 2
    assert "input.uri 'data/' is a relative local path" in capsys.readouterr().err


def test_python_dash_m_ragbatch_is_the_command():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, "-m", "ragbatch", "submit", "--help"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.startswith("usage: ragbatch submit")
