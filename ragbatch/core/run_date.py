"""Which date a run takes when none is given, decided in one place.

A run's date is the first of ``--run-date``, the config's ``run.run_date`` (and, for a
resumed run, the date its first attempt recorded) that is given; else today in UTC for
``run``, ``validate``, ``dry-run``, ``submit`` and ``calibrate`` (the UTC date the run
starts), and yesterday in UTC for a nightly run (``nightly``, ``submit --nightly``), whose
night has ended (docs/commands.md, "Nightly runs"). The date is written ``YYYY-MM-DD``
(ISO 8601) wherever it appears: partition keys, ``{run_date}`` in URIs, run ids, the
manifest.
"""

from __future__ import annotations

import datetime as dt


def today_utc(now: dt.datetime | None = None) -> dt.date:
    """The UTC calendar date of ``now`` (default: the current time); a naive ``now`` is
    taken as local time."""
    now = now or dt.datetime.now(dt.timezone.utc)
    return now.astimezone(dt.timezone.utc).date()


def yesterday_utc(now: dt.datetime | None = None) -> dt.date:
    """The UTC calendar date before ``now`` (default: the current time)."""
    return today_utc(now) - dt.timedelta(days=1)


def choose_run_date(
    *given: dt.date | None, nightly: bool = False, now: dt.datetime | None = None
) -> dt.date:
    """The run date: the first of ``given`` that is not None, else the default.

    Parameters
    ----------
    *given : datetime.date or None
        Candidates in order of precedence (for example ``--run-date``, then
        ``run.run_date``, then the date an earlier attempt recorded).
    nightly : bool
        The default is yesterday in UTC (:func:`yesterday_utc`) instead of today in UTC
        (:func:`today_utc`).
    now : datetime.datetime, optional
        The time the default is taken from (default: the current time); a run passes its
        start time, so that its date is the UTC date it started.

    Returns
    -------
    datetime.date
    """
    for date in given:
        if date is not None:
            return date
    return yesterday_utc(now) if nightly else today_utc(now)
