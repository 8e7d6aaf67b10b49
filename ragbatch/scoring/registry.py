"""The metric registry: one place that maps a metric name to its class.

A metric registers itself with :func:`register` in its own file under
:mod:`ragbatch.metrics`; the planner, UDFs, writer, CLI and the contract test find it here.
"""

from __future__ import annotations

import difflib
import importlib
from typing import TYPE_CHECKING

from ragbatch.core.errors import ConfigError

if TYPE_CHECKING:
    from ragbatch.scoring.base import Metric

_REGISTRY: dict[str, type["Metric"]] = {}
_loaded = False


def register(cls: type["Metric"]) -> type["Metric"]:
    """Class decorator adding a metric class under ``cls.name``.

    Raises
    ------
    ValueError
        Another class already registered the same name.
    """
    existing = _REGISTRY.get(cls.name)
    if existing is not None and existing is not cls:
        raise ValueError(f"metric name {cls.name!r} registered twice ({existing} and {cls})")
    _REGISTRY[cls.name] = cls
    return cls


def _ensure_loaded() -> None:
    global _loaded
    if not _loaded:
        importlib.import_module("ragbatch.metrics").load_all()
        _loaded = True


def get_metric(name: str, where: str = "metrics[].name") -> type["Metric"]:
    """Return the metric class registered as ``name``.

    Raises
    ------
    ConfigError
        Unknown name; the message suggests the nearest registered names.
    """
    _ensure_loaded()
    try:
        return _REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=3, cutoff=0.5)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ConfigError(
            f"{where}: unknown metric {name!r}{hint} (`ragbatch metrics` lists all "
            f"{len(_REGISTRY)})"
        ) from None


def all_metrics() -> list[type["Metric"]]:
    """Every registered metric class, sorted by name."""
    _ensure_loaded()
    return [_REGISTRY[n] for n in sorted(_REGISTRY)]
