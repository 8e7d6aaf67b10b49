"""Metric definitions, one module per metric.

Each module registers its metric with :func:`ragbatch.registry.register`; the registry
imports every module here (:func:`load_all`) the first time a metric is looked up.
Adding a metric means adding one file here.
"""

from __future__ import annotations

import importlib
import pkgutil


def load_all() -> None:
    """Import every metric module of this package (each registers its metric)."""
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_") and info.name != "base":
            importlib.import_module(f"{__name__}.{info.name}")
