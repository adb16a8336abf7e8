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


install()
