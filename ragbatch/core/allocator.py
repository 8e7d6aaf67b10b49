"""Arrow's memory allocator in the ``ragbatch`` process.

PyArrow's wheels carry three allocators and pick one as the default pool (mimalloc in
the wheels this project is tested with). The data path of a run allocates and frees
buffers of tens to hundreds of megabytes (decoded pages, string views, score columns)
many times over; with mimalloc, a run of six expression metrics over 1,000,000 rows
spent 2.7-3.5 s of kernel time on a two-core machine, against 1.7-2.2 s with jemalloc
or the system allocator, and took 10-20 % longer (docs/benchmarks/whole-job.md, round
five). The command line therefore makes jemalloc the default pool, unless the user
chose one with Arrow's own ``ARROW_DEFAULT_MEMORY_POOL`` variable.
"""

from __future__ import annotations

import os

#: Arrow's environment variable that chooses the default pool (``jemalloc``,
#: ``mimalloc`` or ``system``); when set, ragbatch leaves the choice to it.
POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"


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
