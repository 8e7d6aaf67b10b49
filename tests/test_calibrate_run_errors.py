"""A judge run that fails inside ``ragbatch calibrate`` reports its own error.

Before, the run started inside the handler of the lookup that found no committed run;
its failure then carried that lookup's "no committed run" error as context, and the
runner (which looks through an error's context for the project's own error) reported
the lookup's message instead of the failure. The run's failure is caused here by a
stand-in for ``run_job`` that fails the way a run whose actors died does: with an
error that is not the project's own, which cannot be caused cheaply for real.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from ragbatch.calibrate import command


def test_failed_judge_run_is_not_reported_as_a_missing_run(tmp_path, monkeypatch):
    seen = {}

    def failing_run_job(job, **kwargs):
        # What the runner's error lookup would walk: the exception being handled now.
        seen["handling"] = sys.exc_info()[1]
        raise RuntimeError("actor died mid-batch")

    monkeypatch.setattr("ragbatch.pipeline.runner.run_job", failing_run_job)
    cal = SimpleNamespace(output=SimpleNamespace(uri=str(tmp_path), storage_options={}))
    with pytest.raises(RuntimeError, match="actor died mid-batch") as info:
        command.committed_judge_run(cal, object(), "cal1", "judge", None, None)
    assert seen["handling"] is None
    assert info.value.__context__ is None
