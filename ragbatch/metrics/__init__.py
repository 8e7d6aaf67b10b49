"""Metric definitions, one module per metric.

Each module registers its metric with :func:`ragbatch.scoring.registry.register`; the registry
imports every module here (:func:`load_all`) the first time a metric is looked up.
Adding a metric means adding one file here. The modules of :data:`SUPPORT_MODULES` hold
what some metrics share and register nothing; the base classes and cell helpers all
metrics and judges use live a layer below, in :mod:`ragbatch.scoring`.
"""

from __future__ import annotations

import importlib
import pkgutil

#: Modules of this package that define no metric: the PII base class
#: (:mod:`ragbatch.metrics.pii_base`). Private modules (a leading ``_``) are skipped too.
SUPPORT_MODULES = ("pii_base",)


def load_all() -> None:
    """Import every metric module of this package (each registers its metric)."""
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_") and info.name not in SUPPORT_MODULES:
            importlib.import_module(f"{__name__}.{info.name}")
