"""Triton's interpreter, faster at one thing and otherwise the same: imported first by every
script that :func:`tests.helpers.run_in_triton_interpreter` runs.

Every call of a ``@triton.jit`` device function (``_lemire``, ``_floyd``, ... called in a
kernel's loops) makes the interpreter patch ``triton.language`` again: its ``_patch_builtin``
lists each module's members with ``inspect.getmembers`` (``dir``, a sort, a ``getattr`` per
name) to find the builtins. That listing was a third of the run time of the slowest interpreter
test (``test_locality_graphed.py``'s dry run: 57 s, 38 s with this). Here each module's builtin
names are listed once, at its first patch -- when nothing is patched yet -- and every later
patch looks at those names only, with the interpreter's own test (``is_builtin``) and its own
patching (``_patch_attr``): the same attributes patched as before. Names a module did not have
as builtins at first are never builtins later (patching replaces builtins, restoring puts the
same ones back). Where the interpreter does not have these functions (another Triton), nothing
changes.
"""

from __future__ import annotations

import inspect


def install() -> bool:
    """Replace the interpreter's ``_patch_builtin`` (once); whether it was (or already is)."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    orig = getattr(interpreter, "_patch_builtin", None)
    patch_attr = getattr(interpreter, "_patch_attr", None)
    is_builtin = getattr(getattr(tl, "core", None), "is_builtin", None)
    if orig is None or patch_attr is None or is_builtin is None:
        return False
    if getattr(orig, "gnnio_listed_once", False):
        return True
    names: dict[int, list[str]] = {}

    def patch_builtin(pkg, builder, scope):
        listed = names.get(id(pkg))
        if listed is None:
            listed = names[id(pkg)] = [n for n, m in inspect.getmembers(pkg) if is_builtin(m)]
        for name in listed:
            member = getattr(pkg, name, None)
            if is_builtin(member):
                patch_attr(pkg, name, member, builder, scope)

    patch_builtin.gnnio_listed_once = True
    patch_builtin.original = orig  # (the test compares the two)
    interpreter._patch_builtin = patch_builtin
    return True


def install_once_per_launch() -> bool:
    """Replace the interpreter's ``_patch_lang`` (once): a device function's call inside a
    launch skips it where that launch, on this thread, has already patched the modules the
    function sees and no other launch began or ended since; whether it was (or already is)."""
    import itertools
    import sys
    import threading

    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    orig = getattr(interpreter, "_patch_lang", None)
    launch = vars(getattr(interpreter, "GridExecutor", object)).get("__call__")
    if orig is None or getattr(launch, "__code__", None) is None:
        return False
    if getattr(orig, "gnnio_once_per_launch", False):
        return True
    launch_code, scope_type = launch.__code__, interpreter._LangPatchScope
    tokens, last = itertools.count(1), [0]  # a token per launch begun or ended, any thread
    mine = threading.local()  # .launch: [its token, the modules patched since it began]

    def langs_of(fn) -> set[int]:  # (the interpreter's choice: tl and tl.core among the globals)
        return {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}

    def patch_lang(fn):
        now = getattr(mine, "launch", None)
        if sys._getframe(1).f_code is not launch_code:  # a device function's call
            if now is None or now[0] != last[0]:
                return orig(fn)
            langs = langs_of(fn)
            if langs <= now[1]:
                if patch_lang.on_skip is not None:  # (the test: what the call would have done)
                    patch_lang.on_skip(fn)
                return scope_type()  # all in place already: nothing to patch, nothing to undo
            scope = orig(fn)
            now[1] |= langs
            return scope
        scope = orig(fn)
        last[0] = next(tokens)
        mine.launch, restore = [last[0], langs_of(fn)], scope.restore

        def restore_then_forget():
            try:
                restore()
            finally:
                last[0], mine.launch = next(tokens), now

        scope.restore = restore_then_forget
        return scope

    patch_lang.on_skip = None
    patch_lang.gnnio_once_per_launch = True
    patch_lang.original = orig  # (the test compares the two)
    interpreter._patch_lang = patch_lang
    return True


def install_np_dtype_memo() -> bool:
    """Replace the interpreter's ``_get_np_dtype`` (once) by a memo of its own answers, keyed by
    the element type (a block's answer is its element's); whether it was (or already is). The
    interpreter builds its table of 19 types at every call, but for a pointer (unhashable: asked
    of the interpreter each time, answered before the table)."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    orig = getattr(interpreter, "_get_np_dtype", None)
    if orig is None or not hasattr(tl, "block_type") or not hasattr(tl, "pointer_type"):
        return False
    if getattr(orig, "gnnio_memo", False):
        return True
    memo: dict = {}
    block, pointer = tl.block_type, tl.pointer_type

    def get_np_dtype(tt_dtype):
        el = tt_dtype.element_ty if isinstance(tt_dtype, block) else tt_dtype
        if isinstance(el, pointer):
            return orig(el)
        got = memo.get(el)
        if got is None:
            got = memo[el] = orig(el)
        return got

    get_np_dtype.gnnio_memo = True
    get_np_dtype.original = orig  # (the test compares the two)
    interpreter._get_np_dtype = get_np_dtype
    return True


install()
install_once_per_launch()
install_np_dtype_memo()

if __import__("os").environ.get("GNNIO_TRITON_RECORD"):  # scripts/triton-compile-check.sh
    from tests import triton_record

    triton_record.install()
