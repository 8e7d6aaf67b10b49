"""torch's compute threads in an actor, set once for every thread of the process.

Ray starts an actor with ``OMP_NUM_THREADS`` set to the whole CPUs it reserved (1 when it
reserved less), and a pool rule may give an engine more threads than that
(:mod:`ragbatch.core.pool_sizing`). ``torch.set_num_threads`` alone is not enough: OpenMP
keeps the count per thread, and a thread that calls it changes only its own, so an engine
stepped from another thread (the event loop of an actor judging several batches at once)
would run with Ray's count, and vLLM's CPU attention refuses a step whose threads differ
from those it was planned with.
"""

from __future__ import annotations

import os
import sys

#: The variables OpenMP and MKL read, once, when torch first starts them.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def set_thread_variables(threads: int) -> None:
    """Set :data:`THREAD_VARIABLES` to ``threads`` without importing torch: the count
    every thread of this process starts with once torch is imported (call it before).

    Raises
    ------
    ValueError
        ``threads`` is below 1.
    """
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    for name in THREAD_VARIABLES:
        os.environ[name] = str(threads)


def set_torch_threads(threads: int) -> bool:
    """Give torch ``threads`` compute threads in this process.

    Sets :data:`THREAD_VARIABLES` (read when torch is first imported: the default of
    every thread, the event loop's included) and calls ``torch.set_num_threads`` (the
    calling thread, when torch was imported before).

    Parameters
    ----------
    threads : int
        At least 1.

    Returns
    -------
    bool
        Whether torch was imported before this call (then threads other than the
        caller's keep the count they had).

    Raises
    ------
    ValueError
        ``threads`` is below 1.
    """
    imported = "torch" in sys.modules
    set_thread_variables(threads)
    import torch

    torch.set_num_threads(threads)
    return imported
