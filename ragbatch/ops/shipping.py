"""What a submission from an installed ragbatch ships to the cluster, and how it is put together.

Without a checkout to ship, ``ragbatch submit`` sends a small working directory that it
assembles in a temporary folder: the config file, and the user code its metrics import
(the module of every ``binary`` callback) when that code lies in the config's folder or
the current folder, the folders a run looks in for it. Everything lands at the top of
the working directory, so that on the cluster the config's folder and the job's working
directory are one folder, as they are for the callbacks here.

Nothing else goes: input and output URIs that are local paths are read and written where
they are (every node must reach them at the same path), model directories are not
shipped, and code imported from anywhere else (an installed package) must be installed
on the cluster.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Iterable, Sequence

from ragbatch.core.errors import ConfigError
from ragbatch.scoring.base import Metric

#: Never copied from a shipped package folder.
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".git")


def job_files(
    config_file: Path, metrics: Iterable[Metric], search_dirs: Sequence[Path]
) -> dict[str, Path]:
    """The files of a job's working directory: name at its top -> local source.

    Parameters
    ----------
    config_file : Path
        The job config; it goes under its own file name.
    metrics : iterable of Metric
        The config's metrics, built (so their user modules have been imported).
    search_dirs : sequence of Path
        Folders whose user code is shipped (the current folder and the config's).

    Returns
    -------
    dict of str to Path
        ``{config file name: config file, module file or package folder name: its
        source}``; a source is a file, or a package folder shipped whole.

    Raises
    ------
    ConfigError
        Two sources would take the same name.
    """
    files = {config_file.name: config_file.resolve()}
    for metric in metrics:
        for module in metric.user_modules():
            source = module_source(module, search_dirs)
            if source is None:
                continue
            known = files.setdefault(source.name, source)
            if known != source:
                raise ConfigError(
                    f"module {module!r} ({source}) and {known} would both be shipped as "
                    f"{source.name!r}; rename one of them"
                )
    return files


def module_source(module: str, search_dirs: Sequence[Path]) -> Path | None:
    """The file or package folder that provides the top-level package of ``module``,
    when it lies in one of ``search_dirs``; None when it comes from elsewhere (an
    installed package, the standard library) or cannot be found."""
    top = module.partition(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:  # a package (or namespace package): its folder
        candidates = [Path(p) for p in spec.submodule_search_locations]
    elif spec.origin and spec.has_location:
        candidates = [Path(spec.origin)]
    else:
        return None
    roots = [d.resolve() for d in search_dirs]
    for candidate in candidates:
        resolved = candidate.resolve()
        if resolved.parent in roots:
            return resolved
    return None


def assemble(files: dict[str, Path], dest: Path) -> None:
    """Copy ``files`` (as returned by :func:`job_files`) into the folder ``dest``: each
    file, and each package folder without its ``__pycache__``."""
    for name, source in files.items():
        target = dest / name
        if source.is_dir():
            shutil.copytree(source, target, ignore=IGNORED)
        else:
            shutil.copy2(source, target)
