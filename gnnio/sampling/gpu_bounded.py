"""The GPU sampler's batch with one host synchronisation: sizes bounded above, counts on the device.

:class:`gnnio.sampling.gpu.TorchUniformSampler` needs, to sample a hop, how many edges the hop
will draw, and to relabel it, how many new nodes it found: read on the host, that is one sync per
hop (issue 24: 4 per batch of a 3-layer model, each one stalling the GPU's launch queue). Here no
count is read until the batch is done. Every buffer is allocated at an upper bound known from the
fanouts alone, and the real sizes live in 1-element int64 tensors on the device:

* hop ``h`` draws at most ``E_h = min(R_h * fanout_h, num_edges)`` edges from its ``R_h`` rows;
* it adds at most ``E_h`` nodes, and the batch holds at most ``num_nodes`` distinct nodes:
  ``R_{h+1} = max(R_h, min(num_nodes, R_h + E_h))``, ``R_0 = len(seeds)``.

(For fanouts 15,10,5 and 1024 seeds on the 2^21 graph: 1.08M node slots, and 0.9M edge slots in
the last hop, for ~0.1M nodes and ~0.5M edges sampled in all: the kernels also visit the padding,
masked, in exchange for a launch queue that never drains. On CPU tensors, where a sync costs
nothing, this path is slower than the synced one.)

The node list is one buffer ``nodes[R_L + 1]``: seeds first, then each hop's new nodes appended at
the device-held count (the last slot a dummy). Hop ``h``'s destination rows are the buffer's
first ``R_h`` entries, of which the first ``count`` are real (the hop kernel masks the rest:
:func:`gnnio.sampling.gpu_hop.sample_hop_torch`'s bounded form); ``cum[h]`` is their cumulative
``k = min(deg, fanout)`` (0 for padding rows) after a leading 0: the rows' output offsets, the
hop's edge count at ``[R_h]``, and the block's CSR pointer (its prefix). The edges fill a prefix
of the ``E_h``-slot edge buffers. The relabelling numbers the edges' new sources in
first-appearance order -- the order the synced path and the CPU sampler give: seeds first, then
new nodes in order of first appearance -- as Triton kernels on CUDA (:mod:`._triton_relabel`,
which also write the next hop's ``k``; the hop kernel makes its claims) or, where Triton cannot
build them (one warning, recorded in the ``kernels`` report as ``relabel``), the same writes in
torch ops (:func:`seeds_torch`, :func:`relabel_step_torch`).

Host work (issue 24: on a GPU the loop is paced by the host): every buffer and its views are
allocated once per sampler scratch and batch size (:class:`_Buffers`, travelling with the
scratch through the pool) and reused; the counts all live in one ``meta`` buffer. A batch is 22
torch ops and 11 Triton launches for 3 hops (``tests/test_gpu_sampler_ops.py``; 111 + 15 before).

At the end **one** host sync (``meta.tolist()``) reads the seeds' checks, every hop's node and
edge count and the torch hop's rejection flags; then the batch's arrays are copied out of the
buffers in one ``cat`` (before the buffers go back to the pool: another thread may write them
next). Bad seeds are reported then (out-of-range ids were sampled as node 0 meanwhile, so
nothing reads out of bounds). A batch whose fast torch draws met a Lemire rejection
(``d / 2**32`` per draw, the Triton hop never does) returns None and is drawn again by the
synced path (same batch).
"""

from __future__ import annotations

import torch

from ..utils.capture import CAPTURE_LOCK
from ..utils.triton_kernels import kernel_failed, kernel_ran, triton_available
from .base import Block, MiniBatch
from .gpu_hop import _SENTINEL, bad_seeds, number_seeds, sample_hop_torch
from .threaded import hop_key

__all__ = ["MAX_EDGE_SLOTS", "bounds", "relabel_step_torch", "relabel_torch", "sample_bounded",
           "seeds_torch"]  # fmt: skip

#: a hop whose edge bound is larger than this is sampled by the synced path instead (deep models
#: with large fanouts: the bounded buffers, ~6 int64 arrays of the bound, would take GBs)
MAX_EDGE_SLOTS = 1 << 25


