"""The one rule for a run's date (ragbatch.core.run_date) and the commands that follow it."""

from __future__ import annotations

import datetime as dt

import pytest

from ragbatch.config.job import JobConfig
from ragbatch.core.run_date import choose_run_date, today_utc, yesterday_utc
from ragbatch.ops.submit import _run_naming

#: 00:30 on 11-28 in UTC+2 is 22:30 on 11-27 in UTC.
LATE_EVENING_UTC = dt.datetime(2026, 11, 28, 0, 30, tzinfo=dt.timezone(dt.timedelta(hours=2)))


def _config(**run) -> JobConfig:
    return JobConfig.from_dict(
        {
            "input": {"uri": "in/"},
            "output": {"uri": "out/"},
            "run": run,
            "metrics": [{"name": "response_length", "params": {"min_chars": 1}}],
        }
    )


def test_the_default_is_the_utc_date_today_or_yesterday_for_a_night():
    assert today_utc(LATE_EVENING_UTC) == dt.date(2026, 11, 27)
    assert yesterday_utc(LATE_EVENING_UTC) == dt.date(2026, 11, 26)
    assert choose_run_date(None, None, now=LATE_EVENING_UTC) == dt.date(2026, 11, 27)
    assert choose_run_date(now=LATE_EVENING_UTC, nightly=True) == dt.date(2026, 11, 26)
    before = dt.datetime.now(dt.timezone.utc).date()
    got = choose_run_date()
    assert got in {before, dt.datetime.now(dt.timezone.utc).date()}


def test_the_first_given_date_wins():
    given, config = dt.date(2026, 1, 2), dt.date(2026, 1, 3)
    assert choose_run_date(given, config, now=LATE_EVENING_UTC) == given
    assert choose_run_date(None, config, now=LATE_EVENING_UTC, nightly=True) == config


@pytest.mark.parametrize("nightly", [False, True])
def test_submit_names_the_run_date_as_run_and_nightly_do(nightly):
    back = dt.timedelta(days=1 if nightly else 0)  # nightly: yesterday in UTC
    before = dt.datetime.now(dt.timezone.utc).date()
    _, date = _run_naming(_config(), "r1", None, nightly)
    after = dt.datetime.now(dt.timezone.utc).date()
    assert date in {before - back, after - back}
    _, date = _run_naming(_config(run_date="2026-11-20"), "r1", None, nightly)
    assert date == dt.date(2026, 11, 20)
    _, date = _run_naming(_config(run_date="2026-11-20"), "r1", dt.date(2026, 11, 21), nightly)
    assert date == dt.date(2026, 11, 21)
