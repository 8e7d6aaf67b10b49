"""Where built models are kept and how a built folder proves it is intact.

A built folder holds a record, :data:`RECORD` (JSON): the model's name, the recipe
version, its source (package, version, sha256 of the wheel and of the GGUF), its licence
and attribution, and the sha256 of every other file in the folder. :func:`check_folder`
recomputes those; a folder that fails is rebuilt.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ragbatch.models.catalogue import GgufWheelModel
from ragbatch.models.wheel import sha256_file

#: Name of the record file in a built folder.
RECORD = "ragbatch-model.json"
#: Version of the conversion recipe; a folder built by another version is rebuilt.
#: 2: the tokenizer is loaded with ``local_files_only=True`` whatever the environment.
RECIPE = 2
#: Environment variable that overrides the cache directory.
CACHE_ENV = "RAGBATCH_MODEL_CACHE"


def cache_dir() -> Path:
    """The directory built models are cached under.

    ``$RAGBATCH_MODEL_CACHE`` when set, else ``$XDG_CACHE_HOME/ragbatch/models``, else
    ``~/.cache/ragbatch/models``.
    """
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ragbatch" / "models"


def default_folder(source: GgufWheelModel) -> Path:
    """The cached folder of ``source``: ``<cache>/<folder>-<first 12 hex of the GGUF sha256>``."""
    return cache_dir() / f"{source.folder}-{source.gguf_sha256[:12]}"


def make_record(source: GgufWheelModel, folder: Path, conversion: dict) -> dict:
    """The record of a freshly built ``folder``: source, licence, ``conversion`` (package
    versions and dtype) and the sha256 of every file in it but the record."""
    return {
        "model": source.name,
        "recipe": RECIPE,
        "source": {"index": "PyPI", "package": source.package, "version": source.version,
                   "wheel_sha256": source.wheel_sha256, "gguf": source.gguf,
                   "gguf_sha256": source.gguf_sha256},
        "licence": {"spdx": source.licence, "attribution": source.attribution,
                    "text": "LICENSE"},
        "conversion": conversion,
        "files": {p.name: sha256_file(p) for p in sorted(folder.iterdir())
                  if p.is_file() and p.name != RECORD},
    }


def write_record(folder: Path, record: dict) -> None:
    """Write ``record`` as :data:`RECORD` in ``folder``."""
    (folder / RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def read_record(folder: Path) -> dict | None:
    """The record of ``folder``, or None when it has none or it is not a JSON object."""
    try:
        record = json.loads((folder / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def check_folder(source: GgufWheelModel, folder: Path) -> str | None:
    """Why ``folder`` is not an intact build of ``source``, or None when it is.

    Returns
    -------
    str or None
        None when the record names ``source``'s GGUF and the current recipe, and the
        folder's files are exactly those recorded with their sha256; otherwise the first
        problem found, for example ``"model.safetensors: sha256 differs"``.
    """
    if not folder.is_dir():
        return "not built yet"
    record = read_record(folder)
    if record is None:
        return f"no readable {RECORD}"
    if record.get("model") != source.name or \
            (record.get("source") or {}).get("gguf_sha256") != source.gguf_sha256:
        return f"{RECORD} describes another model"
    if record.get("recipe") != RECIPE:
        return f"built by recipe {record.get('recipe')}, current is {RECIPE}"
    files = record.get("files") or {}
    present = {p.name for p in folder.iterdir() if p.name != RECORD}
    if present != set(files):
        extra, lost = sorted(present - set(files)), sorted(set(files) - present)
        return f"files differ from the record (missing: {lost or 'none'}; extra: {extra or 'none'})"
    for name, digest in files.items():
        if sha256_file(folder / name) != digest:
            return f"{name}: sha256 differs from the record"
    return None
