"""Ids that name directories: one check for every place an id enters.

A run id, a calibration id and a judge's engine name (in a calibration's judge runs,
``<calibration id>-<judge>``) become path segments under an output root
(``runs/run_date=<d>/run_id=<id>/``, ``_staging/run_id=<id>/``,
``calibration/run_date=<d>/run_id=<id>/``). :func:`check_id` is the one check; it runs
where an id enters (the config's validators, the command line's ``--run-id`` flags, the
ids ragbatch composes such as ``nightly-<date>`` and ``<id>-<judge>``) and again where
output paths are built for writing (:class:`ragbatch.io.staging.Staging`,
:func:`ragbatch.calibrate.output.calibration_path`).

An id is 1 to :data:`MAX_ID_LENGTH` characters from :data:`ID_ALPHABET` (ASCII letters,
digits, ``-``, ``_`` and ``.``) and starts with a letter, a digit or ``_``. So it can
never be ``..`` or hold ``/`` or ``\\``, it is never a hidden file (a leading ``.``) or
an option on a command line (a leading ``-``), and it reads the same on every store and
tool: non-ASCII letters are refused because one visible name can be several byte
strings (Unicode normalization differs between macOS and Linux), and object-store
consoles, hive partition readers and shells escape them differently.
"""

from __future__ import annotations

import argparse
import re
from typing import Annotated, Callable, cast

from pydantic import AfterValidator

from ragbatch.core.errors import ConfigError

#: Longest id. Leaves room in a 255-byte file name for ``run_id=`` and a judge suffix,
#: and in a 1,024-byte object key for the rest of the path.
MAX_ID_LENGTH = 128

#: The characters an id may hold, as error messages name them.
ID_ALPHABET = "ASCII letters, digits, '-', '_' and '.'"

_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")

_RULE = (
    f"use 1 to {MAX_ID_LENGTH} {ID_ALPHABET}, starting with a letter, a digit or '_' "
    "(it names a directory under the output root)"
)


def id_problem(value: object) -> str | None:
    """What makes ``value`` unusable as an id, or None when it is a valid id.

    Parameters
    ----------
    value : object
        A candidate id (anything that is not a ``str`` is refused).

    Returns
    -------
    str or None
        A short reason such as ``"holds '/'"``, without the rule itself.
    """
    if not isinstance(value, str):
        return f"is a {type(value).__name__}, not text"
    if not value:
        return "is empty"
    if len(value) > MAX_ID_LENGTH:
        return f"is {len(value)} characters long (at most {MAX_ID_LENGTH})"
    if _ID.fullmatch(value):
        return None
    if value[0] in ".-":
        return f"starts with {value[0]!r}"
    bad = next(c for c in value if not _ID.fullmatch("a" + c))
    return f"holds {bad!r}"


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_id(value: object, what: str) -> str:
    """Return ``value`` when it is a valid id; else raise naming ``what``.

    Parameters
    ----------
    value : object
        The candidate id.
    what : str
        Where it came from, as the user wrote it: a flag (``"--run-id"``), a config field
        (``"calibration.run_id"``) or a description (``"judge run id"``).

    Returns
    -------
    str
        ``value`` unchanged.

    Raises
    ------
    ConfigError
        ``value`` is not a str, is empty, longer than :data:`MAX_ID_LENGTH`, starts with
        ``.`` or ``-``, or holds a character outside :data:`ID_ALPHABET` (``/``, ``\\``,
        a control character, a non-ASCII letter, ...). The message names ``what``, the
        value (cut to 60 characters), the reason and the rule.
    """
    problem = id_problem(value)
    if problem is not None:
        raise ConfigError(f"{what}: {_shown(value)} {problem}; {_RULE}")
    return cast(str, value)  # id_problem returns None only for a str


def _pydantic_check(value: str) -> str:
    problem = id_problem(value)
    if problem is not None:
        raise ValueError(f"{_shown(value)} {problem}; {_RULE}")
    return value


#: A config field that holds an id: pydantic reports a bad value under the field's path
#: (``run.run_id: '../x' holds '/'; use ...``).
PathId = Annotated[str, AfterValidator(_pydantic_check)]


def id_argument(what: str) -> Callable[[str], str]:
    """An argparse ``type=`` that accepts only valid ids.

    Parameters
    ----------
    what : str
        How the message names the value (argparse prefixes it with the flag).

    Returns
    -------
    callable
        Returns its argument unchanged, or raises ``argparse.ArgumentTypeError`` (argparse
        then prints the message and exits with status 2).
    """

    def parse(text: str) -> str:
        problem = id_problem(text)
        if problem is not None:
            raise argparse.ArgumentTypeError(f"{what} {_shown(text)} {problem}; {_RULE}")
        return text

    parse.__name__ = what.replace(" ", "_")
    return parse
