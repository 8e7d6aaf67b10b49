"""Metric definitions, one module per metric.

Importing this package imports every module in it, and each module registers its metric
with :func:`ragbatch.registry.register`. Adding a metric means adding one file here.
"""

from __future__ import annotations

import importlib
import pkgutil

for _info in pkgutil.iter_modules(__path__):
    if not _info.name.startswith("_") and _info.name != "base":
        importlib.import_module(f"{__name__}.{_info.name}")
