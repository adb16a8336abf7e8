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
from tests.helpers import KERNEL_SPY, TIERED_SPY, run_in_triton_interpreter

SCRIPT = r"""
import warnings
import numpy as np, torch
from gnnio.features import _triton_rows
from gnnio.features._gather import copy_rows
from gnnio.features.tiers.simdevice import SimulatedDevice
from gnnio.features.tiers.tiered import TieredFeatureStore
from gnnio.utils import triton_kernels

warnings.simplefilter("error", RuntimeWarning)  # a kernel failure (and torch fallback) fails here
calls = []  # recorded only once the kernel has run and said it applied
real = _triton_rows.copy_rows_triton
def spy(*a):
    done = real(*a)
    calls.append(a[0].dtype) if done else None
    return done
_triton_rows.copy_rows_triton = spy
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
assert len(calls) == 25 and calls.count(torch.uint8) == 5, calls  # every copy above
# the tiered store, both cold paths' zero-copy view and the hot part, through the kernel
host = torch.randn(500, 24, generator=g)
for f in (0.0, 0.3, 1.0):
    with TieredFeatureStore.from_reordered(host, f, simulate=SimulatedDevice()) as st:
        ids = torch.randint(0, 500, (200,), generator=g)
        assert torch.equal(st.gather(ids), host[ids]), f
assert calls.count(torch.float32) > 8 and not triton_kernels._FAILED, triton_kernels._FAILED
print("ok")
"""

# The unaligned-rows branch: rows read through the widest word both base addresses and the row
# size allow. Every copy must go through the kernel (the launch's word type and words per row are
# recorded) and equal index_select; a wrong word choice that makes the kernel raise or fall back
# fails this, as does a kernel that writes the wrong bytes.
UNALIGNED = (
    KERNEL_SPY
    + r"""
import warnings
import torch
from gnnio.features._gather import copy_rows
from gnnio.utils import triton_kernels

warnings.simplefilter("error", RuntimeWarning)
launches = spy("_rows", lambda a, kw: (a[0].dtype, kw["W"]))
g = torch.Generator().manual_seed(1)
base = torch.randint(0, 256, (64 + 300 * 24,), generator=g, dtype=torch.uint8)
for src_off, dst_off, row, want in (
    (0, 0, 24, (torch.int64, 3)), (3, 0, 24, (torch.uint8, 24)), (2, 0, 24, (torch.int16, 12)),
    (4, 0, 24, (torch.int32, 6)), (0, 4, 24, (torch.int32, 6)), (0, 1, 24, (torch.uint8, 24)),
    (0, 0, 6, (torch.int16, 3)), (0, 0, 12, (torch.int32, 3)),
):
    src = base[src_off : src_off + 300 * row].view(300, row)
    buf = torch.zeros(64 + 40 * row, dtype=torch.uint8)
    dst = buf[dst_off : dst_off + 40 * row].view(40, row)
    for idt in (torch.int32, torch.int64):
        ids = torch.randint(0, 300, (40,), generator=g).to(idt)
        dst.zero_()
        copy_rows(src, ids, dst)
        assert torch.equal(dst, src[ids.long()]), (src_off, dst_off, row)
        assert launches[-1] == want, (src_off, dst_off, row, launches[-1], want)
        pos = torch.randperm(40, generator=g)[:30].to(idt)
        dst.zero_()
        copy_rows(src, ids[:30], dst, pos)
        expect = torch.zeros_like(dst)
        expect[pos.long()] = src[ids[:30].long()]
        assert torch.equal(dst, expect) and launches[-1] == want, (src_off, dst_off, row)
assert len(launches) == 32 and not triton_kernels._FAILED, (len(launches), triton_kernels._FAILED)
print("ok")
"""
)

