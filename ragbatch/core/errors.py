"""Error types raised by ragbatch.

Every error carries a message meant for the person running the job: it names the config
field, input column, file or row involved and says what to change.
"""

from __future__ import annotations

import unicodedata


class RagbatchError(Exception):
    """Base class of every error ragbatch raises on purpose."""


class ConfigError(RagbatchError):
    """The job config is invalid (unknown metric, bad params, missing section, ...)."""

    def __init__(self, problems: list[str] | str):
        if isinstance(problems, str):
            problems = [problems]
        self.problems = list(problems)
        text = (
            self.problems[0]
            if len(self.problems) == 1
            else "\n".join(f"  - {p}" for p in self.problems)
        )
        if len(self.problems) > 1:
            text = f"{len(self.problems)} problems in the config:\n{text}"
        super().__init__(text)


class InputError(RagbatchError):
    """The input cannot be found, read or decoded, or lacks a mapped column."""


class InputNotFoundError(InputError):
    """The input location holds no files: the path does not exist, the glob matches
    nothing, or the directory holds no visible file. (For a nightly job whose input
    folder is written by another job, it may not be there *yet*.)"""


class OutputError(RagbatchError):
    """The output location cannot be written, or a run with the same id already exists."""


class OutputNotWritableError(ConfigError, OutputError):
    """The output root cannot be written for a reason a retry does not fix: the bucket
    is missing, the path lies under a regular file, or the account may not write or
    delete there. A :class:`ConfigError` (exit status 2: the config needs a fix) and an
    :class:`OutputError`."""


class RunInProgressError(RagbatchError):
    """Another attempt of the same run id holds the run's lease (it is running now, on
    this machine or another), or took it over from this attempt; the message names the
    holder and when its lease expires (:mod:`ragbatch.io.lease`)."""


class ConservationError(RagbatchError):
    """The written scores do not hold exactly one cell per (input row, metric)."""


class EngineError(RagbatchError):
    """A model engine (embedding, cross-encoder, judge) cannot be loaded or run."""


class ClusterError(RagbatchError):
    """A Ray cluster's job server cannot be reached or refused a request."""


class JobNotFoundError(RagbatchError):
    """The Ray cluster has no job with the given id."""


class RunError(RagbatchError):
    """The run stopped while running: more rows failed than ``run.error_budget`` allows."""


class StageBugError(RagbatchError):
    """A stage of the run raised an exception from ragbatch's own code (a bug, not a
    fault of the engine or the data): the run fails instead of marking rows ``error``.

    The message names the stage (``<kind>:<engine>``), the exception's type and message,
    and ends with its traceback.
    """


def exception_chain(exc: BaseException, limit: int = 10) -> list[BaseException]:
    """``exc`` and its causes (``__cause__``, else ``__context__``), at most ``limit``."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < limit:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


#: Unicode categories :func:`printable` escapes: controls, format characters (bidi
#: overrides, zero-width spaces), surrogates and private-use characters.
UNPRINTABLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co"})


def printable(text: str) -> str:
    """``text`` as one line a terminal shows as written: runs of whitespace (line breaks
    included) as one space, and each character of :data:`UNPRINTABLE_CATEGORIES` as its
    escape (``\\x1b``, ``\\u202e``, ``\\U000f0000``), so that text taken from a file or
    a reply (a damaged file's column names, PyArrow quoting its bytes) cannot move the
    cursor, recolour the screen or reorder a line. Letters, marks, symbols and emoji of
    any script are kept."""
    return "".join(_escaped(c) for c in " ".join(text.split()))


def _escaped(c: str) -> str:
    if unicodedata.category(c) not in UNPRINTABLE_CATEGORIES:
        return c
    code = ord(c)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def describe_exception(exc: BaseException, limit: int = 1000) -> str:
    """``"<exception type>: <message>"`` on one line, the message :func:`printable`
    (PyArrow's and vLLM's errors span several lines; PyArrow quotes a damaged file's
    bytes) and cut to ``limit`` characters with ``...``; the type alone when the message
    is empty."""
    text = printable(str(exc))
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C (SIGINT) after it began staging scores: it is not
    committed, what it staged is kept, and starting it again with the same run id
    resumes it. A KeyboardInterrupt, so that it stops everything as one does.

    Attributes
    ----------
    run_id : str
    run_date : str
        The run's date, ``YYYY-MM-DD``.
    staging_uri : str
        Where the run's staged scores and state are kept.
    """

    def __init__(self, run_id: str, run_date: str, staging_uri: str):
        self.run_id = run_id
        self.run_date = run_date
        self.staging_uri = staging_uri
        super().__init__(f"run {run_id} interrupted; not committed")
