"""Importing a ``binary`` metric's callback module without shadowing any other module.

A callback ``"module:function"`` whose module file lies in one of the callback folders
(the working folder and the config file's folder, :func:`set_callback_dirs`) is imported
from that file under a private module name, so it neither replaces nor is replaced by a
module of the same name elsewhere (a ``secrets.py`` next to the config is the callback's
own module and nothing else's). Its folder is appended to ``sys.path`` (after the
standard library and the installed packages) so that it can import modules beside it.
Any other callback module is imported by its name, from the installed packages and
``PYTHONPATH``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

_DIRS: tuple[str, ...] = ()


def set_callback_dirs(dirs: list[str | Path]) -> tuple[str, ...]:
    """Record the folders callback modules are looked for in, first match wins.

    Returns
    -------
    tuple of str
        The folders as absolute paths, duplicates removed.
    """
    global _DIRS
    _DIRS = tuple(dict.fromkeys(str(Path(d).resolve()) for d in dirs))
    return _DIRS


def find_module_file(module_name: str, dirs: tuple[str, ...] | None = None) -> Path | None:
    """The file of the top-level module of ``module_name`` in the callback folders.

    Parameters
    ----------
    module_name : str
        A dotted module name (``pkg.sub`` looks for ``pkg``).
    dirs : tuple of str, optional
        Folders to look in (default: those :func:`set_callback_dirs` recorded).

    Returns
    -------
    Path or None
        ``<dir>/<top>.py`` or ``<dir>/<top>/__init__.py`` in the first folder holding
        one; None when no folder does.
    """
    top = module_name.partition(".")[0]
    for folder in _DIRS if dirs is None else dirs:
        for candidate in (Path(folder) / f"{top}.py", Path(folder) / top / "__init__.py"):
            if candidate.is_file():
                return candidate.resolve()
    return None


def import_callback_module(module_name: str, origin: str | Path | None) -> ModuleType:
    """Import ``module_name``: from ``origin`` (its top-level module's file, as
    :func:`find_module_file` found it) under a private name, or by name when None.

    Raises
    ------
    Exception
        Whatever importing the module raises (ImportError when it is not found).
    """
    if origin is None:
        return importlib.import_module(module_name)
    origin = Path(origin)
    top, _, rest = module_name.partition(".")
    folder = str(origin.parent.parent if origin.name == "__init__.py" else origin.parent)
    if folder not in sys.path:
        sys.path.append(folder)  # after everything else: it can shadow nothing
    private = f"_ragbatch_callback_{hashlib.sha256(str(origin).encode()).hexdigest()[:12]}_{top}"
    if private not in sys.modules:
        _exec_file(private, origin)
    return importlib.import_module(f"{private}.{rest}") if rest else sys.modules[private]


def _exec_file(name: str, origin: Path) -> None:
    package = [str(origin.parent)] if origin.name == "__init__.py" else None
    spec = importlib.util.spec_from_file_location(name, origin, submodule_search_locations=package)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {os.fspath(origin)} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: dataclasses and relative imports look it up
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
