"""tests/interpreter_fork.py runs a script as ``python -c`` would: its exit status, output,
environment and working directory, a process of its own (nothing left for the next script),
and a script past its time limit killed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests import interpreter_fork

ROOT = Path(__file__).resolve().parents[1]


def env(**extra) -> dict:
    return {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT), **extra}


def test_a_script_runs_as_python_c_would(tmp_path):
    pytest.importorskip("triton")
    e = env(GNNIO_FORK_TEST="7")
    script = (
        "import os, sys, torch, warnings\n"
        "print(__name__, sys.argv, os.environ['GNNIO_FORK_TEST'], os.getcwd())\n"
        "print(os.getpid() != int(os.environ['PARENT']), sys.modules['__main__'].__dict__ is "
        "globals())\n"
        "warnings.warn('to stderr', UserWarning)\n"
        "torch.gnnio_left_behind = 1\n"
    )
    r = interpreter_fork.run(script, {**e, "PARENT": str(os.getpid())}, str(tmp_path), 60)
    assert r is not None and r.returncode == 0, r.stderr
    first, second = r.stdout.splitlines()
    assert first == f"__main__ ['-c'] 7 {tmp_path}" and second == "True True"
    assert "UserWarning: to stderr" in r.stderr
    # the next script: a process of its own (the first one's module state gone)
    r = interpreter_fork.run("import torch; assert not hasattr(torch, 'gnnio_left_behind')",
                             e, str(ROOT), 60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert os.environ.get("GNNIO_FORK_TEST") is None  # (nothing set here)


@pytest.mark.parametrize(
    "script, status, said",
    [
        ("raise ValueError('boom')", 1, "ValueError: boom"),
        ("import sys; sys.exit(3)", 3, ""),
        ("import sys; sys.exit('a message')", 1, "a message"),
        ("import os; os._exit(5)", 5, ""),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -9, ""),
    ],
)
def test_a_failing_script_reports_its_status(script, status, said):
    pytest.importorskip("triton")
    r = interpreter_fork.run(script, env(), str(ROOT), 60)
    assert r.returncode == status and said in r.stderr, (r.returncode, r.stderr)
    assert interpreter_fork.run("print('ok')", env(), str(ROOT), 60).stdout == "ok\n"


def test_a_script_past_its_limit_is_killed_and_the_next_runs():
    pytest.importorskip("triton")
    with pytest.raises(subprocess.TimeoutExpired):
        interpreter_fork.run("print('started', flush=True)\nimport time; time.sleep(60)", env(),
                             str(ROOT), 3)  # fmt: skip
    assert interpreter_fork.run("print('ok')", env(), str(ROOT), 60).stdout == "ok\n"


def test_an_interrupted_run_ends_its_child_and_the_next_runs(monkeypatch):
    """Interrupted while its script runs (Ctrl-C, pytest-timeout): the script's process killed,
    the server replaced (its next line would have been that script's status)."""
    pytest.importorskip("triton")
    assert interpreter_fork.run("print('ok')", env(), str(ROOT), 60).stdout == "ok\n"
    real, seen = interpreter_fork._read, []

    def read(p, timeout):
        if seen:  # the wait for the script's end
            raise KeyboardInterrupt
        seen.append(real(p, timeout))
        return seen[-1]

    monkeypatch.setattr(interpreter_fork, "_read", read)
    with pytest.raises(KeyboardInterrupt):
        interpreter_fork.run("import time; time.sleep(60)", env(), str(ROOT), 60)
    monkeypatch.undo()
    with pytest.raises(ProcessLookupError):
        for _ in range(100):  # (killed: gone once its server, killed too, no longer holds it)
            os.kill(seen[0]["pid"], 0)
            __import__("time").sleep(0.05)
    assert interpreter_fork.run("print('ok')", env(), str(ROOT), 60).stdout == "ok\n"