def bounds(num_seeds: int, fanouts, num_nodes: int, num_edges: int) -> tuple[list, list]:
    """``(rows, edges)``: the upper bounds ``R_0 .. R_L`` and ``E_0 .. E_{L-1}`` (module
    docstring) for ``fanouts >= 0``."""
    rows, edges = [int(num_seeds)], []
    for f in fanouts:
        e = min(rows[-1] * int(f), int(num_edges))
        edges.append(e)
        rows.append(max(rows[-1], min(int(num_nodes), rows[-1] + e)))
    return rows, edges


def relabel_torch(
    src: torch.Tensor,
    e_count: torch.Tensor,
    loc: torch.Tensor,
    first: torch.Tensor,
    nodes: torch.Tensor,
    count: torch.Tensor,
    cap: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Number one hop's new sources in first-appearance order, with no host sync.

    Args:
        src: int64 ``[E]`` global ids of the hop's sampled neighbours; the first ``e_count``
            (int64 ``[1]`` on the device) are real, the rest padding (valid ids, ignored).
        loc, first: the sampler's scratch (``[N + 1]``, last slot a dummy): ``loc`` global ->
            local id or -1; ``first`` all-sentinel on entry and on exit.
        nodes: int64 ``[cap + 1]``, the batch's node list, real up to ``count`` (int64 ``[1]``);
            the new nodes are appended there and numbered in ``loc``.

    Returns:
        ``(local, count')``: the local id of every real edge's source (``[E]``; padding
        entries hold junk) and the node count after this hop (int64 ``[1]``).
    """
    n, dev = int(src.shape[0]), src.device
    if n == 0:
        return torch.empty(0, dtype=torch.int64, device=dev), count
    dummy = int(loc.shape[0]) - 1
    e = torch.arange(n, device=dev)
    live = e < e_count
    s = torch.where(live, src, dummy)
    unknown = live & (loc[s] < 0)
    first.scatter_reduce_(0, torch.where(unknown, s, dummy), e, reduce="amin")  # _claim
    is_new = unknown & (first[s] == e)  # _flag
    rank = torch.cumsum(is_new, 0)
    known = loc[s]  # _lookup: read before anything writes loc
    fresh = count + rank[torch.clamp(first[s], max=n - 1)] - 1
    local = torch.where(known >= 0, known, fresh)
    pos = count + rank - 1  # _commit
    ok = is_new & (pos < cap)
    nodes.scatter_(0, torch.where(ok, pos, cap), s)
    loc.scatter_(0, torch.where(ok, s, dummy), pos)
    loc.narrow(0, dummy, 1).fill_(-1)  # (t[i] = v copies v up from the host and waits)
    first.scatter_(0, torch.where(is_new, s, dummy), _SENTINEL)
    first.narrow(0, dummy, 1).fill_(_SENTINEL)
    return local, count + rank[-1:]


def seeds_torch(seeds, loc, nodes, k0, meta, indptr, num_nodes: int, fanout: int) -> None:
    """Start a batch: the seeds (bad ones as node 0) at the head of ``nodes``, numbered in
    ``loc``; ``meta[0]`` > 0 iff a seed is given twice, ``meta[1]`` the out-of-range ones,
    ``meta[2] = len(seeds)``; ``k0`` the first hop's ``min(deg, fanout)`` of every seed."""
    b, n = int(seeds.shape[0]), num_nodes
    ok, _slot, repeated = number_seeds(seeds, loc, n)
    loc.narrow(0, n, 1).fill_(-1)  # (t[i] = v copies v up from the host and waits)
    g = torch.where(ok, seeds, 0)
    nodes.narrow(0, 0, b).copy_(g)
    k0.copy_(torch.clamp(indptr[g + 1] - indptr[g], max=max(fanout, 0)))
    meta.narrow(0, 0, 2).copy_(torch.stack([repeated, b - ok.sum()]))
    meta.narrow(0, 2, 1).fill_(b)


def relabel_step_torch(src, ecnt, loc, first, nodes, meta, h: int, cap: int, nxt=None):
    """One hop's relabelling in torch ops (:func:`relabel_torch`) with the bookkeeping of
    :func:`gnnio.sampling._triton_relabel.relabel_triton`: the node count after hop ``h`` to
    ``meta[3 + h]`` and the hop's edge count ``ecnt`` to ``meta[3 + L + h]``; with ``nxt =
    (k, rows, fanout, indptr)`` the next hop's ``min(deg, fanout)`` of its ``rows`` rows into
    ``k`` (0 past the node count). Returns the local ids of the edges' sources."""
    L = (int(meta.shape[0]) - 3) // 3
    count = meta.narrow(0, 2 + h, 1)
    local, after = relabel_torch(src, ecnt, loc, first, nodes, count, cap)
    meta.narrow(0, 3 + h, 1).copy_(after)
    meta.narrow(0, 3 + L + h, 1).copy_(ecnt)
    if nxt is not None:
        k, rows, fanout, ip = nxt
        g = nodes[:rows]
        live = torch.arange(rows, device=g.device) < after
        k.copy_(torch.where(live, torch.clamp(ip[g + 1] - ip[g], max=max(fanout, 0)), 0))
    return local


class _Buffers:
    """The bounded batch's device buffers, allocated once per sampler scratch and batch size and
    reused (their views too: no slice op per batch). ``meta`` (int64 ``[3 + 3L]``): seeds given
    twice, seeds out of range, the node count before hop 0 .. after hop L-1, each hop's edge
    count, each torch hop's rejection flag -- the end's one host read. ``cum[h]`` (``[R_h + 1]``,
    ``cum[h][0] = 0``): hop ``h``'s cumulative ``k``: its rows' output offsets, its edge count
    at ``[R_h]``, and the block's CSR pointer (a prefix)."""

    def __init__(self, rows: list, edges: list, dev: torch.device):
        L, em = len(edges), max(edges, default=0)

        def z(n: int) -> torch.Tensor:
            return torch.zeros(n, dtype=torch.int64, device=dev)

        self.meta, self.nodes = z(3 + 3 * L), z(rows[-1] + 1)
        self.cum = [z(rows[h] + 1) for h in range(L)]
        self.k = [c[1:] for c in self.cum]
        self.ecnt = [c[r:] for c, r in zip(self.cum, rows, strict=False)]
        self.count = [self.meta[2 + h : 3 + h] for h in range(L)]
        src, flag, rank = z(em), z(em), z(em)
        self.src = [src[:e] for e in edges]
        self.work = [(flag[:e], rank[:e]) for e in edges]
        self.local = [z(e) for e in edges]
        self.row = [z(e) for e in edges]
        self.uses = 0  # batches sampled with this set (which set a full scratch drops)
        self._own = [self.meta, self.nodes, *self.cum, src, flag, rank, *self.local, *self.row]
        self._edges = edges
        self._w: list[torch.Tensor] | None = None
        self.graph: dict = {}  # :mod:`.gpu_graphed`'s state for this set, per kind of hop

    def weights(self) -> list:
        """Per hop a float32 ``[E_h]`` buffer for edge weights a hop kernel writes (the
        locality-aware one's, :mod:`.locality_torch`), made at the first call (never inside a
        CUDA graph's capture: its caller asks before the launches) and reused."""
        if self._w is None:  # (one buffer, a slice per hop: every hop's stay until the end)
            w = torch.empty(sum(self._edges), dtype=torch.float32, device=self.meta.device)
            self._w = list(w.split(self._edges))
            self._own.append(w)
        return self._w

    def tensors(self) -> list:
        """Every tensor the set owns (views aside), and its graphs' static inputs."""
        return self._own + [st.inp for st in self.graph.values()]


def _triton(dev: torch.device, kernel: str):
    """The Triton kernels' module where ``kernel`` runs as Triton on ``dev``, else None."""
    if not triton_available(dev, kernel):
        return None
    from . import _triton_hop, _triton_relabel

    return _triton_relabel if kernel == "relabel" else _triton_hop


def _failed(kernel: str, e: BaseException) -> None:
    what = "sampling" if kernel == "sample_hop" else "relabelling"
    kernel_failed(kernel, e, f"{what} with torch ops instead (same batches)")


def _relabel_kernel(dev: torch.device, name: str, fallback, *args) -> None:
    """``_triton_relabel.<name>(*args)`` where the relabelling kernels run on ``dev``; else, and
    where it fails (one warning), ``fallback(*args)``: the same writes in torch ops."""
    mod = _triton(dev, "relabel")
    if mod is not None:
        try:
            getattr(mod, name)(*args)
            return
        except Exception as err:  # noqa: BLE001 - a Triton that cannot build it: torch ops
            _failed("relabel", err)
    fallback(*args)


def _hop(sampler, buf: _Buffers, h: int, n_rows: int, hk, loc, first):
    """Hop ``h``'s draws with hop key ``hk`` (an int, or an int64 ``[1]`` device tensor of its
    bits: :mod:`.gpu_graphed`): ``(src, row, claimed)``, as the Triton kernel (into the reused
    buffers, claiming for the relabelling) where it runs, else torch ops (rejection flag to
    ``meta``)."""
    fanout, e = sampler.fanouts[h], int(buf.src[h].shape[0])
    ip, ix = sampler.indptr, sampler.indices
    if e == 0:  # nothing to draw (fanout 0, no rows or no edges): no kernel of either kind
        return buf.src[h], buf.row[h], False
    theta = sampler.thresholds[h]  # HyDRA's pruning (0: none)
    mod = _triton(sampler.device, "sample_hop") if fanout > 0 else None
    if mod is not None:
        try:
            out = (buf.src[h], buf.row[h])
            mod.sample_hop_triton(ip, ix, buf.nodes, fanout, hk, e, buf.count[h], buf.cum[h],
                                  out=out, claim=(loc, first), rows=n_rows, theta=theta)  # fmt: skip
            kernel_ran("hop", "triton")
            return out[0], out[1], True
        except Exception as err:  # noqa: BLE001 - a Triton that cannot build it: torch ops
            _failed("sample_hop", err)
    if isinstance(hk, torch.Tensor):  # (a kernel that failed while a graph was being prepared)
        hk = int(hk.item()) & ((1 << 64) - 1)
    src, row, redo = sample_hop_torch(ip, ix, buf.nodes[:n_rows], fanout, hk, e, False,
                                      buf.count[h], buf.cum[h][:n_rows], theta)  # fmt: skip
    L = len(sampler.fanouts)
    buf.meta.narrow(0, 3 + 2 * L + h, 1).copy_(redo.view(1))
    return src, row, False


def _relabel(sampler, buf: _Buffers, h: int, rows: list, src, claimed: bool, loc, first):
    """Hop ``h``'s relabelling (module docstring): the sources' local ids."""
    L, cap, dev = len(sampler.fanouts), rows[-1], sampler.device
    nxt = None
    if h + 1 < L:
        nxt = (buf.k[h + 1], rows[h + 1], sampler.k_fanouts[h + 1], sampler.indptr)
    args = (src, buf.ecnt[h], loc, first, buf.nodes, buf.meta, h, cap)
    mod = _triton(dev, "relabel") if src.shape[0] else None
    if mod is not None:
        try:
            out = (buf.local[h], *buf.work[h])
            local = mod.relabel_triton(*args, out, claimed, nxt)
            kernel_ran("relabel", "triton")
            return local
        except Exception as err:  # noqa: BLE001 - a Triton that cannot build it: torch ops
            _failed("relabel", err)  # (loc and nodes untouched; the torch steps claim again)
    if src.shape[0]:  # (an empty hop's bookkeeping ran no kernel of either kind)
        kernel_ran("relabel", "torch")
    return relabel_step_torch(*args, nxt)


def plan(sampler, b: int, slack: int = 1) -> tuple[list, list] | None:
    """The bounds ``(rows, edges)`` of a batch of ``b`` seeds, or None where the synced path
    must sample it (a fanout of -1, an edge bound past :data:`MAX_EDGE_SLOTS`). ``slack``
    multiplies the fanouts in the bounds (a hop whose rows may keep more than the fanout:
    LABOR-0's Poisson design, :mod:`gnnio.sampling.labor_torch`)."""
    fanouts = sampler.k_fanouts  # (a row's draws: at most the fanout, or a pruning window)
    if not fanouts or min(fanouts) < 0:
        return None
    fanouts = [f * slack for f in fanouts]
    rows, edges = bounds(b, fanouts, sampler.num_nodes, int(sampler.indices.shape[0]))
    if max(edges, default=0) > MAX_EDGE_SLOTS:
        return None
    return rows, edges


def buffers(cache: dict, b: int, rows: list, edges: list, dev: torch.device) -> _Buffers:
    """The scratch's reused buffer set for batches of ``b`` seeds, made where there is none.
    The scratch keeps at most three sets (a full batch's, the last one's, an evaluation's); a
    fourth size drops the least used."""
    buf = cache.get(b)
    if buf is None:
        if len(cache) >= 3:
            gone = cache.pop(min(cache, key=lambda size: cache[size].uses))
            if dev.type == "cuda":  # last read maybe on another thread's stream (which ours
                cur = torch.cuda.current_stream(dev)  # waited for in _take): freed after ours
                for t in gone.tensors():
                    t.record_stream(cur)
            if gone.graph:  # its CUDA graphs destroyed, never beside a capture
                with CAPTURE_LOCK:
                    gone.graph.clear()
        buf = cache[b] = _Buffers(rows, edges, dev)
    buf.uses += 1
    return buf


def launch(sampler, buf: _Buffers, rows: list, seeds, keys, loc, first, reset=None,
           mark: bool = True, hop=None) -> list:  # fmt: skip
    """The batch's launches, none of which reads the device on the host: the seeds, then per
    hop the draws with hop key ``keys[h]`` and the relabelling; with ``reset`` (the node
    count's bound) the scratch put back at rest at the end, by the device-held count. ``mark``:
    call the sampler's phase hook between the steps. ``hop``: the draws (default the uniform
    ones, :func:`_hop`; LABOR-0's :func:`gnnio.sampling.labor_torch.labor_hop`, same
    signature). Returns every hop's ``(local, row)`` buffers."""
    hop = hop or _hop
    dev, fanouts = sampler.device, sampler.fanouts
    buf.meta.zero_()
    _relabel_kernel(dev, "seeds_triton", seeds_torch, seeds, loc, buf.nodes, buf.k[0], buf.meta,
                    sampler.indptr, sampler.num_nodes, sampler.k_fanouts[0])  # fmt: skip
    hop_edges = []
    for h in range(len(fanouts)):
        buf.k[h].cumsum_(0)  # the rows' output offsets, and the hop's edge count at the end
        src, row, claimed = hop(sampler, buf, h, rows[h], keys[h], loc, first)
        if mark:
            sampler._mark("sample")
        local = _relabel(sampler, buf, h, rows, src, claimed, loc, first)
        if mark:
            sampler._mark("relabel")
        hop_edges.append((local, row))
    if reset is not None:
        last = buf.meta.narrow(0, 2 + len(fanouts), 1)
        _relabel_kernel(dev, "reset_triton", _reset_torch, buf.nodes, reset, loc, first, last)
    return hop_edges


def finish(sampler, buf: _Buffers, rows: list, edges: list, seeds, hop_edges, loc, first, cache,
           reset: bool = True, weighted=None) -> MiniBatch | None:  # fmt: skip
    """The batch's one host sync and its arrays (module docstring); gives the scratch back.
    ``reset``: put the scratch at rest (False: :func:`launch` did, and ``seeds`` is a static
    buffer: the batch's seeds are then the head of its node list). ``weighted``: per hop
    whether its kernel wrote the edges' weights into :meth:`_Buffers.weights` (copied out as
    the blocks' ``edge_weight``; the others None). Raises ValueError for bad
    seeds (``seeds``: the batch's, on the device); None where the torch draws must be redone
    or a hop drew more edges than its bound ``edges[h]`` (LABOR-0's Poisson rows)."""
    L, cap, b = len(sampler.fanouts), rows[-1], int(seeds.shape[0])
    head = buf.meta.tolist()  # the batch's one host sync
    hop_nodes = [min(c, cap) for c in head[2 : 3 + L]]
    sizes = head[3 + L : 3 + 2 * L]
    over = any(s > e for s, e in zip(sizes, edges, strict=True))  # (a hop past its bound)
    rep, bad, redo = head[0], head[1], any(head[3 + 2 * L :]) or over
    if b and (rep or bad):
        loc.fill_(-1)  # (the error path: writes past the node buffer were dropped)
        first.fill_(_SENTINEL)
        sampler._give(loc, first, cache)
        raise bad_seeds(seeds, int(seeds.min()), int(seeds.max()), sampler.num_nodes)
    if reset:
        _relabel_kernel(sampler.device, "reset_triton", _reset_torch, buf.nodes, hop_nodes[-1],
                        loc, first)  # fmt: skip
    if redo:
        sampler._give(loc, first, cache)
        return None
    # the batch's arrays, copied out of the reused buffers in one op: the input nodes, then per
    # hop the sources' local ids, the destinations, and the CSR pointer (a prefix of cum)
    parts, lengths = [buf.nodes[: hop_nodes[-1]]], [hop_nodes[-1]]
    for h in range(L):
        local, row = hop_edges[h]
        parts += [local[: sizes[h]], row[: sizes[h]], buf.cum[h][: hop_nodes[h] + 1]]
        lengths += [2 * sizes[h], hop_nodes[h] + 1]
    flat = torch.cat(parts).split(lengths)
    hops_w = [h for h in range(L) if weighted is not None and weighted[h]]
    w = [None] * L
    if hops_w:  # (float32: a copy of their own, also before the scratch goes back)
        ws = buf.weights()
        got = torch.cat([ws[h][: sizes[h]] for h in hops_w]).split([sizes[h] for h in hops_w])
        for h, x in zip(hops_w, got, strict=True):
            w[h] = x
    sampler._give(loc, first, cache)  # after the copy: another thread may write them next
    blocks = []
    for h in range(L - 1, -1, -1):  # edges grouped by destination (the CSR pointer: no sort)
        ei = flat[1 + 2 * h].view(2, sizes[h])
        blocks.append(Block(ei, num_src=hop_nodes[h + 1], num_dst=hop_nodes[h],
                            ptr=flat[2 + 2 * h], edge_weight=w[h]))  # fmt: skip
    if not reset:  # ``seeds`` a static buffer (a graph's): the node list's head, a copy
        seeds = flat[0][:b]
    return MiniBatch(seeds=seeds, input_nodes=flat[0], blocks=blocks, meta={"hop_nodes": hop_nodes})


def sample_bounded(sampler, seeds: torch.Tensor, key: int, hop=None, slack: int = 1,
                   keys=None, weighted=None) -> MiniBatch | None:  # fmt: skip
    """One batch of ``sampler`` (a :class:`~gnnio.sampling.gpu.TorchUniformSampler`) around
    int64 ``seeds`` with one host sync (module docstring). None where the synced path must
    sample it: a fanout of -1, an edge bound past :data:`MAX_EDGE_SLOTS`, torch draws to
    redo step by step, or a hop that drew more edges than its bound. Raises ValueError for bad
    seeds. ``hop``, ``slack``: another sampler's draws and bound (:func:`launch`,
    :func:`plan`; LABOR-0), ``keys``: its hop keys (default ``hop_key(key, h)``),
    ``weighted``: the hops whose kernel writes edge weights (:func:`finish`)."""
    b = int(seeds.shape[0])
    bounded = plan(sampler, b, slack)
    if bounded is None:
        return None
    rows, edges = bounded
    loc, first, cache = sampler._take(cache=True)
    buf = buffers(cache, b, rows, edges, sampler.device)
    if weighted is not None:
        buf.weights()
    if keys is None:
        keys = [hop_key(key, h) for h in range(len(sampler.fanouts))]
    hop_edges = launch(sampler, buf, rows, seeds, keys, loc, first, hop=hop)
    return finish(sampler, buf, rows, edges, seeds, hop_edges, loc, first, cache,
                  weighted=weighted)  # fmt: skip


def _reset_torch(nodes: torch.Tensor, n: int, loc, first, count=None) -> None:
    """The scratch at rest again: ``loc`` -1 and ``first`` the sentinel at the batch's nodes
    (the first ``n``; with ``count`` on the device, the first ``min(n, count)``)."""
    ids = nodes[:n]
    if count is not None:  # the rest point at the dummy slot, set back after
        ids = torch.where(torch.arange(n, device=ids.device) < count, ids, loc.shape[0] - 1)
    loc.index_fill_(0, ids, -1)
    first.index_fill_(0, ids, _SENTINEL)
