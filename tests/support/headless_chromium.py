"""Open a page in headless Chromium and report what a user's console would show.

Chromium (Debian's ``chromium`` package; ``.ci/run`` installs it) starts with
``--headless --no-sandbox`` and a DevTools port; the page is driven over the Chrome
DevTools Protocol (one WebSocket, ``websockets``' synchronous client). Collected while the
page loads and for a short settle time after the ``load`` event:

- uncaught exceptions (``Runtime.exceptionThrown``);
- ``console.error`` / ``console.assert`` calls (``Runtime.consoleAPICalled``);
- browser log entries of level ``error`` (``Log.entryAdded``): resources that failed to
  load, Content-Security-Policy violations, ...;
- every URL the page requested (``Network.requestWillBeSent``).

Name resolution is mapped to nowhere (``--host-resolver-rules``), so a page that needs
the network shows it as failed requests.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

BINARIES = ("chromium", "chromium-browser", "google-chrome")
#: Set by .ci/run: a missing Chromium then fails the tests instead of skipping them.
REQUIRE_ENV = "RAGBATCH_REQUIRE_CHROMIUM"


def chromium_binary() -> str:
    """Path of the Chromium binary; skips the test when none is installed, unless
    ``RAGBATCH_REQUIRE_CHROMIUM=1`` (CI), where it fails."""
    for name in BINARIES:
        path = shutil.which(name)
        if path:
            return path
    message = "headless Chromium is not installed (apt-get install chromium; .ci/run does it)"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(message)
    pytest.skip(message)


@dataclass
class PageResult:
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    value: Any = None
    screenshot: bytes = b""


class _DevTools:
    def __init__(self, ws: Any):
        self.ws = ws
        self.ids = itertools.count(1)
        self.events: list[dict] = []

    def call(self, method: str, timeout: float = 30.0, **params) -> dict:
        ident = next(self.ids)
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, method: str, timeout: float = 30.0) -> None:
        if any(e.get("method") == method for e in self.events):
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            self.events.append(message)
            if message.get("method") == method:
                return
        raise TimeoutError(f"no {method} within {timeout} s")

    def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                self.events.append(json.loads(self.ws.recv(timeout=left)))
            except TimeoutError:
                return


def _errors(events: list[dict]) -> list[str]:
    out = []
    for e in events:
        method, params = e.get("method"), e.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            exc = details.get("exception", {})
            out.append(f"exception: {exc.get('description') or details.get('text')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            texts = [str(a.get("value", a.get("description", ""))) for a in params.get("args", [])]
            out.append(f"console.{params['type']}: {' '.join(texts)}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            out.append(
                f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}".strip()
            )
    return out


def _start(binary: str, profile: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [
            binary,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    port_file = Path(profile) / "DevToolsActivePort"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if port_file.exists() and port_file.read_text().strip():
            return proc, int(port_file.read_text().splitlines()[0])
        if proc.poll() is not None:
            raise RuntimeError(
                f"chromium exited with {proc.returncode} before opening its DevTools port"
            )
        time.sleep(0.1)
    proc.kill()
    raise TimeoutError("chromium did not open its DevTools port within 60 s")


class HeadlessChromium:
    """A headless Chromium process; each :meth:`open_page` runs in a new tab.

    Use as a context manager (the process ends on exit)."""

    def __enter__(self) -> "HeadlessChromium":
        self._profile = tempfile.TemporaryDirectory(prefix="chromium-profile-")
        self.proc, self.port = _start(chromium_binary(), self._profile.name)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._profile.cleanup()

    def _http(self, path: str, method: str = "GET") -> Any:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", method=method)
        with urllib.request.urlopen(request, timeout=30) as resp:
            body = resp.read()
        try:
            return json.loads(body)
        except ValueError:
            return body.decode()

    def open_page(
        self,
        url: str,
        *,
        evaluate: str | None = None,
        screenshot: bool = False,
        width: int = 1280,
        settle_s: float = 0.5,
    ) -> PageResult:
        """Load ``url`` in a new tab; return the console errors, requested URLs, the value
        of the JavaScript expression ``evaluate`` (promises awaited) and, when asked, a
        full-page PNG screenshot."""
        from websockets.sync.client import connect

        target = self._http("/json/new?about:blank", method="PUT")
        try:
            with connect(target["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as ws:
                return _drive(_DevTools(ws), url, evaluate, screenshot, width, settle_s)
        finally:
            self._http(f"/json/close/{target['id']}")


def _drive(
    tools: _DevTools, url: str, evaluate: str | None, screenshot: bool, width: int, settle_s: float
) -> PageResult:
    for domain in ("Runtime", "Log", "Page", "Network"):
        tools.call(f"{domain}.enable")
    tools.call(
        "Emulation.setDeviceMetricsOverride",
        width=width,
        height=900,
        deviceScaleFactor=1,
        mobile=False,
    )
    tools.call("Page.navigate", url=url)
    tools.wait_for("Page.loadEventFired", timeout=60)
    tools.drain(settle_s)
    result = PageResult()
    if evaluate is not None:
        got = tools.call(
            "Runtime.evaluate",
            expression=evaluate,
            returnByValue=True,
            awaitPromise=True,
            timeout=60,
        )
        if "exceptionDetails" in got:
            raise RuntimeError(f"evaluate failed: {got['exceptionDetails']}")
        result.value = got["result"].get("value")
    if screenshot:
        height = tools.call(
            "Runtime.evaluate",
            returnByValue=True,
            expression="document.documentElement.scrollHeight",
        )["result"]["value"]
        tools.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=min(int(height), 16000),
            deviceScaleFactor=1,
            mobile=False,
        )
        shot = tools.call("Page.captureScreenshot", format="png", timeout=60)
        result.screenshot = base64.b64decode(shot["data"])
    tools.drain(0.1)
    result.errors = _errors(tools.events)
    result.requests = [
        e["params"]["request"]["url"]
        for e in tools.events
        if e.get("method") == "Network.requestWillBeSent"
    ]
    return result
