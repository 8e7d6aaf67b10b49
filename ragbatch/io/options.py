"""Storage options given on the command line (``--storage-option KEY=VALUE``).

Commands that open an output root without a config (``compare``, ``report``) take the
fsspec ``storage_options`` as repeatable flags. One form, the same for every flag:

- ``KEY=VALUE``: the value is read as a YAML scalar, so ``anon=false`` is a bool,
  ``retries=5`` an int, and a string that YAML would read as something else is quoted
  (``secret='0123'``);
- a dotted key nests: ``client_kwargs.region_name=eu-west-1`` gives
  ``{"client_kwargs": {"region_name": "eu-west-1"}}``.

A flag's value is one scalar, never a config: a mapping or list is refused whatever it
holds (so a flow mapping repeating a key, ``k={a: 1, a: 2}``, is refused as any mapping),
and a key given by two flags is refused by :func:`storage_options_from`. Config files are
read by :func:`ragbatch.config.safe_yaml.load_yaml`, which also refuses repeated keys.

The filesystem still reads the standard environment variables (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, ...) for anything the flags leave out.
"""

from __future__ import annotations

from typing import Any, Iterable

import yaml

from ragbatch.core.errors import ConfigError


def parse_storage_option(text: str) -> tuple[tuple[str, ...], Any]:
    """One ``KEY=VALUE`` flag as (key path, value).

    Parameters
    ----------
    text : str
        ``KEY=VALUE``; KEY may be dotted (``client_kwargs.region_name``).

    Returns
    -------
    tuple of (tuple of str, object)
        The key split at dots and the value read as a YAML scalar (str, bool, int,
        float or None).

    Raises
    ------
    ValueError
        No ``=``, an empty key part, or a value that is not a scalar; the message
        shows the flag and the expected form.
    """
    key, sep, raw = text.partition("=")
    keys = tuple(key.strip().split("."))
    if not sep or not all(keys):
        raise ValueError(
            f"expected KEY=VALUE (KEY may be dotted, e.g. "
            f"client_kwargs.region_name=eu-west-1), got {text!r}"
        )
    try:
        value = yaml.safe_load(raw) if raw.strip() else raw
    except yaml.YAMLError:
        value = raw
    if isinstance(value, (dict, list)):
        raise ValueError(
            f"{text!r}: the value must be a single value; give nested keys "
            "with dots (client_kwargs.region_name=eu-west-1), one flag each"
        )
    return keys, value


def storage_options_from(pairs: Iterable[tuple[tuple[str, ...], Any]], flag: str) -> dict[str, Any]:
    """Nested ``storage_options`` from parsed flags (:func:`parse_storage_option`).

    Parameters
    ----------
    pairs : iterable of (tuple of str, object)
        In the order given on the command line.
    flag : str
        The flag's name, for messages (``--storage-option``).

    Returns
    -------
    dict
        Empty when no flag was given.

    Raises
    ------
    ConfigError
        A key is given twice, or is both a value and a parent of nested keys
        (``client_kwargs=x`` with ``client_kwargs.region_name=y``).
    """
    options: dict[str, Any] = {}
    for keys, value in pairs:
        node = options
        for depth, key in enumerate(keys[:-1]):
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ConfigError(
                    f"{flag} {'.'.join(keys)}: {'.'.join(keys[: depth + 1])} "
                    "already has a value; give it either a value or nested keys"
                )
        if keys[-1] in node:
            raise ConfigError(
                f"{flag} {'.'.join(keys)} is given twice (or is also a parent "
                "of nested keys); give each key once"
            )
        node[keys[-1]] = value
    return options
