"""A real S3 HTTP endpoint on loopback (moto in server mode) for object-storage tests."""

from __future__ import annotations

import socket

import pytest

S3_KEY = "testing"
S3_SECRET = "testing"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_endpoint():
    """Start moto's S3 server on a free loopback port; yield its endpoint URL."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
    import logging

    logging.getLogger("werkzeug").setLevel(
        logging.ERROR
    )  # one access-log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture()
def s3_storage_options(s3_endpoint) -> dict:
    """s3fs options that reach the loopback endpoint with moto's test credentials."""
    return {"endpoint_url": s3_endpoint, "key": S3_KEY, "secret": S3_SECRET}


@pytest.fixture()
def s3_bucket(s3_storage_options) -> str:
    """A fresh, empty bucket; yields its name."""
    import uuid

    import s3fs

    fs = s3fs.S3FileSystem(**s3_storage_options)
    name = f"rb-{uuid.uuid4().hex[:12]}"
    fs.mkdir(name)
    fs.invalidate_cache()
    yield name
