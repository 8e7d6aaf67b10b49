"""A real two-node Ray cluster on this machine, for the job submission tests.

Both nodes are ``ray start --block`` processes in process groups of their own, on ports
that were free when the cluster started, each with a temp directory of its own;
:meth:`TwoNodeCluster.stop` ends those process groups and nothing else (never ``ray
stop``, which would end every Ray instance of the machine's user).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

#: Custom resource that only the second node has.
STAGE_NODE_RESOURCE = "stage_node"
#: Tries to start each node (see :meth:`TwoNodeCluster._start_node`).
START_ATTEMPTS = 3
#: Worker ports per node (one per worker process; a job here starts about a dozen).
WORKER_PORTS = 40


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


class _Ports:
    """Hands out distinct loopback ports that are free now."""

    def __init__(self) -> None:
        self.taken: set[int] = set()

    def one(self) -> int:
        while True:
            with socket.socket() as s:
                s.bind(("", 0))
                port = s.getsockname()[1]
            if port not in self.taken:
                self.taken.add(port)
                return port

    def block(self, size: int) -> int:
        """The first of ``size`` consecutive free ports (for a worker port range)."""
        import random

        rng = random.Random()
        for _ in range(200):
            start = rng.randrange(20_000, 32_000)
            ports = range(start, start + size)
            if not self.taken.intersection(ports) and all(_port_is_free(p) for p in ports):
                self.taken.update(ports)
                return start
        raise RuntimeError(f"no {size} consecutive free ports found between 20000 and 32000")


def cluster_env() -> dict[str, str]:
    """Environment of the cluster's processes and of the clients that talk to it: this
    interpreter's ``bin`` first on PATH (so a job's ``python`` is this environment's),
    token authentication off (a stale ``~/.ray/auth_token`` would otherwise switch it on),
    no inherited Ray address, no PYTHONPATH (a job imports ragbatch from what it ships)."""
    env = dict(os.environ)
    for var in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "PYTHONPATH"):
        env.pop(var, None)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(
        RAY_AUTH_MODE="disabled",
        RAY_USAGE_STATS_ENABLED="0",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    return env


@dataclass
class TwoNodeCluster:
    """A head node and a second node with the custom resource ``stage_node``."""

    temp_dir: Path
    gcs_address: str = ""
    dashboard_url: str = ""
    env: dict[str, str] = field(default_factory=cluster_env)
    procs: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def _launch(self, name: str, args: list[str]) -> subprocess.Popen:
        log = self.temp_dir / f"{name}.log"
        with log.open("wb") as fh:
            proc = subprocess.Popen(
                [str(Path(sys.executable).with_name("ray")), "start", "--block", *args],
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        self.procs.append(proc)
        self.logs.append(log)
        return proc

    def _start_node(self, name: str, args, ready, timeout_s: float) -> None:
        """Start a node (``args()`` gives fresh ports each time) and wait for ``ready``.

        ``ray start`` gives up when its raylet has not registered within 30 s (fixed in
        Ray), which a loaded 2-core machine can exceed: such a start is cleaned up and
        tried again, up to :data:`START_ATTEMPTS` times in all.
        """
        for attempt in range(1, START_ATTEMPTS + 1):
            proc = self._launch(f"{name}-{attempt}", args())
            try:
                self._wait_for(ready, timeout_s, f"the {name} node")
                return
            except RuntimeError:
                if proc.poll() is None or attempt == START_ATTEMPTS:
                    raise
                _kill_group(proc)
                index = self.procs.index(proc)
                del self.procs[index], self.logs[index]

    def start(
        self,
        head_cpus: int = 2,
        second_cpus: int = 1,
        stage_slots: int = 1,
        timeout_s: float = 120.0,
    ) -> None:
        """Start both nodes and wait until the dashboard lists two live nodes; the second
        has ``second_cpus`` CPUs and ``stage_slots`` units of ``stage_node``.

        Ray turns ``--node-ip-address 127.0.0.1`` into this machine's own address (on
        this machine kind, 192.0.2.2); the dashboard listens on loopback.
        """
        ports = _Ports()
        common = [
            "--node-ip-address",
            "127.0.0.1",
            "--disable-usage-stats",
            "--object-store-memory",
            str(200 * 1024 * 1024),
        ]

        def node_ports() -> list[str]:
            return [
                "--node-manager-port",
                str(ports.one()),
                "--object-manager-port",
                str(ports.one()),
                "--dashboard-agent-listen-port",
                str(ports.one()),
                "--dashboard-agent-grpc-port",
                str(ports.one()),
                "--runtime-env-agent-port",
                str(ports.one()),
                "--metrics-export-port",
                str(ports.one()),
                "--min-worker-port",
                str(start := ports.block(WORKER_PORTS)),
                "--max-worker-port",
                str(start + WORKER_PORTS - 1),
            ]

        def head_args() -> list[str]:
            gcs, dashboard = ports.one(), ports.one()
            self.gcs_address = f"127.0.0.1:{gcs}"
            self.dashboard_url = f"http://127.0.0.1:{dashboard}"
            return [
                "--head",
                "--port",
                str(gcs),
                "--num-cpus",
                str(head_cpus),
                "--include-dashboard",
                "true",
                "--dashboard-host",
                "127.0.0.1",
                "--dashboard-port",
                str(dashboard),
                "--ray-client-server-port",
                str(ports.one()),
                "--temp-dir",
                str(self.temp_dir),
                *common,
                *node_ports(),
            ]

        def second_args() -> list[str]:
            return [
                "--address",
                self.gcs_address,
                "--num-cpus",
                str(second_cpus),
                "--resources",
                json.dumps({STAGE_NODE_RESOURCE: stage_slots}),
                # A temp dir of its own, as on a machine of its own: in a shared one
                # the two nodes' runtime env agents would unpack a job's working dir
                # into the same directory, the second replacing it under the driver.
                "--temp-dir",
                str(self.temp_dir / "second"),
                *common,
                *node_ports(),
            ]

        self._start_node("head", head_args, lambda nodes: len(nodes) >= 1, timeout_s)
        self._start_node("second", second_args, lambda nodes: len(nodes) >= 2, timeout_s)

    def nodes(self) -> list[dict]:
        """Live nodes from the dashboard's state API (``/api/v0/nodes``)."""
        with urllib.request.urlopen(f"{self.dashboard_url}/api/v0/nodes?detail=1", timeout=5) as r:
            body = json.load(r)
        return [n for n in body["data"]["result"]["result"] if n.get("state") == "ALIVE"]

    def node_id_with(self, resource: str) -> str:
        """Hex id of the one live node that has ``resource``."""
        ids = [n["node_id"] for n in self.nodes() if resource in (n.get("resources_total") or {})]
        assert len(ids) == 1, f"expected one node with {resource}, got {ids}"
        return ids[0]

    def _check_alive(self, what: str) -> None:
        for proc, log in zip(self.procs, self.logs):
            if proc.poll() is not None:
                raise RuntimeError(
                    f"ray start exited with {proc.returncode} while waiting for "
                    f"{what}:\n{log.read_text(errors='replace')[-3000:]}"
                )

    def _wait_for(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_alive(what)
            try:
                if ready(self.nodes()):
                    return
            except (OSError, KeyError, ValueError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{what} did not come up within {timeout_s:.0f} s")

    def stop(self) -> None:
        """Kill both nodes' process groups and remove the temp dir.

        SIGKILL, not SIGTERM: on SIGTERM each node first asks the GCS to drain it, which
        waits up to 30 s when the head is going down at the same time. Nothing of the
        cluster outlives it: its processes are all in the two groups, and its files are
        in the temp dir.
        """
        for proc in reversed(self.procs):
            _kill_group(proc)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL what is left of the process group ``proc`` leads, and reap ``proc``."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


def start_two_node_cluster(python_path: str | None = None, **sizes: int) -> TwoNodeCluster:
    """Start a :class:`TwoNodeCluster` (``sizes`` as for :meth:`TwoNodeCluster.start`) in
    a fresh temp directory under /tmp (a short path: Ray's Unix socket paths inside it
    must stay under about 100 characters). ``python_path`` is the nodes' PYTHONPATH
    (default: none), for example a checkout that stands for the package installed in a
    cluster's image."""
    cluster = TwoNodeCluster(Path(tempfile.mkdtemp(prefix="rbc", dir="/tmp")))
    if python_path is not None:
        cluster.env["PYTHONPATH"] = python_path
    try:
        cluster.start(**sizes)
    except BaseException:
        cluster.stop()
        raise
    return cluster
