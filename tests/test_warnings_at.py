"""gnnio's warnings point at the user's line (gnnio.utils.warnings_at.warn), whichever gnnio
path raised them, and the CLI still prints them as one ``gnnio: warning:`` line."""

from __future__ import annotations

import os
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import torch

import gnnio
from gnnio.features.tiers.tiered import TieredFeatureStore, TieringWarning
from gnnio.utils.warnings_at import warn

_GNNIO = Path(gnnio.__file__).parent
_TORCH = Path(torch.__file__).parent
_STDLIB = Path(os.__file__).parent


def _caught(fn) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return caught


def _in_file(path: Path, src: str, name: str, **env):
    """Function ``name`` of ``src`` compiled as if it lived in ``path`` (its frames say so)."""
    ns = dict(env)
    exec(compile(src, str(path), "exec"), ns)
    return ns[name]


def test_the_budget_clamp_through_from_scores_points_at_the_users_call():
    """The clamp warning raised two gnnio frames down (from_scores, then the constructor) names
    this file and line, as the same warning from the constructor itself does."""
    feats = np.arange(60, dtype=np.float32).reshape(20, 3)
    score = np.arange(20, dtype=np.float64)
    for build in (
        lambda: TieredFeatureStore.from_scores(feats, score, 0.5, gpu_budget_bytes=100),
        lambda: TieredFeatureStore(feats, hot=10, gpu_budget_bytes=100),
    ):
        tw = [w for w in _caught(build) if issubclass(w.category, TieringWarning)]
        assert len(tw) == 1 and os.path.samefile(tw[0].filename, __file__), tw
        assert "hot rows clamped" in str(tw[0].message)


def test_frames_of_gnnio_torch_and_the_stdlib_are_skipped():
    """user -> torch -> stdlib -> gnnio -> warn: the warning names the user's frame."""
    inner = _in_file(_GNNIO / "fake_inner.py", "def inner():\n    warn('w')\n", "inner", warn=warn)
    mid = _in_file(_STDLIB / "fake_mid.py", "def mid():\n    inner()\n", "mid", inner=inner)
    outer = _in_file(_TORCH / "fake_outer.py", "def outer():\n    mid()\n", "outer", mid=mid)
    (w,) = _caught(outer)
    assert os.path.samefile(w.filename, __file__) and w.category is UserWarning
    assert w.message.gnnio_warning is True


def test_a_user_frame_between_gnnio_frames_is_the_one_named():
    """user -> gnnio -> user callback -> gnnio -> warn: the callback (the nearest user frame)."""
    inner = _in_file(_GNNIO / "fake_inner.py", "def inner():\n    warn('w')\n", "inner", warn=warn)
    callback_file = Path(__file__).with_name("fake_callback.py")
    cb = _in_file(callback_file, "def cb():\n    inner()\n", "cb", inner=inner)
    outer = _in_file(_GNNIO / "fake_outer.py", "def outer(f):\n    f()\n", "outer")
    (w,) = _caught(lambda: outer(cb))
    assert w.filename == str(callback_file) and w.lineno == 2


def test_frozen_frames_are_skipped():
    """user -> ``<frozen runpy>`` (``python -m``'s frames) -> gnnio -> warn: the user's frame.
    The ``<...>`` test ran on the absolute path (``/cwd/<frozen runpy>``) and never matched."""
    inner = _in_file(_GNNIO / "fake_inner.py", "def inner():\n    warn('w')\n", "inner", warn=warn)
    mid = _in_file(Path("<frozen runpy>"), "def mid():\n    inner()\n", "mid", inner=inner)
    (w,) = _caught(mid)
    assert w.filename != "<frozen runpy>" and os.path.samefile(w.filename, __file__)


def test_site_packages_inside_the_stdlib_are_user_frames(monkeypatch):
    """Where site-packages lies inside the standard library's directory (a system Python:
    ``/usr/lib/python3.11/site-packages``), a library there is the user's, not Python's."""
    import gnnio.utils.warnings_at as wa

    stdlib = Path(__file__).parent / "fake_stdlib"
    monkeypatch.setattr(wa, "_STDLIB", str(stdlib) + os.sep)
    monkeypatch.setattr(wa, "_SITE", (str(stdlib / "site-packages") + os.sep,))
    inner = _in_file(_GNNIO / "fake_inner.py", "def inner():\n    warn('w')\n", "inner", warn=warn)
    lib = stdlib / "site-packages" / "userlib.py"
    mid = _in_file(lib, "def mid():\n    inner()\n", "mid", inner=inner)
    std = _in_file(stdlib / "contextlib.py", "def std():\n    mid()\n", "std", mid=mid)
    (w,) = _caught(std)
    assert w.filename == str(lib) and w.lineno == 2


def test_a_gnnio_path_spelled_with_dotdot_is_gnnio(tmp_path):
    """A frame's file named through ``..`` (a script's ``sys.path.insert(0, here + "/..")``) is
    still gnnio's when it lies there."""
    odd = _GNNIO.parent / "tests" / ".." / "gnnio" / "fake_inner.py"
    inner = _in_file(odd, "def inner():\n    warn('w')\n", "inner", warn=warn)
    (w,) = _caught(inner)
    assert os.path.samefile(w.filename, __file__), w.filename


def test_a_warning_in_a_background_thread_names_the_gnnio_line():
    """With no user frame above (a thread starts in ``threading``), the gnnio line that warned."""
    inner = _in_file(_GNNIO / "fake_inner.py", "def inner():\n    warn('w')\n", "inner", warn=warn)

    def run() -> None:
        t = threading.Thread(target=inner)
        t.start()
        t.join()

    (w,) = _caught(run)
    assert w.filename == str(_GNNIO / "fake_inner.py") and w.lineno == 2


def test_the_cli_prints_a_marked_warning_as_one_line_wherever_it_points():
    """A ``warn`` warning naming a user's file (the console script's) is one ``gnnio:`` line;
    another library's warning keeps Python's format."""
    from gnnio.cli.main import _one_line_warnings

    fmt = _one_line_warnings(warnings.formatwarning)
    mine = RuntimeWarning("--cuda-graph: capture\n  failed")
    mine.gnnio_warning = True
    assert (
        fmt(mine, RuntimeWarning, sys.argv[0], 8)
        == "gnnio: warning: --cuda-graph: capture failed\n"
    )
    other = fmt(UserWarning("theirs"), UserWarning, "/elsewhere/lib.py", 3)
    assert other.startswith("/elsewhere/lib.py:3: UserWarning: theirs")
