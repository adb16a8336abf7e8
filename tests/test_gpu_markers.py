"""The suite's CUDA guards make sense on both kinds of machine (issue 15, fault 3).

Every test's ``skipif`` decorators are evaluated from the source (``ast``) in two worlds, one
without CUDA and one with eight GPUs: no test may be skipped in both (contradictory guards hide it
everywhere), every ``gpu``-marked test must run where CUDA is present and be skipped where it is
not, and a test of the no-CUDA error path must be skipped where CUDA is present (it would fail
there). Module-level names (``CUDA = torch.cuda.is_available()``, ``needs_cuda =
pytest.mark.skipif(...)``) are evaluated in the same world.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

TESTS = Path(__file__).resolve().parent
NO_CUDA_PATH_WORDS = ("without_cuda", "no_cuda", "without_gpu")


class _Skip:
    def __init__(self, cond) -> None:
        self.cond = cond


class _Other:
    def __call__(self, *a, **k):
        return self

    def __getattr__(self, name):
        return self


_GPU = object()


class _Mark:
    gpu = _GPU

    def skipif(self, cond, *a, **k):
        return _Skip(cond)

    def __getattr__(self, name):
        return _Other()


def _world(cuda: bool) -> dict:
    cuda_ns = SimpleNamespace(is_available=lambda: cuda, device_count=lambda: 8 if cuda else 0)
    return {
        "torch": SimpleNamespace(cuda=cuda_ns),
        "pytest": SimpleNamespace(mark=_Mark(), param=lambda *a, **k: None),
        "True": True,
        "False": False,
    }


def guards(source: str, cuda: bool) -> dict[str, tuple[bool, bool]]:
    """``test name -> (skipped, gpu-marked)`` for the tests of one module in one world."""
    tree = ast.parse(source)
    env = _world(cuda)
    for node in tree.body:  # module-level names the decorators may use
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                try:
                    env[target.id] = eval(compile(ast.Expression(node.value), "<t>", "eval"), env)
                except Exception:  # noqa: BLE001 - anything else is not a guard
                    pass
    out: dict[str, tuple[bool, bool]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if not node.name.startswith("test"):
            continue
        skipped = gpu = False
        for dec in node.decorator_list:
            try:
                val = eval(compile(ast.Expression(dec), "<t>", "eval"), env)
            except Exception:  # noqa: BLE001 - a decorator that is no guard
                continue
            if val is _GPU:
                gpu = True
            elif isinstance(val, _Skip) and not isinstance(val.cond, str):
                skipped = skipped or bool(val.cond)
        out[node.name] = (skipped, gpu)
    return out


def check_guards(source: str) -> list[str]:
    """One line per test whose CUDA guards are wrong (empty when all are right)."""
    without, with_cuda = guards(source, cuda=False), guards(source, cuda=True)
    problems = []
    for name, (skip_a, gpu) in without.items():
        skip_b = with_cuda[name][0]
        if skip_a and skip_b:
            problems.append(f"{name}: skipped with and without CUDA (contradictory skipif)")
        if gpu and not skip_a:
            problems.append(f"{name}: gpu-marked but not skipped without CUDA")
        if gpu and skip_b:
            problems.append(f"{name}: gpu-marked but skipped where CUDA is present")
        if any(w in name for w in NO_CUDA_PATH_WORDS) and not skip_b:
            problems.append(f"{name}: tests the no-CUDA path but runs where CUDA is present")
    return problems


def test_the_checker_finds_contradictions_and_unguarded_tests():
    bad = """
import pytest, torch
CUDA = torch.cuda.is_available()
needs = pytest.mark.skipif(not CUDA, reason="x")

@pytest.mark.skipif(torch.cuda.is_available(), reason="no-CUDA path")
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a(): pass

def test_cli_without_cuda(): pass

@pytest.mark.gpu
def test_b(): pass

@needs
@pytest.mark.gpu
@pytest.mark.parametrize("x", [1, 2])
def test_good(x): pass

@pytest.mark.skipif(CUDA, reason="no-CUDA path")
def test_good_without_cuda(): pass
"""
    problems = check_guards(bad)
    assert [p.split(":")[0] for p in problems] == [
        "test_a",
        "test_a",
        "test_cli_without_cuda",
        "test_b",
    ]


@pytest.mark.parametrize("path", sorted(TESTS.glob("test_*.py")), ids=lambda p: p.name)
def test_cuda_guards_of_the_suite(path):
    assert check_guards(path.read_text()) == []
