"""Every launched Triton kernel takes its per-batch sizes unspecialised.

Triton compiles a separate kernel for an integer argument divisible by 16 or equal to 1 unless the
argument is in ``do_not_specialize``. A size that changes every batch (the rows of a gather, the
ids of a cache batch, a hop's rows) would then compile a second and a third kernel mid-epoch, the
first time a batch's size is a multiple of 16 -- hundreds of milliseconds of host time inside a
timed window (gpu-check's feature-bound runs time 30 batches after 10 of warm-up: about half the
runs would meet their first such batch among the timed ones)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parent.parent
#: the arguments that vary from batch to batch, by name
PER_BATCH = {"n"}


def launched_kernels():
    """``(module, name)`` of every ``@triton.jit`` function launched as ``name[grid](...)``."""
    for path in sorted((ROOT / "gnnio").rglob("*.py")):
        src = path.read_text()
        if "@triton.jit" not in src:
            continue
        mod = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
        for name in sorted(set(re.findall(r"\b(_\w+)\[[^\]]+\]\(", src))):
            fn = getattr(mod, name, None)
            if isinstance(fn, triton.runtime.jit.JITFunction):
                yield mod.__name__, fn


def test_the_scan_finds_the_kernels():
    names = {(m, fn.__name__) for m, fn in launched_kernels()}
    for want in (("gnnio.features._triton_rows", "_rows"),
                 ("gnnio.features.caches._triton_cache", "_admit"),
                 ("gnnio.sampling._triton_hop", "_hop")):  # fmt: skip
        assert want in names, sorted(names)


@pytest.mark.parametrize(
    "mod,fn", list(launched_kernels()), ids=lambda x: getattr(x, "__name__", x)
)
def test_per_batch_sizes_are_not_specialised(mod, fn):
    loose = [
        p.name
        for p in fn.params
        if p.name in PER_BATCH and not p.is_constexpr and not p.do_not_specialize
    ]
    assert not loose, f"{mod}.{fn.__name__}: add {loose} to do_not_specialize"
