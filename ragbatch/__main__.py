"""``python -m ragbatch``: the ``ragbatch`` command where only the interpreter is on the
path, as in a Ray job's entry point (``ragbatch submit`` starts jobs this way)."""

from __future__ import annotations

import sys

from ragbatch.cli import main

if __name__ == "__main__":
    sys.exit(main())
