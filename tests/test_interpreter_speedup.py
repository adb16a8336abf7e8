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


_ONCE = r"""
import functools
import numpy as np
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter as I
import tests.interpreter_speedup as S

new = I._patch_lang
assert getattr(new, "gnnio_once_per_launch", False), "not installed"


def code(v):  # a closure by its code, a partial by its function's and its arguments
    v = v.fget if isinstance(v, property) else v
    if isinstance(v, functools.partial):
        return (code(v.func), v.args, tuple(sorted(v.keywords.items())))
    return getattr(v, "__code__", v)


skipped = []


def would_have(fn):  # the interpreter's own patching at this call: it must change nothing
    scope = new.original(fn)
    changed = [(n, o) for obj, n, o in scope._changes if code(o) != code(getattr(obj, n))]
    scope.restore()
    assert not changed, (fn.__name__, changed[:5])
    skipped.append(fn.__name__)


new.on_skip = would_have


@triton.jit
def _twice(x):
    return x * 2


@triton.jit
def _k(X, Y, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(X + offs)
    for _ in range(3):
        x = _twice(x) + tl.sum(x, 0)
    tl.store(Y + offs, x - tl.max(x, 0))


x = torch.arange(8, dtype=torch.float32)
for launch in range(2):
    y = torch.empty_like(x)
    _k[(2,)](x, y, N=8)
    want = x.clone()
    for _ in range(3):
        want = want * 2 + want.sum()
    assert torch.equal(y, want - want.max()), (launch, y, want)
# per launch, 2 programs of 7 calls (_twice 3, tl.sum 3, tl.max 1): only the first tl.sum (its
# module sees tl.core too, which the launch did not patch) patches; and the launch's patching
# is undone after it as before
assert sorted(set(skipped)) == ["_twice", "max", "sum"] and len(skipped) == 2 * (7 + 6), skipped
assert tl.load is not None and "lambda" not in tl.load.__qualname__
print("ok")
"""


def test_a_device_call_skips_only_patching_that_changes_nothing():
    """Inside a launch, a device function's call (``_twice``; ``tl.sum``, whose module sees
    ``tl.core`` too) skips the interpreter's ``_patch_lang`` only where that call would change
    no attribute; the kernel's result is the reference's, launch after launch."""
    pytest.importorskip("triton")
    run_in_triton_interpreter(_ONCE, timeout=300)


_DTYPES = r"""
import triton.language as tl
from triton.runtime import interpreter as I
import tests.interpreter_speedup as S

new = I._get_np_dtype
assert getattr(new, "gnnio_memo", False), "not installed"
orig = new.original
scalars = [v for v in vars(tl).values() if isinstance(v, tl.dtype) and not v.is_block()]
assert len(scalars) >= 19, scalars
kinds = [*scalars, *(tl.pointer_type(t) for t in scalars if t.name != "void")]
kinds += [tl.block_type(t, [4, 2]) for t in list(kinds)]


def answer(f, t):
    try:
        return f(t)
    except KeyError as e:
        return ("KeyError", str(e))


for _ in range(2):  # asked, then answered from the memo
    for t in kinds:
        assert answer(new, t) == answer(orig, t), t
assert any(isinstance(answer(orig, t), tuple) for t in kinds)  # (types it has no answer for)
print("ok")
"""


def test_the_numpy_dtype_memo_answers_as_the_interpreter():
    """Every scalar type of ``triton.language``, a pointer to each and a block of each: the
    memo's numpy dtype is the interpreter's own (or the same KeyError), asked twice."""
    pytest.importorskip("triton")
    run_in_triton_interpreter(_DTYPES, timeout=300)
