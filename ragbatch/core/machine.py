"""What this process may use of the machine it runs on: cores and memory, with the limits
of a container (Linux control groups) counted.

A process in a container sees the host's cores and memory in ``os.cpu_count()`` and
``/proc/meminfo``; its own share is in its control group: a CPU quota (``cpu.max``, or
``cpu.cfs_quota_us`` in version 1) and a memory limit (``memory.max``, or
``memory.limit_in_bytes``). Sizing work to the host there starts more than the container
can hold, and the kernel stops the process when its memory passes the limit.
"""

from __future__ import annotations

from pathlib import Path

#: Where the control-group filesystem is mounted.
CGROUP_ROOT = Path("/sys/fs/cgroup")

#: A memory limit at or above this is "no limit" (version 1 writes the largest page-
#: aligned 64-bit number; version 2 writes ``max``).
UNLIMITED = 2**60


def usable_cores() -> int:
    """The cores this process's work may use: the size of Polars' thread pool.

    Polars sizes it with Rust's ``available_parallelism``, which counts the process's
    CPU affinity and a control group's CPU quota (rounded down, at least 1), unless
    ``POLARS_MAX_THREADS`` sets it. Loads Polars.
    """
    import polars as pl

    return max(1, int(pl.thread_pool_size()))


def available_memory(root: Path = CGROUP_ROOT, proc_cgroup: Path | None = None) -> int:
    """Bytes of memory this process may still take: what the system has available
    (``psutil.virtual_memory().available``), or what the process's control group has
    left under its limit when that is less.

    What the group has left is its limit less its usage, not counting the page cache the
    kernel can reclaim (``inactive_file`` in ``memory.stat``), as container runtimes
    report a container's working set.

    Parameters
    ----------
    root : Path
        The control-group mount (tests pass a folder laid out the same way).
    proc_cgroup : Path, optional
        This process's ``/proc/self/cgroup`` (the default), naming its groups.
    """
    import psutil

    available = int(psutil.virtual_memory().available)
    left = _cgroup_memory_left(root, proc_cgroup or Path("/proc/self/cgroup"))
    return available if left is None else max(0, min(available, left))


def _cgroup_memory_left(root: Path, proc_cgroup: Path) -> int | None:
    """The memory the process's control group has left under its limit, or None where
    there is no limit (or no control group to read)."""
    for folder, names in _memory_groups(root, proc_cgroup):
        limit = _read_int(folder / names[0])
        if limit is None or limit >= UNLIMITED:
            continue
        usage = _read_int(folder / names[1]) or 0
        inactive = _stat(folder / "memory.stat", names[2]) or 0
        return limit - max(0, usage - inactive)
    return None


def _memory_groups(root: Path, proc_cgroup: Path) -> list[tuple[Path, tuple[str, str, str]]]:
    """The memory-controller folders of the process's groups (deepest first, then the
    mount's top, which is the process's own group inside a container), each with the
    names of its limit and usage files and of the reclaimable cache in memory.stat."""
    v2 = ("memory.max", "memory.current", "inactive_file")
    v1 = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
    found: list[tuple[Path, tuple[str, str, str]]] = []
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        relative = path.lstrip("/")
        if controllers == "":
            found.append((root / relative, v2))
        elif "memory" in controllers.split(","):
            found.append((root / "memory" / relative, v1))
    found += [(root, v2), (root / "memory", v1)]
    return found


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return UNLIMITED
    try:
        return int(text)
    except ValueError:
        return None


def _stat(path: Path, key: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        return None
    return None
