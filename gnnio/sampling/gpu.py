"""Uniform neighbour sampling with vectorized torch ops, for topology held on a GPU.

The same contract as :class:`gnnio.sampling.uniform.UniformSampler` (whose ``device="cuda"`` path
lands here): fanout order, fresh sampling for every destination of every hop, first-appearance
local ids, blocks ordered input layer first. Nothing here is CUDA-specific, so the logic is tested
on CPU tensors; on a GPU every step is a handful of kernels with no per-node Python. On CUDA with
Triton installed, each hop's draws are one Triton kernel instead (:mod:`._triton_hop`; measured on
an H100: 8.7 -> 2.6 ms per batch of 1024 seeds, fanouts 15,10,5, the same batches); the torch ops
below remain the path for CPU tensors, fanout ``-1``, and a Triton that cannot build the kernel.

Host synchronisations are what sizes require, and no more: one per batch for the seeds (range,
repeats, and how many edges each later hop will draw from them) and one per hop (how many new
nodes it found, and their edges in the later hops), i.e. ``len(fanouts) + 1`` per batch. Nothing
else reads a device value on the host: no ``nonzero``, no boolean-mask indexing, no ``.item()``.
:func:`count_syncs` counts them (a test holds the sampler to the bound on the CPU).

Per hop, with ``d`` the degree and ``k = min(d, fanout)`` of each destination row, every row's
picks fill the first ``k`` columns of a ``[rows, fanout]`` matrix:

* ``d <= fanout``: the whole row, positions ``0 .. d-1``;
* ``d > fanout``: Floyd's algorithm, vectorized over the rows: for ``i = 0 .. k-1`` with
  ``j = d - k + i`` draw ``t`` uniform in ``[0, j]`` and keep ``t``, or ``j`` if ``t`` was kept
  already. The kept set is a uniform ``k``-subset of the row (Floyd, CACM 1987). Cost
  ``O(rows * fanout^2 / 2)`` comparisons, independent of the degree;
* fanout ``-1`` (all neighbours): a segmented ``arange`` over the rows.

The matrix is compacted into the CSR positions by a scatter with the rows' offsets (invalid cells
go to a dummy slot past the end), so no count is read to compact it.

Relabelling uses two dense ``int64 [num_nodes + 1]`` scratch tensors on the device (``loc``:
global -> local id, ``first``: first edge position of a not-yet-seen node via
``scatter_reduce(amin)``; the extra slot absorbs the writes of masked-out entries), reset after
each batch by touching only the batch's entries. Scratch goes back to a pool with an event on the
stream that last used it, and a sampler thread on another stream waits for that event before
reusing it.

Random numbers are the CPU kernels' (:mod:`gnnio.sampling._kernels`), computed in int64 torch ops:
row ``g`` of hop ``h`` starts from ``splitmix64(hop_key ^ g * GAMMA)`` and its ``i``-th draw in
``[0, j]`` is Lemire's multiply-shift of the high 32 bits of ``splitmix64(state + (i + 1) * GAMMA)``,
so a batch is bit-identical to the CPU sampler's with the same seed and call key, on any device
and any thread count (issue 18). All ``fanout`` draws of every row are computed at once assuming
no rejection; Lemire rejects with probability below ``d / 2**32`` per draw, and a hop where some
row did reject (counted in the hop's one host sync) is drawn again exactly, step by step, with a
few extra syncs -- rare, and the batch is the same. Rows of ``2**32`` or more neighbours (the CPU
kernel's 64-bit branch) are not supported here.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode

from ..utils.triton_kernels import kernel_failed, kernel_ran, triton_available
from .base import Block, MiniBatch, dst_ptr
from .threaded import hop_key

__all__ = [
    "TorchUniformSampler",
    "count_syncs",
    "mix64_torch",
    "pinned_csr",
    "sample_hop_torch",
]

_SENTINEL = torch.iinfo(torch.int64).max


def _repeat_rows(counts: torch.Tensor, total: int) -> torch.Tensor:
    """``i`` repeated ``counts[i]`` times (``total = counts.sum()``), as int64, with no host sync.

    Same as ``repeat_interleave(arange(n), counts)``, built from a cumulative sum of row-start
    marks (ATen's CPU ``repeat_interleave`` runs an OpenMP loop of grain 1, ~14 ms per call on a
    loaded 2-core machine; on a GPU it reads the total back unless told). Marks past the end go
    to a dummy slot.
    """
    marks = torch.zeros(total + 1, dtype=torch.int64, device=counts.device)
    ends = torch.cumsum(counts, 0)[:-1]
    marks.index_add_(0, ends.clamp(max=total), torch.ones_like(ends))
    return torch.cumsum(marks[:total], 0)


def _kcount(deg: torch.Tensor, fanout: int) -> torch.Tensor:
    return deg if fanout < 0 else torch.clamp(deg, max=fanout)


def _s64(x: int) -> int:
    """A uint64 constant as the int64 with the same bits (torch has no uint64 arithmetic)."""
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >= 1 << 63 else x


_GAMMA = _s64(0x9E3779B97F4A7C15)
_M1, _M2 = _s64(0xBF58476D1CE4E5B9), _s64(0x94D049BB133111EB)
_LOW32 = 0xFFFFFFFF


def _srl(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (``>>`` on int64 is arithmetic)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def mix64_torch(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finalizer on int64 tensors, bit-identical to :func:`gnnio.sampling._kernels.mix64`
    on uint64 (int64 products wrap modulo 2**64 on CPU and CUDA, as uint64 ones do)."""
    z = (z ^ _srl(z, 30)) * _M1
    z = (z ^ _srl(z, 27)) * _M2
    return z ^ _srl(z, 31)


