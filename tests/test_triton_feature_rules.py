"""Rules of the feature path's Triton kernels that the replays against the host path do not pin
down (found by a mutation pass): the row kernels' skip and tier choice where the two tiers hold
different bytes, the checks that refuse what the kernels cannot copy, non-contiguous indices, a
zero-copy tier whose rows start off a word boundary, the widest row one tile takes, and the
fallback's one warning per kernel. The kernels run in Triton's interpreter (one subprocess per
module: each launch there costs time)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import run_in_triton_interpreter

# Hand-worked expectations: every expected tensor below is built with plain indexing from the
# documented contract (``dst[dst_idx[i]] = src[src_idx[i]]``; ``dst[i] = hot[slots[i]]`` where
# ``slots[i] >= 0``, else ``cold[ids[i]]``; a skipped row left as it was).
ROWS = r"""
import torch
from gnnio.features import _triton_rows as R

g = torch.Generator().manual_seed(5)
src = torch.randn(20, 3, generator=g)

# skip: a negative destination copies nothing and reads nothing (its source index is past the
# end); destination row 0 is a real row
si = torch.tensor([0, 5, 10**6, 7, 19])
di = torch.tensor([4, 0, -1, -3, 2])
dst = torch.full((6, 3), 9.0)
assert R.copy_rows_triton(src, si, dst, di, skip=True)
want = torch.full((6, 3), 9.0)
want[4], want[0], want[2] = src[0], src[5], src[19]
assert torch.equal(dst, want), dst

# non-contiguous indices (every other element of a longer tensor), with and without dst_idx
perm = torch.randperm(24, generator=g)
si = torch.randint(0, 20, (24,), generator=g)
for idt in (torch.int64, torch.int32):
    dst = torch.zeros(12, 3)
    assert R.copy_rows_triton(src, si[::2].to(idt), dst, None)
    assert torch.equal(dst, src[si[::2]]), idt
    dst = torch.zeros(12, 3)
    d = (perm[perm < 12]).to(idt)  # 12 distinct destinations, then strided views of them
    assert R.copy_rows_triton(src, si[1::2].to(idt), dst, d.repeat_interleave(2)[::2])
    want = torch.zeros(12, 3)
    want[d.long()] = src[si[1::2]]
    assert torch.equal(dst, want), idt

# what the kernel cannot copy: refused (False), nothing written
ids = torch.arange(4)
for bad_dst in (torch.zeros(4, 4), torch.zeros(4, 3, dtype=torch.int32), torch.zeros(12)):
    before = bad_dst.clone()
    assert not R.copy_rows_triton(src, ids, bad_dst, None), bad_dst.shape
    assert torch.equal(bad_dst, before)
assert not R.copy_rows_triton(src, ids, torch.zeros(4, 3), torch.arange(3))

# the tiered gather where the tiers differ: hot row 0 is a hot row, slot -1 the cold row; with
# skip a slot below -1 leaves the row, without it that row is cold too
hot = torch.randn(5, 3, generator=g)
cold = torch.randn(30, 3, generator=g) + 100
slots = torch.tensor([0, -1, -2, 4, -1, 0, -7])
ids = torch.tensor([11, 12, 13, 14, 29, 0, 3])
for skip in (False, True):
    dst = torch.full((7, 3), 9.0)
    assert R.copy_tiered_triton(hot, cold, slots, ids, dst, skip=skip)
    want = torch.stack([hot[s] if s >= 0 else cold[i] for s, i in zip(slots.tolist(), ids.tolist())])
    if skip:
        want[slots < -1] = 9.0
    assert torch.equal(dst, want), (skip, dst)
# ... refused where slots and ids differ in shape (nothing written)
dst = torch.full((7, 3), 9.0)
assert not R.copy_tiered_triton(hot, cold, slots[:6], ids, dst)
assert (dst == 9.0).all()

