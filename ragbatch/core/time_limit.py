"""Per-item time limits for pure-Python work that cannot be interrupted in-process.

Python's ``re`` holds the interpreter for the whole of one match call: a pattern that
backtracks catastrophically cannot be stopped by a thread, a signal handler or a Ray
task timeout. :func:`map_with_time_limit` therefore runs the items in a forked child
process and the parent waits at most ``limit_s`` for each result. When an item runs past
its limit the child is killed, that item becomes :data:`TIMED_OUT`, and a fresh child
carries on with the next item. Results are exactly what ``fn`` returns in-process; only
the time it may take is bounded.

The child sends its results in chunks (every :data:`FLUSH_S` seconds or
:data:`CHUNK` items), so fast items cost little more than in-process. When no chunk
arrives within ``limit_s + FLUSH_S`` (or the child dies), some item ran past the limit
(or killed it): the child is killed and the items it had not reported are run again one
result per message, which finds that item (a hanging one costs up to twice ``limit_s``).

Forking copies the calling process, so ``fn`` and the items need no pickling; results
travel back through a pipe and must pickle. Linux and macOS only (``fork``).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence


@dataclass(frozen=True)
class Failed:
    """``fn`` raised for an item (in the child); ``message`` is ``"<Type>: <text>"``."""

    message: str


class _TimedOut:
    def __repr__(self) -> str:
        return "TIMED_OUT"


#: The result of an item that ran past its time limit.
TIMED_OUT: Any = _TimedOut()


def map_with_time_limit(
    fn: Callable[[Any], Any], items: Sequence[Any], limit_s: float
) -> list[Any]:
    """``[fn(x) for x in items]``, with each call limited to ``limit_s`` seconds.

    Parameters
    ----------
    fn : callable
        Called once per item in a forked child process (an item is called again only
        after a child was killed before reporting it); its return value must pickle.
    items : sequence
        The inputs, in order.
    limit_s : float
        Wall-clock seconds each call may take (> 0).

    Returns
    -------
    list
        One entry per item, in order: ``fn``'s return value, :data:`TIMED_OUT` when the
        call ran past ``limit_s`` (the child was killed), or :class:`Failed` when it
        raised or the child died.

    Raises
    ------
    ValueError
        ``limit_s`` is not positive.
    """
    if limit_s <= 0:
        raise ValueError(f"limit_s must be > 0, got {limit_s}")
    results: list[Any] = []
    chunked = True
    while len(results) < len(items):
        done, stalled = _run_child(fn, items, len(results), limit_s, chunked)
        results += done
        # A stall in chunked mode does not say which item hangs: find it item by item.
        chunked = not stalled or not chunked
    return results


#: Seconds and items after which the child sends the results it holds.
FLUSH_S = 0.01
CHUNK = 512


def _run_child(
    fn: Callable[[Any], Any], items: Sequence[Any], start: int, limit_s: float, chunked: bool
) -> tuple[list[Any], bool]:
    """Results of ``items[start:]`` from one child, up to the first item that times out
    or kills the child; and whether a chunked child stalled or died (nothing is known
    about the items it had not reported)."""
    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_serve, args=(fn, items, start, sender, chunked), daemon=True)
    child.start()
    sender.close()
    out: list[Any] = []
    stalled = False
    try:
        while start + len(out) < len(items):
            if not receiver.poll(limit_s + (FLUSH_S if chunked else 0.0)):
                if chunked:
                    stalled = True
                else:
                    out.append(TIMED_OUT)
                break
            try:
                chunk = receiver.recv()
            except EOFError:  # the child died: which item killed it is known only unchunked
                child.join(limit_s)
                if chunked:
                    stalled = True
                else:
                    out.append(Failed(f"the worker process died (exit code {child.exitcode})"))
                break
            out += [value if kind == "ok" else Failed(value) for kind, value in chunk]
    finally:
        receiver.close()
        if child.is_alive():
            child.kill()
        child.join()
    return out, stalled


def _serve(
    fn: Callable[[Any], Any], items: Sequence[Any], start: int, sender: Any, chunked: bool
) -> None:
    try:
        buffer: list[tuple[str, Any]] = []
        last = time.monotonic()
        for item in items[start:]:
            try:
                buffer.append(("ok", fn(item)))
            except Exception as exc:  # reported to the parent as this item's result
                buffer.append(("failed", f"{type(exc).__name__}: {exc}"))
            now = time.monotonic()
            if not chunked or len(buffer) >= CHUNK or now - last >= FLUSH_S:
                sender.send(buffer)
                buffer, last = [], now
        if buffer:
            sender.send(buffer)
    finally:
        sender.close()
        # Leave without running the parent's exit handlers (Ray's, atexit) in the copy.
        os._exit(0)
