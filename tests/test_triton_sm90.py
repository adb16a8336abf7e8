"""The fake driver of ``scripts/triton-compile-check.sh`` (:mod:`tests.triton_sm90`) still makes
this machine's Triton compile gnnio's kernels for sm_90 without a GPU: the check that the GPU's
compiler accepts every kernel the interpreter tests launch cannot rot unnoticed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")


def _nvidia_ptxas() -> Path | None:
    spec = importlib.util.find_spec("triton.backends.nvidia")
    if spec is None or spec.origin is None:
        return None
    p = Path(spec.origin).parent / "bin" / "ptxas"
    return p if p.exists() else None


def _compiled_rows_module():
    """gnnio/features/_triton_rows.py loaded afresh, so its kernels are ``JITFunction``s even
    where a test imported it under ``TRITON_INTERPRET=1`` (the interpreter compiles nothing)."""
    from gnnio.features import _triton_rows

    if isinstance(_triton_rows._tiered, triton.runtime.jit.JITFunction):
        return _triton_rows
    spec = importlib.util.spec_from_file_location(
        "gnnio.features._rows_sm90", _triton_rows.__file__
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(_nvidia_ptxas() is None, reason="this Triton has no CUDA backend or ptxas")
@pytest.mark.parametrize("wide", [False, True], ids=["n<2^31", "n>2^31"])
def test_gnnio_row_kernels_compile_for_sm90_through_the_fake_driver(tmp_path, monkeypatch, wide):
    import torch
    from triton.runtime.driver import driver

    from tests.triton_sm90 import sm90_driver

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # (compiled here, not found cached)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    R = _compiled_rows_module()
    before = driver._active
    i64, i32 = torch.zeros(64, dtype=torch.int64), torch.zeros(64, dtype=torch.int32)
    n = (1 << 33) + 7 if wide else 7
    with sm90_driver():
        # the skipping tiered copy, 40-byte rows of 32-bit words, int64 slots: Triton 3.6 refused
        # it before df594f2 ('arith.andi' op requires the same encoding)
        tiered = R._tiered.warmup(i32, i32, i64, i64, i32, n, W=10, WP=16, BR=64, SKIP=True,
                                  grid=(1,))  # fmt: skip
        rows = R._rows.warmup(i64, i64, i64, i64, n, W=10, WP=16, BR=64, SCATTER=True, SKIP=True,
                              STREAM=False, I32=False, num_warps=4, grid=(1,))  # fmt: skip
    assert driver._active is before  # the real driver (or none yet) again
    for k in (tiered, rows):
        assert k.metadata.target.arch == 90 and k.metadata.target.backend == "cuda"
        assert b"sm_90" in k.asm["ptx"].encode() and len(k.asm["cubin"]) > 0
