"""The command line makes jemalloc Arrow's default pool unless the user chose one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = (
    "from ragbatch.cli.main import main; import pyarrow as pa; "
    "code = main(['metrics']); print(pa.default_memory_pool().backend_name)"
)


def _pool_after_a_command(env_pool: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if env_pool is not None:
        env["ARROW_DEFAULT_MEMORY_POOL"] = env_pool
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_the_command_line_uses_jemalloc():
    import pyarrow as pa

    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:
        pytest.skip("this PyArrow was built without jemalloc")
    assert _pool_after_a_command(None) == "jemalloc"


@pytest.mark.parametrize("chosen", ["system", "mimalloc"])
def test_a_pool_the_user_chose_is_kept(chosen):
    assert _pool_after_a_command(chosen) == chosen
