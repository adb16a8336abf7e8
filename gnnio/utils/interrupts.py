"""Ctrl-C while numba compiles or loads a kernel: deferred to the end of that step.

A KeyboardInterrupt raised in the middle of numba's compiler (or of loading a kernel from its
disk cache, which builds LLVM objects too) leaves numba's and LLVM's state half built: the next
call of that kernel segfaulted (``gnnio partition --method bfs-block`` on a 1M-node graph, SIGINT
about 8 s in: 2 of 7 tries in issue 27's probe), or an LLVM object's ``__del__`` swallowed the
interrupt and the command ran on to the end. Numba holds its global compiler lock for exactly
these steps and reports taking and releasing it as ``numba:compiler_lock`` events. The CLI's
SIGINT handler (:func:`defer_sigint_while_compiling`) raises KeyboardInterrupt as Python's does,
except while the main thread holds that lock: then it records the signal, and KeyboardInterrupt
is raised as soon as the outermost hold ends (the kernel is then complete and usable). Importing
gnnio changes no signal handling.
"""

from __future__ import annotations

import signal
import threading

__all__ = ["defer_sigint_while_compiling"]

_installed = None


def _listener_class():
    from numba.core import event

    class DeferSigint(event.Listener):
        """Counts the main thread's holds of numba's compiler lock; SIGINT during one is
        recorded and raised when the outermost hold ends (module docstring)."""

        def __init__(self):
            self.depth, self.pending = 0, False

        def handle_sigint(self, signum, frame) -> None:
            """The process's SIGINT handler (installed once): KeyboardInterrupt, unless numba
            is compiling in the main thread, then recorded for :meth:`on_end`."""
            if self.depth > 0:
                self.pending = True
                return
            raise KeyboardInterrupt

        def on_start(self, event) -> None:
            if threading.current_thread() is threading.main_thread():
                self.depth += 1  # a SIGINT before this line raises here, before the lock

        def on_end(self, event) -> None:
            if threading.current_thread() is not threading.main_thread() or self.depth == 0:
                return
            self.depth -= 1
            if self.depth == 0 and self.pending:
                self.pending = False
                raise KeyboardInterrupt  # the kernel is complete and the lock released

    return DeferSigint


def defer_sigint_while_compiling() -> None:
    """Install the deferral (module docstring) once per process: a no-op outside the main
    thread or when SIGINT is not Python's default handler (ignored, or someone else's)."""
    global _installed
    if _installed is not None or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return
    try:
        from numba.core import event
    except ImportError:  # pragma: no cover - numba is a dependency
        return
    _installed = _listener_class()()
    event.register("numba:compiler_lock", _installed)
    signal.signal(signal.SIGINT, _installed.handle_sigint)
