"""tests/interpreter_speedup.py patches exactly what Triton's interpreter patches, faster."""

from __future__ import annotations

import pytest

from tests.helpers import run_in_triton_interpreter

_SAME = r"""
from triton.runtime import interpreter as I
import triton.language as tl
import tests.interpreter_speedup as S

new = I._patch_builtin
assert getattr(new, "gnnio_listed_once", False), "not installed"
orig = new.original
PKGS = [tl, tl.tensor, tl.math, tl.core, tl.core.tensor_descriptor_base]


def patched(fn):
    I._patch_builtin = fn
    scope = I._LangPatchScope()
    for pkg in PKGS:
        fn(pkg, I.interpreter_builder, scope)
    I._patch_builtin = new
    return scope, sorted((id(o), n) for o, n, _ in scope._changes)


def compare(state):
    s_new, a = patched(new)
    s_new.restore()
    s_orig, b = patched(orig)
    s_orig.restore()
    assert a == b, (state, len(a), len(b))
    return a


fresh = compare("unpatched")
assert fresh, "nothing patched"
outer = I._LangPatchScope()
for pkg in PKGS:  # what a launch leaves in effect while its device functions run
    orig(pkg, I.interpreter_builder, outer)
inside = compare("inside a launch's patches")
outer.restore()
assert compare("after the launch") == fresh
print("ok")
"""


def test_the_faster_patching_patches_what_the_interpreter_patches():
    """The same (object, name) pairs patched as the interpreter's own ``_patch_builtin``, with
    nothing patched yet (a launch) and inside a launch's patches (a device function's call)."""
    pytest.importorskip("triton")
    run_in_triton_interpreter(_SAME, timeout=300)
