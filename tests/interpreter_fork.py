"""A Python that has imported torch, Triton (``TRITON_INTERPRET=1``) and numba once, and
forks a child per script of :func:`tests.helpers.run_in_triton_interpreter`: each script still
runs in a process of its own, started as the fresh one was (the same environment, working
directory and warning filters, ``__name__ == "__main__"``, its own module state), without
importing torch, Triton and numba again (~0.5-1.5 s of CPU for each of the suite's ~45
interpreter scripts). One server per test process, started at its first script; it ends with
that process (its stdin closed). Where it cannot start, :func:`run` returns ``None`` and the
caller starts a Python itself."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path

#: the server's loop: a request per line on stdin ({"script", "env", "cwd", "out", "err"}); per
#: request a line on stdout: {"pid"} once the child runs, then {"status"} once it has ended
SERVER = r"""
import json, os, sys, traceback
import numpy, torch, triton, triton.language  # noqa: F401 - what every script imports again
try:
    import numba  # noqa: F401 - (gnnio's CPU kernels; imports no thread pool)
except ImportError:
    pass
print(json.dumps({"ready": os.getpid()}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fd = os.open(req["out"], os.O_WRONLY)
            os.dup2(fd, 1)
            fd = os.open(req["err"], os.O_WRONLY)
            os.dup2(fd, 2)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            os.environ.clear()
            os.environ.update(req["env"])
            os.chdir(req["cwd"])
            sys.argv = ["-c"]
            main = type(sys)("__main__")  # a fresh __main__, as python -c has
            main.__builtins__ = __builtins__
            sys.modules["__main__"] = main
            exec(compile(req["script"], "<string>", "exec"), main.__dict__)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, int) and e.code is not None:
                print(e.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"status": os.waitstatus_to_exitcode(status)}), flush=True)
"""

#: [(Popen, the pid that started it, its environment)]: a forked test process starts its own
_server: list = []


def _start(env: dict, cwd: str) -> subprocess.Popen | None:
    """The server of this process, started with ``env`` (a new one where it was another)."""
    if _server:
        p, pid, its_env = _server[0]
        if pid == os.getpid() and its_env == _imports_see(env) and p.poll() is None:
            return p
        if pid == os.getpid():
            _end(p)
    _server.clear()
    try:
        p = subprocess.Popen([sys.executable, "-c", SERVER], env=env, cwd=cwd, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    except OSError:
        return None
    ready = _read(p, 120)
    if not ready or "ready" not in ready:
        _end(p)
        return None
    if not _server_stop_registered:
        atexit.register(_stop)
        _server_stop_registered.append(True)
    _server.append((p, os.getpid(), _imports_see(env)))
    return p


_server_stop_registered: list = []


def _imports_see(env: dict) -> dict:
    """``env`` as the server's imports see it: pytest's name of the test in progress (in the
    child's environment all the same) does not start a new server per test."""
    return {k: v for k, v in env.items() if k != "PYTEST_CURRENT_TEST"}


def _stop() -> None:
    """At exit: the server's stdin closed (its loop ends), then waited for."""
    if _server and _server[0][1] == os.getpid():
        p = _server[0][0]
        try:
            p.stdin.close()
            p.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            pass
        _end(p)


def _end(p: subprocess.Popen) -> None:
    """The server killed (where it still runs), waited for, its pipes closed."""
    p.kill()
    p.wait()
    for f in (p.stdin, p.stdout):
        try:
            f.close()
        except OSError:
            pass


_pending: dict = {}  # bytes read from a server past its last line, by its pid


def _read(p: subprocess.Popen, timeout: float) -> dict | None:
    """The server's next line, parsed (``None`` past ``timeout`` s or at its end). Read from its
    pipe itself, not through a buffered file, whose read-ahead select() would not see."""
    import time

    buf, fd = _pending.pop(p.pid, b""), p.stdout.fileno()
    end = time.monotonic() + max(0.0, timeout)
    while b"\n" not in buf:
        if not select.select([fd], [], [], max(0.0, end - time.monotonic()))[0]:
            _pending[p.pid] = buf
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            return None
        buf += chunk
    line, rest = buf.split(b"\n", 1)
    _pending[p.pid] = rest
    return json.loads(line)


def run(script: str, env: dict, cwd: str, timeout: float) -> subprocess.CompletedProcess | None:
    """``script`` as ``python -c script`` with ``env`` and ``cwd`` would run it, in a child of
    the server; ``None`` where the server is not there (the caller runs a Python itself). Past
    ``timeout`` s the child is killed and ``subprocess.TimeoutExpired`` raised."""
    import time

    p = _start(env, cwd)
    if p is None:
        return None
    with tempfile.TemporaryDirectory(prefix="gnnio-interp-") as d:
        out, err = Path(d, "out"), Path(d, "err")
        out.touch()
        err.touch()
        req = {"script": script, "env": env, "cwd": str(cwd), "out": str(out), "err": str(err)}
        t0, started, done = time.monotonic(), None, None
        try:
            p.stdin.write(json.dumps(req) + "\n")
            p.stdin.flush()
            started = _read(p, 60)
            if started and "pid" in started:
                done = _read(p, timeout - (time.monotonic() - t0))
        finally:  # (interrupted, or past the limit: the child ends, the server is started anew)
            if done is None:
                if started and "pid" in started:
                    with contextlib.suppress(ProcessLookupError):  # (it ended meanwhile)
                        os.kill(started["pid"], 9)
                _end(p)
                _server.clear()
        if done is None and not (started and "pid" in started):
            return None  # the server did not take the script: the caller starts a Python
        if done is None:
            raise subprocess.TimeoutExpired(["python", "-c", "..."], timeout,
                                            out.read_text(), err.read_text())  # fmt: skip
        return subprocess.CompletedProcess(["python", "-c", "..."], done["status"],
                                           out.read_text(), err.read_text())  # fmt: skip
