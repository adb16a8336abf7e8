"""One hop of uniform sampling as a single Triton kernel (the GPU sampler's hot loop).

:func:`gnnio.sampling.gpu.sample_hop_torch` in torch ops is about 120 kernel launches per hop for
fanout 15 (the SplitMix64 mixing, Lemire's bound, and Floyd's loop one column at a time), which on
an H100 made the GPU sampler launch-bound: 8.7 ms per batch of 1024 seeds with fanouts 15,10,5,
slower than 16 CPU threads (measured by ``scripts/gpu-check.sh``, docs/benchmarks.md). This kernel
does the whole hop in one launch: each program takes ``BLOCK`` destination rows, draws every
row's Floyd sample with the CPU kernels' counter-based numbers -- Lemire's rejection loop run
exactly, draw by draw, so there is no "redo" -- and writes the sampled neighbours and their row
ids straight into the hop's CSR positions (``row_off``).

Bit-identical to :func:`gnnio.sampling._kernels._floyd_linear` / ``_floyd_hashed`` (the same
Floyd sequence; the hash set there is only how membership is tested) and to the torch path:
row ``g`` of hop key ``K`` starts from ``splitmix64(K ^ g * GAMMA)``, each draw steps the state by
``GAMMA`` until Lemire accepts. Rows of ``2**32`` or more neighbours are not supported (as in the
torch path). ``theta`` (a runtime argument, 0 = none) is HyDRA's threshold pruning
(:mod:`gnnio.sampling.pruned_torch`): a row longer than ``theta`` first draws its circular
window's start, then samples inside the window, as
:func:`gnnio.sampling._las_kernels.sample_rows` does.

This module imports Triton: :mod:`gnnio.sampling.gpu` imports it on the first CUDA hop, when
Triton is installed (CUDA builds of PyTorch bring it). ``TRITON_INTERPRET=1`` (set before this module
is imported) runs the kernel on CPU tensors in Triton's interpreter: that is how the tests check
it without a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["sample_hop_triton"]

_BLOCK = 64
_M22 = (1 << 22) - 1


@triton.jit
def _mix64(z):
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    return z ^ (z >> 31)


@triton.jit
def _key(k0, k1, k2, kp, KEY_PTR: tl.constexpr):
    """A sampler kernel's 64-bit key (uniform, LABOR-0, LAS hops): with ``KEY_PTR`` the bits at
    ``kp`` (int64 ``[1]`` in device memory: a CUDA graph's replay reads each batch's key there),
    else from three 22-bit int32 arguments (one compiled signature for every key)."""
    if KEY_PTR:
        key = tl.load(kp).to(tl.uint64, bitcast=True)
    else:
        key = (
            (k2.to(tl.int64).to(tl.uint64) << 44)
            | (k1.to(tl.int64).to(tl.uint64) << 22)
            | k0.to(tl.int64).to(tl.uint64)
        )
    return key


@triton.jit
def _lemire(state, bound, pending):
    """The CPU's ``_bounded(state, bound)`` on the ``pending`` lanes, rejections redrawn:
    ``(value, state)``."""
    b = bound.to(tl.uint64)
    thr = ((1 << 32) - b) % tl.maximum(b, 1)
    val = tl.zeros(bound.shape, dtype=tl.int64)
    while tl.max(pending.to(tl.int32), 0) > 0:
        state = tl.where(pending, state + 0x9E3779B97F4A7C15, state)
        m = (_mix64(state) >> 32) * b
        low = m & 0xFFFFFFFF
        ok = (low >= b) | (low >= thr)
        val = tl.where(pending & ok, (m >> 32).to(tl.int64), val)
        pending = pending & (ok == 0)
    return val, state


@triton.jit(do_not_specialize=["n", "cap", "k0", "k1", "k2", "theta"])
def _hop(indptr, indices, dst, row_off, out_src, out_row, n, cnt, cap, k0, k1, k2, kp, loc,
         first, theta, fanout: tl.constexpr, FP: tl.constexpr, BLOCK: tl.constexpr,
         HAS_CNT: tl.constexpr, CLAIM: tl.constexpr, KEY_PTR: tl.constexpr = False):  # fmt: skip
    r = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    rm = r < n
    if HAS_CNT:  # a bounded buffer of rows: only the first ``cnt[0]`` are real (no host sync)
        real = tl.load(cnt)
        if tl.program_id(0).to(tl.int64) * BLOCK >= real:
            return  # a program of padding rows only: nothing to draw or write
        rm = rm & (r < real)
    g = tl.load(dst + r, mask=rm, other=0)
    start = tl.load(indptr + g, mask=rm, other=0)
    deg = tl.load(indptr + g + 1, mask=rm, other=0) - start
    off = tl.load(row_off + r, mask=rm, other=0)
    key = _key(k0, k1, k2, kp, KEY_PTR)  # (in device memory: a CUDA graph's replay)
    state = _mix64(key ^ (g.to(tl.uint64) * 0x9E3779B97F4A7C15))
    # HyDRA's pruning (theta > 0): a row longer than theta first draws its window's start in
    # [0, deg) (Lemire, rejections redrawn), then samples the theta positions from there
    cut = rm & (deg > theta) & (theta > 0)
    st, state = _lemire(state, deg, cut)
    w = tl.where(cut, theta, deg)  # the positions to sample from: the window or the row
    k = tl.minimum(w, fanout)
    col = tl.arange(0, FP)
    picks = tl.full([BLOCK, FP], -1, tl.int64)
    live = rm & (w > fanout)
    for i in range(0, fanout):
        j = w - fanout + i  # Floyd: j runs over the last `fanout` positions
        val, state = _lemire(state, j + 1, live)  # redraws the rejected rows
        seen = tl.sum(((picks == val[:, None]) & (col[None, :] < i)).to(tl.int32), 1) > 0
        t = tl.where(seen, j, val)
        picks = tl.where(col[None, :] == i, t[:, None], picks)
    pos = tl.where((w <= fanout)[:, None], col[None, :], picks)  # short rows: all of them
    pos = st[:, None] + pos  # the window is circular: past the row's end it wraps to its start
    pos = tl.where(pos >= deg[:, None], pos - deg[:, None], pos)
    dest = off[:, None] + col[None, :]
    valid = rm[:, None] & (col[None, :] < k[:, None]) & (dest < cap)
    nb = tl.load(indices + start[:, None] + pos, mask=valid, other=0)
    tl.store(out_src + dest, nb.to(tl.int64), mask=valid)
    tl.store(out_row + dest, r[:, None] + 0 * col[None, :], mask=valid)
    if CLAIM:  # the relabelling's first step (_triton_relabel._claim), here: no extra launch
        unknown = valid & (tl.load(loc + nb, mask=valid, other=0) < 0)
        tl.atomic_min(first + nb, dest, mask=unknown)


def sample_hop_triton(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    dst_nodes: torch.Tensor,
    fanout: int,
    hop_key: int | torch.Tensor,
    total: int,
    count: torch.Tensor | None = None,
    row_off: torch.Tensor | None = None,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    claim: tuple[torch.Tensor, torch.Tensor] | None = None,
    rows: int | None = None,
    theta: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(src, row)`` of one hop with ``fanout >= 1`` (see
    :func:`gnnio.sampling.gpu.sample_hop_torch`, whose results these equal); ``total`` =
    ``sum(min(deg, fanout))`` over the rows, known to the caller. ``theta > 0``: HyDRA's
    threshold pruning (:class:`gnnio.sampling.PrunedUniformSampler`'s rows): a row longer than
    ``theta`` samples from a circular window of ``theta`` positions at a random start, and
    ``total`` = ``sum(min(deg, theta, fanout))``; a runtime argument, so one compiled kernel
    serves every threshold.

    Bounded form (:mod:`gnnio.sampling.gpu_bounded`, no host sync): ``count`` (int64 ``[1]`` on
    the device) says how many leading rows of ``dst_nodes`` are real, ``row_off`` gives each
    row's first output position (the caller computed it over the real rows), and ``total`` is
    the outputs' size, an upper bound: only a prefix is written, nothing at or past ``total``.
    There ``rows`` (default ``len(dst_nodes)``) says how many leading entries of ``dst_nodes``
    and ``row_off`` are the rows (the batch's node buffer and its cumulative sums, passed
    whole: no slice op), ``out`` = ``(src, row)`` buffers of
    ``total`` entries to write into (the sampler's reused ones: no allocation), and ``claim`` =
    ``(loc, first)`` the relabelling's scratch: every sampled source not numbered yet
    (``loc < 0``) does ``atomic_min(first[s], position)``, the relabelling's first step
    (:mod:`._triton_relabel`), in this kernel instead of a launch of its own.

    ``hop_key`` may be an int64 ``[1]`` device tensor holding the key's bits
    (:func:`gnnio.sampling.gpu_hop._s64` of it): the kernel reads it there, so a captured
    launch (:mod:`gnnio.sampling.gpu_graphed`) samples with whatever key the tensor holds when
    it is replayed."""
    dev = dst_nodes.device
    n = int(dst_nodes.shape[0]) if rows is None else rows
    if out is None:
        src = torch.empty(total, dtype=torch.int64, device=dev)
        row = torch.empty(total, dtype=torch.int64, device=dev)
    else:
        src, row = out
    if total == 0 or n == 0:
        return src, row
    if row_off is None:
        deg = indptr[dst_nodes + 1] - indptr[dst_nodes]
        k = torch.clamp(deg, max=min(fanout, theta) if theta > 0 else fanout)
        row_off = torch.cumsum(k, 0) - k
    key_ptr = isinstance(hop_key, torch.Tensor)
    key = 0 if key_ptr else hop_key & ((1 << 64) - 1)
    fp = max(2, 1 << (fanout - 1).bit_length())
    grid = (triton_cdiv(n, _BLOCK),)
    cnt = count if count is not None else row_off  # (an unread placeholder without a count)
    loc, first = claim if claim is not None else (src, src)  # (unread without a claim)
    kp = hop_key if key_ptr else cnt  # (unread without KEY_PTR)
    _hop[grid](indptr, indices, dst_nodes.contiguous(), row_off, src, row, n, cnt, total,
               key & _M22, (key >> 22) & _M22, key >> 44, kp, loc, first, int(theta),
               fanout=fanout, FP=fp, BLOCK=_BLOCK, HAS_CNT=count is not None,
               CLAIM=claim is not None, KEY_PTR=key_ptr)  # fmt: skip
    return src, row


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
