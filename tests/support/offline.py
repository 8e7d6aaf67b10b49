"""Run a command in a subprocess that behaves like a machine whose only network is loopback.

:func:`offline_env` writes a ``sitecustomize.py`` into a scratch directory and returns an
environment whose ``PYTHONPATH`` starts with that directory. Every Python interpreter
started with that environment imports the module at start-up, before any user code,
and it patches the standard :mod:`socket` module:

* ``socket.socket.connect``, ``connect_ex``, ``sendto`` and ``sendmsg`` refuse any
  destination that is not local, raising ``OSError(errno.ENETUNREACH)``
  (``connect_ex`` returns ``errno.ENETUNREACH`` instead, as the real one does);
* ``socket.getaddrinfo``, ``gethostbyname``, ``gethostbyname_ex`` and ``gethostbyaddr``
  refuse to look up a host name that would need a DNS query, raising
  ``socket.gaierror(socket.EAI_NONAME)`` (``socket.herror`` for ``gethostbyaddr``).
  Numeric addresses are passed through, since turning them into a socket address
  needs no network; connecting to one is what gets refused.

Local destinations are: IPv4 ``127.0.0.0/8``, IPv6 ``::1`` (also as ``::ffff:127.x.y.z``),
the unspecified addresses ``0.0.0.0`` / ``::`` / ``""`` (which Linux delivers to the
host itself), the names ``localhost`` / ``*.localhost`` / ``ip6-localhost`` /
``ip6-loopback``, names that ``/etc/hosts`` maps only to loopback addresses, and
sockets that never leave the kernel (``AF_UNIX``, ``AF_NETLINK``). A name listed in
``/etc/hosts`` may still be looked up (no DNS query is needed for it), but connecting
to a non-loopback address it maps to is refused.

Each refused attempt is appended to a JSON-lines log (path in the
``RAGBATCH_TEST_BLOCKED_LOG`` environment variable, with the path chosen by
:func:`offline_env` as fallback) as one object with keys ``pid``, ``argv0``, ``kind``
(``connect``, ``connect_ex``, ``sendto``, ``sendmsg``, ``getaddrinfo``, ...),
``target`` (the address or name, as text) and ``stack`` (the last few Python frames
before the call, innermost last, each as ``"file:line function"``). :func:`read_blocked`
parses the log.

Ray starts its raylet and worker processes with the environment of the process that
calls ``ray.init(address="local")``, so the patch (and the log path) reaches Ray
workers too, as long as nothing drops ``PYTHONPATH`` on the way (a ``runtime_env``
whose ``env_vars`` set ``PYTHONPATH`` must keep the original entries).

Limits: only sockets created through Python's :mod:`socket` module are covered.
Native code that opens sockets or resolves names itself bypasses the patch and is
neither refused nor logged: Ray's compiled core (its node-address discovery, which
"connects" a UDP socket towards a public resolver, and its gRPC traffic, which for a
local instance goes to the host's own primary address rather than 127.0.0.1), libcurl
and other C extensions. So does a process started with ``python -S``/``-I`` or with
an environment that no longer carries ``PYTHONPATH``. For lookups that asyncio runs
in a thread pool, the recorded stack ends at the pool's worker, not at the caller.
If another ``sitecustomize`` module exists further along ``sys.path``, it is still
run after the patch is installed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

#: Environment variable that holds the path of the log of refused attempts.
LOG_ENV = "RAGBATCH_TEST_BLOCKED_LOG"

_SITECUSTOMIZE = r'''
"""Loopback-only network for this interpreter (written by tests/support/offline.py)."""

import errno as _errno
import ipaddress as _ipaddress
import json as _json
import os as _os
import socket as _socket
import sys as _sys

_LOG_ENV = "@LOG_ENV@"
_DEFAULT_LOG = @DEFAULT_LOG@
_STACK_DEPTH = @STACK_DEPTH@
_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}
_LOCAL_FAMILIES = {getattr(_socket, n) for n in ("AF_UNIX", "AF_NETLINK") if hasattr(_socket, n)}
_INET_FAMILIES = {_socket.AF_INET, _socket.AF_INET6}


def _etc_hosts():
    """Map each name in /etc/hosts (lower case) to the set of addresses listed for it."""
    table = {}
    try:
        with open("/etc/hosts", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                fields = line.split("#", 1)[0].split()
                for name in fields[1:]:
                    table.setdefault(name.lower().rstrip("."), set()).add(fields[0])
    except OSError:
        pass
    return table


_HOSTS = _etc_hosts()


def _as_text(host):
    if isinstance(host, (bytes, bytearray)):
        return bytes(host).decode("ascii", "replace")
    return host


def _numeric(host):
    """The ip_address for a numeric host (scope id dropped), or None for a name."""
    try:
        return _ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None


def _ip_is_local(ip):
    mapped = getattr(ip, "ipv4_mapped", None)
    if mapped is not None:
        ip = mapped
    return ip.is_loopback or ip.is_unspecified


def _name_needs_no_dns(name):
    """True for a name answered without a DNS query (localhost names, /etc/hosts)."""
    name = name.lower().rstrip(".")
    return name in _LOCAL_NAMES or name.endswith(".localhost") or name in _HOSTS


def _host_is_local(host):
    """True when connecting to ``host`` (numeric or name) stays on loopback."""
    host = _as_text(host)
    if host is None or host == "":
        return True
    if not isinstance(host, str):
        return False
    ip = _numeric(host)
    if ip is not None:
        return _ip_is_local(ip)
    name = host.lower().rstrip(".")
    if name in _LOCAL_NAMES or name.endswith(".localhost"):
        return True
    listed = _HOSTS.get(name)
    if not listed:
        return False
    ips = [_numeric(a) for a in listed]
    return all(ip is not None and _ip_is_local(ip) for ip in ips)


def _address_is_local(family, address):
    if family in _LOCAL_FAMILIES:
        return True
    if family in _INET_FAMILIES:
        if isinstance(address, tuple) and address:
            return _host_is_local(address[0])
        return False
    return False


def _frames():
    """The innermost frames of the caller's stack, outside this module, innermost last."""
    frames = []
    frame = _sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    while frame is not None and len(frames) < _STACK_DEPTH:
        code = frame.f_code
        path = code.co_filename
        cut = path.rfind("site-packages/")
        if cut >= 0:
            path = path[cut + len("site-packages/"):]
        frames.append(f"{path}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    frames.reverse()
    return frames


def _record(kind, target):
    """Append one JSON line describing a refused attempt; never raise."""
    path = _os.environ.get(_LOG_ENV) or _DEFAULT_LOG
    if not path:
        return
    try:
        argv = getattr(_sys, "argv", None) or [""]
        entry = {
            "pid": _os.getpid(),
            "argv0": argv[0] if argv else "",
            "kind": kind,
            "target": repr(target) if not isinstance(target, str) else target,
            "stack": _frames(),
        }
        data = (_json.dumps(entry) + "\n").encode("utf-8")
        fd = _os.open(path, _os.O_WRONLY | _os.O_APPEND | _os.O_CREAT, 0o644)
        try:
            _os.write(fd, data)
        finally:
            _os.close(fd)
    except Exception:
        pass


def _unreachable(kind, target):
    _record(kind, target)
    return OSError(_errno.ENETUNREACH, f"Network is unreachable (offline test: {kind} {target!r})")


def _no_such_name(kind, name):
    _record(kind, name)
    return _socket.gaierror(_socket.EAI_NONAME, f"Name or service not known (offline test: {name!r})")


_real_connect = _socket.socket.connect
_real_connect_ex = _socket.socket.connect_ex
_real_sendto = _socket.socket.sendto
_real_sendmsg = getattr(_socket.socket, "sendmsg", None)
_real_getaddrinfo = _socket.getaddrinfo
_real_gethostbyname = _socket.gethostbyname
_real_gethostbyname_ex = _socket.gethostbyname_ex
_real_gethostbyaddr = _socket.gethostbyaddr


def connect(self, address):
    if not _address_is_local(self.family, address):
        raise _unreachable("connect", address)
    return _real_connect(self, address)


def connect_ex(self, address):
    if not _address_is_local(self.family, address):
        _record("connect_ex", address)
        return _errno.ENETUNREACH
    return _real_connect_ex(self, address)


def sendto(self, data, *args):
    address = args[-1] if args else None
    if not _address_is_local(self.family, address):
        raise _unreachable("sendto", address)
    return _real_sendto(self, data, *args)


def sendmsg(self, buffers, ancdata=(), flags=0, address=None):
    if address is not None and not _address_is_local(self.family, address):
        raise _unreachable("sendmsg", address)
    if address is None:
        return _real_sendmsg(self, buffers, ancdata, flags)
    return _real_sendmsg(self, buffers, ancdata, flags, address)


def _check_name(kind, host):
    text = _as_text(host)
    if text is None or text == "" or not isinstance(text, str):
        return
    if _numeric(text) is not None or _name_needs_no_dns(text):
        return
    raise _no_such_name(kind, text)


def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
    _check_name("getaddrinfo", host)
    return _real_getaddrinfo(host, port, family, type, proto, flags)


def gethostbyname(hostname):
    _check_name("gethostbyname", hostname)
    return _real_gethostbyname(hostname)


def gethostbyname_ex(hostname):
    _check_name("gethostbyname_ex", hostname)
    return _real_gethostbyname_ex(hostname)


def gethostbyaddr(ip_address):
    text = _as_text(ip_address)
    ip = _numeric(text) if isinstance(text, str) else None
    listed = isinstance(text, str) and (
        _name_needs_no_dns(text)
        or (ip is not None and (_ip_is_local(ip) or any(text in a for a in _HOSTS.values())))
    )
    if not listed:
        _record("gethostbyaddr", text)
        raise _socket.herror(1, f"Unknown host (offline test: {text!r})")
    return _real_gethostbyaddr(ip_address)


_socket.socket.connect = connect
_socket.socket.connect_ex = connect_ex
_socket.socket.sendto = sendto
if _real_sendmsg is not None:
    _socket.socket.sendmsg = sendmsg
_socket.getaddrinfo = getaddrinfo
_socket.gethostbyname = gethostbyname
_socket.gethostbyname_ex = gethostbyname_ex
_socket.gethostbyaddr = gethostbyaddr


def _chain_next_sitecustomize():
    """Run the sitecustomize this module shadows, if there is one further on sys.path."""
    import importlib.machinery
    import importlib.util

    here = _os.path.dirname(_os.path.abspath(__file__))
    rest = [p for p in _sys.path if _os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_chain_next_sitecustomize()
'''


def offline_env(
    tmp_dir: Path, base_env: dict[str, str] | None = None, *, stack_depth: int = 20
) -> tuple[dict[str, str], Path]:
    """Prepare an environment in which Python subprocesses can reach loopback only.

    Writes ``tmp_dir/site/sitecustomize.py`` (see the module docstring for what it
    refuses and how) and returns ``(env, log)``: ``env`` is a copy of ``base_env``
    (default: ``os.environ``) with ``tmp_dir/site`` first on ``PYTHONPATH`` and
    :data:`LOG_ENV` set to ``log``; ``log`` is ``tmp_dir/blocked.jsonl``, where every
    refused attempt of every process started with ``env`` (and of their children that
    keep it, such as Ray workers) is appended, with the ``stack_depth`` innermost Python
    frames of the caller (an HTTP client alone accounts for a dozen or more, so a
    smaller depth tends to hide who made the request). The log is created empty.
    """
    tmp_dir = Path(tmp_dir).resolve()
    site_dir = tmp_dir / "site"
    site_dir.mkdir(parents=True, exist_ok=True)
    log = tmp_dir / "blocked.jsonl"
    log.write_text("")
    source = (
        _SITECUSTOMIZE.replace("@LOG_ENV@", LOG_ENV)
        .replace("@DEFAULT_LOG@", repr(str(log)))
        .replace("@STACK_DEPTH@", str(int(stack_depth)))
    )
    (site_dir / "sitecustomize.py").write_text(source.lstrip(), encoding="utf-8")

    env = dict(os.environ if base_env is None else base_env)
    existing = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join([str(site_dir), existing]) if existing else str(site_dir)
    env[LOG_ENV] = str(log)
    return env, log


def read_blocked(log: Path) -> list[dict]:
    """Return the refused attempts recorded in ``log``, oldest first (empty if none).

    Each entry is a dict with keys ``pid``, ``argv0``, ``kind``, ``target`` and
    ``stack``; a line cut short by a process killed mid-write is skipped.
    """
    log = Path(log)
    if not log.exists():
        return []
    entries = []
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return entries
