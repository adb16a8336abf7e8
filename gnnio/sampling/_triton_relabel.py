"""The GPU sampler's relabelling as Triton kernels: one hop's sampled neighbours numbered in
first-appearance order, with no host synchronisation (:mod:`gnnio.sampling.gpu_bounded`).

The table is the sampler's dense scratch (``loc``: global id -> local id or -1, ``first``: the
first edge position of a not-yet-numbered node, all-sentinel between hops; both ``[N + 1]``, the
last slot a dummy): a perfect hash of the node ids, so a lookup is one load and there is no
probing. Per hop, over a bounded edge buffer whose real length ``e_count`` stays on the device:

1. ``_claim``: every real edge whose source is not numbered yet does ``atomic_min(first[s], e)``
   (done by the hop kernel itself, :mod:`._triton_hop`'s ``CLAIM``, when that kernel ran);
2. ``_flag``: edge ``e`` is the first appearance of a new node iff ``first[s] == e``;
   then ``rank = cumsum(flag)`` (torch) numbers the new nodes in edge order;
3. ``_commit``: the local id of every edge's source -- ``loc[s]`` for a node numbered before,
   ``count + rank[first[s]] - 1`` for a new one -- and each new node's first edge appends it
   to ``nodes`` at ``count + rank - 1`` and sets ``loc[s]`` (another program may read ``loc[s]``
   before or after that write: both give the same id); the node count after the hop goes to
   the batch's ``meta`` buffer, and, with ``NEXT``, every row's ``k = min(deg, fanout)`` of the
   next hop (old rows from ``nodes``, new ones from the edge that appends them, padding 0).

``first`` keeps its claims of numbered nodes (only nodes with ``loc < 0`` read it) until
``_reset`` puts ``loc`` and ``first`` back at the batch's end, over its node list. ``_seeds``
starts a batch: the seeds into ``nodes`` and ``loc``, their checks counted in ``meta``, and the
first hop's ``k``. Only ``_commit`` writes ``loc`` and ``nodes`` in a hop, last: a kernel that
fails to build leaves them untouched and the torch steps, which claim again (``amin``: the same
values), take over. Bit-identical to :mod:`gnnio.sampling.gpu_bounded`'s torch steps and so to
:func:`gnnio.sampling.gpu._relabel`. ``TRITON_INTERPRET=1`` runs them on CPU tensors (the tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["relabel_triton", "reset_triton", "seeds_triton"]

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


@triton.jit(do_not_specialize=["n", "cap", "rows", "fanout", "hc", "he"])
def _commit(src, ecnt, flag, rank, meta, hc, he, nodes, loc, first, local, kn, indptr, n, cap,
            rows, fanout, NEXT: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    e, m = _edges(ecnt, n, BLOCK)
    count = tl.load(meta + hc)
    s = tl.load(src + e, mask=m, other=0)
    known = tl.load(loc + s, mask=m, other=-1)
    f = tl.load(first + s, mask=m & (known < 0), other=0)
    fresh = count + tl.load(rank + f, mask=m & (known < 0), other=0) - 1
    tl.store(local + e, tl.where(known >= 0, known, fresh), mask=m)
    new = m & (tl.load(flag + e, mask=m, other=0) != 0)
    pos = count + tl.load(rank + e, mask=new, other=0) - 1
    ok = new & (pos < cap)  # (only seeds given twice, an error the batch reports, get past it)
    tl.store(nodes + pos, s, mask=ok)
    tl.store(loc + s, pos, mask=ok)
    after = count + tl.load(rank + n - 1)
    if NEXT:  # the next hop's k: new rows here, rows numbered before and padding by index
        d = tl.load(indptr + s + 1, mask=new, other=0) - tl.load(indptr + s, mask=new, other=0)
        tl.store(kn + pos, tl.minimum(d, fanout), mask=new & (pos < rows))
        old = e < count
        by_row = (e < rows) & (old | (e >= after))
        g = tl.load(nodes + e, mask=by_row & old, other=0)
        d = tl.load(indptr + g + 1, mask=by_row & old, other=0)
        d -= tl.load(indptr + g, mask=by_row & old, other=0)
        tl.store(kn + e, tl.where(old, tl.minimum(d, fanout), 0), mask=by_row)
    first_prog = e == 0
    tl.store(meta + hc + 1 + 0 * e, after + 0 * e, mask=first_prog)
    tl.store(meta + he + 0 * e, tl.load(ecnt) + 0 * e, mask=first_prog)


@triton.jit(do_not_specialize=["n", "N", "fanout"])
def _seeds(seeds, loc, nodes, k0, meta, indptr, n, N, fanout, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    s = tl.load(seeds + i, mask=m, other=0)
    ok = m & (s >= 0) & (s < N)
    g = tl.where(ok, s, 0)  # a bad seed is sampled as node 0 until the batch's end reports it
    tl.store(nodes + i, g, mask=m)
    old = tl.atomic_xchg(loc + g, i, mask=ok)
    tl.atomic_add(meta + 0, tl.sum((ok & (old >= 0)).to(tl.int64), 0))  # seeds given twice
    tl.atomic_add(meta + 1, tl.sum((m & (ok == 0)).to(tl.int64), 0))  # out of range
    d = tl.load(indptr + g + 1, mask=m, other=0) - tl.load(indptr + g, mask=m, other=0)
    tl.store(k0 + i, tl.minimum(d, fanout), mask=m)
    tl.store(meta + 2 + 0 * i, n + 0 * i, mask=i == 0)


@triton.jit(do_not_specialize=["n"])
def _reset(nodes, loc, first, n, cnt, BLOCK: tl.constexpr, HAS_CNT: tl.constexpr = False):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    if HAS_CNT:  # n an upper bound, the count on the device (a captured batch's end)
        m = m & (i < tl.load(cnt))
    s = tl.load(nodes + i, mask=m, other=0)
    tl.store(loc + s, tl.full([BLOCK], -1, tl.int64), mask=m)
    tl.store(first + s, tl.full([BLOCK], 0x7FFFFFFFFFFFFFFF, tl.int64), mask=m)


def seeds_triton(seeds, loc, nodes, k0, meta, indptr, num_nodes: int, fanout: int) -> None:
    """Start a batch (see :func:`gnnio.sampling.gpu_bounded.seeds_torch`, the same writes)."""
    b = int(seeds.shape[0])
    if b:
        _seeds[(triton.cdiv(b, _BLOCK),)](seeds, loc, nodes, k0, meta, indptr, b, num_nodes,
                                          max(fanout, 0), BLOCK=_BLOCK)  # fmt: skip


def reset_triton(nodes, n: int, loc, first, count=None) -> None:
    """``loc[nodes[:n]] = -1`` and ``first[nodes[:n]] = sentinel``: the scratch at rest. With
    ``count`` (int64 ``[1]`` on the device) only the first ``min(n, count)`` nodes: ``n`` is then
    a bound, and nothing is read on the host."""
    if n:
        cnt = nodes if count is None else count  # (unread without a count)
        _reset[(triton.cdiv(n, _BLOCK),)](nodes, loc, first, n, cnt, BLOCK=_BLOCK,
                                          HAS_CNT=count is not None)  # fmt: skip


def relabel_triton(src, ecnt, loc, first, nodes, meta, h: int, cap: int, out, claimed: bool,
                   nxt=None) -> torch.Tensor:  # fmt: skip
    """One hop's relabelling (see :func:`gnnio.sampling.gpu_bounded.relabel_step_torch`, the
    same arguments and writes): ``out`` = ``(local, flag, rank)`` buffers of ``len(src)``
    entries; ``claimed``: the hop kernel made the claims already; ``nxt`` = ``(k, rows,
    fanout, indptr)`` for the next hop's ``k``, or None. Returns ``local``."""
    n = int(src.shape[0])
    local, flag, rank = out
    L = (int(meta.shape[0]) - 3) // 3
    rows = 0 if nxt is None else nxt[1]
    grid = (triton.cdiv(n, _BLOCK),)
    if not claimed:
        _claim[grid](src, ecnt, loc, first, n, BLOCK=_BLOCK)
    _flag[grid](src, ecnt, loc, first, flag, n, BLOCK=_BLOCK)
    torch.cumsum(flag, 0, out=rank)
    kn, _, fanout, indptr = nxt if nxt is not None else (local, 0, 0, src)
    _commit[(triton.cdiv(max(n, rows), _BLOCK),)](src, ecnt, flag, rank, meta, 2 + h, 3 + L + h, nodes, loc, first, local, kn,
                  indptr, n, cap, rows, max(fanout, 0), NEXT=nxt is not None,
                  BLOCK=_BLOCK)  # fmt: skip
    return local
