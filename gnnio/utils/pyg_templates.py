"""Remove, when the process exits, the source files PyG generated for its layers in it.

PyG's ``MessagePassing`` renders a ``propagate`` (and ``edge_updater``) module per layer class from
a jinja template, writes it to a temporary ``.py`` file (``tempfile.NamedTemporaryFile(...,
delete=False)``, in ``torch_geometric.template.module_from_template``) and imports it; the file is
never deleted. Every process that builds a GraphSAGE, GCN, GIN or GAT layer -- each ``gnnio train``,
each rank of a distributed run -- so leaves one to three files in ``/tmp``; a sweep of a thousand
runs leaves thousands (5,000 were found on the development VM). :func:`remove_at_exit` registers an
exit handler that deletes those files once the process no longer needs them: the modules whose
``__file__`` is a file in the temporary directory named ``<module name>_*.py``, which is how PyG
names them (so a user's own files are never touched). Only the process that registered it deletes
(a forked child exiting normally leaves its parent's files alone), and only at exit, because
TorchScript and ``inspect`` read a module's source while the process runs.
"""

from __future__ import annotations

import atexit
import os
import sys
import tempfile
import threading

__all__ = ["generated_files", "remove_at_exit"]

_lock = threading.Lock()
_registered_pid: int | None = None


def generated_files() -> list[str]:
    """The temporary source files of the modules PyG generated from its templates in this process."""
    tmp = os.path.realpath(tempfile.gettempdir())
    out = []
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None)
        if not path:
            continue
        base = os.path.basename(path)
        if (
            base.startswith(name + "_")
            and base.endswith(".py")
            and os.path.dirname(os.path.realpath(path)) == tmp
        ):
            out.append(path)
    return out


def _remove(pid: int) -> None:
    if os.getpid() != pid:
        return
    for path in generated_files():
        try:
            os.unlink(path)
        except OSError:
            pass


def remove_at_exit() -> None:
    """Delete PyG's generated template files of this process when it exits (idempotent)."""
    global _registered_pid
    with _lock:
        if _registered_pid == os.getpid():
            return
        _registered_pid = os.getpid()
        atexit.register(_remove, _registered_pid)
