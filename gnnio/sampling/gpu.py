"""Uniform neighbour sampling with vectorized torch ops, for topology held on a GPU.

The same contract as :class:`gnnio.sampling.uniform.UniformSampler` (whose ``device="cuda"`` path
lands here): fanout order, fresh sampling for every destination of every hop, first-appearance
local ids, blocks ordered input layer first. Nothing here is CUDA-specific, so the logic is tested
on CPU tensors; on a GPU every step is a handful of kernels with no per-node Python. Each hop's
draws are :func:`gnnio.sampling.gpu_hop.sample_hop_torch` (on CUDA with Triton one kernel,
:mod:`._triton_hop`; measured on an H100: 8.7 -> 2.6 ms per batch of 1024 seeds, fanouts 15,10,5,
the same batches).

Host synchronisations: with every fanout ``>= 0`` a batch is sampled into buffers of bounded size
(:mod:`gnnio.sampling.gpu_bounded`: sizes bounded above from the fanouts, the relabelling a Triton
kernel or the same steps in torch ops) and reads the device **once**, at its end, for its sizes
and its seeds' checks (issue 24). With fanout ``-1`` (all neighbours; no useful bound), and for a
batch whose fast torch draws met a Lemire rejection, or bounds past
:data:`gnnio.sampling.gpu_bounded.MAX_EDGE_SLOTS`, the synced path below runs: one sync for the
seeds (range, repeats, and how many edges each later hop will draw from them) and one per hop (how
many new nodes it found, and their edges in the later hops), ``len(fanouts) + 1`` per batch.
Nothing else reads a device value on the host: no ``nonzero``, no boolean-mask indexing, no
``.item()``; nor waits for the stream: no ``t[i] = 5`` (torch copies the 5 up from the host and
waits; ``index_fill_`` / ``fill_`` take it as an argument). :func:`count_syncs` counts them all
(tests hold both paths to their bounds on the CPU).

Relabelling uses two dense ``int64 [num_nodes + 1]`` scratch tensors on the device (``loc``:
global -> local id, ``first``: first edge position of a not-yet-seen node via
``scatter_reduce(amin)``; the extra slot absorbs the writes of masked-out entries), reset after
each batch by touching only the batch's entries. Scratch goes back to a pool with an event on the
stream that last used it, and a sampler thread on another stream waits for that event before
reusing it.

``phase_hook`` (None by default): a callable the sampler calls with ``"sample"`` just before each
hop's relabelling and ``"relabel"`` just after it, so ``gnnio bench step`` times the two apart.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .base import Block, MiniBatch, dst_ptr
from .gpu_bounded import sample_bounded
from .gpu_hop import _SENTINEL, _kcount, bad_seeds, mix64_torch, number_seeds, sample_hop_torch
from .threaded import hop_key

__all__ = [
    "TorchUniformSampler",
    "count_syncs",
    "mix64_torch",
    "pinned_csr",
    "sample_hop_torch",
]
_SYNC_OPS = frozenset(
    {"__int__", "__bool__", "__float__", "__index__", "item", "tolist", "nonzero", "unique",
     "masked_select", "cpu", "numpy"}
)  # fmt: skip


class _SyncCounter(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.ops: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        sync = name in _SYNC_OPS
        if name == "__getitem__" and len(args) > 1:  # boolean-mask indexing reads a count
            idx = args[1] if isinstance(args[1], tuple) else (args[1],)
            sync = any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in idx)
        if name == "repeat_interleave" and kwargs.get("output_size") is None:
            sync = True
        if name == "__setitem__" and len(args) > 2 and not isinstance(args[2], torch.Tensor):
            # ``t[i] = 5`` on a CUDA tensor, ``i`` an int or an index tensor: torch makes the 5 a
            # CPU tensor and copies it up with a blocking copy, which waits for the stream (a
            # slice's or a bool mask's is a fill; use index_fill_ / fill_)
            idx = args[1] if isinstance(args[1], tuple) else (args[1],)
            sync = any((isinstance(i, int) and not isinstance(i, bool))
                       or (isinstance(i, torch.Tensor) and i.dtype != torch.bool)
                       for i in idx)  # fmt: skip
        if sync:
            self.count += 1
            self.ops.append(name)
        return func(*args, **kwargs)


@contextmanager
def count_syncs():
    """Count the torch calls inside the block that read a device value on the host, or assign a
    Python number by index (a blocking copy up) -- each one a host synchronisation on a GPU:
    ``with count_syncs() as c: ...; c.count, c.ops``. Works on
    CPU tensors too, which is how the tests hold the GPU sampler to its bound without a GPU."""
    with _SyncCounter() as c:
        yield c


def pinned_csr(indptr: torch.Tensor, indices: torch.Tensor, device: torch.device):
    """UVA sampling's topology: ``(indptr, indices, handles)`` where the two tensors are CUDA
    views of the host CSR, pinned in place (:mod:`gnnio.features.tiers.uva`, the tiered store's
    registration machinery): the GPU sampler's kernels read the rows they touch over PCIe and the
    CSR is never copied to the GPU (DGL's users found UVA sampling costing 5x the index memory,
    dgl#3918). If the host arrays cannot be registered where they are (a file-backed memory map,
    for instance), they are copied once into ordinary host memory and that is pinned. Keep
    ``handles`` alive as long as the views are used; ``release()`` them afterwards."""
    from ..features.tiers import uva

    views, handles = [], []
    for t in (indptr, indices):
        t = t.contiguous()
        try:
            h = uva.pin_host_tensor(t, device)
        except uva.PinError:
            t = t.clone()  # anonymous host memory: registrable
            h = uva.pin_host_tensor(t, device)
        handles.append(h)
        views.append(uva.device_view(t.view(-1, 1), device).view(-1))
    return views[0], views[1], handles


class TorchUniformSampler:
    """Vectorized uniform sampler over torch CSR tensors (any device; meant for CUDA).

    Args:
        indptr: int64 ``[N + 1]``; indices: ``[E]`` -- CSR of in-neighbours, on the sampling device
            (or pinned host memory viewed from the GPU, :mod:`gnnio.features.tiers.uva`: UVA sampling).
        fanouts: per hop, ``fanouts[0]`` = the seeds' hop (see :mod:`gnnio.sampling.uniform`).
        device: where the sampling runs and the batches are returned; None = ``indptr.device``.
        cuda_graph: replay each batch's launches as a CUDA graph (:mod:`.gpu_graphed`; the
            same batches; default off: not yet measured on a GPU).

    :meth:`sample` takes the 64-bit call key explicitly; :class:`UniformSampler` derives it from its
    seed and call counter / ``epoch_seed``. Thread-safe (scratch tensors come from a pool, each
    with the event of its last use, see the module docstring).
    """

    def __init__(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        fanouts: Sequence[int],
        device: torch.device | None = None,
        cuda_graph: bool = False,
    ):
        self.indptr = indptr if indptr.dtype == torch.int64 else indptr.to(torch.int64)
        self.indptr = self.indptr.contiguous()
        self.indices = indices.contiguous()
        if self.indices.device != self.indptr.device:
            raise ValueError(
                f"graph: indptr on {self.indptr.device} but indices on {self.indices.device}"
            )
        self._device = torch.device(device) if device is not None else self.indptr.device
        self.fanouts = [int(f) for f in fanouts]
        self.num_nodes = int(self.indptr.shape[0]) - 1
        self._lock = threading.Lock()
        self._scratch: list[tuple[torch.Tensor, torch.Tensor, Any, dict]] = []
        self.phase_hook = None  # see the module docstring (gnnio bench step's relabel timer)
        self.cuda_graph = bool(cuda_graph)
        self.thresholds = [0] * len(self.fanouts)  # HyDRA's pruning per hop (.pruned_torch)

    @property
    def k_fanouts(self) -> list[int]:
        """Each hop's cap on a row's draws, ``k = min(deg, cap)``: the fanout, or with a pruning
        threshold ``theta > 0`` (:mod:`.pruned_torch`) ``min(fanout, theta)``."""
        return [min(f, t) if t > 0 and f >= 0 else f for f, t in zip(self.fanouts, self.thresholds)]

    @property
    def device(self) -> torch.device:
        return self._device

    def _take(self, cache: bool = False):
        """``(loc, first)``, or with ``cache`` ``(loc, first, cache)``: a dict of the bounded
        path's reused buffers (:mod:`gnnio.sampling.gpu_bounded`) that travels with them."""
        with self._lock:
            item = self._scratch.pop() if self._scratch else None
        if item is not None:
            loc, first, ev, bufs = item
            if ev is not None:  # last used on another thread's stream: wait for it on ours
                torch.cuda.current_stream(self._device).wait_event(ev)
        else:
            n, dev = self.num_nodes + 1, self._device  # + 1: the dummy slot of masked writes
            loc = torch.full((n,), -1, dtype=torch.int64, device=dev)
            first = torch.full((n,), _SENTINEL, dtype=torch.int64, device=dev)
            bufs = {}
        return (loc, first, bufs) if cache else (loc, first)

    def _give(self, loc: torch.Tensor, first: torch.Tensor, cache: dict | None = None) -> None:
        ev = None
        if loc.is_cuda:
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(self._device))
        with self._lock:
            self._scratch.append((loc, first, ev, {} if cache is None else cache))

    def _mark(self, phase: str) -> None:
        if self.phase_hook is not None:
            self.phase_hook(phase)

    @staticmethod
    def _int64_seeds(seeds) -> torch.Tensor:
        """``seeds`` as an int64 tensor where they are (host or device), checked for shape and
        dtype."""
        seeds = torch.as_tensor(seeds)
        if seeds.dim() != 1:
            raise ValueError(f"seeds: need a 1-D array of node ids, got shape {tuple(seeds.shape)}")
        if seeds.is_floating_point() or seeds.is_complex() or seeds.dtype == torch.bool:
            raise ValueError(f"seeds: need integer node ids, got dtype {seeds.dtype}")
        return seeds.to(torch.int64)

    def _device_seeds(self, seeds: torch.Tensor) -> torch.Tensor:
        """Int64 ``seeds`` (:meth:`_int64_seeds`) on the sampling device (no sync: a host
        array is copied from pinned memory, queued)."""
        if self.device.type == "cuda" and not seeds.is_cuda:
            seeds = seeds.pin_memory().to(self.device, non_blocking=True)
        return seeds.to(self.device, torch.int64)

    def _start_batch(self, seeds) -> tuple[torch.Tensor, int, torch.Tensor, torch.Tensor]:
        """``(seeds, D, loc, first)``: a scratch pair taken and the seeds numbered in it
        (:meth:`_numbered_seeds`); on bad seeds the scratch goes back before the error. The
        LADIES and LABOR-i torch paths start so."""
        loc, first = self._take()
        try:
            seeds, total = self._numbered_seeds(seeds, loc)
        except ValueError:
            self._give(loc, first)
            raise
        return seeds, total, loc, first

    def _numbered_seeds(self, seeds, loc: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Seeds on the device, numbered ``0..B-1`` in ``loc``; returns them and the first hop's
        ``D`` (their neighbour entries; range, repeats and ``D`` read back together: one host
        sync). On bad seeds ``loc`` is cleared again (the dummy slot too) before the error."""
        seeds = self._device_seeds(self._int64_seeds(seeds))
        b, n = int(seeds.shape[0]), self.num_nodes
        if b == 0:
            return seeds, 0
        ok, slot, repeated = number_seeds(seeds, loc, n)
        safe = torch.where(ok, seeds, 0)
        total = (self.indptr[safe + 1] - self.indptr[safe]).sum()
        lo, hi, rep, total = torch.stack([seeds.min(), seeds.max(), repeated, total]).tolist()
        if lo < 0 or hi >= n or rep:
            loc.index_fill_(0, slot, -1)  # (out-of-range seeds wrote the dummy slot n: cleared)
            raise bad_seeds(seeds, lo, hi, n)
        return seeds, int(total)

    def sample(self, seeds, key: int) -> MiniBatch:
        """Sample around ``seeds`` (distinct global ids) with the random stream of ``key``."""
        seeds = self._int64_seeds(seeds)
        if self.cuda_graph:  # seeds and keys uploaded together, the batch one replay
            from .gpu_graphed import not_replayed, sample_graphed

            mb = sample_graphed(self, seeds, key)
            if mb is not None:
                return mb
            not_replayed(self, "the GPU sampler", int(seeds.shape[0]))
        seeds = self._device_seeds(seeds)
        mb = sample_bounded(self, seeds, key)  # one host sync
        if mb is not None:
            return mb
        return self._sample_synced(seeds, key)  # fanout -1, huge bounds, or a Lemire rejection

    def _sample_synced(self, seeds: torch.Tensor, key: int) -> MiniBatch:
        """The batch with ``len(fanouts) + 1`` host syncs (see the module docstring)."""
        dev, n_nodes, fanouts = self._device, self.num_nodes, self.fanouts
        b = int(seeds.shape[0])
        loc, first = self._take()
        ip = self.indptr
        # the batch's one sync before sampling: range, repeats, and the edges of every hop
        ok, slot, repeated = number_seeds(seeds, loc, n_nodes)
        safe = torch.where(ok, seeds, 0)
        deg = ip[safe + 1] - ip[safe]
        lo_hi = torch.stack([seeds.min(), seeds.max()]) if b else torch.zeros(2, device=dev)
        kf = self.k_fanouts
        ksum = [_kcount(deg, f).sum() for f in kf]
        head = torch.stack([lo_hi[0].long(), lo_hi[1].long(), repeated, *ksum]).tolist()
        lo, hi, rep, totals = head[0], head[1], head[2], head[3:]
        if b and (lo < 0 or hi >= n_nodes or rep):
            loc.index_fill_(0, slot, -1)  # (``loc[i] = -1``: a blocking copy of the -1)
            self._give(loc, first)
            raise bad_seeds(seeds, lo, hi, n_nodes)
        parts, hop_nodes, hop_edges = [seeds], [b], []
        dst_nodes = seeds
        for h in range(len(fanouts)):
            hk = hop_key(key, h)
            src, dst, redo = self._synced_hop(h, dst_nodes, hk, totals[h], exact=False)
            self._mark("sample")
            new, more, redo = _relabel(src, loc, first, hop_nodes[-1], ip, kf[h + 1 :], redo)
            self._mark("relabel")
            if redo:  # a rejected draw (rare): undo the numbering, draw the hop step by step
                loc.index_fill_(0, new, -1)
                src, dst, _ = self._synced_hop(h, dst_nodes, hk, totals[h], exact=True)
                new, more, _ = _relabel(src, loc, first, hop_nodes[-1], ip, kf[h + 1 :])
            for g, extra in enumerate(more):  # the new nodes' edges in the later hops
                totals[h + 1 + g] += extra
            parts.append(new)
            hop_nodes.append(hop_nodes[-1] + int(new.shape[0]))
            hop_edges.append(torch.stack([loc[src], dst]))
            dst_nodes = torch.cat(parts)
        loc.index_fill_(0, dst_nodes, -1)
        self._give(loc, first)
        blocks = [  # edges grouped by destination as on the CPU: the CSR pointer, no sync
            Block(hop_edges[h], num_src=hop_nodes[h + 1], num_dst=hop_nodes[h],
                  ptr=dst_ptr(hop_edges[h], hop_nodes[h]))
            for h in range(len(hop_edges) - 1, -1, -1)
        ]  # fmt: skip
        return MiniBatch(
            seeds=seeds, input_nodes=dst_nodes, blocks=blocks, meta={"hop_nodes": hop_nodes}
        )

    def _synced_hop(self, h: int, dst_nodes, hk: int, total: int, exact: bool):
        """The synced path's hop ``h`` from ``dst_nodes`` with hop key ``hk``, drawing ``total``
        edges: ``(src, row, redo)`` (:func:`sample_hop_torch`; another sampler's hop:
        :class:`~gnnio.sampling.locality_torch.TorchLocalitySampler`)."""
        return sample_hop_torch(self.indptr, self.indices, dst_nodes, self.fanouts[h], hk,
                                total=total, exact=exact, theta=self.thresholds[h])  # fmt: skip


def _relabel(
    src: torch.Tensor,
    loc: torch.Tensor,
    first: torch.Tensor,
    base: int,
    indptr: torch.Tensor,
    later: Sequence[int],
    redo: torch.Tensor | None = None,
) -> tuple[torch.Tensor, list[int], int]:
    """Give the nodes of ``src`` not yet in ``loc`` ids ``base, base + 1, ...`` in order of first
    appearance. Returns those new nodes (global ids), for each fanout in ``later`` how many
    edges they will draw (``sum(min(deg, fanout))``), and the value of ``redo`` (0 if None), all
    read back in the hop's one host sync.
    ``first`` is all-sentinel on entry and exit; ``loc`` / ``first`` have a dummy last slot."""
    dummy = loc.shape[0] - 1
    e = torch.arange(src.shape[0], device=src.device)
    unknown = loc[src] < 0
    first.scatter_reduce_(0, torch.where(unknown, src, dummy), e, reduce="amin")
    is_new = unknown & (first[src] == e)
    rank = torch.cumsum(is_new, 0) - 1
    first.index_fill_(0, src, _SENTINEL)  # (``first[i] = v`` on CUDA: a blocking copy of v)
    first.narrow(0, dummy, 1).fill_(_SENTINEL)
    deg = indptr[src + 1] - indptr[src]
    sums = [torch.where(is_new, _kcount(deg, f), 0).sum() for f in later]
    flag = torch.zeros((), dtype=torch.int64, device=src.device) if redo is None else redo
    counts = torch.stack([is_new.sum(), flag, *sums]).tolist()  # the hop's one host sync
    num_new = counts[0]
    target = torch.where(is_new, rank, num_new)
    new = torch.empty(num_new + 1, dtype=torch.int64, device=src.device)
    new.scatter_(0, target, src)
    new = new[:num_new]
    loc[new] = base + torch.arange(num_new, device=src.device)
    return new, counts[2:], counts[1]
