"""Give freed heap memory back to the operating system.

A model actor allocates and frees hundreds of megabytes per batch (tokenizer output,
activations, Arrow and Polars buffers). glibc's allocator keeps much of what is freed in
its arenas instead of returning it, so a long-lived actor's resident memory creeps up
batch after batch although the stage holds no state: measured in one process on the
similarity stage, USS went from 0.72 to 1.15 GiB over 6,400 rows, and stayed at 0.54 GiB
when ``malloc_trim(0)`` ran after each batch (``benchmarks/model_stage_memory.py``); in a
100,000-row Ray run with trimming, each model actor stayed at about 0.75 GiB PSS
throughout (docs/benchmarks/scale.md).

:func:`release_free_heap` calls glibc's ``malloc_trim(0)`` (``man 3 malloc_trim``),
which returns the free pages of every arena, not only the top of the main heap. Other C
libraries (musl, macOS, Windows) have no such call; there it does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import time
from typing import Any, Callable


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim`` as a ctypes function, or ``None`` where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the symbols already loaded in this process
    except (OSError, AttributeError):  # musl and other C libraries without it
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def heap_trim_available() -> bool:
    """Whether this process's C library has ``malloc_trim`` (glibc on Linux)."""
    return _malloc_trim() is not None


def release_free_heap() -> bool:
    """Return the allocator's free pages to the operating system.

    Calls ``malloc_trim(0)``: every arena keeps only the pages it uses; live memory is
    untouched. Costs a walk over the arenas (milliseconds for a heap of about 1 GiB) and
    page faults when the memory is needed again, so call it between batches, not per row.

    Returns
    -------
    bool
        ``True`` when the call was made (glibc), ``False`` where the C library has no
        ``malloc_trim`` and nothing was done. It never raises.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


#: Least seconds between two trims in a model, PII or judge actor. Where a batch takes
#: longer (a small model on CPU: seconds per batch) the actor trims after every batch
#: (+3 % time measured); where batches take milliseconds (a GPU) it trims about once a
#: second, so the trim's cost (walking the arenas, and page faults when the memory is used
#: again) stays small.
TRIM_INTERVAL_S = 1.0


class HeapTrimmer:
    """Calls :func:`release_free_heap` after a batch when enough time has passed.

    Parameters
    ----------
    interval_s : float or None, default :data:`TRIM_INTERVAL_S`
        Least seconds between trims; ``0`` trims after every batch, ``None`` never.
        Negative values raise ``ValueError``.
    clock : callable, default :func:`time.monotonic`
        Seconds, for the interval.

    Attributes
    ----------
    batches : int
        Batches counted so far.
    trims : int
        Trims made so far (stays 0 where the C library has no ``malloc_trim``).
    """

    def __init__(
        self,
        interval_s: float | None = TRIM_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s is not None and interval_s < 0:
            raise ValueError(f"interval_s must be >= 0 or None (never), got {interval_s}")
        self.interval_s = interval_s
        self.clock = clock
        self.batches = 0
        self.trims = 0
        self._last = clock()

    def batch_done(self) -> bool:
        """Count one batch; trim when ``interval_s`` has passed since the last trim (or
        since the trimmer was made). Returns ``True`` when this call trimmed the heap."""
        self.batches += 1
        if self.interval_s is None:
            return False
        now = self.clock()
        if now - self._last < self.interval_s:
            return False
        self._last = now
        if release_free_heap():
            self.trims += 1
            return True
        return False
