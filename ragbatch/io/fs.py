"""Filesystems behind input URIs: resolution, pyarrow bridging and error messages.

Every input location is an fsspec URI: a plain local path (relative or absolute),
``file://``, ``s3://`` (s3fs), ``gs://`` (gcsfs), ``memory://`` or any other protocol
fsspec knows. Object-store backends are optional dependencies; a missing one is reported
with the exact ``pip install`` command that adds it.

Object stores get defaults that make a wrong endpoint or missing network fail within
seconds instead of retrying for minutes (see :data:`S3_DEFAULTS`); anything the user puts
in ``storage_options`` wins over them.
"""

from __future__ import annotations

import copy
import errno
import logging
import os
import random
import time
from typing import Any, Callable, TypeVar
from urllib.parse import urlsplit

import fsspec
import pyarrow.fs as pafs
from fsspec.core import url_to_fs
from fsspec.utils import get_protocol

from ragbatch.core.errors import InputError, exception_chain
from ragbatch.core.redact import REDACTED

log = logging.getLogger("ragbatch")
T = TypeVar("T")

#: Optional backend per protocol: (module that must import, pyproject extra).
_BACKENDS: dict[str, tuple[str, str]] = {
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
}

#: s3fs defaults applied under the user's ``storage_options``. ``config_kwargs`` goes to
#: botocore's ``Config`` (through aiobotocore): a 5 s connect timeout, a 30 s socket read
#: timeout, and botocore's "standard" retry mode with 3 attempts in all, which still
#: retries throttling and transient 5xx errors (botocore's own default is 60 s timeouts
#: and the "legacy" mode). ``retries`` is s3fs's own retry loop around each call (class
#: default 5), which stacks on botocore's; 2 keeps a dead endpoint from multiplying the
#: wait. With these values a refused connection (wrong port) fails planning in 3-6 s; an
#: address that never answers costs about connect_timeout x 3 attempts per request.
S3_DEFAULTS: dict[str, Any] = {
    "config_kwargs": {
        "connect_timeout": 5,
        "read_timeout": 30,
        "retries": {"max_attempts": 3, "mode": "standard"},
    },
    "retries": 2,
}

#: Option keys that ragbatch consumes itself instead of passing to the filesystem class.
_S3_OWN_KEYS = ("retries",)


def resolve(
    uri: str, storage_options: dict[str, Any] | None = None
) -> tuple[fsspec.AbstractFileSystem, str]:
    """Turn a URI into a filesystem and the path inside it.

    Parameters
    ----------
    uri : str
        Any fsspec URI or a plain local path (relative paths are made absolute).
    storage_options : dict, optional
        Passed to the filesystem class (for s3fs: ``endpoint_url``, ``key``, ``secret``,
        ``token``, ``anon``, ``client_kwargs``, ``config_kwargs``, ...). For ``s3://``
        they are laid over :data:`S3_DEFAULTS`; nested ``config_kwargs`` merge key by key.
        ``retries`` sets s3fs's own retry count.

    Returns
    -------
    tuple of (fsspec.AbstractFileSystem, str)
        The filesystem and the path without its protocol (``bucket/key`` for object
        stores, an absolute POSIX path for local files).

    Raises
    ------
    InputError
        The protocol is unknown, its optional backend is not installed (the message gives
        the ``pip install 'ragbatch[extra]'`` to run), or the options are rejected.
    """
    protocol = get_protocol(uri)
    options = dict(storage_options or {})
    own: dict[str, Any] = {}
    if protocol in ("s3", "s3a") and "::" not in uri:
        options = _with_s3_defaults(options)
        own = {k: options.pop(k) for k in _S3_OWN_KEYS if k in options}
    try:
        fs, path = url_to_fs(uri, **options)
    except ImportError as exc:
        raise _missing_backend(uri, protocol, exc) from None
    except ValueError as exc:
        if "Protocol not known" in str(exc) or "not known" in str(exc):
            raise InputError(
                f"{uri}: unknown storage protocol {protocol!r}; use a local path or one of "
                "file://, s3://, gs://, memory:// (or another protocol fsspec supports)"
            ) from None
        raise InputError(f"{uri}: cannot open the filesystem: {exc}") from None
    except TypeError as exc:
        raise InputError(
            f"{uri}: the storage_options were rejected by the {protocol!r} filesystem: "
            f"{exc}; remove or rename the offending option"
        ) from None
    if "retries" in own:
        fs.retries = int(own["retries"])
    return fs, path


#: botocore's standard environment variables for the retry settings of
#: :data:`S3_DEFAULTS`: when one is set, that default is left out so that it applies.
_RETRY_ENV = {"max_attempts": "AWS_MAX_ATTEMPTS", "mode": "AWS_RETRY_MODE"}


