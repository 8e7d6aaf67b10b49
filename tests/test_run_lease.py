"""One attempt per run id: the run's lease, across processes, on a local disk and on S3.

The reproduction: two ``ragbatch run`` with one ``--run-id`` started together each
started a local Ray, so the ledger actor could not see the other, and both printed
"committed". Here the same two processes run: exactly one commits and the other exits
2 naming the winner's host and pid (the pid is the one this test started, so the
expected message is known independently). The lease itself is driven by real
processes that race for it, crash holding it, or hold it from "another machine" (a
lease file written as another host writes it), on a local folder and on a real S3
endpoint on loopback (moto).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from ragbatch.core.errors import RunError, RunInProgressError
from ragbatch.io.lease import RunLease, create_exclusive

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

#: Run by the processes of the race and crash tests: take the lease on (protocol,
#: options, folder) once all N racers have started (a barrier of files in BARRIER), print
#: the outcome, then crash at once ("crash") or stay alive until every racer has tried
#: ("hold"), so that no racer outlives the winner.
HOLDER = """
import json, os, sys, time
import fsspec
from ragbatch.core.errors import RunInProgressError
from ragbatch.io.lease import RunLease
protocol, options, folder, barrier, n, then = sys.argv[1:]
fs = fsspec.filesystem(protocol, **json.loads(options))
lease = RunLease(fs, folder, "raced")

def wait_for(stage):
    open(os.path.join(barrier, f"{stage}-{os.getpid()}"), "w").close()
    while sum(name.startswith(stage) for name in os.listdir(barrier)) < int(n):
        time.sleep(0.01)

wait_for("ready")
try:
    record = lease.acquire()
except RunInProgressError as exc:
    print("lost", exc, flush=True)
else:
    print("won", record.generation, flush=True)
    if then == "crash":
        os._exit(9)  # no release: as a killed process leaves it
