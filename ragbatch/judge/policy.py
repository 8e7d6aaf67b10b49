"""The rows of a judge metric's ``policy`` for the judge's own failures, the same in every
judge metric: a prompt longer than the judge's context window is refused as
``context_too_long`` (:mod:`ragbatch.judge.run`), and a reply that does not parse is
asked again and then recorded as ``parse_failure`` (:mod:`ragbatch.judge.parse`).

:func:`failure_policy` gives the two rows; each metric names what makes its own reply
unparsable. docs/metrics.md and docs/judges.md show them in each metric's table.
"""

from __future__ import annotations

#: The case of the window row, before a metric's note on what its prompt holds.
TOO_LONG = "prompt longer than the judge's window"
#: The window note of a metric whose step reads little of the row: the prompt's shared
#: block (:mod:`ragbatch.judge.prompt`) holds the contexts all the same.
SHARED_BLOCK = "the shared block holds the contexts too"
#: What a cell of a prompt over the judge's window holds.
TOO_LONG_OUTCOME = "context_too_long; nothing is truncated"
#: What a cell whose reply did not parse holds.
PARSE_FAILURE_OUTCOME = "parse_failure after the retries; the raw reply is kept"


def failure_policy(unparsable: str, window_note: str | None = None) -> tuple[tuple[str, str], ...]:
    """The two ``(case, outcome)`` policy rows of a judge metric's failures, in order: the
    prompt over the judge's window (:data:`TOO_LONG_OUTCOME`), then a reply that does not
    parse (:data:`PARSE_FAILURE_OUTCOME`).

    Parameters
    ----------
    unparsable : str
        The metric's case for a reply it cannot parse, e.g. ``"verdict count differs from
        the statement count"``.
    window_note : str, optional
        Why the prompt may run long, shown in parentheses after :data:`TOO_LONG`.
    """
    too_long = TOO_LONG if window_note is None else f"{TOO_LONG} ({window_note})"
    return ((too_long, TOO_LONG_OUTCOME), (unparsable, PARSE_FAILURE_OUTCOME))