def _with_s3_defaults(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` laid over :data:`S3_DEFAULTS`. Nothing here sets an endpoint or
    credentials, so botocore's environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
    ``AWS_PROFILE``, ...) applies to whatever ``options`` leave out; the retry defaults
    give way to ``AWS_MAX_ATTEMPTS`` and ``AWS_RETRY_MODE`` too."""
    merged = copy.deepcopy(S3_DEFAULTS)
    retries = merged["config_kwargs"]["retries"]
    for key, env in _RETRY_ENV.items():
        if os.environ.get(env):
            retries.pop(key)
    user_config = options.get("config_kwargs") or {}
    merged["config_kwargs"].update(user_config)
    for key, value in options.items():
        if key != "config_kwargs":
            merged[key] = value
    return merged


def _missing_backend(uri: str, protocol: str, exc: ImportError) -> InputError:
    module, extra = _BACKENDS.get(protocol, (None, None))
    if extra is not None:
        return InputError(
            f"{uri}: reading {protocol}:// needs the optional package {module!r}, which is "
            f"not installed; run: pip install 'ragbatch[{extra}]'"
        )
    return InputError(f"{uri}: the filesystem for {protocol!r} cannot be loaded: {exc}")


def is_process_local(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether ``fs`` keeps its files in this process's memory only (``memory://``).

    Ray workers cannot see such files, so the runner reads and writes them on the driver.

    Returns
    -------
    bool
    """
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return "memory" in protocols


def to_pyarrow(fs: fsspec.AbstractFileSystem) -> pafs.FileSystem:
    """A :class:`pyarrow.fs.FileSystem` over the same storage.

    Returns
    -------
    pyarrow.fs.FileSystem
        :class:`pyarrow.fs.LocalFileSystem` for the local filesystem, else a
        :class:`pyarrow.fs.PyFileSystem` wrapping ``fs`` with
        :class:`pyarrow.fs.FSSpecHandler`. Paths are the ones :func:`resolve` returns.
    """
    from fsspec.implementations.local import LocalFileSystem

    if isinstance(fs, LocalFileSystem):
        return pafs.LocalFileSystem()
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs))


# Exception class names (anywhere in the MRO of the error or its causes) -> likely cause.
_NOT_FOUND = {"FileNotFoundError", "NoSuchBucket", "NoSuchKey", "NotFound"}
_DENIED = {
    "PermissionError",
    "NoCredentialsError",
    "PartialCredentialsError",
    "CredentialRetrievalError",
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "DefaultCredentialsError",
}
_TIMEOUT = {
    "TimeoutError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "FSTimeoutError",
    "ServerTimeoutError",
    "timeout",
}
_UNREACHABLE = {
    "EndpointConnectionError",
    "ConnectionRefusedError",
    "ClientConnectorError",
    "ClientConnectionError",
    "ServerDisconnectedError",
    "ConnectionError",
    "gaierror",
}
_DENIED_WORDS = (
    "access denied",
    "accessdenied",
    "forbidden",
    "invalidaccesskeyid",
    "signaturedoesnotmatch",
    "unable to locate credentials",
)
_NOT_FOUND_WORDS = ("nosuchbucket", "nosuchkey", "does not exist", "not found")


def describe_storage_error(uri: str, exc: BaseException, section: str = "input") -> InputError:
    """Turn a storage exception into one :class:`InputError` that names ``uri`` and the
    likely cause.

    Parameters
    ----------
    uri : str
        The location being read (shown verbatim in the message).
    exc : BaseException
        What the filesystem raised: ``OSError`` subclasses, botocore / aiohttp errors,
        s3fs-translated errors, timeouts.
    section : str, default "input"
        Config section the advice names (``input.uri``, ``output.storage_options``, ...).

    Returns
    -------
    InputError
        Message of the form ``"<uri>: <cause>: <original message>; <what to do>"``, with
        cause one of: not found, access denied or no credentials, timed out, storage
        endpoint unreachable, is a directory, or a generic read failure.
    """
    names = _class_names(exc)
    detail = _short(exc, hide=_userinfo(uri))
    low = detail.lower()
    if names & _DENIED or isinstance(exc, PermissionError) or any(w in low for w in _DENIED_WORDS):
        return InputError(
            f"{uri}: access denied or no valid credentials ({detail}); check the credentials "
            f"({section}.storage_options key/secret/token, or the AWS_*/GOOGLE_* environment of "
            "every node) and that they may read this location"
        )
    if names & _TIMEOUT:
        return InputError(
            f"{uri}: timed out talking to the storage service ({detail}); check the network "
            f"and {section}.storage_options.endpoint_url, or raise "
            f"{section}.storage_options.config_kwargs.connect_timeout/read_timeout"
        )
    if names & _UNREACHABLE or _errno(exc) in (
        errno.ECONNREFUSED,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
    ):
        return InputError(
            f"{uri}: cannot reach the storage endpoint ({detail}); check "
            f"{section}.storage_options.endpoint_url (scheme, host, port) and that the service is up"
        )
    if names & _NOT_FOUND or any(w in low for w in _NOT_FOUND_WORDS):
        relative = "://" not in uri and not os.path.isabs(uri)
        where = (
            f" (a relative path is taken from the directory ragbatch runs in, {os.getcwd()})"
            if relative
            else ""
        )
        return InputError(
            f"{uri}: not found ({detail}); check that the bucket and path in {section}.uri exist "
            f"and are spelled right{where}"
        )
    if "IsADirectoryError" in names:
        return InputError(f"{uri}: is a directory, expected a file ({detail})")
    return InputError(f"{uri}: cannot read ({type(exc).__name__}: {detail})")


def _class_names(exc: BaseException) -> set[str]:
    names: set[str] = set()
    for item in exception_chain(exc):
        names.update(cls.__name__ for cls in type(item).__mro__)
        code = _error_code(item)
        if code:
            names.add(code)
    return names


def _error_code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return response.get("Error", {}).get("Code")
    return None


def _errno(exc: BaseException) -> int | None:
    for item in exception_chain(exc):
        if isinstance(item, OSError) and item.errno:
            return item.errno
    return None


def _short(exc: BaseException, limit: int = 300, hide: tuple[str, ...] = ()) -> str:
    text = str(exc) or type(exc).__name__
    for secret in hide:
        text = text.replace(secret, REDACTED)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _userinfo(uri: str) -> tuple[str, ...]:
    """The credentials written into ``uri`` (``key:secret`` of ``s3://key:secret@bucket``),
    each link of an fsspec chain. A storage client may quote the bucket name it was given,
    and there they have no scheme for :func:`ragbatch.core.redact.redact_text` to find."""
    found = []
    for link in uri.split("::"):
        if "://" not in link:
            continue
        try:
            netloc = urlsplit(link).netloc
        except ValueError:  # an unbalanced IPv6 bracket: no userinfo can be read either
            netloc = link.split("://", 1)[1].split("/", 1)[0]
        userinfo = netloc.rpartition("@")[0]
        if userinfo:
            found.append(userinfo)
    return tuple(found)


#: Exception class names and error codes of storage failures worth retrying: the service
#: could not be reached or did not answer in time, or it asked the client to slow down.
_THROTTLED = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequestsException",
    "ServiceUnavailable",
    "InternalError",
    "RequestTimeout",
    "503",
    "500",
}


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` is a storage failure a later attempt may not meet: the endpoint
    unreachable or the connection dropped, a timeout, throttling or a 5xx reply. Not
    found, access denied and anything else are permanent."""
    names = _class_names(exc)
    if (
        names & _DENIED
        or names & _NOT_FOUND
        or isinstance(exc, (PermissionError, FileNotFoundError))
    ):
        return False
    if names & (_TIMEOUT | _UNREACHABLE | _THROTTLED):
        return True
    return _errno(exc) in (
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ETIMEDOUT,
        errno.EPIPE,
    )


def is_not_found(exc: BaseException | None) -> bool:
    """True when ``exc`` says the path (or its bucket) does not exist: ``FileNotFoundError``
    or a ``NoSuchKey``/``NoSuchBucket``/``NotFound`` error; False for None."""
    if exc is None:
        return False
    return isinstance(exc, FileNotFoundError) or bool(_class_names(exc) & _NOT_FOUND)


#: Attempts and the longest wait between them for :func:`with_storage_retries`: the
#: waits grow 1, 2, 4, 8, 16, 16 ... s (with 20 % jitter), about 1.5 minutes in all.
STORAGE_ATTEMPTS = 8
STORAGE_MAX_BACKOFF_S = 16.0


def with_storage_retries(
    fn: Callable[[], T],
    what: str,
    *,
    attempts: int = STORAGE_ATTEMPTS,
    max_backoff_s: float = STORAGE_MAX_BACKOFF_S,
) -> T:
    """``fn()``, tried again with exponential backoff while it fails with a transient
    storage error (:func:`is_transient`).

    Parameters
    ----------
    fn : callable
        The storage operation, without arguments.
    what : str
        What it does, for the log ("read s3://b/x.csv").
    attempts : int
        Calls in all (>= 1).
    max_backoff_s : float
        Longest wait between two calls, in seconds.

    Raises
    ------
    Exception
        Whatever ``fn`` raised: at once when it is not transient, else after the last
        attempt.
    """
    for attempt in range(attempts):
        try:
            return fn()
        except Exception as exc:
            if attempt + 1 >= attempts or not is_transient(exc):
                raise
            wait = min(2.0**attempt, max_backoff_s) * random.uniform(0.8, 1.2)
            log.warning(
                "%s failed (%s: %s); attempt %d of %d in %.1f s",
                what,
                type(exc).__name__,
                _short(exc, 200),
                attempt + 2,
                attempts,
                wait,
            )
            time.sleep(wait)
    raise AssertionError("unreachable")
