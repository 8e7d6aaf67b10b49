"""Arrow's and Polars' memory allocators in the ``ragbatch`` process.

PyArrow's wheels carry three allocators and pick one as the default pool (mimalloc in
the wheels this project is tested with). The data path of a run allocates and frees
buffers of tens to hundreds of megabytes (decoded pages, string views, score columns)
many times over; with mimalloc, a run of six expression metrics over 1,000,000 rows
spent 2.7-3.5 s of kernel time on a two-core machine, against 1.7-2.2 s with jemalloc
or the system allocator, and took 10-20 % longer (docs/benchmarks/whole-job.md, round
five). The command line therefore makes jemalloc the default pool, unless the user
chose one with Arrow's own ``ARROW_DEFAULT_MEMORY_POOL`` variable.

Polars carries its own jemalloc (in its Linux wheels, which this project is tested
with). Its Python package sets that allocator's options before the library loads:
freed pages go back to the kernel within about half a second (``dirty_decay_ms:500``),
followed by whatever the user put in
:data:`POLARS_JEMALLOC_VARIABLE`. Reading wide text columns, each row group's decoded
pages were then handed back and faulted in afresh for the next: a run of six expression
metrics over 1,000,000 rows of long, distinct texts spent 3.0-3.8 s of kernel time on
1.1-1.3 million page faults. :func:`keep_freed_pages_for_polars` keeps freed pages for
five seconds instead, so the next row groups reuse them: 1.9-2.5 s of kernel time and
about 6 % less wall time (medians of four), with the same peak memory
(docs/benchmarks/whole-job.md, round six).
"""

from __future__ import annotations

import os
import sys

#: Arrow's environment variable that chooses the default pool (``jemalloc``,
#: ``mimalloc`` or ``system``); when set, ragbatch leaves the choice to it.
POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"

#: The environment variable Polars' jemalloc reads its options from when the library
#: loads (the Rust jemalloc crate prefixes its symbols and this name with ``_RJEM_``).
POLARS_JEMALLOC_VARIABLE = "_RJEM_MALLOC_CONF"

#: What ragbatch adds to it: freed pages go back to the kernel over five seconds rather
#: than half a second. ``-1`` (never) was no faster and raised the peak resident memory by
#: 0.25 GiB at 10,000,000 rows (the driver holds Polars' pages while DuckDB checks the
#: run); 2,000 ms was slower.
POLARS_JEMALLOC_OPTIONS = "dirty_decay_ms:5000"

#: What Polars' package itself puts at the front of the variable (Polars 2.1; a test
#: checks), and after it when ``POLARS_THP=1``. A process started by one that loaded
#: Polars inherits them; they are not the user's choice.
POLARS_OWN_OPTIONS = "dirty_decay_ms:500,muzzy_decay_ms:1000"
POLARS_THP_OPTIONS = "thp:always,metadata_thp:always"


def prefer_jemalloc() -> str:
    """Make jemalloc PyArrow's default memory pool in this process, unless
    :data:`POOL_VARIABLE` is set or this PyArrow was built without it.

    Changes only this process (not Ray's workers). Memory already allocated stays with
    the pool that allocated it.

    Returns
    -------
    str
        The backend name of the default pool afterwards: ``"jemalloc"``, or what it
        was (``"mimalloc"``, ``"system"``).
    """
    import pyarrow as pa

    if not os.environ.get(POOL_VARIABLE):
        try:
            pa.set_memory_pool(pa.jemalloc_memory_pool())
        except NotImplementedError:  # a build without jemalloc keeps its default
            pass
    return pa.default_memory_pool().backend_name


def keep_freed_pages_for_polars() -> str | None:
    """Put :data:`POLARS_JEMALLOC_OPTIONS` in this process's
    :data:`POLARS_JEMALLOC_VARIABLE`, unless Polars is imported already (its allocator
    has read its options by then) or the user chose a decay there (``dirty_decay_ms``),
    which is kept as it is (``dirty_decay_ms:500`` keeps Polars' half second).

    What Polars filled in by itself in parent processes (leading runs of
    :data:`POLARS_OWN_OPTIONS`, each maybe followed by :data:`POLARS_THP_OPTIONS`) is
    dropped: Polars puts its own options back when it loads here. Other options the user
    set stay, after ours.

    Call it before anything imports Polars. Processes started afterwards inherit the
    setting (a local Ray's workers). It changes when freed memory goes back to the kernel,
    not how much is allocated; a Polars without jemalloc ignores it.

    Returns
    -------
    str or None
        The variable's new value, or ``None`` when nothing was changed.
    """
    if "polars" in sys.modules:
        return None
    current = os.environ.get(POLARS_JEMALLOC_VARIABLE) or ""
    pairs = [pair.strip() for pair in current.split(",") if pair.strip()]
    own, thp = POLARS_OWN_OPTIONS.split(","), POLARS_THP_OPTIONS.split(",")
    while pairs[: len(own)] == own:
        pairs = pairs[len(own) :]
        if pairs[: len(thp)] == thp:
            pairs = pairs[len(thp) :]
    if any(pair.partition(":")[0] == "dirty_decay_ms" for pair in pairs):
        return None
    value = ",".join([POLARS_JEMALLOC_OPTIONS, *pairs])
    os.environ[POLARS_JEMALLOC_VARIABLE] = value
    return value
