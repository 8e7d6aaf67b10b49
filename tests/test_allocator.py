"""The command line makes jemalloc Arrow's default pool unless the user chose one, and
gives Polars' jemalloc its decay setting before Polars loads unless the user set one."""

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


POLARS_PROBE = (
    "import os, sys; from ragbatch.cli.main import main; "
    "loaded = 'polars' in sys.modules; code = main(['metrics']); "
    "print(loaded, 'polars' in sys.modules, os.environ.get('_RJEM_MALLOC_CONF'))"
)


def _polars_conf_after_a_command(user_value: str | None) -> tuple[str, str, str]:
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    if user_value is not None:
        env["_RJEM_MALLOC_CONF"] = user_value
    done = subprocess.run(
        [sys.executable, "-c", POLARS_PROBE], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    before, after, conf = done.stdout.strip().splitlines()[-1].split(" ", 2)
    return before, after, conf


def test_polars_jemalloc_reads_the_variable():
    """The variable is the one this Polars build's allocator reads: an unknown option in
    it draws jemalloc's own complaint when Polars loads."""
    if not sys.platform.startswith("linux"):
        pytest.skip("Polars uses jemalloc on Linux only")
    env = {**os.environ, "_RJEM_MALLOC_CONF": "ragbatch_probe:1"}
    done = subprocess.run(
        [sys.executable, "-c", "import polars"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Invalid conf pair: ragbatch_probe:1" in done.stderr


def test_the_command_line_sets_polars_decay_before_polars_loads():
    from ragbatch.core.allocator import POLARS_JEMALLOC_OPTIONS

    before, after, conf = _polars_conf_after_a_command(None)
    # Polars was not loaded when the command started and was by the end, so the setting
    # was in place when its allocator read it. Polars puts its own defaults first, and
    # jemalloc takes the last value of an option.
    assert (before, after) == ("False", "True")
    assert conf.split(",")[-1] == POLARS_JEMALLOC_OPTIONS == "dirty_decay_ms:5000"


def test_a_polars_setting_the_user_chose_is_kept():
    from ragbatch.core.allocator import POLARS_JEMALLOC_OPTIONS

    before, after, conf = _polars_conf_after_a_command("dirty_decay_ms:750")
    assert (before, after) == ("False", "True")
    assert conf.split(",")[-1] == "dirty_decay_ms:750"
    assert POLARS_JEMALLOC_OPTIONS not in conf


def test_polars_own_options_inherited_from_a_parent_get_ours_after_them():
    """A process that loaded Polars (a notebook, a scheduler's Python task) and starts
    ``ragbatch`` passes on the variable Polars' package filled in; that is not the
    user's choice, so the command still adds its setting, last."""
    from ragbatch.core.allocator import POLARS_JEMALLOC_OPTIONS, POLARS_OWN_OPTIONS

    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    done = subprocess.run(
        [sys.executable, "-c", "import os, polars; print(os.environ['_RJEM_MALLOC_CONF'])"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    inherited = done.stdout.strip()
    # The constant names what this Polars puts there by itself.
    assert set(inherited.split(",")) == POLARS_OWN_OPTIONS
    before, after, conf = _polars_conf_after_a_command(inherited)
    assert (before, after) == ("False", "True")
    assert conf.split(",")[-1] == POLARS_JEMALLOC_OPTIONS


def test_nothing_is_set_once_polars_is_loaded(monkeypatch):
    import polars  # noqa: F401  (loaded, as in any process that used Polars already)

    from ragbatch.core.allocator import POLARS_JEMALLOC_VARIABLE, keep_freed_pages_for_polars

    monkeypatch.delenv(POLARS_JEMALLOC_VARIABLE, raising=False)
    assert keep_freed_pages_for_polars() is None
    assert POLARS_JEMALLOC_VARIABLE not in os.environ


def test_the_variable_is_set_when_polars_is_not_loaded(monkeypatch):
    from ragbatch.core.allocator import (
        POLARS_JEMALLOC_OPTIONS,
        POLARS_JEMALLOC_VARIABLE,
        keep_freed_pages_for_polars,
    )

    monkeypatch.delenv(POLARS_JEMALLOC_VARIABLE, raising=False)
    monkeypatch.delitem(sys.modules, "polars")
    assert keep_freed_pages_for_polars() == POLARS_JEMALLOC_OPTIONS
    assert os.environ[POLARS_JEMALLOC_VARIABLE] == POLARS_JEMALLOC_OPTIONS
    for users in ("narenas:2", "dirty_decay_ms:500,narenas:2", "dirty_decay_ms:-1"):
        monkeypatch.setenv(POLARS_JEMALLOC_VARIABLE, users)
        assert keep_freed_pages_for_polars() is None
        assert os.environ[POLARS_JEMALLOC_VARIABLE] == users
    monkeypatch.setenv(POLARS_JEMALLOC_VARIABLE, "muzzy_decay_ms:1000, dirty_decay_ms:500")
    expected = f"muzzy_decay_ms:1000, dirty_decay_ms:500,{POLARS_JEMALLOC_OPTIONS}"
    assert keep_freed_pages_for_polars() == expected
    assert os.environ[POLARS_JEMALLOC_VARIABLE] == expected
    monkeypatch.setenv(POLARS_JEMALLOC_VARIABLE, " ")
    assert keep_freed_pages_for_polars() == POLARS_JEMALLOC_OPTIONS
