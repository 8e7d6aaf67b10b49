"""The loopback-only subprocess harness in ``tests/support/offline.py``: what it refuses, what it lets
through, and what it records. No test needs a network: refused calls fail before any packet."""

from __future__ import annotations

import errno
import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

from support.offline import offline_env, read_blocked


def _run_python(code: str, env: dict[str, str]) -> dict:
    """Run ``code`` in a fresh interpreter with ``env``; return the JSON it prints last."""
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_connect_to_a_public_address_is_refused_and_logged(tmp_path: Path):
    env, log = offline_env(tmp_path)
    code = """
import json, socket
def reach_out():
    try:
        socket.create_connection(("93.184.216.34", 80), timeout=1)
    except OSError as exc:
        return exc.errno
    return None
tcp_errno = reach_out()
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    udp.sendto(b"x", ("8.8.8.8", 53))
    udp_errno = None
except OSError as exc:
    udp_errno = exc.errno
print(json.dumps({"tcp": tcp_errno, "udp": udp_errno}))
"""
    result = _run_python(code, env)
    assert result == {"tcp": errno.ENETUNREACH, "udp": errno.ENETUNREACH}

    blocked = read_blocked(log)
    assert [(b["kind"], b["target"]) for b in blocked] == [
        ("connect", "('93.184.216.34', 80)"),
        ("sendto", "('8.8.8.8', 53)"),
    ]
    first = blocked[0]
    assert first["argv0"] == "-c" and isinstance(first["pid"], int)
    assert any(frame.endswith(" reach_out") for frame in first["stack"])


def test_loopback_tcp_server_is_reachable(tmp_path: Path):
    env, log = offline_env(tmp_path)
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def answer_once() -> None:
            conn, _ = server.accept()
            with conn:
                conn.sendall(b"pong")

        thread = threading.Thread(target=answer_once, daemon=True)
        thread.start()
        code = f"""
import json, socket
with socket.create_connection(("localhost", {port}), timeout=5) as conn:
    print(json.dumps({{"reply": conn.recv(4).decode()}}))
"""
        result = _run_python(code, env)
        thread.join(timeout=5)
    assert result == {"reply": "pong"}
    assert read_blocked(log) == []


def test_resolving_a_public_name_fails_and_is_logged(tmp_path: Path):
    env, log = offline_env(tmp_path)
    code = """
import json, socket
try:
    socket.getaddrinfo("example.com", 443)
    outcome = None
except socket.gaierror as exc:
    outcome = exc.errno
local = socket.getaddrinfo("localhost", 80)[0][4][0]
print(json.dumps({"errno": outcome, "local": local}))
"""
    result = _run_python(code, env)
    assert result["errno"] == socket.EAI_NONAME
    assert result["local"] in ("127.0.0.1", "::1")
    assert [(b["kind"], b["target"]) for b in read_blocked(log)] == [("getaddrinfo", "example.com")]
