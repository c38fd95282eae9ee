"""A fork server for the isolated children: one process that has imported what every child imports, and forks one
child per runner.

A child started as ``python -m pipeline.runtime.isolate`` pays a new interpreter and 0.3-0.4 s of imports (numpy,
onnx, ONNX Runtime, Polygraphy, the backend table) every time, and verify and benchmark start one per candidate
(the test suite about 600). A child forked from this server starts in milliseconds and is isolated just the same:
its own process, so a segfault kills it and not the parent; its own log; its exit status (``-11`` for SIGSEGV)
reported back. The idea is CPython's ``multiprocessing`` forkserver. Its ``Process`` is not used because every
child would import the parent's ``__main__`` again (the ``pipeline`` console script's is the command line, with
pydantic), and an isolated child talks over its stdin and stdout, which ``Process`` closes.

The server is started on the first child and ends with its parent (the end of its control socket). Children start
as a new interpreter, as before, where it cannot serve: ``isolate.fork_server: false``; a variable the dynamic
loader or Python reads only at start (``LD_LIBRARY_PATH``, where CUDA's libraries are) changed since the server
started; or the server is gone.

Protocol: the parent sends one datagram per child (JSON: the module whose ``main(argv)`` the child runs, such as
:func:`pipeline.runtime.isolate.main`, its argv, the environment and the working directory) with four descriptors: a
status socket, the child's stdin, stdout and stderr. The server forks; the server writes ``<pid>\\n`` on the status
socket at once and ``<exit code>\\n`` when the child has ended (negative: the signal), then closes it.
"""

from __future__ import annotations

import atexit
import importlib
import json
import logging
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading

log = logging.getLogger("pipeline")

# What every isolated child imports before its runner is made: imported once, in the server.
PRELOAD = ("pipeline.runtime.isolate", "pipeline.runtime.backends", "onnx", "onnxruntime", "polygraphy.backend.onnxrt",
           "openvino")
# Read by the dynamic loader or the interpreter when a process starts: a child forked from a server started under
# other values would not see the new ones.
START_VARIABLES = ("LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH", "PYTHONNOUSERSITE")
REPLY_TIMEOUT_S = 60.0  # the server's pid reply: its imports, on a busy machine
MAX_REQUEST = 1 << 20


# --------------------------------------------------------------------------- parent side


class ForkedChild:
    """A child of the fork server, with the part of :class:`subprocess.Popen` that the isolated runner uses:
    ``pid``, ``stdin``, ``stdout``, ``returncode``, ``poll``, ``wait`` and ``kill``."""

    def __init__(self, pid: int, status: socket.socket, stdin, stdout, pending: bytes = b""):
        self.pid, self.stdin, self.stdout = pid, stdin, stdout
        self.returncode: int | None = None
        self._status, self._pending = status, pending

    def poll(self) -> int | None:
        return self._ended(timeout=0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._ended(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout)
        return code

    def kill(self) -> None:
        """SIGKILL, unless its end was reported (called from the deadline's timer thread too: it reads nothing)."""
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # it ended meanwhile

    def _ended(self, timeout: float | None) -> int | None:
        """The exit code once the server reports it; None while the child runs (or ``timeout`` ran out)."""
        while self.returncode is None:
            if b"\n" in self._pending:
                self.returncode = int(self._pending.split(b"\n", 1)[0])
                break
            ready, _, _ = select.select([self._status], [], [], timeout)
            if not ready:
                return None
            chunk = self._status.recv(64)
            self._pending += chunk
            if not chunk and b"\n" not in self._pending:  # the server died first: kill the child, so it surely ended
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.returncode = -signal.SIGKILL
        self._status.close()
        return self.returncode


class _Server:
    def __init__(self, env: dict):
        self.start_env = {k: env.get(k) for k in START_VARIABLES}
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "pipeline.runtime.zygote", str(theirs.fileno())],
                                         pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        finally:
            theirs.close()

    def serves(self, env: dict) -> bool:
        return self.proc.poll() is None and self.start_env == {k: env.get(k) for k in START_VARIABLES}

    def close(self) -> None:
        self.control.close()  # the server's end of its loop
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def fork(self, main: str, argv: list[str], env: dict, stderr_fd: int) -> ForkedChild:
        """Ask for a child running ``main``'s ``main(argv)``; its stdin and stdout are pipes to this process."""
        status, status_theirs = socket.socketpair()
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        request = json.dumps({"main": main, "argv": argv, "env": env, "cwd": os.getcwd()}).encode()
        try:
            socket.send_fds(self.control, [request], [status_theirs.fileno(), stdin_r, stdout_w, stderr_fd])
        except OSError:
            for fd in (stdin_w, stdout_r):
                os.close(fd)
            status.close()
            raise
        finally:
            status_theirs.close()
            os.close(stdin_r)
            os.close(stdout_w)
        status.settimeout(REPLY_TIMEOUT_S)
        try:
            reply = status.recv(64)
        except OSError:
            reply = b""
        status.settimeout(None)
        if b"\n" not in reply:
            for fd in (stdin_w, stdout_r):
                os.close(fd)
            status.close()
            raise OSError("the fork server did not answer")
        pid, _, rest = reply.partition(b"\n")  # rest: the exit code already, from a child that ended at once
        return ForkedChild(int(pid), status, open(stdin_w, "wb"), open(stdout_r, "rb"), pending=rest)


