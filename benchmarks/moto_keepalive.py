"""moto's S3 server with HTTP/1.1 keep-alive: a stand-in store that keeps connections open.

Usage (from the repository root, in the project's virtual environment)::

    python benchmarks/moto_keepalive.py [-H 127.0.0.1] [-p 5000]

It serves the application ``python -m moto.server`` serves (moto's
``DomainDispatcherApplication`` over ``create_backend_app``, one thread a connection,
moto's own request handler), with one difference: a connection stays open after a
response, as S3 and other stores keep theirs, instead of being closed after every
request. ``python -m moto.server`` cannot be told to: werkzeug's development server
(3.x) sends ``Connection: close`` with every response whatever its protocol version,
so a client such as botocore opens a new TCP connection for every request.

Here the handler speaks HTTP/1.1 and leaves that header out, so the connection is kept
unless the client asks to close it. Two details of werkzeug's server are changed for it:

* after each response werkzeug waits up to 10 ms for bytes the application left unread
  and reads them all, which on a kept connection would hold the connection idle for
  those 10 ms and swallow the client's next request; a request without a body leaves
  nothing unread, so for those the wait is skipped;
* a request with a body (an upload) is still answered with ``Connection: close`` and
  drained as before, so that nothing it left unread can be taken for the next request.

``benchmarks/cache_lookup.py --s3-server moto-keepalive`` starts it in a process of its
own; ``tests/test_bench_moto_keepalive.py`` checks that requests share connections.
"""

from __future__ import annotations

import argparse
import os
import selectors
import signal
import sys
import threading

from werkzeug import serving

_request = threading.local()


class _Selectors:
    """Stands in for the ``selectors`` module in :mod:`werkzeug.serving`, whose only use
    there is the wait for unread request bytes after a response: skipped for a request
    without a body (the connection is kept), as before for one with a body."""

    EVENT_READ = selectors.EVENT_READ

    class _Nothing:
        def register(self, *args, **kwargs) -> None:
            pass

        def select(self, timeout=None) -> list:
            return []

        def close(self) -> None:
            pass

    @classmethod
    def DefaultSelector(cls):  # noqa: N802 (the name werkzeug calls)
        return selectors.DefaultSelector() if getattr(_request, "body", True) else cls._Nothing()


def _handler():
    """moto's request handler, speaking HTTP/1.1 and keeping connections open."""
    from moto.moto_server.werkzeug_app import MotoRequestHandler

    class KeepAliveHandler(MotoRequestHandler):
        protocol_version = "HTTP/1.1"

        def handle_one_request(self) -> None:
            _request.body = True
            super().handle_one_request()

        def make_environ(self) -> dict:
            headers = self.headers
            _request.body = (
                int(headers.get("Content-Length") or 0) > 0 or "Transfer-Encoding" in headers
            )
            return super().make_environ()

        def send_header(self, keyword: str, value: str) -> None:
            # werkzeug sends this with every response; BaseHTTPRequestHandler closes the
            # connection once it is sent. Leave it out unless the request had a body.
            if keyword.lower() == "connection" and value.lower() == "close" and not _request.body:
                return
            super().send_header(keyword, value)

    return KeepAliveHandler


def serve(host: str, port: int) -> None:
    """Serve moto's application on ``host:port``, keeping connections open, until ended."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    os.environ.setdefault("MOTO_PORT", str(port))  # as moto.server sets it
    serving.selectors = _Selectors
    app = DomainDispatcherApplication(create_backend_app)
    app.debug = True  # as moto.server has it
    server = serving.make_server(host, port, app, threaded=True, request_handler=_handler())
    server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-H", "--host", default="127.0.0.1")
    p.add_argument("-p", "--port", type=int, default=5000)
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    serve(args.host, args.port)


if __name__ == "__main__":
    main()
