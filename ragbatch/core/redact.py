"""Credentials out of everything ragbatch writes or prints.

One redaction serves every writer (run and calibration manifests, logs, printed config,
reports, recorded model ids):

* :func:`redact` copies a config-like value (mappings, lists, scalars, any depth) with
  the value of every credential key replaced by :data:`REDACTED`, and every URL's
  credentials removed;
* :func:`redact_url` removes the credentials of one URL: its userinfo
  (``https://user:pass@host`` -> ``https://host``) and any query parameter whose name is a
  credential key (``?sig=...``, ``X-Amz-Signature=...``). A URL without credentials comes
  back unchanged, byte for byte;
* :func:`redact_text` does the same to every URL inside free text (log lines, error
  messages); :class:`RedactingFilter` applies it to log records;
* :func:`drop_redacted` removes redacted values again, for code that re-opens storage
  from a recorded config (the filesystem then falls back on the environment's
  credentials).

Which key names are credentials (:func:`is_credential_key`) is decided on the words of
the name (split at ``_``, ``-``, ``.``, spaces and camelCase): see docs/secrets.md.
"""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

#: What a redacted value is replaced with.
REDACTED = "***"

#: A key holding one of these words anywhere in its name holds a credential
#: (``aws_secret_access_key``, ``client_secret``, ``sas_token``, ``aws_session_token``,
#: ``X-Amz-Security-Token``, ``Authorization``, ``X-Amz-Credential``, ``sig``).
CREDENTIAL_WORDS = frozenset(
    {
        "secret",
        "password",
        "passwd",
        "pwd",
        "passphrase",
        "token",
        "credential",
        "credentials",
        "authorization",
        "cookie",
        "apikey",
        "signature",
        "sig",
        "sas",
    }
)
#: A key whose last word is one of these holds a credential (``key``, ``api_key``,
#: ``account_key``, ``private_key``, ``X-Api-Key``, ``auth``, ``db_pass``); a key
#: where the word comes earlier (``key_prefix``, ``api_key_env``) does not.
CREDENTIAL_LAST_WORDS = frozenset({"key", "keys", "auth", "pass"})
#: Whole key names (words joined with ``_``) that hold credentials without such a word:
#: connection strings, and the ids that name a key (an access key id is half of the
#: pair that signs requests, recorded nowhere else).
CREDENTIAL_NAMES = frozenset(
    {"connection_string", "conn_str", "dsn", "aws_access_key_id", "access_key_id", "private_key_id"}
)

_CAMEL = (re.compile(r"([A-Z]+)([A-Z][a-z])"), re.compile(r"([a-z0-9])([A-Z])"))
#: fsspec's chain separator: ``::`` before a protocol (not the ``::`` of an IPv6 host).
_CHAIN = re.compile(r"::(?=[A-Za-z][A-Za-z0-9+.-]*://)")
#: A URL inside free text: a scheme, ``://`` and everything up to white space or a quote,
#: less punctuation that ends a sentence or clause.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]*[^\s'\"<>.,;:!?)]")


def key_words(name: str) -> list[str]:
    """The lower-case words of a key name: ``"AWSSecretAccessKey"`` -> ``["aws",
    "secret", "access", "key"]``, ``"x-api-key"`` -> ``["x", "api", "key"]``."""
    for pattern in _CAMEL:
        name = pattern.sub(r"\1_\2", name)
    return [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]


def is_credential_key(name: Any) -> bool:
    """Whether a mapping key names a credential (see :data:`CREDENTIAL_WORDS`,
    :data:`CREDENTIAL_LAST_WORDS` and :data:`CREDENTIAL_NAMES`).

    Parameters
    ----------
    name : Any
        The key; only strings can name a credential.

    Returns
    -------
    bool
    """
    if not isinstance(name, str):
        return False
    words = key_words(name)
    if not words:
        return False
    return (
        any(w in CREDENTIAL_WORDS for w in words)
        or words[-1] in CREDENTIAL_LAST_WORDS
        or "_".join(words) in CREDENTIAL_NAMES
    )


def redact_url(url: str) -> str:
    """``url`` without credentials: no userinfo, no query parameter named like a
    credential. fsspec chains (``simplecache::https://...``) are redacted link by link.

    Parameters
    ----------
    url : str
        Any string; one that is not a URL with credentials comes back unchanged.

    Returns
    -------
    str
        The same string when it held no credentials (so ids derived from credential-free
        URLs do not change); otherwise the URL rebuilt without them, for example
        ``http://user:pass@[::1]:8000/v1?sig=x&a=1`` -> ``http://[::1]:8000/v1?a=1``.
    """
    return "::".join(_redact_one_url(part) for part in _CHAIN.split(url))


def _redact_one_url(url: str) -> str:
    if "://" not in url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:  # for example an unbalanced IPv6 bracket: not a URL we can read
        return url
    netloc, query = parts.netloc, parts.query
    if "@" in netloc:
        netloc = netloc.rpartition("@")[2]
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        kept = [(k, v) for k, v in pairs if not is_credential_key(k)]
        if len(kept) != len(pairs):
            query = urlencode(kept)
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def redact_text(text: str) -> str:
    """``text`` with every URL in it passed through :func:`redact_url` (a URL ends at
    white space or a quote; punctuation right after it is not part of it)."""
    if "://" not in text:
        return text
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)


def redact(value: Any) -> Any:
    """A copy of ``value`` safe to write or print.

    Parameters
    ----------
    value : Any
        A config or part of one: mappings, lists, tuples and scalars, any depth (for
        example ``JobConfig.model_dump(mode="json")``).

    Returns
    -------
    Any
        The same shape. Under a credential key (:func:`is_credential_key`), a string,
        number or list becomes :data:`REDACTED`; a mapping is redacted inside (so a
        name-keyed mapping such as ``engines`` or ``min_agreement`` keeps its entries
        whatever they are called); ``None``, ``""`` and booleans stay, since they hold
        no secret. Every other string goes through :func:`redact_url`. The input is not
        modified.
    """
    if isinstance(value, dict):
        return {k: _redact_entry(k, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v) for v in value)
    if isinstance(value, str):
        return redact_url(value)
    return value


def _redact_entry(key: Any, value: Any) -> Any:
    if not is_credential_key(key) or isinstance(value, (dict, bool)) or value in (None, ""):
        return redact(value)
    return REDACTED


def drop_redacted(value: Any) -> Any:
    """A copy of ``value`` (mappings and lists, any depth) without the entries that
    :func:`redact` replaced by :data:`REDACTED`: what is left of recorded storage options
    can open the storage again, with credentials from the environment.

    Parameters
    ----------
    value : Any

    Returns
    -------
    Any
        Mappings lose keys whose value is :data:`REDACTED`, lists lose such items;
        other values are returned as they are.
    """
    if isinstance(value, dict):
        return {k: drop_redacted(v) for k, v in value.items() if v != REDACTED}
    if isinstance(value, list):
        return [drop_redacted(v) for v in value if v != REDACTED]
    return value


class RedactingFilter(logging.Filter):
    """A logging filter that passes every record with the credentials of the URLs in its
    message removed (:func:`redact_text`). Install it with :func:`install_log_redaction`."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite ``record``'s message in place; always keep the record."""
        message = record.getMessage()
        clean = redact_text(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


def install_log_redaction(logger: logging.Logger | None = None) -> None:
    """Add one :class:`RedactingFilter` to every handler of ``logger`` (default: the root
    logger), so that records of every logger that reach them are redacted. Calling it
    again adds nothing."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
