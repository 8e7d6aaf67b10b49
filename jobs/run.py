"""Job entry point for ``ray job submit``: ``python jobs/run.py CONFIG [ragbatch run options]``.

Equivalent to ``ragbatch run CONFIG ...`` (and ``python -m ragbatch run CONFIG ...``) with
this checkout's code: ``ragbatch submit --working-dir CHECKOUT`` starts jobs this way, so a
cluster job needs only the shipped checkout and an interpreter with ragbatch's dependencies.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragbatch.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
