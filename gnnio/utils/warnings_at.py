"""gnnio's warnings, attributed to the user's line (:func:`warn`).

A fixed ``stacklevel`` points at the right line for one call path only: the budget clamp of
``TieredFeatureStore(...)`` pointed at the user's call, the same clamp through
``TieredFeatureStore.from_scores(...)`` at a line inside gnnio. :func:`warn` walks the stack to
the first frame outside gnnio (and outside torch, whose ``nn.Module.__call__`` sits between a
user's call and a gnnio model's ``forward``, and outside the standard library, whose
``contextlib`` may sit there too), as Python 3.12's ``skip_file_prefixes`` does. A warning raised
where the stack holds no user frame (one of gnnio's background threads, which start in
``threading``; ``python -m gnnio``) points at the gnnio line that raised it.

The warning instance carries ``gnnio_warning = True``, so that the CLI still prints it as one
``gnnio: warning:`` line (``gnnio.cli.main``) wherever it points.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import warnings
from types import FrameType

__all__ = ["warn"]

_GNNIO = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # gnnio/
_PATHS = sysconfig.get_paths()
_STDLIB = os.path.abspath(_PATHS["stdlib"]) + os.sep
_SITE = tuple({os.path.abspath(_PATHS[k]) + os.sep for k in ("purelib", "platlib")})


def _torch_dir() -> tuple[str, ...]:
    """torch's directory once torch is imported (no frame is torch's before: ``gnnio prepare``
    and ``reorder`` warn without importing it)."""
    torch = sys.modules.get("torch")
    file = getattr(torch, "__file__", None)
    return (os.path.dirname(os.path.abspath(file)) + os.sep,) if file else ()


def _skipped(path: str) -> bool:
    """A frame of gnnio, of torch, or of Python's standard library (not its site-packages)."""
    if path.startswith("<"):  # ("<frozen runpy>" and the like; not made absolute first)
        return True
    path = os.path.abspath(path)
    if path.startswith(_GNNIO) or path.startswith(_torch_dir()):
        return True
    return path.startswith(_STDLIB) and not path.startswith(_SITE)


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` at the first frame outside gnnio, torch and the
    standard library (see module docstring); at the calling gnnio line where there is none (a
    background thread, ``python -m gnnio``)."""
    w = category(message)
    w.gnnio_warning = True  # type: ignore[attr-defined]  # the CLI's mark, read with getattr
    level = 2  # (stacklevel 2: warn's caller)
    f: FrameType | None = sys._getframe(1)
    while f is not None and _skipped(f.f_code.co_filename):
        f, level = f.f_back, level + 1
    warnings.warn(w, stacklevel=2 if f is None else level)
