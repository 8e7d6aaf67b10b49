"""Deletes that stay inside the prefix that owns them.

Every delete ragbatch makes goes through :func:`remove_under` or
:func:`remove_empty_dir`, which first check with :func:`ensure_under` that the target
lies strictly below the prefix the caller owns (a run's staging prefix, the output
root's ``_staging/``, a temporary folder). A path that leaves it (through ``..``, an
absolute part, or by being the prefix itself) is refused before anything is deleted.
"""

from __future__ import annotations

import logging
import posixpath
from typing import Any

from ragbatch.core.errors import OutputError

log = logging.getLogger("ragbatch")


def _normal(path: str) -> str:
    path = path.replace("\\", "/")
    lead = "/" if path.startswith("/") else ""
    return lead + posixpath.normpath(path).lstrip("/")


def ensure_under(owner: str, path: str) -> str:
    """``path``, normalized, when it lies strictly below ``owner``.

    Both are filesystem paths of one fsspec filesystem (no protocol: ``bucket/key`` on
    object stores, absolute POSIX paths locally); ``.`` and ``..`` parts are resolved
    lexically and ``\\`` counts as ``/``.

    Parameters
    ----------
    owner : str
        The prefix the caller owns.
    path : str
        What the caller is about to delete.

    Returns
    -------
    str
        The normalized ``path``.

    Raises
    ------
    OutputError
        ``path`` is ``owner`` itself or lies outside it; the message names both.
    """
    root, target = _normal(owner).rstrip("/"), _normal(path)
    if not root or root in (".", "/") or not target.startswith(root + "/"):
        raise OutputError(
            f"refusing to delete {path!r}: it is not inside {owner!r}, the "
            "prefix this step owns (nothing was deleted)"
        )
    return target


def remove_under(fs: Any, owner: str, path: str, *, recursive: bool = False) -> None:
    """Delete ``path`` (a file, or with ``recursive`` a whole prefix) on ``fs`` after
    :func:`ensure_under` has accepted it.

    Raises
    ------
    OutputError
        ``path`` is not strictly below ``owner``.
    OSError
        The filesystem's own errors (a missing path, denied access).
    """
    fs.rm(ensure_under(owner, path), recursive=recursive)


def remove_empty_dir(fs: Any, owner: str, path: str) -> bool:
    """Remove the directory ``path`` if, and only if, it is empty; return whether it was.

    A directory that holds anything (another run's staging prefix, say) or that is
    already gone is left alone. Local and in-memory filesystems remove an empty
    directory atomically (``rmdir``); object stores have no directories, and their
    ``rmdir`` of a key prefix deletes nothing.

    Raises
    ------
    OutputError
        ``path`` is not strictly below ``owner``.
    """
    target = ensure_under(owner, path)
    try:
        fs.rmdir(target)
    except OSError:  # not empty, already gone, or a store without directories
        return False
    return True
