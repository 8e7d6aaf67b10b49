"""An engine added by another distribution: the plugin under tests/plugins/ (one module
and its pyproject.toml with a ``ragbatch.engines`` entry point) is installed with pip into
a fresh virtual environment, and a job run there with that engine scores through Ray,
whose workers find the engine the same way the driver does (docs/extending.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import polars as pl
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PLUGIN = REPO / "tests" / "plugins" / "ragbatch-echo-engine"

#: The input rows: the echo engine's verdict is true where the answer holds its marker.
ROWS = [
    {"id": "a", "question": "Who?", "contexts": ["Some text."], "answer": "It says ECHO-TRUE."},
    {"id": "b", "question": "Who?", "contexts": ["Some text."], "answer": "A plain answer."},
    {"id": "c", "question": "Who?", "contexts": ["Some text."], "answer": None},
    {"id": "d", "question": "Why?", "contexts": [], "answer": "ECHO-TRUE twice: ECHO-TRUE"},
]
#: hate_speech is 1.0 for a true verdict and 0.0 for a false one; a null answer is
#: missing_input without a judge call.
EXPECTED = {
    "a": (1.0, "ok"),
    "b": (0.0, "ok"),
    "c": (None, "missing_input"),
    "d": (1.0, "ok"),
}


def _fresh_venv(root: Path) -> Path:
    """A virtual environment without pip whose ``sys.path`` holds this checkout, then
    the site-packages of the running interpreter (ragbatch's dependencies), through a
    ``.pth`` file; returns its interpreter."""
    venv.create(root, with_pip=False, symlinks=True)
    python = root / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = sysconfig.get_paths()
    lines = dict.fromkeys([str(REPO), ours["purelib"], ours["platlib"]])
    Path(site, "ragbatch_checkout.pth").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return python


def _pip_for(python: Path) -> list[str]:
    """The pip command that installs into ``python``'s environment: this interpreter's pip
    with ``--python`` (pip 22.3 and later), else the fresh interpreter's own ``-m pip``,
    which it finds through the ``.pth`` file."""
    from importlib.metadata import version

    major, minor = (int(p) for p in version("pip").split(".")[:2])
    if (major, minor) >= (22, 3):
        return [sys.executable, "-m", "pip", "--python", str(python)]
    return [str(python), "-m", "pip"]


@pytest.mark.slow
def test_an_installed_engine_runs_a_job_on_ray(tmp_path):
    python = _fresh_venv(tmp_path / "venv")
    plugin = shutil.copytree(PLUGIN, tmp_path / PLUGIN.name)  # pip builds in the folder
    install = subprocess.run(
        [
            *_pip_for(python),
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--quiet",
            str(plugin),
        ],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stderr
    # Not importable by the interpreter running the tests: only the fresh one has it.
    found = subprocess.run(
        [
            str(python),
            "-c",
            "from importlib import metadata; "
            "print([p.value for p in metadata.entry_points(group='ragbatch.engines')])",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert found.stdout.strip() == "['ragbatch_echo_engine']"

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    job = {
        "input": {
            "uri": str(data),
            "columns": {
                "row_id": "id",
                "question": "question",
                "contexts": "contexts",
                "answer": "answer",
            },
        },
        "output": {"uri": str(tmp_path / "out")},
        "engines": {"rule": {"type": "echo", "model": "m1"}},
        "metrics": [{"name": "hate_speech", "engine": "rule"}],
        "run": {"executor": "ray"},
    }
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(job), encoding="utf-8")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    run = subprocess.run(
        [str(python), "-m", "ragbatch", "run", str(config)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    files = sorted((tmp_path / "out" / "scores").rglob("*.parquet"))
    scores = pl.concat([pl.read_parquet(f) for f in files], how="diagonal_relaxed")
    got = {
        r["row_id"]: (r["score"], r["status"])
        for r in scores.filter(pl.col("metric") == "hate_speech").iter_rows(named=True)
    }
    assert got == EXPECTED
    [manifest] = (tmp_path / "out" / "runs").rglob("manifest.json")
    stages = json.loads(manifest.read_text(encoding="utf-8"))["stages"]
    assert [(s["kind"], s["engine_spec"]["type"]) for s in stages] == [("judge", "echo")]
