"""The ``ragbatch`` command line.

Commands: ``run``, ``validate``, ``metrics``, ``compare``, ``report``, ``nightly``,
``calibrate``, ``models build`` (a small real judge model, :mod:`ragbatch.models`), and
``submit``, ``status``, ``logs`` for Ray jobs. Exit status: 0 on success, 2 for a problem
in the config or input found before running (a run id that cannot name a directory, see
:mod:`ragbatch.core.ids`; another attempt of the same run id running now, see
:mod:`ragbatch.io.lease`; for ``compare`` and ``report``: an unknown run, root or column;
for ``status`` and ``logs``: an unknown job id), 1 for a failure while running (or an
unreachable cluster or package index), and 3 when ``compare --fail-on-regression`` finds
a metric that regresses beyond the threshold. ``run`` and ``nightly`` exit 5 when the run
committed but a judge metric's all-rows result is degenerate and ``--fail-on-degenerate``
(or ``diagnostics.fail_on_degenerate`` in the config) asks to gate on it (docs/judges.md,
"Judge health"). ``nightly`` adds 4 (the night's input is not there yet;
:mod:`ragbatch.ops.nightly_job`). ``submit --wait`` exits with the job's own status.
Ctrl-C exits 130; a run it stops says where its staged scores are kept and how to resume.

One module per command group:
:mod:`.common`, :mod:`.run`, :mod:`.validate`, :mod:`.metrics`, :mod:`.analysis`,
:mod:`.nightly`, :mod:`.jobs`, :mod:`.main`.
"""

from ragbatch.cli.main import main

__all__ = ["main"]
