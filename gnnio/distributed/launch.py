"""``gnnio train --nproc N``: start N local ranks with PyTorch's elastic launcher.

The workers are started by ``torch.distributed.launcher.api.elastic_launch`` -- the machinery
behind ``torchrun`` (c10d rendezvous on 127.0.0.1, ``max_restarts=0``) -- so a ``--nproc`` run and
a ``torchrun ... -m gnnio train`` run execute the same worker code with the same environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ...). gnnio writes no supervisor of its
own: when a worker raises or dies (even by SIGKILL) the elastic agent stops the others and raises
``ChildFailedError``, which :func:`launch` turns into one line naming the rank and the reason.

Each worker runs ``gnnio train`` with the same arguments (``--nproc`` is ignored inside a worker,
which sees ``WORLD_SIZE`` set) through :func:`gnnio.cli.main.rank_main`, passed in by the CLI (so
``dist`` never imports ``cli``). Worker exceptions are recorded by the ``record`` decorator of
``torch.distributed.elastic`` into the error file the agent reads.

Ctrl-C reaches the launcher and every rank (one process group). A rank starts with SIGINT blocked
(:func:`_ranks_start_without_sigint`, as CPython's resource tracker is started) until
:func:`rank_entry` has set its default action, so a Ctrl-C while a rank still imports torch ends
it without a KeyboardInterrupt traceback; the launcher prints gnnio's one line.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import uuid
from contextlib import contextmanager

from ..errors import GnnioError

__all__ = ["DistRunError", "failure_line", "is_peer_loss", "launch", "peer_loss_line"]


class DistRunError(GnnioError):
    """A rank of a distributed run failed; the message names it."""


#: the class-name prefix of gnnio's one-line errors in a rank's error record
_GNNIO_ERRORS = (r"^(?:UsageError|DatasetError|GnnioError|LoaderStall|PinError|"
                 r"SimulatedOutOfMemory|DistRunError): ")  # fmt: skip


def failure_line(err) -> str:
    """One line for a ``ChildFailedError``: the rank that failed first (a killed rank before a
    rank that only saw its peer disappear), how, and the other failed ranks."""
    failures = dict(getattr(err, "failures", {}) or {})
    if not failures:
        return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__

    def describe(rank: int, f) -> str:
        if f.exitcode is not None and f.exitcode < 0:
            try:
                sig = f.signal_name()
            except Exception:  # noqa: BLE001
                sig = f"signal {-f.exitcode}"
            return f"rank {rank} (pid {f.pid}) was killed by {sig}"
        msg = f.message
        if isinstance(msg, dict):  # the error file's {"message": ..., "extraInfo": ...}
            msg = msg.get("message", "")
        # gnnio's own errors read as they do in one process, without the class name
        msg = re.sub(_GNNIO_ERRORS, "", _last_error_line(str(msg)))
        return (
            f"rank {rank} (pid {f.pid}) failed: {msg}"
            if msg
            else (f"rank {rank} (pid {f.pid}) exited with code {f.exitcode}")
        )

    def peer_loss(f) -> bool:
        m = f.message.get("message", "") if isinstance(f.message, dict) else f.message
        return is_peer_loss(str(m))

    def cause(f) -> int:
        """0: killed by a signal from outside (SIGKILL, SIGSEGV, ...); 1: a real error; 2: a rank
        that aborted (SIGABRT: gloo aborts a rank whose peer vanished mid-collective; seen in CI
        reported before its SIGKILLed peer) or saw its peer go away."""
        killed = f.exitcode is not None and f.exitcode < 0
        if killed:
            return 2 if f.exitcode == -signal.SIGABRT else 0
        return 2 if peer_loss(f) else 1

    ranked = sorted(failures.items(), key=lambda kv: (cause(kv[1]), kv[1].timestamp, kv[0]))
    first_rank, first = ranked[0]
    line = describe(first_rank, first)
    others = [r for r, _ in ranked[1:]]
    if others:
        line += f"; stopped rank(s) {', '.join(map(str, sorted(others)))} too"
    return line


def is_peer_loss(msg: str) -> bool:
    """Whether a rank's error says that another rank went away (closed, reset or timed out)."""
    m = msg.lower()
    return any(k in m for k in ("connection closed", "connection reset", "broken pipe",
                                "peer", "timed out", "timeout", "remote worker",
                                "socket closed"))  # fmt: skip


def peer_loss_line(err: BaseException, rank: str, world_size: int) -> str:
    """One line for a rank (under ``torchrun``) whose collective failed because another rank is
    gone: gloo's message without its source location, callback wrapper and advice."""
    lines = [ln.strip() for ln in str(err).splitlines() if is_peer_loss(ln)]
    msg = lines[0][:300] if lines else (_last_error_line(str(err)) or type(err).__name__)
    msg = re.sub(r"^(Got the following error when running the callback: )?(\w+Error: )?", "", msg)
    msg = re.sub(r"\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*", "", msg).split(". This is typically")[0]
    return f"rank {rank} of {world_size}: another rank is gone or stopped answering ({msg})"


