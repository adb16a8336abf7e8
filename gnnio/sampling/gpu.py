"""Uniform neighbour sampling with vectorized torch ops, for topology held on a GPU.

The same contract as :class:`gnnio.sampling.uniform.UniformSampler` (whose ``device="cuda"`` path
lands here): fanout order, fresh sampling for every destination of every hop, first-appearance
local ids, blocks ordered input layer first. Nothing here is CUDA-specific, so the logic is tested
on CPU tensors; on a GPU every step is a handful of kernels with no per-node Python.

Per hop, with ``d`` the degree and ``k = min(d, fanout)`` of each destination row:

* ``k == d``: the whole row (segmented ``arange``);
* ``k < d <= 4k`` ("dense" rows): a float64 random key per CSR position, sort by key then stably
  by row, keep each row's first ``k`` -- a uniform ``k``-subset, costing ``O(d) <= O(4k)``;
* ``d > 4k`` ("sparse" rows): ``k`` independent uniform positions per row, then repeatedly sort
  ``(row, position)``, find repeats and redraw them until every row's positions are distinct.
  Each redraw collides with probability ``< 1/4``, so a few rounds suffice. The procedure treats
  all positions symmetrically, so the final ``k``-subset is uniform.

Relabelling uses two dense ``int64 [num_nodes]`` scratch tensors on the device (``loc``: global ->
local id, ``first``: first edge position of a not-yet-seen node via ``scatter_reduce(amin)``),
reset after each batch by touching only the batch's entries.

Random numbers come from a ``torch.Generator`` on the graph's device seeded from the call key, so a
batch is reproducible on the same device and torch version, but differs from the CPU kernels'.
Positions are drawn as ``floor(u * d)`` with 53-bit ``u``: the bias is below ``d / 2**53``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from .base import Block, MiniBatch

__all__ = ["TorchUniformSampler", "sample_hop_torch", "DENSE_FACTOR"]

#: rows with ``fanout < deg <= DENSE_FACTOR * fanout`` use the sort-based method
DENSE_FACTOR = 4
_SENTINEL = torch.iinfo(torch.int64).max
_MAX_REDRAW_ROUNDS = 10_000


def _repeat_rows(counts: torch.Tensor, total: int) -> torch.Tensor:
    """``i`` repeated ``counts[i]`` times (``total = counts.sum()``), as int64.

    Same as ``repeat_interleave(arange(n), counts)``, built from a cumulative sum of row-start
    marks instead: ATen's CPU ``repeat_interleave`` runs an OpenMP loop of grain 1, which cost
    ~14 ms per call on a loaded 2-core machine even for tiny inputs.
    """
    marks = torch.zeros(total, dtype=torch.int64, device=counts.device)
    ends = torch.cumsum(counts, 0)[:-1]
    ends = ends[ends < total]
    marks.index_add_(0, ends, torch.ones_like(ends))
    return torch.cumsum(marks, 0)


def _segment_arange(counts: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For ``counts`` ``[n]``: ``(row, j)`` of length ``total = counts.sum()`` with ``row``
    repeating ``i`` ``counts[i]`` times and ``j`` running ``0 .. counts[i] - 1`` within it."""
    row = _repeat_rows(counts, total)
    starts = torch.cumsum(counts, 0) - counts
    j = torch.arange(total, device=counts.device) - starts[row]
    return row, j


def _sort_pairs(row: torch.Tensor, val: torch.Tensor, max_val: int) -> torch.Tensor:
    """Permutation sorting by ``(row, val)`` lexicographically."""
    n_rows = int(row.max()) + 1 if row.numel() else 0
    if n_rows * (max_val + 1) < 2**62:
        return torch.sort(row * (max_val + 1) + val).indices
    perm = torch.sort(val, stable=True).indices
    return perm[torch.sort(row[perm], stable=True).indices]


