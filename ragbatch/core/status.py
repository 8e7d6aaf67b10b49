"""The status vocabulary of a score cell.

Every (row, metric) cell of the scores table carries exactly one of these one-word
statuses. ``score`` is non-null only when the status is ``ok``: a score of 0 always means
the metric measured 0, never that something failed.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

OK = "ok"
NOT_APPLICABLE = "not_applicable"
MISSING_INPUT = "missing_input"
PARSE_FAILURE = "parse_failure"
JUDGE_ERROR = "judge_error"
TIMEOUT = "timeout"
CONTEXT_TOO_LONG = "context_too_long"
ERROR = "error"

#: Every status, in the order summaries and reports list them.
STATUSES: tuple[str, ...] = (
    OK,
    NOT_APPLICABLE,
    MISSING_INPUT,
    PARSE_FAILURE,
    JUDGE_ERROR,
    TIMEOUT,
    CONTEXT_TOO_LONG,
    ERROR,
)

#: One line per status, used by ``ragbatch metrics`` and the docs.
DESCRIPTIONS: dict[str, str] = {
    OK: "the metric ran; `score` holds its value",
    NOT_APPLICABLE: "the inputs are present but the metric does not apply to them "
    "(for example an empty context list for context_length)",
    MISSING_INPUT: "a required input is null, empty where content is needed, or not of "
    "the expected type; `reason` names the column",
    PARSE_FAILURE: "a model or callback reply could not be parsed",
    JUDGE_ERROR: "the judge engine failed for this row",
    TIMEOUT: "the call for this row ran past its time limit",
    CONTEXT_TOO_LONG: "the prompt would exceed the model's context window",
    ERROR: "anything else went wrong for this row; `reason` holds the message",
}


def other_statuses(counts: Mapping[str, Any]) -> str:
    """The statuses other than ``ok`` that a summary row counts, as ``"status=n, ..."``.

    Parameters
    ----------
    counts : mapping
        A summary row (``summary.parquet``, docs/output-schema.md): an ``n_<status>``
        integer for each of :data:`STATUSES` (null or missing counts as 0).

    Returns
    -------
    str
        The non-zero counts in :data:`STATUSES` order, ``ok`` left out; empty when every
        cell is ``ok``.
    """
    return ", ".join(
        f"{s}={counts[f'n_{s}']}" for s in STATUSES if s != OK and counts.get(f"n_{s}")
    )


#: Statuses a run can be told to judge again (``cache.rejudge``, ``--rejudge``). Only a
#: ``parse_failure`` cell comes from a cached reply, and only it is re-asked under new
#: cache keys (:mod:`ragbatch.judge.rejudge`); the others are never cached, so every run
#: asks them again anyway, and naming them changes nothing.
REJUDGE_STATUSES: tuple[str, ...] = (PARSE_FAILURE, JUDGE_ERROR, TIMEOUT, CONTEXT_TOO_LONG)


def check_rejudge(statuses: Iterable[str], where: str) -> list[str]:
    """``statuses`` without repeats, in order, each one of :data:`REJUDGE_STATUSES`.

    Parameters
    ----------
    statuses : iterable of str
        What ``cache.rejudge`` or ``--rejudge`` names.
    where : str
        The field or flag, for the message.

    Returns
    -------
    list of str

    Raises
    ------
    ValueError
        A status that cannot be judged again: the message names it, ``where`` and the
        statuses accepted, and for ``error`` why (the metric's own code failed; a new
        reply does not fix it).
    """
    out: list[str] = []
    for status in statuses:
        if status not in REJUDGE_STATUSES:
            why = (
                " (an error cell is the metric's own code failing: asking the judge again "
                "does not fix it)"
                if status == ERROR
                else ""
            )
            raise ValueError(
                f"{where}: {status!r} cannot be judged again{why}; choose from "
                f"{', '.join(REJUDGE_STATUSES)}"
            )
        if status not in out:
            out.append(status)
    return out