# a zero-copy tier whose rows start off a word boundary (aligned hot tier and output): the rows
# are read through the word all three allow
base = torch.randint(0, 256, (1 + 30 * 8,), generator=g, dtype=torch.uint8)
cold8 = base[1:].view(30, 8)
hot8 = torch.randint(0, 256, (5, 8), generator=g, dtype=torch.uint8)
dst = torch.zeros(7, 8, dtype=torch.uint8)
assert R.copy_tiered_triton(hot8, cold8, slots, ids, dst)
want = torch.stack([hot8[s] if s >= 0 else cold8[i] for s, i in zip(slots.tolist(), ids.tolist())])
assert torch.equal(dst, want)
print("ok")
"""


def test_row_kernels_skip_choose_tiers_and_refuse_as_documented():
    """The row and tiered kernels: skip, non-contiguous indices, refusals, tier choice and an
    unaligned zero-copy tier, against plain indexing."""
    pytest.importorskip("triton")
    run_in_triton_interpreter(ROWS)


def test_row_tiling_takes_rows_up_to_max_words_and_pads_to_a_power_of_two():
    """A row of exactly MAX_WORDS words is one tile, one word more is refused; the padded width
    is the smallest power of two holding the row."""
    pytest.importorskip("triton")
    import torch

    from gnnio.features._triton_rows import MAX_WORDS, _tiling

    t = torch.zeros(2, 8)  # (an aligned tensor: 8-byte words)
    w, words, wp, _ = _tiling(MAX_WORDS * 8, t)
    assert (w, words, wp) == (8, MAX_WORDS, MAX_WORDS)
    assert _tiling((MAX_WORDS + 1) * 8, t) is None
    for n in range(1, 70):
        _, words, wp, _ = _tiling(n * 8, t)
        assert words == n and wp >= n and wp & (wp - 1) == 0 and (wp == 1 or wp // 2 < n), n


@pytest.fixture
def record(monkeypatch):
    """The kernel records of :mod:`gnnio.utils.triton_kernels`, empty for one test."""
    from gnnio.utils import triton_kernels as tk

    monkeypatch.setattr(tk, "_FAILED", {})
    monkeypatch.setattr(tk, "_RAN", {})
    monkeypatch.setattr(tk, "_CONFIGS", {})
    monkeypatch.delenv("GNNIO_TRITON", raising=False)
    return tk


def test_a_failed_kernel_warns_once_and_is_not_tried_again(record, monkeypatch):
    """Two failures of one kernel: one warning (a second kernel's failure warns too); the failed
    kernel is no longer available, the other one still is, and a reset of the record keeps the
    failures."""
    import warnings

    import torch

    tk = record
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(tk, "_importable", lambda: True)
    cpu = torch.device("cpu")
    assert tk.triton_available(cpu, "a") and tk.triton_available(cpu, "b")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tk.kernel_failed("a", RuntimeError("first"), "torch instead")
        tk.kernel_failed("a", RuntimeError("second"), "torch instead")
        tk.kernel_failed("b", ValueError("other"), "torch instead")
    msgs = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 2 and "'a' failed (RuntimeError: first)" in msgs[0], msgs
    assert not tk.triton_available(cpu, "a") and tk.triton_available(cpu, "c")
    tk.reset_kernel_record()
    assert not tk.triton_available(cpu, "a")
    rep = tk.kernels_report()
    assert rep["fallbacks"] == 2 and rep["failed"]["a"] == "RuntimeError: first", rep


def test_where_triton_kernels_run(record, monkeypatch):
    """CUDA tensors: unless GNNIO_TRITON=0; CPU tensors: only under TRITON_INTERPRET=1."""
    import torch

    tk = record
    monkeypatch.setattr(tk, "_importable", lambda: True)
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert tk.triton_available(cuda, "k") and not tk.triton_available(cpu, "k")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert tk.triton_available(cuda, "k") and tk.triton_available(cpu, "k")
    monkeypatch.setenv("GNNIO_TRITON", "0")
    assert not tk.triton_available(cuda, "k") and not tk.triton_available(cpu, "k")
    monkeypatch.setenv("GNNIO_TRITON", "1")
    assert tk.triton_available(cuda, "k")


def test_a_failure_inside_a_capture_is_raised_not_recorded(record, monkeypatch):
    """Inside a CUDA graph capture the launch's error is re-raised and the kernel is not marked
    failed (no warning, no fallback counted)."""
    import warnings

    tk = record
    monkeypatch.setattr(tk, "capturing", lambda: True)
    err = RuntimeError("refused while capturing")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeError, match="refused while capturing"):
            tk.kernel_failed("k", err, "torch instead")
    assert tk.kernels_report()["fallbacks"] == 0 and "k" not in tk._FAILED


def test_the_kernels_report_is_sorted_and_names_configs_once_chosen(record):
    """Several implementations of one kernel are joined in sorted order (one spelling whatever
    order they ran in); ``configs`` appears only once a variant was chosen; a reset forgets what
    ran."""
    tk = record
    for impl in ("triton", "torch", "numba", "torch"):
        tk.kernel_ran("rows", impl)
    tk.kernel_ran("cache", "triton")
    rep = tk.kernels_report()
    assert rep == {"cache": "triton", "rows": "numba+torch+triton", "fallbacks": 0, "failed": {}}
    assert list(rep)[:2] == ["cache", "rows"]

    class Unsorted(set):  # a set that iterates in the order given (as a hash order may)
        def __init__(self, order):
            super().__init__(order)
            self.order = list(order)

        def __iter__(self):
            return iter(self.order)

    tk._RAN["rows"] = Unsorted(["triton", "torch", "numba"])
    assert tk.kernels_report()["rows"] == "numba+torch+triton"
    tk.kernel_config("rows", "512B", "t8k_w2")
    assert tk.kernels_report()["configs"] == {"rows": {"512B": "t8k_w2"}}
    tk.reset_kernel_record()
    assert tk.kernels_report() == {
        "fallbacks": 0,
        "failed": {},
        "configs": {"rows": {"512B": "t8k_w2"}},
    }


# The caches' kernels at the widest row one tile takes (MAX_WIDTH elements: one row per program)
# and one element past it (the torch ops): the rows, maps and counts equal the host path's.
WIDE = r"""
import warnings
import numpy as np, torch
from gnnio.features import InMemoryFeatureStore
from gnnio.features.caches import _triton_cache as tc
from gnnio.features.caches.cache import FeatureCache
from gnnio.utils import triton_kernels

warnings.simplefilter("error", RuntimeWarning)
g = torch.Generator().manual_seed(4)
N = 24
hot_ids = torch.randperm(N, generator=g).numpy()
for dim, impl, policies in ((tc.MAX_WIDTH, "triton", ("fifo", "static")),
                            (tc.MAX_WIDTH + 1, "torch", ("fifo",))):
    feats = torch.randn(N, dim, generator=g)
    for policy in policies:
        mk = lambda free: FeatureCache(InMemoryFeatureStore(feats), 6, policy, hot_ids=hot_ids,
                                       sync_free=free)
        a, b = mk(True), mk(False)
        triton_kernels.reset_kernel_record()
        for size in (7, 4):
            ids = torch.randint(0, N, (size,), generator=g)
            got = a.gather(ids)
            assert torch.equal(got, feats[ids]) and torch.equal(b.gather(ids), got), (dim, policy)
            assert torch.equal(a.policy.slot_of, b.policy.slot_of)
            assert a.stats.as_dict()["hits"] == b.stats.as_dict()["hits"]
        assert triton_kernels.kernels_report()["cache"] == impl, (dim, policy)
assert not triton_kernels._FAILED, triton_kernels._FAILED
print("ok")
"""


def test_cache_kernels_take_rows_up_to_max_width():
    """FIFO and static batches with rows of exactly MAX_WIDTH elements run the kernels (one row
    per program) and equal the host path; one element wider runs the torch ops."""
    pytest.importorskip("triton")
    run_in_triton_interpreter(WIDE)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_skipping_tiered_kernel_compiles_for_int64_slots_on_cuda():  # pragma: no cover
    """On a GPU the masked tiered copy (``skip=True``: a sync-free cache's hit rows,
    ``copy_masked``; a backing's ``gather_into``) with int64 slots, as the caches pass them,
    compiles and copies, for rows of 40 to 2048 bytes. Triton 3.6 (the GPU image's) refused the
    kernel for rows up to 512 bytes ('arith.andi' op requires the same encoding, in
    TritonGPURemoveLayoutConversions): the process then marked ``copy_tiered`` failed and every
    later tiered gather split its batch with two host syncs."""
    pytest.importorskip("triton")
    from gnnio.features._triton_rows import copy_tiered_triton

    g = torch.Generator().manual_seed(3)
    for dtype, dim in ((torch.float32, 10), (torch.float32, 128), (torch.float16, 64),
                       (torch.float32, 512)):  # fmt: skip
        hot = torch.randn(50, dim, generator=g).to(dtype).cuda()
        cold = torch.randn(300, dim, generator=g).to(dtype).cuda()
        slots = torch.randint(-3, 50, (1000,), generator=g)  # -1 cold, below -1 skipped
        ids = torch.randint(0, 300, (1000,), generator=g)
        for skip in (True, False):
            dst = torch.full((1000, dim), 7.0, dtype=dtype).cuda()
            assert copy_tiered_triton(hot, cold, slots.cuda(), ids.cuda(), dst, skip=skip)
            want = torch.where((slots >= 0)[:, None], hot.cpu()[slots.clamp(min=0)],
                               cold.cpu()[ids])  # fmt: skip
            if skip:
                want[slots < -1] = 7.0
            assert torch.equal(dst.cpu(), want), (dtype, dim, skip)
