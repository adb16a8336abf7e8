"""The ``gpu``-marked tests run only where a GPU is (gpu-check's first step, a few times a
month): a gnnio name they use that a refactoring renamed fails there, not in CI. This checks,
without running them, that every gnnio module and attribute they import or reach through an
imported gnnio module (``gpu_ipc._data``, ``from gnnio.x import y``) exists."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _is_gpu_marked(fn: ast.FunctionDef) -> bool:
    return any("mark.gpu" in ast.unparse(d) for d in fn.decorator_list)


def _gnnio_imports(nodes) -> dict[str, str]:
    """``local name -> module path`` for ``import gnnio.x as n`` and ``from gnnio.x import m``
    where ``m`` is a module; plus ``local name -> "module:attr"`` for imported attributes."""
    out: dict[str, str] = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "gnnio":
                    out[a.asname or a.name.split(".")[0]] = a.name if a.asname else "gnnio"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "gnnio":
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}:{a.name}"
    return out


def _resolve(ref: str):
    if ":" not in ref:
        return importlib.import_module(ref)
    mod, attr = ref.split(":")
    try:
        return importlib.import_module(f"{mod}.{attr}")
    except ImportError:
        m = importlib.import_module(mod)
        if not hasattr(m, attr):
            raise AttributeError(f"{mod} has no {attr}") from None
        return getattr(m, attr)


def problems(source: str, name: str) -> list[str]:
    """What the gpu tests of ``source`` use from gnnio that does not exist."""
    tree = ast.parse(source)
    top = _gnnio_imports(tree.body)
    bad = []
    for fn in ast.walk(tree):
        if not (isinstance(fn, ast.FunctionDef) and _is_gpu_marked(fn)):
            continue
        names = {**top, **_gnnio_imports(ast.walk(fn))}
        objs = {}
        for local, ref in names.items():
            try:
                objs[local] = _resolve(ref)
            except (ImportError, AttributeError) as e:
                bad.append(f"{name}::{fn.name}: {ref}: {e}")
        for node in ast.walk(fn):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                obj = objs.get(node.value.id)
                if obj is not None and type(obj).__name__ == "module":
                    if not hasattr(obj, node.attr):
                        bad.append(f"{name}::{fn.name}: {node.value.id}.{node.attr} is gone")
    return bad


def test_the_checker_finds_a_renamed_helper():
    src = (
        "import pytest\n"
        "from gnnio.bench import gpu_ipc\n"
        "@pytest.mark.gpu\n"
        "def test_x():\n"
        "    from gnnio.sampling import NoSuchSampler\n"
        "    gpu_ipc._no_such_helper(1)\n"
        "    gpu_ipc.small_partitioned\n"
    )
    got = problems(src, "t.py")
    assert len(got) == 2 and "NoSuchSampler" in got[0] and "_no_such_helper" in got[1], got


def test_every_gpu_test_uses_names_that_exist():
    bad = []
    for path in sorted(TESTS.glob("test_*.py")):
        bad += problems(path.read_text(), path.name)
    assert not bad, "\n".join(bad)
