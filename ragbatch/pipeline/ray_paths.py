"""What Ray's workers import from, and the folder they work in.

Ray puts the folder a driver starts in at the front of every worker's ``sys.path``. For
``ragbatch run`` that is usually the folder of the job config, so a ``secrets.py`` or a
``jinja2.py`` there would replace the real module in every worker. A local Ray instance is
therefore started from a private empty folder (:func:`start_local_ray`), and each worker
moves back into the driver's folder before it runs anything (:func:`enter_driver_folder`,
Ray's ``worker_process_setup_hook``), so relative paths keep their meaning.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

#: Environment variable that carries the driver's working folder to the workers.
DRIVER_FOLDER_VAR = "RAGBATCH_DRIVER_FOLDER"


def enter_driver_folder() -> None:
    """Ray worker set-up hook: change into the driver's working folder (when it exists)."""
    folder = os.environ.get(DRIVER_FOLDER_VAR)
    if folder and os.path.isdir(folder):
        os.chdir(folder)


def worker_pythonpath() -> str:
    """The workers' ``PYTHONPATH``: the folder this ragbatch (and ``udfs``) is imported
    from when that is a checkout rather than an installation, then this process's own
    ``PYTHONPATH``. Never the working folder or the config's folder."""
    code_root = str(Path(__file__).resolve().parents[2])
    paths = sysconfig.get_paths()
    installed = {str(Path(paths[key]).resolve()) for key in ("purelib", "platlib")}
    own = [] if code_root in installed else [code_root]
    existing = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys([*own, *existing]))


#: Ray settings of the local instance :func:`start_local_ray` starts: workers at the
#: driver's own niceness, and no idle workers started ahead of the job (they start
#: without the job's runtime environment, so none of the job's tasks or actors can use
#: them, and on a small machine starting them delays the workers it does use).
LOCAL_SYSTEM_CONFIG: dict[str, Any] = {
    "worker_niceness": 0,
    "enable_worker_prestart": False,
    "prestart_worker_first_driver": False,
}


def start_local_ray(runtime_env: dict[str, Any], **init_kwargs: Any) -> None:
    """Start a new local Ray instance whose workers search no user folder for modules.

    Parameters
    ----------
    runtime_env : dict
        The job's runtime environment; its ``env_vars`` gain :data:`DRIVER_FOLDER_VAR`
        and it gains the set-up hook :func:`enter_driver_folder`.
    **init_kwargs
        Passed on to ``ray.init`` (``address="local"`` is set here).

    Notes
    -----
    Ray starts its worker processes at a niceness 15 above its own by default
    (``worker_niceness``), so that on a busy machine its control processes stay
    responsive. In a run those workers do all the work: started that way, a model
    stage got about half the CPU of the same model run as a plain script beside any
    other busy process. The local instance here starts them at the niceness of this
    process (``nice ragbatch run`` still lowers the whole run).
    """
    import ray

    driver_folder = os.getcwd()
    env = {**runtime_env.get("env_vars", {}), DRIVER_FOLDER_VAR: driver_folder}
    runtime_env = {
        **runtime_env,
        "env_vars": env,
        "worker_process_setup_hook": f"{__name__}.enter_driver_folder",
    }
    empty = tempfile.mkdtemp(prefix="ragbatch-ray-")  # private (0700), holds nothing
    atexit.register(shutil.rmtree, empty, ignore_errors=True)
    os.chdir(empty)
    try:
        system = {**LOCAL_SYSTEM_CONFIG, **init_kwargs.pop("_system_config", {})}
        ray.init(address="local", runtime_env=runtime_env, _system_config=system, **init_kwargs)
    finally:
        os.chdir(driver_folder)


#: Ray Data's own actors, as ``(module, function)``: each function creates its actor (or
#: finds it) and returns at once. Ray Data creates them when a dataset first runs.
DATA_ACTORS = (
    (
        "ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator",
        "get_or_create_autoscaling_coordinator",
    ),
    ("ray.data._internal.stats", "get_or_create_stats_actor"),
)


def start_data_actors() -> list[str]:
    """Ask Ray to start Ray Data's coordinator and statistics actors (:data:`DATA_ACTORS`)
    now, without waiting for them; return the names of those asked for.

    Each is a worker process of its own, seconds to start on a small machine. Until the
    coordinator answers, Ray Data sees no CPUs it may use and runs one task at a time
    (ray 2.60: ``ResourceManager.get_global_limits``). Started right after Ray, they come
    up while the driver does its own work (the cluster check, the run's ledger actor,
    building the dataset). Ray Data finds them by name and uses them as if it had
    started them. A Ray version without these functions skips them.
    """
    import importlib

    started = []
    for module, name in DATA_ACTORS:
        try:
            create = getattr(importlib.import_module(module), name)
            create()
        except Exception:  # noqa: BLE001 - Ray Data then starts them itself, as before
            continue
        started.append(name)
    return started
