"""What a run may use of the machine (:mod:`ragbatch.core.machine`): a container's memory
limit and CPU quota count, read from control-group files laid out as the kernel lays
them out (version 2 and version 1), in a temporary folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from ragbatch.core.machine import UNLIMITED, available_memory, usable_cores

GIB = 2**30


def _files(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _proc(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "proc-self-cgroup"
    path.write_text(text)
    return path


def test_no_limit_leaves_what_the_system_has(tmp_path):
    root = _files(tmp_path / "cg", {"memory.max": "max\n", "memory.current": "123\n"})
    system = psutil.virtual_memory().available
    got = available_memory(root, _proc(tmp_path, "0::/\n"))
    # The system's figure moves between two reads; a limit would have cut it far lower.
    assert abs(got - system) < 0.1 * system


def test_a_version_2_limit_counts_its_working_set(tmp_path):
    # Limit 4 GiB, 3 GiB used of which 1 GiB is reclaimable page cache: 2 GiB left.
    root = _files(
        tmp_path / "cg",
        {
            "kubepods/pod1/memory.max": f"{4 * GIB}\n",
            "kubepods/pod1/memory.current": f"{3 * GIB}\n",
            "kubepods/pod1/memory.stat": f"anon 123\ninactive_file {GIB}\nactive_file 5\n",
        },
    )
    got = available_memory(root, _proc(tmp_path, "0::/kubepods/pod1\n"))
    assert got == 2 * GIB


def test_a_version_2_limit_at_the_top_inside_a_container(tmp_path):
    # A container's own namespace shows its group as "/": the files are at the top.
    root = _files(
        tmp_path / "cg",
        {"memory.max": f"{GIB}\n", "memory.current": f"{GIB // 4}\n", "memory.stat": ""},
    )
    assert available_memory(root, _proc(tmp_path, "0::/\n")) == GIB - GIB // 4


def test_a_version_1_limit(tmp_path):
    root = _files(
        tmp_path / "cg",
        {
            "memory/docker/abc/memory.limit_in_bytes": f"{8 * GIB}\n",
            "memory/docker/abc/memory.usage_in_bytes": f"{5 * GIB}\n",
            "memory/docker/abc/memory.stat": f"cache 9\ntotal_inactive_file {2 * GIB}\n",
            "memory/memory.limit_in_bytes": "9223372036854771712\n",
        },
    )
    proc = _proc(tmp_path, "12:pids:/docker/abc\n9:memory:/docker/abc\n1:name=systemd:/x\n")
    assert available_memory(root, proc) == 5 * GIB


def test_version_1_unlimited_and_missing_files_mean_no_limit(tmp_path):
    root = _files(tmp_path / "cg", {"memory/memory.limit_in_bytes": "9223372036854771712\n"})
    assert 9223372036854771712 >= UNLIMITED
    system = psutil.virtual_memory().available
    got = available_memory(root, _proc(tmp_path, "9:memory:/\n"))
    assert abs(got - system) < 0.1 * system
    got = available_memory(tmp_path / "nothing-here", tmp_path / "no-such-file")
    assert abs(got - system) < 0.1 * system


def test_a_group_over_its_limit_has_nothing_left(tmp_path):
    root = _files(
        tmp_path / "cg",
        {"memory.max": f"{GIB}\n", "memory.current": f"{2 * GIB}\n", "memory.stat": "x\n"},
    )
    assert available_memory(root, _proc(tmp_path, "0::/\n")) == 0


def test_garbage_in_the_files_is_no_limit(tmp_path):
    root = _files(
        tmp_path / "cg",
        {"memory.max": "lots\n", "memory.current": "?\n", "memory.stat": "inactive_file x\n"},
    )
    system = psutil.virtual_memory().available
    got = available_memory(root, _proc(tmp_path, "garbage\n0::/\n"))
    assert abs(got - system) < 0.1 * system


def test_usable_cores_follow_affinity_and_polars_setting():
    code = "from ragbatch.core.machine import usable_cores; print(usable_cores())"
    env = {k: v for k, v in os.environ.items() if k != "POLARS_MAX_THREADS"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    if hasattr(os, "sched_getaffinity"):
        assert int(out.stdout) == len(os.sched_getaffinity(0))
    env["POLARS_MAX_THREADS"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout) == 1
    assert usable_cores() >= 1


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_usable_cores_of_a_process_pinned_to_one_core():
    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from ragbatch.core.machine import usable_cores; print(usable_cores())"
    )
    env = {k: v for k, v in os.environ.items() if k != "POLARS_MAX_THREADS"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout) == 1
