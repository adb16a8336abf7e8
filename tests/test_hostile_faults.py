"""Interrupts and faults (issue 27, item 4): Ctrl-C during ``train --nproc 2`` is gnnio's one
line and exit 130, ``--nproc`` past the machine is refused, SIGINT early in ``partition`` never
crashes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gnnio.cli.main import main
from tests.helpers import write_tiny_dataset
from tests.test_bad_input_prepare import one_line_error

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("f") / "tiny", num_nodes=60, num_edges=300)


def test_nproc_past_the_machine_refused(tiny, capsys):
    from gnnio.train.config import MAX_RANKS_PER_CORE

    cores = len(os.sched_getaffinity(0))
    n = MAX_RANKS_PER_CORE * cores + 1
    assert main(["train", str(tiny), "--nproc", str(n), "--epochs", "1", "--quiet"]) == 2
    one_line_error(capsys, f"--nproc {n}", "per CPU core", f"at most {n - 1}")
    assert main(["train", str(tiny), "--nproc", "1000", "--epochs", "1", "--quiet"]) == 2
    one_line_error(capsys, "--nproc 1000")


def _interrupt_when(argv, ready: str, tmp_path, timeout: float = 120):
    """Start ``gnnio ARGV`` in its own process group, wait until its stderr shows ``ready``,
    send SIGINT to the whole group (as Ctrl-C in a terminal does); return (rc, stderr)."""
    err_path = tmp_path / "stderr"
    with open(err_path, "w") as err:
        p = subprocess.Popen([sys.executable, "-m", "gnnio", *argv], stdout=subprocess.DEVNULL,
                             stderr=err, env=ENV, cwd=ROOT, start_new_session=True)  # fmt: skip
        t0 = time.monotonic()
        while ready not in err_path.read_text() and p.poll() is None:
            assert time.monotonic() - t0 < timeout, err_path.read_text()[-2000:]
            time.sleep(0.1)
        os.killpg(p.pid, signal.SIGINT)
        try:
            rc = p.wait(timeout=60)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    return rc, err_path.read_text()


def test_ctrl_c_during_nproc_2_is_one_line(tiny, tmp_path):
    """Before: the elastic agent's SignalException traceback (exit 1), and with the ranks'
    KeyboardInterrupt "terminate called after throwing" aborts or atexit tracebacks."""
    argv = ["train", str(tiny), "--nproc", "2", "--epochs", "500", "--batch-size", "8"]
    rc, err = _interrupt_when(argv, "epoch   2", tmp_path)
    assert rc == 130, err[-3000:]
    assert "Traceback" not in err and "terminate called" not in err, err[-3000:]
    # the ranks' progress lines, then gnnio's line last (perhaps after a cut progress bar)
    assert err.rstrip().endswith("gnnio: interrupted") and err.count("gnnio:") == 1, err[-3000:]
    assert "death signal" not in err and "leaked semaphore" not in err, err[-3000:]


def test_sigint_during_a_numba_compile_waits_for_its_end(monkeypatch):
    """A SIGINT that lands inside numba's compiler (here: sent from the compile event itself) is
    raised once the kernel is complete, not in the middle (which left numba's and LLVM's state
    half built: a segfault at the next call of ``partition --method bfs-block``)."""
    import numpy as np
    from numba import njit
    from numba.core import event

    from gnnio.utils import interrupts
    from gnnio.utils.interrupts import defer_sigint_while_compiling

    # the deferral installs itself over Python's own handler only (a SIGINT that a shell's
    # background job ignores stays ignored): start from that handler whatever this process
    # inherited, and without an earlier test's install
    prev = signal.signal(signal.SIGINT, signal.default_int_handler)
    monkeypatch.setattr(interrupts, "_installed", None)
    try:
        _compile_interrupted(defer_sigint_while_compiling, njit, event, np)
    finally:
        signal.signal(signal.SIGINT, prev)


def _compile_interrupted(defer_sigint_while_compiling, njit, event, np):
    defer_sigint_while_compiling()
    assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler  # (installed)

    @njit(cache=False)
    def kernel(a):
        s = 0.0
        for x in a:
            s += x * 2.0
        return s

    class Interrupt(event.Listener):
        def on_start(self, ev):
            os.kill(os.getpid(), signal.SIGINT)

        def on_end(self, ev):
            pass

    with event.install_listener("numba:compile", Interrupt()):
        with pytest.raises(KeyboardInterrupt):
            kernel(np.arange(4.0))
    assert len(kernel.signatures) == 1  # compiled whole before the interrupt was raised
    assert kernel(np.arange(4.0)) == 12.0


TERM_SCRIPT = r"""
import os, signal, sys
from gnnio.cli.main import main
from gnnio.preprocess import reorder

real = reorder.relabel_csr
def relabel_then_sigterm(*a, **k):  # the output directory exists and is half-written here
    out = real(*a, **k)
    os.kill(os.getpid(), signal.SIGTERM)
    return out
reorder.relabel_csr = relabel_then_sigterm
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_mid_reorder_leaves_nothing(tiny, tmp_path):
    """``kill`` / ``timeout`` (SIGTERM) during a write: gnnio's handler turns it into an exception,
    so the writer removes its temporary directory and lock; one line, exit 143 (the code of a
    process ended by SIGTERM). Without the handler the temporary stays (found by a 26 GB run)."""
    out = tmp_path / "r"
    p = subprocess.run([sys.executable, "-c", TERM_SCRIPT, "reorder", str(tiny), "--by", "degree",
                        "--out", str(out), "--memory-budget", "none", "--quiet"],
                       capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=300)  # fmt: skip
    assert p.returncode == 143, p.stderr[-2000:]
    assert p.stderr.strip() == "gnnio: terminated"
    assert sorted(x.name for x in tmp_path.iterdir()) == [], list(tmp_path.iterdir())
