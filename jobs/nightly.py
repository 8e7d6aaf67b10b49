"""Nightly entry point: ``python jobs/nightly.py CONFIG [ragbatch nightly options]``.

Equivalent to ``ragbatch nightly CONFIG ...``: runs one night (default: yesterday, UTC),
publishes its report and its comparison with the previous committed run, and exits 0
(committed), 1 (failed; retrying may help), 2 (config or input needs a fix), 3 (committed
but regressed beyond --fail-on-regression) or 4 (the night's input is not there yet).
For ``ray job submit``, ``ragbatch submit --nightly --working-dir CHECKOUT`` and schedulers
that start a script; ``python -m ragbatch nightly`` is the same with the installed package.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragbatch.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["nightly", *sys.argv[1:]]))
