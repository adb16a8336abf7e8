"""The GPU sampler's relabelling as Triton kernels: one hop's sampled neighbours numbered in
first-appearance order, with no host synchronisation (:mod:`gnnio.sampling.gpu_bounded`).

The table is the sampler's dense scratch (``loc``: global id -> local id or -1, ``first``: the
first edge position of a not-yet-numbered node, all-sentinel between hops; both ``[N + 1]``, the
last slot a dummy): a perfect hash of the node ids, so a lookup is one load and there is no
probing. Four launches and a prefix sum per hop, over a bounded edge buffer whose real length
``e_count`` stays on the device:

1. ``_claim``: every real edge whose source is not numbered yet does ``atomic_min(first[s], e)``;
2. ``_flag``: edge ``e`` is the first appearance of a new node iff ``first[s] == e``;
   then ``rank = cumsum(flag)`` (torch) numbers the new nodes in edge order;
3. ``_lookup``: the local id of every edge's source -- ``loc[s]`` for a node numbered before,
   ``count + rank[first[s]] - 1`` for a new one (so ``loc`` is read before anything writes it);
4. ``_commit``: each new node's first edge appends it to ``nodes`` at ``count + rank - 1``, sets
   ``loc[s]`` and puts ``first[s]`` back to the sentinel.

Only ``_claim`` and ``_commit`` write the scratch, ``_commit`` last: a kernel that fails to build
before it leaves ``loc`` and ``nodes`` untouched and ``first`` to be reset by the caller.
Bit-identical to :func:`gnnio.sampling.gpu_bounded.relabel_torch` (the same steps in torch ops)
and so to :func:`gnnio.sampling.gpu._relabel`. ``TRITON_INTERPRET=1`` runs them on CPU tensors
(the tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["relabel_triton"]

_BLOCK = 256
_SENTINEL = torch.iinfo(torch.int64).max


@triton.jit
def _edges(ecnt, n, BLOCK: tl.constexpr):
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    return e, (e < n) & (e < tl.load(ecnt))


@triton.jit(do_not_specialize=["n"])
def _claim(src, ecnt, loc, first, n, BLOCK: tl.constexpr):
    e, m = _edges(ecnt, n, BLOCK)
    s = tl.load(src + e, mask=m, other=0)
    unknown = m & (tl.load(loc + s, mask=m, other=0) < 0)
    tl.atomic_min(first + s, e, mask=unknown)


@triton.jit(do_not_specialize=["n"])
def _flag(src, ecnt, loc, first, flag, n, BLOCK: tl.constexpr):
    e, m = _edges(ecnt, n, BLOCK)
    s = tl.load(src + e, mask=m, other=0)
    unknown = m & (tl.load(loc + s, mask=m, other=0) < 0)
    is_new = unknown & (tl.load(first + s, mask=unknown, other=-1) == e)
    tl.store(flag + e, is_new.to(tl.int64), mask=e < n)


@triton.jit(do_not_specialize=["n"])
def _lookup(src, ecnt, loc, first, rank, count, local, n, BLOCK: tl.constexpr):
    e, m = _edges(ecnt, n, BLOCK)
    s = tl.load(src + e, mask=m, other=0)
    known = tl.load(loc + s, mask=m, other=-1)
    f = tl.load(first + s, mask=m & (known < 0), other=0)
    fresh = tl.load(count) + tl.load(rank + f, mask=m & (known < 0), other=0) - 1
    tl.store(local + e, tl.where(known >= 0, known, fresh), mask=m)


@triton.jit(do_not_specialize=["n", "cap"])
def _commit(src, ecnt, flag, rank, count, nodes, loc, first, n, cap, BLOCK: tl.constexpr):
    e, m = _edges(ecnt, n, BLOCK)
    new = m & (tl.load(flag + e, mask=m, other=0) != 0)
    s = tl.load(src + e, mask=new, other=0)
    pos = tl.load(count) + tl.load(rank + e, mask=new, other=0) - 1
    ok = new & (pos < cap)  # (only seeds given twice, an error the batch reports, get here)
    tl.store(nodes + pos, s, mask=ok)
    tl.store(loc + s, pos, mask=ok)
    tl.store(first + s, 0x7FFFFFFFFFFFFFFF, mask=new)


def relabel_triton(
    src: torch.Tensor,
    e_count: torch.Tensor,
    loc: torch.Tensor,
    first: torch.Tensor,
    nodes: torch.Tensor,
    count: torch.Tensor,
    cap: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """See :func:`gnnio.sampling.gpu_bounded.relabel_torch` (same arguments and results)."""
    n = int(src.shape[0])
    local = torch.empty(n, dtype=torch.int64, device=src.device)
    if n == 0:
        return local, count
    flag = torch.empty(n, dtype=torch.int64, device=src.device)
    grid = (triton.cdiv(n, _BLOCK),)
    _claim[grid](src, e_count, loc, first, n, BLOCK=_BLOCK)
    _flag[grid](src, e_count, loc, first, flag, n, BLOCK=_BLOCK)
    rank = torch.cumsum(flag, 0)
    _lookup[grid](src, e_count, loc, first, rank, count, local, n, BLOCK=_BLOCK)
    _commit[grid](src, e_count, flag, rank, count, nodes, loc, first, n, cap, BLOCK=_BLOCK)
    return local, count + rank[-1:]