wait_for("tried")
"""


def _python(*args: str) -> subprocess.Popen:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    """(protocol, storage options, filesystem, lease folder) on a local disk or on S3."""
    import fsspec

    if request.param == "local":
        return "file", {}, fsspec.filesystem("file"), str(tmp_path / "_staging/run_id=r/lease")
    options = request.getfixturevalue("s3_storage_options")
    bucket = request.getfixturevalue("s3_bucket")
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **options)
    return (
        "s3",
        {**options, "skip_instance_cache": True},
        fs,
        f"{bucket}/out/_staging/run_id=r/lease",
    )


def _foreign(fs, folder: str, generation: int, expires_in: float, released: bool = False) -> None:
    """A lease file as an attempt on another machine writes it."""
    now = time.time()
    record = {
        "generation": generation,
        "token": "f0f0",
        "host": "other-host",
        "pid": 4242,
        "scope": "other-host||pid:[1]",
        "acquired_at": now - 600,
        "renewed_at": now - 10,
        "expires_at": now + expires_in,
        "released": released,
    }
    fs.makedirs(folder, exist_ok=True)
    fs.pipe_file(f"{folder}/{generation:08d}.json", json.dumps(record).encode())


def _record(fs, folder: str, generation: int) -> dict:
    fs.invalidate_cache(folder)
    return json.loads(fs.cat_file(f"{folder}/{generation:08d}.json"))


def test_held_lease_refuses_a_second_attempt_naming_the_holder(store):
    _, _, fs, folder = store
    first = RunLease(fs, folder, "r")
    taken = first.acquire()
    with pytest.raises(RunInProgressError) as info:
        RunLease(fs, folder, "r").acquire()
    text = str(info.value)
    assert f"host {socket.gethostname()}, pid {os.getpid()}, since " in text
    assert "expires at " in text and "pass a new --run-id" in text
    assert _record(fs, folder, 1)["token"] == taken.token
    first.release()
    assert _record(fs, folder, 1)["released"] is True
    assert RunLease(fs, folder, "r").acquire().generation == 2  # released: taken at once


def test_lease_of_another_machine_holds_until_it_expires(store):
    _, _, fs, folder = store
    _foreign(fs, folder, 1, expires_in=60)
    with pytest.raises(RunInProgressError, match=r"host other-host, pid 4242, since .*expires at"):
        RunLease(fs, folder, "r").acquire()
    _foreign(fs, folder, 2, expires_in=-1)  # that machine crashed: its lease lapsed
    taken = RunLease(fs, folder, "r").acquire()
    assert taken.generation == 3 and _record(fs, folder, 3)["pid"] == os.getpid()


def test_holder_that_stalled_past_its_expiry_loses_the_lease(store):
    _, _, fs, folder = store
    stalled = RunLease(fs, folder, "r", ttl_s=3.0)
    held = stalled.acquire()
    with pytest.raises(RunInProgressError):
        RunLease(fs, folder, "r").acquire()
    time.sleep(max(0.0, held.expires_at - time.time()) + 0.3)  # it did not renew in time
    RunLease(fs, folder, "r").acquire()
    with pytest.raises(RunInProgressError, match=rf"lost its lease .* pid {os.getpid()}"):
        stalled.check()
    stalled.release()
    assert _record(fs, folder, 1)["released"] is False  # a lost lease is not written again


def test_holder_renews_while_it_runs(store):
    _, _, fs, folder = store
    holder = RunLease(fs, folder, "r", ttl_s=1.0, renew_every_s=0.2)
    first = holder.acquire()
    holder.start_renewing()
    time.sleep(1.6)  # past the first expiry
    with pytest.raises(RunInProgressError):
        RunLease(fs, folder, "r").acquire()
    assert _record(fs, folder, 1)["expires_at"] > first.expires_at + 1.0
    holder.check()
    holder.release()
    assert RunLease(fs, folder, "r").acquire().generation == 2


class RacerLandsAfterTheLook:
    """A fake for a fault that timing alone cannot cause on demand: a local filesystem
    whose existence check always answers "no", as it does when another process creates
    the file just after the check. An exclusive create must still refuse."""

    @staticmethod
    def filesystem():
        from fsspec.implementations.local import LocalFileSystem

        class Lying(LocalFileSystem):
            def exists(self, path, **kwargs):
                return False

        return Lying(skip_instance_cache=True)


def test_exclusive_create_on_a_local_disk_refuses_even_after_a_look_that_missed(tmp_path):
    fs = RacerLandsAfterTheLook.filesystem()
    path = str(tmp_path / "00000001.json")
    create_exclusive(fs, path, b"first")
    with pytest.raises(FileExistsError):
        create_exclusive(fs, path, b"second")
    assert Path(path).read_bytes() == b"first"
    # The lease takes a generation the same way: the second attempt that looked and
    # saw generation 1 free (here: a listing taken before the first create) loses it.
    folder = tmp_path / "lease"
    first, second = RunLease(fs, str(folder), "r"), RunLease(fs, str(folder), "r")
    second._generations = lambda: []  # its listing ran before the first attempt's create
    assert first.acquire().generation == 1
    with pytest.raises(RunInProgressError, match="other attempts kept taking its lease"):
        second.acquire()
    assert _record(fs, str(folder), 1)["token"] == first.record.token


def test_exclusive_create_in_threads_racing_on_one_path_lets_exactly_one_through(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    import fsspec

    fs = fsspec.filesystem("file")

    def attempt(args):
        path, n = args
        try:
            create_exclusive(fs, path, str(n).encode())
        except FileExistsError:
            return None
        return n

    for round_ in range(50):
        path = str(tmp_path / f"{round_:08d}.json")
        with ThreadPoolExecutor(8) as pool:
            won = [n for n in pool.map(attempt, [(path, n) for n in range(8)]) if n is not None]
        assert len(won) == 1 and Path(path).read_bytes() == str(won[0]).encode()


@pytest.mark.slow  # separate processes racing, each importing ragbatch
def test_processes_racing_for_one_lease_exactly_one_wins(store, tmp_path):
    protocol, options, fs, folder = store
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [
        _python(protocol, json.dumps(options), folder, str(barrier), "5", "hold") for _ in range(5)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    lines = [out.strip() for out, _ in outs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    winners = [line for line in lines if line.startswith("won")]
    assert len(winners) == 1, lines
    assert all(
        line.startswith("lost run 'raced' is being run by another attempt")
        or line.startswith("lost run 'raced': other attempts kept taking")
        for line in lines
        if not line.startswith("won")
    ), lines
    fs.invalidate_cache(folder)
    assert len(fs.ls(folder, detail=False)) == 1


def test_a_crashed_holder_on_this_machine_is_taken_over_at_once(store, tmp_path):
    """Its process is gone, so its lease ends though it would expire two minutes later."""
    protocol, options, fs, folder = store
    crashed = _python(protocol, json.dumps(options), folder, str(tmp_path), "1", "crash")
    out, err = crashed.communicate(timeout=120)
    assert crashed.returncode == 9 and out.startswith("won 1"), err[-2000:]
    left = _record(fs, folder, 1)
    assert (
        left["pid"] == crashed.pid
        and not left["released"]
        and left["expires_at"] > time.time() + 60
    )
    assert RunLease(fs, folder, "r").acquire().generation == 2


# -- whole runs --------------------------------------------------------------------------


def _input(root: Path, rows: int = 40, files: int = 4) -> Path:
    src = root / "in"
    src.mkdir()
    for f in range(files):
        pq.write_table(
            pa.table(
                {"q": [f"q{i}" for i in range(rows)], "a": [f"answer {f}-{i}" for i in range(rows)]}
            ),
            src / f"part-{f}.parquet",
        )
    return src


def _config(src: str, out: str, callback: str = "slow_digit", **run) -> dict:
    return {
        "run": {"name": "lease", **run},
        "input": {"uri": src, "columns": {"question": "q", "answer": "a"}},
        "output": {"uri": out},
        "metrics": [
            {"name": "response_length", "params": {"min_chars": 1}},
            {
                "name": "binary",
                "id": "cb",
                "params": {"callback": f"support.binary_callbacks:{callback}"},
            },
        ],
    }


@pytest.mark.slow  # separate processes (two full `ragbatch run`s, each with its own Ray)
@pytest.mark.release  # the default suite: processes racing for one lease, below and above
def test_two_concurrent_cli_runs_with_one_run_id_commit_once(tmp_path):
    src = _input(tmp_path)
    out = tmp_path / "out"
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(_config(str(src), str(out))))
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(TESTS), str(REPO), os.environ.get("PYTHONPATH", "")]),
    )
    exe = str(Path(sys.executable).with_name("ragbatch"))
    procs = [
        subprocess.Popen(
            [exe, "run", str(config), "--run-id", "same"],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [(p, *p.communicate(timeout=600)) for p in procs]
    codes = sorted(p.returncode for p, _, _ in results)
    assert codes == [0, 2], [(p.returncode, err[-3000:]) for p, _, err in results]
    ((winner, w_out, _),) = [r for r in results if r[0].returncode == 0]
    ((_, _, l_err),) = [r for r in results if r[0].returncode == 2]
    assert "run same committed" in w_out
    assert (
        f"ragbatch: error: run 'same' is being run by another attempt: host "
        f"{socket.gethostname()}, pid {winner.pid}, since "
    ) in l_err
    assert "expires at" in l_err
    assert len(list(out.glob("runs/*/run_id=same/manifest.json"))) == 1
    assert not (out / "_staging").exists()  # the commit removed the prefix and _staging/


def test_lease_is_released_on_failure_and_staging_cleaned_on_commit(ray_local, tmp_path):
    """A run that fails (error budget) marks its lease released, so the next attempt
    resumes at once; ``_staging/`` stays while another run's prefix is in it and goes
    with the last one."""
    from ragbatch.config.job import JobConfig
    from ragbatch.pipeline.runner import run_job

    src = _input(tmp_path, rows=5, files=2)
    out = tmp_path / "out"
    failing = JobConfig.from_dict(_config(str(src), str(out), "raises", error_budget=0.0))
    with pytest.raises(RunError):
        run_job(failing, run_id="fails")
    lease_dir = out / "_staging" / "run_id=fails" / "lease"
    (only,) = lease_dir.iterdir()
    left = json.loads(only.read_text())
    assert left["released"] is True and left["pid"] == os.getpid()

    run_job(JobConfig.from_dict(_config(str(src), str(out), "answer_has_digit")), run_id="other")
    assert sorted(p.name for p in (out / "_staging").iterdir()) == ["run_id=fails"]

    failing.run.error_budget = 1.0
    result = run_job(failing, run_id="fails")
    assert result.manifest.resume.attempt == 2
    assert not (out / "_staging").exists()
    assert len(list(out.glob("runs/*/run_id=*/manifest.json"))) == 2


def test_run_on_s3_leaves_no_staging_and_refuses_a_held_run_id(
    ray_local, s3_storage_options, s3_bucket, tmp_path
):
    import s3fs

    from ragbatch.config.job import JobConfig
    from ragbatch.pipeline.runner import run_job

    src = _input(tmp_path, rows=5, files=1)
    config = JobConfig.from_dict(_config(str(src), f"s3://{s3_bucket}/eval", "answer_has_digit"))
    config.output.storage_options = dict(s3_storage_options)
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3_storage_options)
    _foreign(fs, f"{s3_bucket}/eval/_staging/run_id=held/lease", 1, expires_in=60)
    with pytest.raises(RunInProgressError, match="host other-host, pid 4242"):
        run_job(config, run_id="held")
    run_job(config, run_id="free")
    fs.invalidate_cache()
    keys = fs.find(f"{s3_bucket}/eval")
    assert [k for k in keys if "/_staging/" in k] == [
        f"{s3_bucket}/eval/_staging/run_id=held/lease/00000001.json"
    ]
    assert any(k.endswith("run_id=free/manifest.json") for k in keys)
