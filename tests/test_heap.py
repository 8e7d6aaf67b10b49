"""ragbatch.core.heap: malloc_trim gives freed heap pages back; the trimmer's batch count."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import textwrap

import pytest

from ragbatch.core.heap import HeapTrimmer, heap_trim_available, release_free_heap

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
needs_glibc = pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's")

# In a fresh interpreter: fill ~400 MB with 2,000-byte blocks (above pymalloc's 512-byte
# limit, so glibc malloc serves them; b"x" * n writes every page, unlike bytes(n)), free
# 49 of every 50 so that the free memory lies in ~98 KB holes between live blocks (free()
# only returns the top of the heap), then trim. RSS in bytes from /proc/self/statm.
PROBE = textwrap.dedent("""
    import json, os
    from ragbatch.core.heap import release_free_heap

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    base = rss()
    size = 2000  # a name, not a literal: b"x" * 2000 would be folded into one constant
    blocks = [b"x" * size for _ in range(200_000)]
    full = rss()
    keep = blocks[::50]
    del blocks
    freed = rss()
    trimmed = release_free_heap()
    after = rss()
    print(json.dumps({"base": base, "full": full, "freed": freed, "after": after,
                      "trimmed": trimmed, "kept": len(keep)}))
""")


@needs_glibc
def test_trim_returns_free_pages_between_live_blocks():
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    m = json.loads(out.stdout)
    mib = {k: round(v / 2**20) for k, v in m.items() if type(v) is int and k != "kept"}
    assert m["trimmed"] is True and m["kept"] == 4000
    # 200,000 x 2,000 bytes = 381 MiB were written.
    assert m["full"] - m["base"] > 350 * 2**20, mib
    # free() alone keeps the holes resident (the premise of the trim) ...
    assert m["freed"] - m["base"] > 300 * 2**20, mib
    # ... malloc_trim(0) gives back all but the ~4,000 live blocks' pages (~8 MB) and
    # the partial pages at each hole's ends.
    assert m["freed"] - m["after"] > 300 * 2**20, mib


@needs_glibc
def test_available_on_glibc():
    assert heap_trim_available()
    assert release_free_heap() is True


class FakeClock:
    """A settable clock: the interval logic is about elapsed time, which a test cannot
    wait for honestly in milliseconds."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_trimmer_trims_once_the_interval_has_passed():
    clock = FakeClock()
    trimmer = HeapTrimmer(interval_s=1.0, clock=clock)
    expected = heap_trim_available()
    done = []
    for step in (0.4, 0.5, 0.2, 0.3, 0.3, 0.5, 2.5, 0.0):  # seconds before each batch ends
        clock.now += step
        done.append(trimmer.batch_done())
    # elapsed since the last trim at each batch: 0.4, 0.9, 1.1 (trim), 0.3, 0.6, 1.1
    # (trim), 2.5 (trim), 0.0
    assert done == [False, False, expected, False, False, expected, expected, False]
    assert trimmer.batches == 8
    assert trimmer.trims == (3 if expected else 0)


def test_trimmer_every_batch_never_and_bad_interval():
    every = HeapTrimmer(interval_s=0, clock=FakeClock())
    assert [every.batch_done() for _ in range(3)] == [heap_trim_available()] * 3
    off = HeapTrimmer(interval_s=None)
    assert not any(off.batch_done() for _ in range(40))
    assert off.trims == 0 and off.batches == 40
    with pytest.raises(ValueError, match="interval_s must be >= 0"):
        HeapTrimmer(interval_s=-1)
