"""The S3 servers of ``benchmarks/cache_lookup.py --s3-server``: ``moto`` closes every
connection after its response; ``moto-keepalive`` (``benchmarks/moto_keepalive.py``)
keeps a connection open between requests without a body, as a real store does, and
answers on it what ``moto`` answers. A short run of the benchmark against it finds the
same entries as on local disk and opens fewer connections than it makes requests
(figures in docs/benchmarks/cache.md)."""

from __future__ import annotations

import http.client
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _benchmark():
    """benchmarks/cache_lookup.py as a module."""
    spec = importlib.util.spec_from_file_location(
        "cache_lookup", ROOT / "benchmarks" / "cache_lookup.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(params=["moto", "moto-keepalive"])
def server(request):
    """(name, port) of each ``--s3-server``, started as the benchmark starts it."""
    process, port = _benchmark().serve_s3(request.param)
    try:
        yield request.param, port
    finally:
        process.terminate()
        process.wait(timeout=10)


def _ask(conn: http.client.HTTPConnection, method: str, path: str, body=None, headers=None):
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    return response, response.read()


def test_keepalive_server_keeps_connections_between_requests_without_a_body(server):
    name, port = server
    setup = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    public = {"x-amz-acl": "public-read"}  # the requests here are not signed
    response, _ = _ask(setup, "PUT", "/keep-bucket", headers=public)
    assert response.status == 200
    # an upload: its connection is closed after it on both servers
    response, _ = _ask(
        setup, "PUT", "/keep-bucket/object", body=b"0123456789" * 1000, headers=public
    )
    assert response.status == 200
    assert response.getheader("Connection") == "close"
    setup.close()

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    first, body = _ask(conn, "GET", "/keep-bucket/object", headers={"Range": "bytes=10-29"})
    assert (first.status, body) == (206, b"0123456789" * 2)
    sock = conn.sock
    second, body = _ask(conn, "GET", "/keep-bucket/object")
    assert (second.status, body) == (200, b"0123456789" * 1000)
    if name == "moto":
        # werkzeug closes every connection: the second request needed a new one
        assert first.getheader("Connection") == "close"
        assert sock is None and conn.sock is None
    else:
        assert first.getheader("Connection") is None and not first.will_close
        assert conn.sock is sock is not None  # one connection for both
        missing, _ = _ask(conn, "GET", "/keep-bucket/absent")
        assert missing.status == 404 and conn.sock is sock
    conn.close()


def test_lookup_benchmark_on_the_keepalive_server_reuses_connections_and_finds_the_same():
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "cache_lookup.py"),
            *("--entries", "3000", "--batches", "8", "--batch", "16", "--repeat", "1"),
            *("--threads", "8", "--order", "bucket", "--s3-server", "moto-keepalive"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    # the same entries on both stores (the script exits otherwise), on the server asked for
    assert "S3 on loopback (moto-keepalive)" in out
    digests = re.findall(r"entries found per pass \(digest (\w+)\)", out)
    assert len(digests) == 2 and digests[0] == digests[1]
    requests = float(re.search(r"S3 requests a batch ([\d.]+)", out).group(1))
    connections = float(re.search(r"TCP connections opened \d+ a pass \(([\d.]+) a batch", out)[1])
    assert requests > 1 and connections < requests / 2, out
