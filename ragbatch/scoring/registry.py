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
    TypeError
        The class is still abstract: it lacks a required hook (an abstract method, or a
        class attribute its bases declare as ``ClassVar`` without a value), so the file
        that defines it fails when it is imported rather than a run when it is used.
    ValueError
        Another class already registered the same name.
    """
    missing = missing_hooks(cls)
    if missing:
        raise TypeError(
            f"metric class {cls.__module__}.{cls.__qualname__} cannot be registered: "
            f"it does not define {', '.join(missing)}"
        )
    existing = _REGISTRY.get(cls.name)
    if existing is not None and existing is not cls:
        raise ValueError(f"metric name {cls.name!r} registered twice ({existing} and {cls})")
    _REGISTRY[cls.name] = cls
    return cls


def missing_hooks(cls: type) -> list[str]:
    """The required hooks ``cls`` lacks, sorted: its abstract methods (``"program()"``)
    and the class attributes annotated ``ClassVar`` in it or a base that none of them
    gives a value (``"statements_of"``). Empty for a class ready to be used."""
    missing = {f"{name}()" for name in getattr(cls, "__abstractmethods__", ())}
    for klass in cls.__mro__:
        for name, annotation in vars(klass).get("__annotations__", {}).items():
            if "ClassVar" in str(annotation) and not hasattr(cls, name):
                missing.add(name)
    return sorted(missing)


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
