"""Finding the modules that register engines and stage kinds.

A registry of :mod:`ragbatch.core` (engines: :mod:`ragbatch.core.engine_registry`; stage
kinds: :mod:`ragbatch.core.stages`) is filled by importing modules that call its
``register_*`` function: the modules of a built-in package of ragbatch, named by string
and imported with :mod:`importlib` (so that ``core`` imports nothing above it), and the
entry points of a group that other installed distributions declare in their
``pyproject.toml``::

    [project.entry-points."ragbatch.engines"]
    echo = "ragbatch_echo_engine"

An entry point names a module (imported: its registration runs) or an object in it
(``"module:ENTRY"``, loaded and handed to the registry's callback). Built-in modules are
found by listing the package, never through ragbatch's own installed metadata, which an
editable install can leave stale.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from importlib import metadata
from typing import Any, Callable

log = logging.getLogger(__name__)


def import_package_modules(package: str) -> list[str]:
    """Import every module of ``package`` whose name does not start with ``_``.

    Parameters
    ----------
    package : str
        A dotted package name, such as ``"ragbatch.engines"``.

    Returns
    -------
    list of str
        The dotted names of the modules imported, in the order :mod:`pkgutil` lists them
        (alphabetical for a folder).

    Raises
    ------
    ImportError
        The package or one of its modules cannot be imported (a built-in module that
        fails to import is a bug, not something to skip).
    """
    root = importlib.import_module(package)
    names = []
    for info in pkgutil.iter_modules(getattr(root, "__path__", [])):
        if not info.name.startswith("_"):
            names.append(f"{package}.{info.name}")
            importlib.import_module(names[-1])
    return names


def load_entry_points(group: str, register: Callable[[Any], Any]) -> list[str]:
    """Load every entry point of ``group`` that the installed distributions declare.

    An entry point whose value names a module is imported (its module-level registration
    runs); one that names an object (``module:attr``) is loaded and passed to
    ``register``. An entry point that fails to load is logged as a warning and skipped,
    so that one broken distribution does not stop every run; the engine or stage kind it
    would have added is then unknown, and a config naming it fails with the known names.

    Parameters
    ----------
    group : str
        The entry-point group, such as ``"ragbatch.engines"``.
    register : callable
        ``register(obj)``: called with each object an entry point names.

    Returns
    -------
    list of str
        The ``name = value`` text of each entry point loaded.
    """
    loaded = []
    for point in metadata.entry_points(group=group):
        try:
            obj = point.load()
            if point.attr:
                register(obj)
        except Exception as exc:  # a third-party module: any failure is reported, not raised
            log.warning(
                "entry point %s = %s of %s failed to load: %s", point.name, point.value, group, exc
            )
            continue
        loaded.append(f"{point.name} = {point.value}")
    return loaded