# A kernel that fails: one RuntimeWarning naming it, the torch ops give the same rows (int32 and
# int64 destination indices), and the kernel is not tried again.
FAILING = r"""
import warnings
import torch
from gnnio.features import _triton_rows
from gnnio.features._gather import copy_rows
from gnnio.utils import triton_kernels

tries = []
class Broken:
    def __getitem__(self, grid):
        def run(*a, **kw):
            tries.append(grid)
            raise RuntimeError("no kernel today")
        return run
_triton_rows._rows = Broken()
g = torch.Generator().manual_seed(2)
src = torch.randn(100, 7, generator=g)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for idt in (torch.int32, torch.int64, torch.int32):
        ids = torch.randint(0, 100, (30,), generator=g).to(idt)
        out = torch.zeros(30, 7)
        copy_rows(src, ids, out)
        assert torch.equal(out, src[ids.long()])
        pos = torch.randperm(40, generator=g)[:30].to(idt)
        out = torch.zeros(40, 7)
        copy_rows(src, ids, out, pos)
        want = torch.zeros(40, 7)
        want[pos.long()] = src[ids.long()]
        assert torch.equal(out, want), idt
mine = [w for w in caught if issubclass(w.category, RuntimeWarning)]
assert len(mine) == 1 and "'copy_rows' failed" in str(mine[0].message), [str(w.message) for w in mine]
assert "index_select" in str(mine[0].message) and len(tries) == 1, tries
assert "copy_rows" in triton_kernels._FAILED
print("ok")
"""


def test_triton_row_copy_equals_index_select():
    pytest.importorskip("triton")
    run_in_triton_interpreter(SCRIPT)


def test_triton_row_copy_on_unaligned_rows_uses_narrower_words():
    pytest.importorskip("triton")
    run_in_triton_interpreter(UNALIGNED)


def test_triton_row_kernel_failure_warns_once_and_falls_back():
    pytest.importorskip("triton")
    run_in_triton_interpreter(FAILING)


@pytest.mark.parametrize("idt", [torch.int32, torch.int64])
def test_copy_rows_fallback_takes_int32_and_int64_indices(idt):
    """The torch path (no Triton here: CPU tensors outside the interpreter) with both index types:
    ``index_copy_`` alone refuses int32 destination indices."""
    g = torch.Generator().manual_seed(3)
    src = torch.randn(50, 5, generator=g)
    ids = torch.randint(0, 50, (20,), generator=g).to(idt)
    out = torch.zeros(20, 5)
    copy_rows(src, ids, out)
    assert torch.equal(out, src[ids.long()])
    pos = torch.randperm(25, generator=g)[:20].to(idt)
    out = torch.zeros(25, 5)
    copy_rows(src, ids, out, pos)
    want = torch.zeros(25, 5)
    want[pos.long()] = src[ids.long()]
    assert torch.equal(out, want)


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


# The tiered store's fused gather (issue 24: no host sync per batch): hot rows from the GPU tier and
# cold rows from the zero-copy view in one kernel, prefix and lookup modes, repeats, a reused
# output buffer larger than the batch; the rows per tier, counted on the device, equal the split
# path's once the counters are read; no operation that would sync a GPU inside gather().
TIERED = (
    TIERED_SPY
    + r"""
g = torch.Generator().manual_seed(3)
host = torch.randn(400, 24, generator=g)
for kind in ("prefix", "lookup"):
    for f in (0.1, 0.5, 0.9):
        h = int(f * 400)
        if kind == "prefix":
            st = TieredFeatureStore(host, h, simulate=SimulatedDevice())
        else:
            st = TieredFeatureStore(host, hot_ids=torch.randperm(400, generator=g)[:h],
                                    simulate=SimulatedDevice())
        want_gpu = want_host = 0
        for b in range(3):
            ids = torch.randint(0, 400, (150,), generator=g)
            ids[:10] = ids[10:20]  # repeats
            hot = st.is_hot(ids)
            out = torch.full((170, 24), 7.0)
            n0 = len(launches)
            with OpCounter() as c:
                got = st.gather(ids, out=out)
            assert c.syncs == 0, dict(c.sync_ops)
            assert len(launches) == n0 + 1, "the fused kernel did not run"
            assert torch.equal(got, host[ids]) and (out[150:] == 7).all(), (kind, f, b)
            want_gpu += int(hot.sum()); want_host += int((~hot).sum())
        assert st.counters.rows == {"gpu": want_gpu, "host": want_host}, (st.counters.rows, want_gpu)
        assert st.counters.bytes["gpu"] == want_gpu * 96
        st.counters.reset()
        ids = torch.tensor([0, 399, 5, 200])
        st.gather(ids)  # after a reset: only these rows, booked once
        k = int(st.is_hot(ids).sum())
        assert dict(st.counters.rows) == {t: r for t, r in (("gpu", k), ("host", 4 - k)) if r}
        st.close()
assert not triton_kernels._FAILED, triton_kernels._FAILED
print("ok")
"""
)


def test_the_tiered_gather_is_one_kernel_without_host_syncs():
    run_in_triton_interpreter(TIERED)
