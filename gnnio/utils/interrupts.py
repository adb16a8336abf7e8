"""Ctrl-C while numba compiles or loads a kernel: deferred to the end of that step.

A KeyboardInterrupt raised in the middle of numba's compiler (or of loading a kernel from its
disk cache, which builds LLVM objects too) leaves numba's and LLVM's state half built: the next
call of that kernel segfaulted (``gnnio partition --method bfs-block`` on a 1M-node graph, SIGINT
about 8 s in: 2 of 7 tries in issue 27's probe), or an LLVM object's ``__del__`` swallowed the
interrupt and the command ran on to the end. Numba holds its global compiler lock for exactly
these steps and reports taking and releasing it as ``numba:compiler_lock`` events; while the
main thread holds it, SIGINT is recorded instead of raised, and raised as KeyboardInterrupt as
soon as the outermost hold ends (the kernel is then complete and usable). The CLI installs it
(:func:`defer_sigint_while_compiling`); importing gnnio changes no signal handling.
"""

from __future__ import annotations

import signal
import threading

__all__ = ["defer_sigint_while_compiling"]

_installed = None


def _listener_class():
    from numba.core import event

    class DeferSigint(event.Listener):
        """Records SIGINT while the main thread holds numba's compiler lock (module docstring)."""

        def __init__(self):
            self.depth, self.pending, self.prev = 0, False, None

        def _record(self, signum, frame) -> None:
            self.pending = True

        def on_start(self, event) -> None:
            if threading.current_thread() is not threading.main_thread():
                return
            if self.depth == 0:
                prev = signal.getsignal(signal.SIGINT)
                if callable(prev):  # a Python handler (KeyboardInterrupt): defer it
                    self.prev = prev
                    signal.signal(signal.SIGINT, self._record)
            self.depth += 1

        def on_end(self, event) -> None:
            if threading.current_thread() is not threading.main_thread() or self.depth == 0:
                return
            self.depth -= 1
            if self.depth == 0 and self.prev is not None:
                prev, self.prev = self.prev, None
                signal.signal(signal.SIGINT, prev)
                if self.pending:
                    self.pending = False
                    prev(signal.SIGINT, None)  # Python's: raises KeyboardInterrupt here

    return DeferSigint


def defer_sigint_while_compiling() -> None:
    """Install the deferral (module docstring) once per process; a no-op without numba or
    outside the main thread."""
    global _installed
    if _installed is not None or threading.current_thread() is not threading.main_thread():
        return
    try:
        from numba.core import event
    except ImportError:  # pragma: no cover - numba is a dependency
        return
    _installed = _listener_class()()
    event.register("numba:compiler_lock", _installed)
