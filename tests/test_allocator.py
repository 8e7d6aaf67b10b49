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


def _run_python(code: str, variable: str, value: str | None) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter whose environment has ``variable`` set to
    ``value``, or not at all when ``value`` is None; it must exit 0."""
    env = {k: v for k, v in os.environ.items() if k != variable}
    if value is not None:
        env[variable] = value
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def _last_line(code: str, variable: str, value: str | None) -> str:
    return _run_python(code, variable, value).stdout.strip().splitlines()[-1]


def _pool_after_a_command(env_pool: str | None) -> str:
    return _last_line(PROBE, "ARROW_DEFAULT_MEMORY_POOL", env_pool)


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
    before, after, conf = _last_line(POLARS_PROBE, "_RJEM_MALLOC_CONF", user_value).split(" ", 2)
    return before, after, conf


def test_polars_jemalloc_reads_the_variable():
    """The variable is the one this Polars build's allocator reads: an unknown option in
    it draws jemalloc's own complaint when Polars loads."""
    if not sys.platform.startswith("linux"):
        pytest.skip("checked on Linux, where Polars is known to use jemalloc")
    done = _run_python("import polars", "_RJEM_MALLOC_CONF", "ragbatch_probe:1")
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

    code = "import os, polars; print(os.environ['_RJEM_MALLOC_CONF'])"
    inherited = _last_line(code, "_RJEM_MALLOC_CONF", None)
    # The constant names what this Polars puts there by itself.
    assert inherited == POLARS_OWN_OPTIONS
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

    ours = POLARS_JEMALLOC_OPTIONS
    monkeypatch.delenv(POLARS_JEMALLOC_VARIABLE, raising=False)
    monkeypatch.delitem(sys.modules, "polars", raising=False)
    assert keep_freed_pages_for_polars() == ours
    assert os.environ[POLARS_JEMALLOC_VARIABLE] == ours
    # A decay the user chose, including Polars' half second asked for by name: kept.
    for value in ("dirty_decay_ms:500", "narenas:2, dirty_decay_ms:750", "dirty_decay_ms:-1"):
        monkeypatch.setenv(POLARS_JEMALLOC_VARIABLE, value)
        assert keep_freed_pages_for_polars() is None
        assert os.environ[POLARS_JEMALLOC_VARIABLE] == value
    # What Polars filled in in parent processes (once, twice, with its THP options, or
    # after an earlier ragbatch), and other options of the user's.
    polars = "dirty_decay_ms:500,muzzy_decay_ms:1000"
    thp = "thp:always,metadata_thp:always"
    cases = {
        " ": ours,
        polars: ours,
        f"{polars} ": ours,
        f"{polars},{polars}": ours,
        f"{polars},{thp}": ours,
        f"{polars},{thp},{polars},{thp},narenas:2": f"{ours},narenas:2",
        "narenas:2": f"{ours},narenas:2",
        "background_thread:false,narenas:4": f"{ours},background_thread:false,narenas:4",
    }
    for value, expected in cases.items():
        monkeypatch.setenv(POLARS_JEMALLOC_VARIABLE, value)
        assert keep_freed_pages_for_polars() == expected, value
        assert os.environ[POLARS_JEMALLOC_VARIABLE] == expected
    # A child of a ragbatch process whose Polars loaded: our decay is there, last.
    monkeypatch.setenv(POLARS_JEMALLOC_VARIABLE, f"{polars},{ours}")
    assert keep_freed_pages_for_polars() is None