def _last_error_line(msg: str) -> str:
    lines = [ln.strip() for ln in str(msg).strip().splitlines() if ln.strip()]
    for ln in reversed(lines):  # the exception line of a traceback is last
        if not ln.startswith(("File ", "^", "~")):
            return ln[:300]
    return lines[-1][:300] if lines else ""


def rank_entry(entrypoint, argv):
    """What each spawned rank runs: ``entrypoint(argv)`` once SIGINT has its default action (a
    rank ends at once, no traceback; the agent stops the others) and is unblocked -- a Ctrl-C that
    came while the rank was starting ends it here."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    return entrypoint(argv)


@contextmanager
def _ranks_start_without_sigint():
    """The processes spawned inside start with SIGINT blocked: a spawned rank's Python would turn
    a Ctrl-C into a KeyboardInterrupt while it imports torch (before any gnnio code runs in it)
    and print a traceback per rank. As CPython starts its resource tracker: the mask is blocked
    around each fork+exec only (``multiprocessing.util.spawnv_passfds``, which the spawn start
    method calls), so this process takes Ctrl-C as before and the agent stops the ranks."""
    from multiprocessing import resource_tracker, util

    # started by the first spawn otherwise, it would unblock SIGINT here after starting itself
    resource_tracker.ensure_running()
    spawnv = util.spawnv_passfds

    def spawnv_sigint_blocked(path, args, passfds):
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            return spawnv(path, args, passfds)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    util.spawnv_passfds = spawnv_sigint_blocked
    try:
        yield
    finally:
        util.spawnv_passfds = spawnv


def launch(nproc: int, entrypoint, argv, timeout_s: float | None = None) -> dict:
    """Run ``entrypoint(argv)`` on ``nproc`` local ranks and wait for them; returns each rank's
    return value by rank.

    ``entrypoint``: a module-level function (pickled for ``spawn``), in gnnio
    :func:`gnnio.cli.main.rank_main`, which runs the command line with exceptions recorded.

    Raises:
        DistRunError: a rank failed (one line naming it).
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # the agent logs each failure's traceback and every signal it sends; gnnio prints one line
    for name in (
        "torch.distributed.elastic",
        "torch.distributed.elastic.agent.server.api",  # "Received 2 death signal"
        "torch.distributed.launcher",
        "torch.multiprocessing",
    ):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    # one thread per rank unless the user set it: N ranks on a few cores must not oversubscribe.
    # Set for the ranks (spawned with this process's environment) and put back afterwards: left
    # in os.environ, numba would refuse every later compile in this process once its threads run
    # with another count ("Cannot set NUMBA_NUM_THREADS ...": a GPU test run, 2026-11-26)
    cores = os.cpu_count() or 1
    per_rank = str(max(1, cores // nproc))
    # a rank ended by Ctrl-C (the signal's default action, gnnio.cli.main.rank_main) cannot
    # unlink its semaphores: multiprocessing's resource tracker (started below, with this
    # process's warning options) unlinks them and would warn about each "leaked" one
    quiet = "ignore::UserWarning:multiprocessing.resource_tracker"
    if quiet not in sys.warnoptions:
        sys.warnoptions.append(quiet)
    # the rendezvous takes whole seconds (it reads them with int()): round a fraction up, so
    # --dist-timeout 0.5 waits one second instead of a zero timeout torch refuses
    timeout = math.ceil(timeout_s) if timeout_s else 120
    # the agent's per-run directory (the ranks' error files): torch's default is a new
    # torchelastic_* directory in the temporary directory per run, never removed
    log_dir = tempfile.mkdtemp(prefix="gnnio-ranks-")
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=int(nproc),
        run_id=f"gnnio-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        # port 0: the agent's rendezvous store binds a port the kernel picks, and holds it (as
        # torchrun --standalone does; the ranks learn it from the agent). A port found free
        # beforehand and bound later could be taken in between by another process (a concurrent
        # run, any socket bound to port 0): the store, unable to bind it, then connected to that
        # process as a client and the launch failed
        rdzv_endpoint="127.0.0.1:0",
        rdzv_configs={"timeout": timeout, "join_timeout": timeout},
        max_restarts=0,
        monitor_interval=0.2,
        start_method="spawn",
        logs_specs=DefaultLogsSpecs(log_dir=log_dir),
    )
    added = [k for k in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS") if k not in os.environ]
    for k in added:
        os.environ[k] = per_rank
    try:
        with _ranks_start_without_sigint():
            return dict(elastic_launch(config, rank_entry)(entrypoint, argv))
    except ChildFailedError as e:
        raise DistRunError(failure_line(e)) from None
    except SignalException as e:  # the agent stopped the ranks; Ctrl-C is gnnio's one line
        if e.sigval == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise DistRunError(f"stopped by {signal.Signals(e.sigval).name}") from None
    finally:
        for k in added:
            os.environ.pop(k, None)
        shutil.rmtree(log_dir, ignore_errors=True)  # (the failure line has read its files)
