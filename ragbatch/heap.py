"""Give freed heap memory back to the operating system.

A model actor allocates and frees hundreds of megabytes per batch (tokenizer output,
activations, Arrow and Polars buffers). glibc's allocator keeps much of what is freed in
its arenas instead of returning it, so a long-lived actor's resident memory creeps up
batch after batch although the stage holds no state: measured in one process on the
similarity stage, USS went from 0.72 to 1.15 GiB over 6,400 rows, and stayed at 0.54 GiB
when ``malloc_trim(0)`` ran after each batch (``benchmarks/model_stage_memory.py``).

:func:`release_free_heap` calls glibc's ``malloc_trim(0)`` (``man 3 malloc_trim``),
which returns the free pages of every arena, not only the top of the main heap. Other C
libraries (musl, macOS, Windows) have no such call; there it does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from typing import Any


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


#: Batches between two trims in a model actor: one per block of
#: ``runner.ACTOR_BLOCK_BATCHES`` batches, which keeps the trim's cost (page faults when
#: the memory is used again) near 1 % of the batches' time on CPU.
TRIM_EVERY_BATCHES = 16


class HeapTrimmer:
    """Counts an actor's batches and calls :func:`release_free_heap` every ``every``.

    Parameters
    ----------
    every : int, default :data:`TRIM_EVERY_BATCHES`
        Batches between trims; ``0`` turns trimming off. Negative values raise
        ``ValueError``.

    Attributes
    ----------
    batches : int
        Batches counted so far.
    trims : int
        Trims made so far (stays 0 where the C library has no ``malloc_trim``).
    """

    def __init__(self, every: int = TRIM_EVERY_BATCHES) -> None:
        if every < 0:
            raise ValueError(f"every must be >= 0 (0 turns trimming off), got {every}")
        self.every = every
        self.batches = 0
        self.trims = 0

    def batch_done(self) -> bool:
        """Count one batch; trim when the count reaches a multiple of ``every``.

        Returns ``True`` when this call trimmed the heap.
        """
        self.batches += 1
        if not self.every or self.batches % self.every:
            return False
        if release_free_heap():
            self.trims += 1
            return True
        return False