def _lemire(state: torch.Tensor, bound: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One attempt of the CPU kernel's ``_bounded`` from the already stepped ``state``:
    ``(value in [0, bound), accepted)`` (``1 <= bound < 2**32``; other bounds give garbage)."""
    r = _srl(mix64_torch(state), 32)
    m = r * bound  # < 2**64: wraps into the sign bit, the bits are right
    low = m & _LOW32
    b = bound.clamp(min=1)
    ok = (low >= b) | (low >= ((1 << 32) - b) % b)
    return _srl(m, 32), ok


def _floyd_draws(
    start_state: torch.Tensor, deg: torch.Tensor, fanout: int, exact: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The raw Floyd draws ``t_i`` in ``[0, deg - fanout + i]`` of every row, ``[rows, fanout]``,
    and the number of rows whose draws hit a Lemire rejection (0-dim tensor).

    Fast (``exact=False``): draw ``i`` uses state step ``i + 1``, right unless an earlier draw
    of the row was rejected, which the count reports. ``exact``: each step redrawn until every
    row accepts (one host sync per step and retry) -- the CPU kernel's sequence exactly."""
    n, dev = int(deg.shape[0]), deg.device
    col = torch.arange(fanout, device=dev)
    bound = deg[:, None] - fanout + 1 + col[None, :]
    live = deg > fanout  # rows that draw at all
    if not exact:
        steps = start_state[:, None] + (col[None, :] + 1) * _GAMMA
        t, ok = _lemire(steps, bound)
        bad = (live & ~ok.all(1)).sum()
        return t, bad
    t = torch.empty((n, fanout), dtype=torch.int64, device=dev)
    state = start_state.clone()
    for i in range(fanout):
        pending = live.clone()
        val = torch.zeros(n, dtype=torch.int64, device=dev)
        while bool(pending.any()):
            state = torch.where(pending, state + _GAMMA, state)
            v, ok = _lemire(state, bound[:, i])
            take = pending & ok
            val = torch.where(take, v, val)
            pending &= ~ok
        t[:, i] = val
    return t, torch.zeros((), dtype=torch.int64, device=dev)


def sample_hop_torch(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    dst_nodes: torch.Tensor,
    fanout: int,
    hop_key: int,
    total: int | None = None,
    exact: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One hop of uniform sampling without replacement on any device.

    On a CUDA device with Triton (and ``fanout >= 1``, ``total`` known) the hop is one Triton
    kernel (:mod:`gnnio.sampling._triton_hop`), with the same results; should that kernel fail,
    a warning says so once and the torch ops below take over.

    Args:
        indptr: int64 ``[N + 1]``; indices: ``[E]`` (int32 or int64) -- CSR of in-neighbours.
        dst_nodes: int64 global ids of the destination rows.
        fanout: neighbours per row, ``-1`` = all.
        hop_key: the hop's 64-bit key (:func:`gnnio.sampling.threaded.hop_key`), as the CPU
            kernels take it.
        total: ``sum(min(deg, fanout))`` over the rows when the caller knows it; None = read it
            (a host sync).
        exact: draw step by step (see :func:`_floyd_draws`); False = the fast draws, whose
            third result says whether they must be redone.

    Returns:
        ``(src, dst, redo)``: int64 ``[E']`` global ids of the sampled neighbours and the local id
        (position in ``dst_nodes``) of their row, grouped by row in ``dst_nodes`` order; ``redo``
        a 0-dim tensor, nonzero when fast draws met a rejection (then redo with ``exact=True``).
    """
    dev = dst_nodes.device
    if fanout > 0 and total is not None and triton_available(dev, "sample_hop"):
        try:
            from ._triton_hop import sample_hop_triton  # the whole hop in one kernel, exact

            src, row = sample_hop_triton(indptr, indices, dst_nodes, fanout, hop_key, total)
            kernel_ran("hop", "triton")
            return src, row, torch.zeros((), dtype=torch.int64, device=dev)
        except Exception as e:  # noqa: BLE001 - a Triton that cannot build it: the torch path
            kernel_failed("sample_hop", e, "sampling with torch ops instead (same batches)")
    kernel_ran("hop", "torch")
    start = indptr[dst_nodes]
    deg = indptr[dst_nodes + 1] - start
    k = _kcount(deg, fanout)
    if total is None:
        total = int(k.sum())
    n = int(dst_nodes.shape[0])
    zero = torch.zeros((), dtype=torch.int64, device=dev)
    if total == 0:
        empty = torch.empty(0, dtype=torch.int64, device=dev)
        return empty, empty, zero
    if fanout < 0:  # every neighbour: a segmented arange
        row = _repeat_rows(k, total)
        j = torch.arange(total, device=dev) - (torch.cumsum(k, 0) - k)[row]
        return indices[start[row] + j].to(torch.int64), row, zero
    col = torch.arange(fanout, device=dev)
    picks = torch.empty((n, fanout), dtype=torch.int64, device=dev)
    state0 = mix64_torch(_s64(hop_key) ^ (dst_nodes * _GAMMA))  # the row's counter-based stream
    draws, redo = _floyd_draws(state0, deg, fanout, exact)
    for i in range(fanout):  # Floyd: j = d - k + i runs over the last k positions
        j = deg - fanout + i
        t = draws[:, i]
        if i:
            seen = (picks[:, :i] == t[:, None]).any(1)
            t = torch.where(seen, j, t)
        picks[:, i] = t
    pos = torch.where(deg[:, None] <= fanout, col[None, :], picks)  # short rows: all of them
    valid = col[None, :] < k[:, None]
    row_off = torch.cumsum(k, 0) - k
    target = torch.where(valid, row_off[:, None] + col[None, :], total).flatten()
    flat = torch.empty(total + 1, dtype=torch.int64, device=dev)
    flat.scatter_(0, target, (start[:, None] + pos).flatten())
    rows = torch.empty(total + 1, dtype=torch.int64, device=dev)
    rows.scatter_(0, target, torch.arange(n, device=dev)[:, None].expand(n, fanout).flatten())
    return indices[flat[:total]].to(torch.int64), rows[:total], redo


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
        if sync:
            self.count += 1
            self.ops.append(name)
        return func(*args, **kwargs)


@contextmanager
def count_syncs():
    """Count the torch calls inside the block that read a device value on the host (each one a
    host synchronisation on a GPU): ``with count_syncs() as c: ...; c.count, c.ops``. Works on
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
        self._scratch: list[tuple[torch.Tensor, torch.Tensor, object]] = []

    @property
    def device(self) -> torch.device:
        return self._device

    def _take(self) -> tuple[torch.Tensor, torch.Tensor]:
        with self._lock:
            item = self._scratch.pop() if self._scratch else None
        if item is not None:
            loc, first, ev = item
            if ev is not None:  # last used on another thread's stream: wait for it on ours
                torch.cuda.current_stream(self._device).wait_event(ev)
            return loc, first
        n, dev = self.num_nodes + 1, self._device  # + 1: the dummy slot of masked writes
        loc = torch.full((n,), -1, dtype=torch.int64, device=dev)
        first = torch.full((n,), _SENTINEL, dtype=torch.int64, device=dev)
        return loc, first

    def _give(self, loc: torch.Tensor, first: torch.Tensor) -> None:
        ev = None
        if loc.is_cuda:
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(self._device))
        with self._lock:
            self._scratch.append((loc, first, ev))

    def sample(self, seeds, key: int) -> MiniBatch:
        """Sample around ``seeds`` (distinct global ids) with the random stream of ``key``."""
        dev, n_nodes, fanouts = self._device, self.num_nodes, self.fanouts
        seeds = torch.as_tensor(seeds, device=dev)
        if seeds.dim() != 1:
            raise ValueError(f"seeds: need a 1-D array of node ids, got shape {tuple(seeds.shape)}")
        if seeds.is_floating_point() or seeds.is_complex() or seeds.dtype == torch.bool:
            raise ValueError(f"seeds: need integer node ids, got dtype {seeds.dtype}")
        seeds = seeds.to(torch.int64)
        b = int(seeds.shape[0])
        loc, first = self._take()
        ip = self.indptr
        # the batch's one sync before sampling: range, repeats, and the edges of every hop
        ar = torch.arange(b, device=dev)
        ok = (seeds >= 0) & (seeds < n_nodes)
        slot = torch.where(ok, seeds, n_nodes)
        loc[slot] = ar
        repeated = ((loc[slot] != ar) & ok).sum()
        safe = torch.where(ok, seeds, 0)
        deg = ip[safe + 1] - ip[safe]
        lo_hi = torch.stack([seeds.min(), seeds.max()]) if b else torch.zeros(2, device=dev)
        ksum = [_kcount(deg, f).sum() for f in fanouts]
        head = torch.stack([lo_hi[0].long(), lo_hi[1].long(), repeated, *ksum]).tolist()
        lo, hi, rep, totals = head[0], head[1], head[2], head[3:]
        if b and (lo < 0 or hi >= n_nodes or rep):
            loc[slot] = -1
            self._give(loc, first)
            if lo < 0 or hi >= n_nodes:
                bad = lo if lo < 0 else hi
                raise ValueError(f"seeds: node id {bad} out of range [0, {n_nodes})")
            dup = int(torch.nonzero(torch.bincount(seeds) > 1)[0, 0])  # error path: sync is fine
            raise ValueError(f"seeds: node id {dup} appears more than once; seeds must be distinct")
        parts, hop_nodes, hop_edges = [seeds], [b], []
        dst_nodes = seeds
        for h, fanout in enumerate(fanouts):
            hk = hop_key(key, h)
            src, dst, redo = sample_hop_torch(
                ip, self.indices, dst_nodes, fanout, hk, total=totals[h], exact=False
            )
            new, more, redo = _relabel(src, loc, first, hop_nodes[-1], ip, fanouts[h + 1 :], redo)
            if redo:  # a rejected draw (rare): undo the numbering, draw the hop step by step
                loc[new] = -1
                src, dst, _ = sample_hop_torch(
                    ip, self.indices, dst_nodes, fanout, hk, total=totals[h], exact=True
                )
                new, more, _ = _relabel(src, loc, first, hop_nodes[-1], ip, fanouts[h + 1 :])
            for g, extra in enumerate(more):  # the new nodes' edges in the later hops
                totals[h + 1 + g] += extra
            parts.append(new)
            hop_nodes.append(hop_nodes[-1] + int(new.shape[0]))
            hop_edges.append(torch.stack([loc[src], dst]))
            dst_nodes = torch.cat(parts)
        loc[dst_nodes] = -1
        self._give(loc, first)
        blocks = [  # edges grouped by destination as on the CPU: the CSR pointer, no sync
            Block(hop_edges[h], num_src=hop_nodes[h + 1], num_dst=hop_nodes[h],
                  ptr=dst_ptr(hop_edges[h], hop_nodes[h]))
            for h in range(len(hop_edges) - 1, -1, -1)
        ]  # fmt: skip
        return MiniBatch(
            seeds=seeds, input_nodes=dst_nodes, blocks=blocks, meta={"hop_nodes": hop_nodes}
        )


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
    first[src] = _SENTINEL
    first[dummy] = _SENTINEL
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
