"""Files next to a config never stand in for other modules; a ``binary`` callback next to
the config is still found, by the driver and by every Ray worker.

The end-to-end case runs ``ragbatch run --report`` as its own process in the config's
folder (so that folder is both the working and the config folder), with a ``jinja2.py``
beside the config and the callback itself in a ``secrets.py``: the callback checks, in
the worker that runs it, that ``import secrets`` and ``import jinja2`` give the real
modules, and records the worker's process id.
"""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

from support.cli_process import run_ragbatch, start_ragbatch
from ragbatch.metrics.binary import load_callback
from ragbatch.pipeline.runner import prepare_import_paths

SHADOW = "SHADOW = True\n"

CALLBACK = '''
import os
from pathlib import Path

import polars as pl


def real_modules(batch):
    """True per row when the standard library's secrets and the installed jinja2 are
    what `import` gives here; the process id is appended to pids.txt."""
    import jinja2
    import secrets

    with open(Path(__file__).with_name("pids.txt"), "a") as f:
        f.write(f"{os.getpid()}\\n")
    real = (not hasattr(secrets, "SHADOW") and hasattr(secrets, "token_hex")
            and not hasattr(jinja2, "SHADOW") and hasattr(jinja2, "Environment"))
    return pl.Series([real] * batch.height)
'''


def _job(folder: Path, callback_module: str = "checks") -> Path:
    for name in ("secrets", "jinja2"):
        (folder / f"{name}.py").write_text(SHADOW, encoding="utf-8")
    (folder / f"{callback_module}.py").write_text(CALLBACK, encoding="utf-8")
    (folder / "in.csv").write_text("q,a\nwhat?,one\nwhy?,two\nhow?,three\n", encoding="utf-8")
    config = {
        "run": {"name": "shadowing"},
        "input": {"uri": str(folder / "in.csv"), "columns": {"question": "q", "answer": "a"}},
        "output": {"uri": str(folder / "out")},
        "metrics": [
            {
                "name": "binary",
                "id": "real_modules",
                "params": {"callback": f"{callback_module}:real_modules"},
            }
        ],
    }
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


@pytest.mark.release
@pytest.mark.slow
def test_run_and_report_use_real_modules_and_the_callback_runs_in_workers(tmp_path):
    config = _job(tmp_path)
    proc = start_ragbatch(["run", str(config), "--run-id", "shadow", "--report"], cwd=tmp_path)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    scores = pl.read_parquet(
        tmp_path / "out" / "scores" / "**" / "*.parquet", hive_partitioning=True
    )
    assert scores.select("metric", "status", "score").rows() == [("real_modules", "ok", 1.0)] * 3
    # validation imports the module in the driver without calling it: every call ran in
    # a Ray worker, where the module was found too
    pids = {int(p) for p in (tmp_path / "pids.txt").read_text().split()}
    assert pids and proc.pid not in pids
    report = next((tmp_path / "out" / "reports").rglob("report.html"))
    assert "real_modules" in report.read_text(encoding="utf-8")

    again = run_ragbatch(
        ["report", "--output", str(tmp_path / "out"), "shadow", "-o", str(tmp_path / "again.html")],
        cwd=tmp_path,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "real_modules" in (tmp_path / "again.html").read_text(encoding="utf-8")


def test_callback_module_named_like_a_standard_module_is_its_own_file(tmp_path, monkeypatch):
    """In this process: the callback in ``secrets.py`` is the file's function, the name
    ``secrets`` stays the standard library's, and ``sys.path`` gains nothing in front."""
    import secrets

    from ragbatch.metrics import callback_import
    from ragbatch.metrics.callback_import import find_module_file

    monkeypatch.setattr(callback_import, "_DIRS", ())  # restored after the test
    config = _job(tmp_path, callback_module="secrets")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = list(sys.path)
    prepare_import_paths(config.parent)
    assert sys.path == before
    assert find_module_file("secrets") == tmp_path / "secrets.py"
    fn = load_callback("secrets:real_modules", str(find_module_file("secrets")))
    assert fn.__code__.co_filename == str(tmp_path / "secrets.py")
    assert sys.modules["secrets"] is secrets and hasattr(secrets, "token_hex")
    assert fn(pl.DataFrame({"a": [1, 2]})).to_list() == [True, True]
    assert sys.path[: len(before)] == before  # the callback's folder, if added, comes last


def test_callback_not_in_the_folders_is_imported_by_name_with_a_clear_error(tmp_path, monkeypatch):
    from ragbatch.metrics import callback_import

    monkeypatch.setattr(callback_import, "_DIRS", ())  # restored after the test
    prepare_import_paths(tmp_path)
    with pytest.raises(
        ValueError,
        match=r"module 'secrets' \(imported from .*secrets.py\) "
        r"has no attribute 'no_such_function'",
    ):
        load_callback("secrets:no_such_function")
