"""The import-direction contract of pyproject.toml ([tool.importlinter]) holds.

Higher layers (commands, operations, calibration, pipeline) may import lower ones
(UDFs, analysis, engines, metrics, judges, scoring, input, config, core), never the reverse.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_imports_point_down_the_layers():
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, (
        "an import breaks the layers of [tool.importlinter] in pyproject.toml (move the "
        "code to the layer it belongs to, or pass what it needs in from above):\n"
        + done.stdout[-4000:]
        + done.stderr[-2000:]
    )
    assert ", 0 broken." in done.stdout


def test_a_broken_layer_is_reported(tmp_path):
    """The checker sees an upward import: a copy of the contract over a two-module
    package whose lower module imports the higher one."""
    pkg = tmp_path / "layered"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "high.py").write_text("")
    (pkg / "low.py").write_text("from layered import high\n")
    (tmp_path / ".importlinter").write_text(
        "[importlinter]\nroot_package = layered\n\n"
        "[importlinter:contract:layers]\nname = high over low\ntype = layers\n"
        "layers =\n    layered.high\n    layered.low\n"
    )
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint), "--no-cache"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(tmp_path), "PATH": ""},
    )
    assert done.returncode == 1
    assert "layered.low -> layered.high" in done.stdout
