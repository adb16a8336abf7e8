"""The GPU row-gather kernel (:mod:`gnnio.features._triton_rows`) behind
:func:`gnnio.features._gather.copy_rows`, run on CPU tensors in Triton's interpreter
(``TRITON_INTERPRET=1``, set before Triton is imported: a subprocess): every word width, row
sizes that are not a power of two, int32 and int64 indices, scattered destination rows, outputs
larger than the batch, and the tiered store (simulated GPU tier, zero-copy cold rows) through it.
On a real GPU the ``gpu`` tests of the stores run the same kernel."""

from __future__ import annotations

import pytest
import torch

from gnnio.features._gather import copy_rows
from tests.helpers import run_in_triton_interpreter

SCRIPT = r"""
import numpy as np, torch
from gnnio.features import _triton_rows
from gnnio.features._gather import copy_rows
from gnnio.features.simdevice import SimulatedDevice
from gnnio.features.tiered import TieredFeatureStore

calls = []
real = _triton_rows.copy_rows_triton
_triton_rows.copy_rows_triton = lambda *a: calls.append(a[0].dtype) or real(*a)
g = torch.Generator().manual_seed(0)
for dtype, dim in ((torch.float32, 128), (torch.float32, 3), (torch.float16, 3), (torch.uint8, 5),
                   (torch.float64, 1), (torch.int32, 0)):
    src = (torch.rand(300, dim, generator=g) * 100).to(dtype)
    for idt in (torch.int64, torch.int32):
        ids = torch.randint(0, 300, (77,), generator=g).to(idt)
        out = torch.full((90, dim), 7, dtype=dtype)
        copy_rows(src, ids, out)
        assert torch.equal(out[:77], src[ids.long()]) and (out[77:] == 7).all(), (dtype, dim)
        pos = torch.randperm(90, generator=g)[:77].to(idt)
        out = torch.full((90, dim), 7, dtype=dtype)
        copy_rows(src, ids, out, pos)
        want = torch.full((90, dim), 7, dtype=dtype)
        want[pos.long()] = src[ids.long()]
        assert torch.equal(out, want), (dtype, dim, "scatter")
# a source whose rows start off a word boundary: narrower words, same rows
base = torch.arange(301 * 8, dtype=torch.uint8).reshape(-1)
src = base[3:3 + 300 * 8].view(300, 8)
ids = torch.randint(0, 300, (50,), generator=g)
out = torch.empty(50, 8, dtype=torch.uint8)
copy_rows(src, ids, out)
assert torch.equal(out, src[ids])
assert torch.float32 in calls and torch.uint8 in calls
# the tiered store, both cold paths' zero-copy view and the hot part, through the kernel
host = torch.randn(500, 24, generator=g)
for f in (0.0, 0.3, 1.0):
    with TieredFeatureStore.from_reordered(host, f, simulate=SimulatedDevice()) as st:
        ids = torch.randint(0, 500, (200,), generator=g)
        assert torch.equal(st.gather(ids), host[ids]), f
print("ok")
"""


def test_triton_row_copy_equals_index_select():
    pytest.importorskip("triton")
    run_in_triton_interpreter(SCRIPT)


def test_copy_rows_without_triton_is_index_select():
    """The torch path (CPU tensors here, or GPUs without Triton) writes the same rows."""
    src = torch.randn(40, 6)
    ids = torch.tensor([3, 3, 0, 39])
    out = torch.zeros(6, 6)
    copy_rows(src, ids, out)
    assert torch.equal(out[:4], src[ids]) and not out[4:].any()
    out = torch.zeros(6, 6)
    copy_rows(src, ids, out, torch.tensor([5, 0, 2, 1]))
    assert torch.equal(out[[5, 0, 2, 1]], src[ids]) and not out[[3, 4]].any()
    big = torch.zeros(6, 12)
    copy_rows(src, ids, big[:, ::2])  # a strided destination
    assert torch.equal(big[:4, ::2], src[ids]) and not big[:, 1::2].any() and not big[4:].any()