_lock = threading.Lock()
_server: _Server | None = None


def fork(main: str, argv: list[str], env: dict, stderr_fd: int) -> ForkedChild | None:
    """A child of this process's fork server that runs ``main(argv)`` of the module named ``main`` (as
    ``python -m <main> <argv>`` would) with ``env``, stdin and stdout piped to this process and ``stderr_fd`` as its
    stderr; or None where the server cannot serve it (then the caller starts a new interpreter). Thread-safe."""
    global _server
    if not hasattr(socket, "send_fds") or not hasattr(os, "fork"):
        return None
    with _lock:
        for _ in range(2):  # a server that died since the last child (and was not seen dead yet) is replaced once
            try:
                if _server is not None and not _server.serves(env):
                    _server.close()
                    _server = None
                if _server is None:
                    _server = _Server(env)
                return _server.fork(main, argv, env, stderr_fd)
            except OSError as exc:
                log.debug("isolate: the fork server could not start a child (%s)", exc)
                if _server is not None:
                    _server.close()
                    _server = None
        return None


@atexit.register
def _stop() -> None:
    global _server
    with _lock:
        if _server is not None:
            _server.close()
            _server = None


# --------------------------------------------------------------------------- server side


def serve(control: socket.socket) -> int:
    """Fork a child per request until the parent closes ``control``; report each child's pid and exit code."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that SIGCHLD writes to wake_w
    reporting: dict[int, socket.socket] = {}
    with selectors.DefaultSelector() as selector:
        selector.register(control, selectors.EVENT_READ)
        selector.register(wake_r, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                if key.fileobj is control:
                    try:
                        message, fds, _, _ = socket.recv_fds(control, MAX_REQUEST, 4)
                    except OSError:
                        return 0
                    if not message:
                        return 0  # the parent is gone
                    _fork_one(json.loads(message), fds, [control.fileno(), wake_r, wake_w, selector], reporting)
                else:
                    os.read(wake_r, 4096)
                    _reap(reporting)


def _fork_one(request: dict, fds: list[int], server_fds: list, reporting: dict) -> None:
    status = socket.socket(fileno=fds[0])
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for other in [*reporting.values(), status]:
                other.close()
            server_fds[-1].close()
            for fd in server_fds[:-1]:
                os.close(fd)
            for fd, target in zip(fds[1:], (0, 1, 2), strict=True):
                os.dup2(fd, target)
                os.close(fd)
            os.environ.clear()
            os.environ.update(request["env"])
            os.chdir(request["cwd"])
            sys.stdin = open(0, encoding="utf-8", closefd=False)
            code = importlib.import_module(request["main"]).main(request["argv"])
        except BaseException:  # anything: the child must end here, never return into the server's loop
            import traceback

            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    for fd in fds[1:]:
        os.close(fd)
    try:
        status.sendall(f"{pid}\n".encode())
    except OSError:
        pass  # the parent gave up waiting: the child reads the end of its stdin and ends
    reporting[pid] = status


def _reap(reporting: dict) -> None:
    while True:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        status = reporting.pop(pid, None)
        if status is not None:
            try:
                status.sendall(f"{os.waitstatus_to_exitcode(wait_status)}\n".encode())
            except OSError:
                pass
            status.close()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    control = socket.socket(fileno=int(argv[0]))
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass  # the child imports it, and says what is missing
    return serve(control)


if __name__ == "__main__":
    sys.exit(main())