def sample_hop_torch(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    dst_nodes: torch.Tensor,
    fanout: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One hop of uniform sampling without replacement on any device.

    Args:
        indptr: int64 ``[N + 1]``; indices: ``[E]`` (int32 or int64) -- CSR of in-neighbours.
        dst_nodes: int64 global ids of the destination rows.
        fanout: neighbours per row, ``-1`` = all.
        generator: a ``torch.Generator`` on the tensors' device.

    Returns:
        ``(src, dst)`` int64 ``[E']``: global ids of the sampled neighbours and the local id
        (position in ``dst_nodes``) of their row, grouped by row in ``dst_nodes`` order.
    """
    dev = dst_nodes.device
    start = indptr[dst_nodes]
    deg = indptr[dst_nodes + 1] - start
    k = deg if fanout < 0 else torch.clamp(deg, max=fanout)
    row_off = torch.cumsum(k, 0) - k
    total = int(k.sum())
    pos = torch.empty(total, dtype=torch.int64, device=dev)

    def place(rows: torch.Tensor, r: torch.Tensor, j: torch.Tensor, p: torch.Tensor) -> None:
        # the j-th pick of row rows[r] is CSR position start + p
        pos[row_off[rows[r]] + j] = start[rows[r]] + p

    full = torch.nonzero(k == deg).squeeze(1)
    if full.numel():
        cnt = deg[full]
        r, j = _segment_arange(cnt, int(cnt.sum()))
        place(full, r, j, j)
    partial = (k < deg) & (k > 0)
    dense = torch.nonzero(partial & (deg <= DENSE_FACTOR * k)).squeeze(1)
    if dense.numel():
        cnt = deg[dense]
        n_pos = int(cnt.sum())
        r, j = _segment_arange(cnt, n_pos)
        keys = torch.rand(n_pos, dtype=torch.float64, device=dev, generator=generator)
        perm = torch.sort(keys).indices
        perm = perm[torch.sort(r[perm], stable=True).indices]  # rows grouped, random within
        r, j = r[perm], j[perm]
        rank = torch.arange(n_pos, device=dev) - (torch.cumsum(cnt, 0) - cnt)[r]
        keep = rank < k[dense][r]
        place(dense, r[keep], rank[keep], j[keep])
    sparse = torch.nonzero(partial & (deg > DENSE_FACTOR * k)).squeeze(1)
    if sparse.numel():
        kk, dd = k[sparse], deg[sparse]
        r, j = _segment_arange(kk, int(kk.sum()))
        d_r = dd[r]
        p = _draw(d_r, generator)
        max_d = int(dd.max())
        for _ in range(_MAX_REDRAW_ROUNDS):
            perm = _sort_pairs(r, p, max_d)
            rs, ps = r[perm], p[perm]
            dup = (rs[1:] == rs[:-1]) & (ps[1:] == ps[:-1])
            redo = perm[1:][dup]
            if redo.numel() == 0:
                break
            p[redo] = _draw(d_r[redo], generator)
        else:  # pragma: no cover - probability ~ 4**-10000
            raise RuntimeError("sample_hop_torch: redrawing repeated positions did not converge")
        place(sparse, r, j, p)
    src = indices[pos].to(torch.int64)
    dst = _repeat_rows(k, total)
    return src, dst


def _draw(bound: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Uniform integers in ``[0, bound)`` elementwise (``bound >= 1``)."""
    u = torch.rand(bound.shape[0], dtype=torch.float64, device=bound.device, generator=generator)
    return torch.minimum((u * bound).to(torch.int64), bound - 1)


class TorchUniformSampler:
    """Vectorized uniform sampler over torch CSR tensors (any device; meant for CUDA).

    Args:
        indptr: int64 ``[N + 1]``; indices: ``[E]`` -- CSR of in-neighbours, on the sampling device.
        fanouts: per hop, ``fanouts[0]`` = the seeds' hop (see :mod:`gnnio.sampling.uniform`).

    :meth:`sample` takes the 64-bit call key explicitly; :class:`UniformSampler` derives it from its
    seed and call counter / ``epoch_seed``. Thread-safe (scratch tensors come from a pool).
    """

    def __init__(self, indptr: torch.Tensor, indices: torch.Tensor, fanouts: Sequence[int]):
        self.indptr = indptr.to(torch.int64).contiguous()
        self.indices = indices.contiguous()
        if self.indices.device != self.indptr.device:
            raise ValueError(
                f"graph: indptr on {self.indptr.device} but indices on {self.indices.device}"
            )
        self.fanouts = [int(f) for f in fanouts]
        self.num_nodes = int(self.indptr.shape[0]) - 1
        self._lock = threading.Lock()
        self._scratch: list[tuple[torch.Tensor, torch.Tensor]] = []

    @property
    def device(self) -> torch.device:
        return self.indptr.device

    def _take(self) -> tuple[torch.Tensor, torch.Tensor]:
        with self._lock:
            if self._scratch:
                return self._scratch.pop()
        n, dev = self.num_nodes, self.device
        loc = torch.full((n,), -1, dtype=torch.int64, device=dev)
        first = torch.full((n,), _SENTINEL, dtype=torch.int64, device=dev)
        return loc, first

    def _give(self, scratch: tuple[torch.Tensor, torch.Tensor]) -> None:
        with self._lock:
            self._scratch.append(scratch)

    def sample(self, seeds, key: int) -> MiniBatch:
        """Sample around ``seeds`` (distinct global ids) with the random stream of ``key``."""
        dev = self.device
        seeds = torch.as_tensor(seeds, device=dev)
        if seeds.dim() != 1:
            raise ValueError(f"seeds: need a 1-D array of node ids, got shape {tuple(seeds.shape)}")
        if seeds.is_floating_point() or seeds.is_complex() or seeds.dtype == torch.bool:
            raise ValueError(f"seeds: need integer node ids, got dtype {seeds.dtype}")
        seeds = seeds.to(torch.int64)
        b = int(seeds.shape[0])
        if b:
            lo, hi = int(seeds.min()), int(seeds.max())
            if lo < 0 or hi >= self.num_nodes:
                bad = lo if lo < 0 else hi
                raise ValueError(f"seeds: node id {bad} out of range [0, {self.num_nodes})")
        gen = torch.Generator(device=dev)
        gen.manual_seed(int(key) & ((1 << 63) - 1))
        loc, first = self._take()
        ar = torch.arange(b, device=dev)
        loc[seeds] = ar
        if b and not bool((loc[seeds] == ar).all()):
            counts = torch.bincount(seeds)
            dup = int(torch.nonzero(counts > 1)[0, 0])
            loc[seeds] = -1
            self._give((loc, first))
            raise ValueError(f"seeds: node id {dup} appears more than once; seeds must be distinct")
        parts = [seeds]
        hop_nodes = [b]
        hop_edges = []
        dst_nodes = seeds
        for fanout in self.fanouts:
            src, dst = sample_hop_torch(self.indptr, self.indices, dst_nodes, fanout, gen)
            new = _relabel(src, loc, first, hop_nodes[-1])
            parts.append(new)
            hop_nodes.append(hop_nodes[-1] + int(new.shape[0]))
            hop_edges.append(torch.stack([loc[src], dst]))
            dst_nodes = torch.cat(parts)
        loc[dst_nodes] = -1
        self._give((loc, first))
        blocks = [
            Block(hop_edges[h], num_src=hop_nodes[h + 1], num_dst=hop_nodes[h])
            for h in range(len(hop_edges) - 1, -1, -1)
        ]
        return MiniBatch(
            seeds=seeds, input_nodes=dst_nodes, blocks=blocks, meta={"hop_nodes": hop_nodes}
        )


def _relabel(src: torch.Tensor, loc: torch.Tensor, first: torch.Tensor, base: int) -> torch.Tensor:
    """Give the nodes of ``src`` not yet in ``loc`` ids ``base, base + 1, ...`` in order of first
    appearance; returns those new nodes (global ids). ``first`` is all-sentinel on entry and exit."""
    unknown = torch.nonzero(loc[src] < 0).squeeze(1)  # ascending edge positions
    g = src[unknown]
    first.scatter_reduce_(0, g, unknown, reduce="amin", include_self=True)
    new = g[first[g] == unknown]
    first[g] = _SENTINEL
    loc[new] = base + torch.arange(new.shape[0], device=src.device)
    return new
