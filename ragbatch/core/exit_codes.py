"""The process exit codes of every ragbatch command, defined once.

``ragbatch run``, ``nightly``, ``compare``, ``submit`` and the other commands return
these; docs/commands.md lists which command returns which, and
:mod:`ragbatch.ops.nightly_job` says what each means for a scheduler of nightly runs.
"""

from __future__ import annotations

#: Done: committed, nothing gated on.
EXIT_OK = 0
#: The run failed while running (or its report could not be written); retrying may help.
EXIT_FAILED = 1
#: A config or input problem that needs a fix, or the run is running elsewhere.
EXIT_INVALID = 2
#: Committed, but a metric regressed beyond the threshold.
EXIT_REGRESSION = 3
#: The night's input is not there yet (``nightly``); retry later.
EXIT_INPUT_NOT_READY = 4
#: Committed, but a judge metric's all-rows result is degenerate, and the run gates on it.
EXIT_DEGENERATE = 5
#: ``ragbatch cache check`` without ``--repair`` found files that cannot be read and left
#: them in place (as ``3`` elsewhere: the command did its work and found something to act
#: on; ``--repair`` sets them aside).
EXIT_CACHE_DAMAGED = 3
#: Ctrl-C (SIGINT), as shells report a process ended by it: 128 + 2.
EXIT_INTERRUPTED = 130

#: Exit code -> what it means for a scheduler (the codes ``ragbatch nightly`` returns).
EXIT_CODES = {
    EXIT_OK: "committed; no regression beyond the threshold",
    EXIT_FAILED: "run failed (or its report could not be written); retrying may help",
    EXIT_INVALID: "config or input problem, or the run is running elsewhere; needs a fix",
    EXIT_REGRESSION: "committed, but a metric regressed beyond the threshold",
    EXIT_INPUT_NOT_READY: "this night's input is not there yet; retry later",
    EXIT_DEGENERATE: "committed, but a judge metric's result is degenerate; check the judge",
}
