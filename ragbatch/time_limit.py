"""Per-item time limits for pure-Python work that cannot be interrupted in-process.

Python's ``re`` holds the interpreter for the whole of one match call: a pattern that
backtracks catastrophically cannot be stopped by a thread, a signal handler or a Ray
task timeout. :func:`map_with_time_limit` therefore runs the items in a forked child
process, one at a time, and the parent waits at most ``limit_s`` for each result. When
an item runs past its limit the child is killed, that item becomes :data:`TIMED_OUT`,
and a fresh child carries on with the next item. Results are exactly what ``fn`` returns
in-process; only the time it may take is bounded.

Forking copies the calling process, so ``fn`` and the items need no pickling; results
travel back through a pipe and must pickle. Linux and macOS only (``fork``).
"""

from __future__ import annotations

import multiprocessing
import os
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


def map_with_time_limit(fn: Callable[[Any], Any], items: Sequence[Any],
                        limit_s: float) -> list[Any]:
    """``[fn(x) for x in items]``, with each call limited to ``limit_s`` seconds.

    Parameters
    ----------
    fn : callable
        Called once per item in a forked child process; its return value must pickle.
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
    while len(results) < len(items):
        results += _run_child(fn, items, len(results), limit_s)
    return results


def _run_child(fn: Callable[[Any], Any], items: Sequence[Any], start: int,
               limit_s: float) -> list[Any]:
    """Results of ``items[start:]`` from one child, up to and including the first item
    that times out or kills the child."""
    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_serve, args=(fn, items, start, sender), daemon=True)
    child.start()
    sender.close()
    out: list[Any] = []
    try:
        for _ in range(start, len(items)):
            if not receiver.poll(limit_s):
                out.append(TIMED_OUT)
                break
            try:
                kind, value = receiver.recv()
            except EOFError:
                child.join(limit_s)
                out.append(Failed(f"the worker process died (exit code {child.exitcode})"))
                break
            out.append(value if kind == "ok" else Failed(value))
    finally:
        receiver.close()
        if child.is_alive():
            child.kill()
        child.join()
    return out


def _serve(fn: Callable[[Any], Any], items: Sequence[Any], start: int, sender: Any) -> None:
    try:
        for item in items[start:]:
            try:
                message = ("ok", fn(item))
            except Exception as exc:  # reported to the parent as this item's result
                message = ("failed", f"{type(exc).__name__}: {exc}")
            sender.send(message)
    finally:
        sender.close()
        # Leave without running the parent's exit handlers (Ray's, atexit) in the copy.
        os._exit(0)
