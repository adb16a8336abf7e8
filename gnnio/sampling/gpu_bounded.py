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
the device-held ``count`` (the last slot a dummy). Hop ``h``'s destination rows are the buffer's
first ``R_h`` entries, of which the first ``count`` are real (the hop kernel masks the rest:
:func:`gnnio.sampling.gpu_hop.sample_hop_torch`'s bounded form); its edges fill a prefix of the
``E_h``-slot edge buffers, ``e_count`` long. The relabelling (:func:`relabel`) numbers the edges'
new sources in first-appearance order -- the order the synced path and the CPU sampler give:
seeds first, then new nodes in order of first appearance -- as a Triton kernel on CUDA
(:mod:`._triton_relabel`) or, where Triton cannot build it (one warning, recorded in the
``kernels`` report as ``relabel``), the same steps in torch ops (:func:`relabel_torch`).

At the end **one** host sync reads the seeds' range and repeats, every hop's node and edge count
and the torch hop's rejection flags; then the blocks are the buffers' prefixes. Bad seeds are
reported then (out-of-range ids were sampled as node 0 meanwhile, so nothing reads out of
bounds). A batch whose fast torch draws met a Lemire rejection (``d / 2**32`` per draw, the
Triton hop never does) returns None and is drawn again by the synced path (same batch).
"""

from __future__ import annotations

import torch

from ..utils.triton_kernels import kernel_failed, kernel_ran, triton_available
from .base import Block, MiniBatch, dst_ptr
from .gpu_hop import _SENTINEL, sample_hop_torch
from .threaded import hop_key

__all__ = ["MAX_EDGE_SLOTS", "bounds", "relabel", "relabel_torch", "sample_bounded"]

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


def relabel(src, e_count, loc, first, nodes, count, cap) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`relabel_torch`'s contract, as the Triton kernels where they run (same results)."""
    if triton_available(src.device, "relabel"):
        try:
            from ._triton_relabel import relabel_triton

            out = relabel_triton(src, e_count, loc, first, nodes, count, cap)
            kernel_ran("relabel", "triton")
            return out
        except Exception as e:  # noqa: BLE001 - a Triton that cannot build it: the torch path
            first.fill_(_SENTINEL)  # _claim may have run; loc and nodes are written last
            kernel_failed("relabel", e, "relabelling with torch ops instead (same batches)")
    kernel_ran("relabel", "torch")
    return relabel_torch(src, e_count, loc, first, nodes, count, cap)


def sample_bounded(sampler, seeds: torch.Tensor, key: int) -> MiniBatch | None:
    """One batch of ``sampler`` (a :class:`~gnnio.sampling.gpu.TorchUniformSampler`) around
    int64 ``seeds`` with one host sync (module docstring). None where the synced path must
    sample it: a fanout of -1, an edge bound past :data:`MAX_EDGE_SLOTS`, or torch draws to
    redo step by step. Raises ValueError for bad seeds."""
    dev, n_nodes, ip = sampler.device, sampler.num_nodes, sampler.indptr
    b = int(seeds.shape[0])
    if min(sampler.fanouts, default=0) < 0:
        return None
    rows, edges = bounds(b, sampler.fanouts, n_nodes, int(sampler.indices.shape[0]))
    if max(edges, default=0) > MAX_EDGE_SLOTS:
        return None
    cap = rows[-1]
    loc, first = sampler._take()
    ok = (seeds >= 0) & (seeds < n_nodes)
    slot = torch.where(ok, seeds, n_nodes)
    loc[slot] = torch.arange(b, device=dev)
    repeated = ((loc[slot] != torch.arange(b, device=dev)) & ok).sum().view(1)
    loc.narrow(0, n_nodes, 1).fill_(-1)  # (t[i] = v copies v up from the host and waits)
    nodes = torch.zeros(cap + 1, dtype=torch.int64, device=dev)
    nodes[:b] = torch.where(ok, seeds, 0)  # bad seeds sampled as node 0 until the end's check
    count = torch.full((1,), b, dtype=torch.int64, device=dev)
    counts, e_counts, hop_edges, redos = [], [], [], []
    for h, fanout in enumerate(sampler.fanouts):
        dst = nodes[: rows[h]]
        live = torch.arange(rows[h], device=dev) < count
        deg = torch.where(live, ip[dst + 1] - ip[dst], 0)
        k = torch.clamp(deg, max=fanout)
        cum = torch.cumsum(k, 0)
        e_count = torch.clamp(cum[-1:], max=edges[h]) if rows[h] else count * 0
        src, row, redo = sample_hop_torch(ip, sampler.indices, dst, fanout, hop_key(key, h),
                                          edges[h], False, count, cum - k)  # fmt: skip
        sampler._mark("sample")
        local, count = relabel(src, e_count, loc, first, nodes, count, cap)
        sampler._mark("relabel")
        counts.append(count)
        e_counts.append(e_count)
        redos.append(redo.view(1))
        hop_edges.append((local, row))
    lo_hi = torch.stack([seeds.min(), seeds.max()]) if b else torch.zeros(2, device=dev)
    head = torch.cat([lo_hi.long(), repeated, *counts, *e_counts, *redos]).tolist()  # the sync
    L = len(sampler.fanouts)
    lo, hi, rep = head[0], head[1], head[2]
    hop_nodes = [b] + [min(c, cap) for c in head[3 : 3 + L]]
    sizes, redo = head[3 + L : 3 + 2 * L], any(head[3 + 2 * L :])
    input_nodes = nodes[: hop_nodes[-1]]
    loc.index_fill_(0, input_nodes, -1)
    sampler._give(loc, first)
    if b and (lo < 0 or hi >= n_nodes or rep):
        if lo < 0 or hi >= n_nodes:
            raise ValueError(f"seeds: node id {lo if lo < 0 else hi} out of range [0, {n_nodes})")
        dup = int(torch.nonzero(torch.bincount(seeds) > 1)[0, 0])  # error path: sync is fine
        raise ValueError(f"seeds: node id {dup} appears more than once; seeds must be distinct")
    if redo:
        return None
    blocks = []
    for h in range(L - 1, -1, -1):  # edges grouped by destination: the CSR pointer, no sync
        local, row = hop_edges[h]
        ei = torch.stack([local[: sizes[h]], row[: sizes[h]]])
        blocks.append(Block(ei, num_src=hop_nodes[h + 1], num_dst=hop_nodes[h],
                            ptr=dst_ptr(ei, hop_nodes[h])))  # fmt: skip
    return MiniBatch(
        seeds=seeds, input_nodes=input_nodes, blocks=blocks, meta={"hop_nodes": hop_nodes}
    )
