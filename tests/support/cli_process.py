"""``ragbatch`` as a separate process, as a user or a scheduler starts it.

Each such process starts its own local Ray (seconds), so tests use it only where the
process boundary matters: what lands on ``sys.path`` and the workers' ``PYTHONPATH``, and
a real SIGINT.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RAGBATCH = str(Path(sys.executable).with_name("ragbatch"))


def cli_env() -> dict[str, str]:
    """This environment with this checkout first on ``PYTHONPATH`` (the code under test,
    not whatever copy the installed console script would import)."""
    existing = os.environ.get("PYTHONPATH", "")
    return dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), existing]) if existing else str(REPO)
    )


def run_ragbatch(
    argv: list[str], cwd: Path, timeout: float = 300, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run ``ragbatch ARGV`` in ``cwd`` to its end, with ``extra_env`` added to the
    environment; output captured as text."""
    return subprocess.run(
        [RAGBATCH, *argv],
        cwd=cwd,
        env={**cli_env(), **(extra_env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_ragbatch(argv: list[str], cwd: Path) -> subprocess.Popen:
    """Start ``ragbatch ARGV`` in ``cwd``; stdout and stderr are pipes of text lines."""
    return subprocess.Popen(
        [RAGBATCH, *argv],
        cwd=cwd,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
