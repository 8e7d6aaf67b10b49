"""Proof that an output root can be written: write one probe object, then delete it.

``ragbatch validate`` and ``ragbatch run`` (before Ray starts) call
:func:`probe_output`. The probe is ``<root>/_staging/_probe-<random hex>``: under the
output root, in the ``_``-prefixed prefix readers skip, uniquely named, and the only
object the probe ever deletes. On the local filesystem the directories the probe had to
create are removed again when they are still empty; on object stores no directory (and
no bucket) is ever created.

A failure a retry does not fix (no bucket, a path under a regular file, no permission)
raises :class:`~ragbatch.core.errors.OutputNotWritableError` (exit status 2); an
unreachable, timed-out or throttling store raises a plain
:class:`~ragbatch.core.errors.OutputError` (exit status 1: trying again later may work).
"""

from __future__ import annotations

import errno
import uuid
from typing import Any

from fsspec.implementations.local import LocalFileSystem

from ragbatch.core.errors import OutputError, OutputNotWritableError
from ragbatch.io.fs import is_not_found, is_transient, resolve

PROBE_PREFIX = "_probe-"
_PROBE_BYTES = b"ragbatch write probe; safe to delete\n"


def probe_path(base: str) -> str:
    """A new, unique probe path under the output root ``base`` (a path of its filesystem)."""
    from ragbatch.io.staging import STAGING

    return f"{base.rstrip('/')}/{STAGING}/{PROBE_PREFIX}{uuid.uuid4().hex}"


def probe_output(
    uri: str, storage_options: dict[str, Any] | None = None, section: str = "output"
) -> str:
    """Write and delete one probe object under the output root ``uri``.

    Parameters
    ----------
    uri : str
        The output root (``output.uri`` as the run will use it).
    storage_options : dict, optional
        fsspec options of the root (``output.storage_options``).
    section : str, default "output"
        Config section the messages name (``output.uri``, ``output.storage_options``).

    Returns
    -------
    str
        The probe's path (already deleted).

    Raises
    ------
    OutputNotWritableError
        The root cannot be written or the probe cannot be deleted for a reason that needs
        a fix; the message contains "cannot write", names ``<section>.uri`` and the fix.
    OutputError
        The store is unreachable, timed out or throttled (transient); the message names
        the root.
    InputError
        The URI's protocol is unknown or its backend is not installed (:func:`resolve`).
    """
    fs, base = resolve(uri, storage_options)
    path = probe_path(base)
    local = isinstance(fs, LocalFileSystem)
    created = _missing_dirs(fs, fs._parent(path)) if local else []
    try:
        if local:
            fs.makedirs(fs._parent(path), exist_ok=True)
        fs.pipe_file(path, _PROBE_BYTES)
        fs.rm_file(path)
    except Exception as exc:  # noqa: BLE001 - every storage failure is classified below
        raise probe_error(uri, fs, base, exc, section) from None
    finally:
        for directory in created:  # deepest first; a directory not empty stays
            try:
                fs.rmdir(directory)
            except OSError:
                break
    return path


def _missing_dirs(fs: Any, path: str) -> list[str]:
    """``path`` and its ancestors that do not exist yet, deepest first."""
    missing = []
    while not fs.exists(path):
        missing.append(path)
        parent = fs._parent(path)
        if parent == path:
            break
        path = parent
    return missing


def probe_error(
    uri: str, fs: Any, base: str, exc: BaseException, section: str = "output"
) -> OutputError:
    """The error :func:`probe_output` raises for ``exc``, a failure to write or delete
    under the root ``uri`` (``base`` is its path in ``fs``).

    Returns
    -------
    OutputError
        A plain :class:`OutputError` when ``exc`` is transient
        (:func:`ragbatch.io.fs.is_transient`), else an :class:`OutputNotWritableError`
        whose message says why and what to change.
    """
    detail = f"{type(exc).__name__}: {str(exc)[:300] or type(exc).__name__}"
    if is_transient(exc):
        return OutputError(
            f"{uri}: cannot write to the storage service now ({detail}); it is unreachable, "
            f"timed out or throttling: check {section}.storage_options.endpoint_url and the "
            "network, or try again later"
        )
    return OutputNotWritableError(
        f"{uri}: cannot write under {section}.uri: {_why(fs, base, exc, section)} ({detail})"
    )


def _why(fs: Any, base: str, exc: BaseException, section: str) -> str:
    """Why the root cannot be written, and the fix."""
    if isinstance(fs, LocalFileSystem):
        blocker = _file_above(fs, base)
        if blocker is not None:
            return (
                f"{blocker} is a regular file, not a directory; set {section}.uri to a "
                "directory (or a path that does not exist yet) that no file is in the way of"
            )
    elif is_not_found(exc):
        bucket = base.split("/", 1)[0]
        return (
            f"bucket {bucket!r} does not exist (or these credentials cannot see it); "
            f"create it, or fix {section}.uri / {section}.storage_options"
        )
    if isinstance(exc, PermissionError) or getattr(exc, "errno", None) in (
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
    ):
        return (
            f"permission denied; set {section}.uri to a location this account may write "
            f"and delete in, or fix its permissions or the credentials "
            f"({section}.storage_options, or the environment)"
        )
    return f"fix {section}.uri or {section}.storage_options"


def _file_above(fs: Any, base: str) -> str | None:
    """The nearest existing path at or above ``base`` when it is a regular file."""
    path = base.rstrip("/") or "/"
    while not fs.exists(path):
        parent = fs._parent(path)
        if parent == path:
            return None
        path = parent
    return path if fs.isfile(path) else None
