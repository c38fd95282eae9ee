"""Refuse and record every network connection this Python process (and every child that inherits PYTHONPATH)
attempts: ``tests/test_privacy.py`` puts this folder on PYTHONPATH, so Python imports it at start-up.

A connection is any ``connect`` of a socket that is not AF_UNIX, ``socket.create_connection`` and a name lookup
(``getaddrinfo``, ``gethostbyname``: a DNS query is traffic too) of anything but a numeric or local address. Each is
written as one line to the file ``PIPELINE_NETGUARD_LOG`` names (pid, call, target, the innermost frames outside
the socket module) and refused with ``ConnectionRefusedError``/``socket.gaierror``, so the caller fails as it would
offline. Native code that opens its own sockets is not seen here; the test's proxy listener catches those that honour
HTTP(S)_PROXY.

With ``PIPELINE_NETGUARD_LOOPBACK=1`` a connection to the loopback (127.0.0.0/8, ::1) is let through: a test that
serves on this machine (tests/test_serve.py) talks to its own server there, and nowhere else.
"""

import os
import socket
import traceback

_LOG = os.environ.get("PIPELINE_NETGUARD_LOG", "")
_LOCAL_NAMES = {"", "localhost", "localhost.localdomain", socket.gethostname()}
_LOOPBACK = os.environ.get("PIPELINE_NETGUARD_LOOPBACK") == "1"


def _loopback(address) -> bool:
    host = address[0] if isinstance(address, tuple) and address else None
    return _LOOPBACK and isinstance(host, str) and (host.startswith("127.") or host in ("::1", "localhost"))


def _record(call: str, target) -> None:
    stack = traceback.extract_stack()[:-2]
    frames = [f"{f.filename}:{f.lineno}" for f in stack if "site-packages" in f.filename or "pipeline" in f.filename]
    frames = (frames or [f"{f.filename}:{f.lineno}" for f in stack])[-12:]
    line = f"{os.getpid()} {call} {target!r} from {' < '.join(reversed(frames))}\n"
    if _LOG:
        with open(_LOG, "a", encoding="utf-8") as f:
            f.write(line)


def _numeric(host) -> bool:
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, str(host))
            return True
        except (OSError, ValueError):
            continue
    return False


_connect, _connect_ex = socket.socket.connect, socket.socket.connect_ex
_getaddrinfo, _gethostbyname = socket.getaddrinfo, socket.gethostbyname


def connect(self, address):
    if self.family == socket.AF_UNIX or _loopback(address):
        return _connect(self, address)
    _record("connect", address)
    raise ConnectionRefusedError(111, "network access refused by the test (tests/netguard)")


def connect_ex(self, address):
    if self.family == socket.AF_UNIX or _loopback(address):
        return _connect_ex(self, address)
    _record("connect_ex", address)
    return 111  # ECONNREFUSED


_create_connection = socket.create_connection


def create_connection(address, *args, **kwargs):
    if _loopback(address):
        return _create_connection(address, *args, **kwargs)
    _record("create_connection", address)
    raise ConnectionRefusedError(111, "network access refused by the test (tests/netguard)")


def getaddrinfo(host, *args, **kwargs):
    if host is None or _numeric(host) or str(host).lower() in _LOCAL_NAMES:
        return _getaddrinfo(host, *args, **kwargs)
    _record("getaddrinfo", host)
    raise socket.gaierror(socket.EAI_NONAME, "name lookup refused by the test (tests/netguard)")


def gethostbyname(host):
    if _numeric(host) or str(host).lower() in _LOCAL_NAMES:
        return _gethostbyname(host)
    _record("gethostbyname", host)
    raise socket.gaierror(socket.EAI_NONAME, "name lookup refused by the test (tests/netguard)")


socket.socket.connect, socket.socket.connect_ex = connect, connect_ex
socket.create_connection, socket.getaddrinfo, socket.gethostbyname = create_connection, getaddrinfo, gethostbyname
