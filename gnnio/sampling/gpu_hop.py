"""One hop of uniform neighbour sampling in vectorized torch ops, on any device (the GPU
sampler's draws, :mod:`gnnio.sampling.gpu`); on CUDA with Triton the hop is one kernel instead
(:mod:`._triton_hop`, the same draws).

Per hop, with ``d`` the degree and ``k = min(d, fanout)`` of each destination row, every row's
picks fill the first ``k`` columns of a ``[rows, fanout]`` matrix:

* ``d <= fanout``: the whole row, positions ``0 .. d-1``;
* ``d > fanout``: Floyd's algorithm, vectorized over the rows: for ``i = 0 .. k-1`` with
  ``j = d - k + i`` draw ``t`` uniform in ``[0, j]`` and keep ``t``, or ``j`` if ``t`` was kept
  already. The kept set is a uniform ``k``-subset of the row (Floyd, CACM 1987). Cost
  ``O(rows * fanout^2 / 2)`` comparisons, independent of the degree;
* fanout ``-1`` (all neighbours): a segmented ``arange`` over the rows;
* HyDRA's threshold pruning (``theta > 0``, :mod:`gnnio.sampling.pruned_torch`): a row with
  ``d > theta`` first draws a window start ``st`` in ``[0, d)``, then the above over the window's
  ``theta`` positions, position ``st + pick`` wrapped past the row's end.

The matrix is compacted into the CSR positions by a scatter with the rows' offsets (invalid cells
go to a dummy slot past the end), so no count is read to compact it.

Random numbers are the CPU kernels' (:mod:`gnnio.sampling._kernels`), computed in int64 torch ops:
row ``g`` of hop ``h`` starts from ``splitmix64(hop_key ^ g * GAMMA)`` and its ``i``-th draw in
``[0, j]`` is Lemire's multiply-shift of the high 32 bits of ``splitmix64(state + (i + 1) * GAMMA)``,
so a batch is bit-identical to the CPU sampler's with the same seed and call key, on any device
and any thread count (issue 18). All ``fanout`` draws of every row are computed at once assuming
no rejection; Lemire rejects with probability below ``d / 2**32`` per draw, and a hop where some
row did reject (its ``redo`` flag) is drawn again exactly, step by step, with a few extra syncs --
rare, and the batch is the same. Rows of ``2**32`` or more neighbours (the CPU kernel's 64-bit
branch) are not supported here.
"""

from __future__ import annotations

import torch

from ..utils.triton_kernels import kernel_failed, kernel_ran, triton_available

__all__ = ["bad_seeds", "mix64_torch", "number_seeds", "sample_hop_torch"]

_SENTINEL = torch.iinfo(torch.int64).max


def number_seeds(seeds: torch.Tensor, loc: torch.Tensor, num_nodes: int):
    """Number ``seeds`` ``0..B-1`` in ``loc`` (``[num_nodes + 1]``; out-of-range seeds write the
    dummy slot ``num_nodes``), with no host sync. Returns ``(ok, slot, repeated)``: which seeds are
    in range, where each was written, and a device count of the in-range seeds given twice."""
    ar = torch.arange(int(seeds.shape[0]), device=seeds.device)
    ok = (seeds >= 0) & (seeds < num_nodes)
    slot = torch.where(ok, seeds, num_nodes)
    loc[slot] = ar
    return ok, slot, ((loc[slot] != ar) & ok).sum()


def bad_seeds(seeds: torch.Tensor, lo: int, hi: int, num_nodes: int, dup=None) -> ValueError:
    """The error for seeds whose smallest and largest ids are ``lo`` and ``hi``: one out of
    ``[0, num_nodes)``, else the smallest repeated one (``dup``, or found here: an error path, so
    its host syncs are fine)."""
    if lo < 0 or hi >= num_nodes:
        return ValueError(f"seeds: node id {lo if lo < 0 else hi} out of range [0, {num_nodes})")
    if dup is None:
        dup = int(torch.nonzero(torch.bincount(seeds) > 1)[0, 0])
    return ValueError(f"seeds: node id {dup} appears more than once; seeds must be distinct")


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


def _window(state: torch.Tensor, deg: torch.Tensor, theta: int, exact: bool):
    """HyDRA's pruning: rows with ``deg > theta`` draw their window's start in ``[0, deg)`` from
    their stream first (the CPU kernel's ``_bounded(state, d)``). Returns ``(start, length,
    state after the draw, rejections)``: ``start`` 0 and ``length = deg`` for the other rows;
    ``rejections`` as :func:`_floyd_draws` counts them (0 with ``exact``)."""
    cut = deg > theta
    st = torch.zeros_like(deg)
    bad = torch.zeros((), dtype=torch.int64, device=deg.device)
    if not exact:  # one attempt, assumed accepted (the count says when it was not)
        nxt = state + _GAMMA
        v, ok = _lemire(nxt, deg)
        bad = (cut & ~ok).sum()
        st = torch.where(cut, v, st)
        state = torch.where(cut, nxt, state)
    else:
        pending = cut.clone()
        while bool(pending.any()):  # (one host sync per attempt: the exact, rare path)
            state = torch.where(pending, state + _GAMMA, state)
            v, ok = _lemire(state, deg)
            st = torch.where(pending & ok, v, st)
            pending &= ~ok
    return st, torch.where(cut, theta, deg), state, bad


def sample_hop_torch(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    dst_nodes: torch.Tensor,
    fanout: int,
    hop_key: int,
    total: int | None = None,
    exact: bool = True,
    count: torch.Tensor | None = None,
    row_off: torch.Tensor | None = None,
    theta: int = 0,
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
        count, row_off: the bounded form (:mod:`gnnio.sampling.gpu_bounded`, ``fanout >= 0``):
            only the first ``count`` (int64 ``[1]`` on the device) rows of ``dst_nodes`` are
            real, ``row_off`` their first output positions (``cumsum(k) - k`` over those rows),
            and ``total`` is an upper bound: a prefix of the outputs holds the hop, the rest is
            padding (valid node ids, never read by the caller).
        theta: HyDRA's threshold pruning (``> 0``, with ``fanout >= 0``): a row longer than
            ``theta`` draws a start ``st`` in ``[0, deg)`` first, then samples its ``min(theta,
            fanout)`` positions from the circular window ``st, st + 1, ...`` of ``theta``
            positions (wrapping past the row's end), as
            :func:`gnnio.sampling._las_kernels.sample_rows` does; ``total`` then counts
            ``min(deg, theta, fanout)`` per row. 0: no pruning.

    Returns:
        ``(src, dst, redo)``: int64 ``[E']`` global ids of the sampled neighbours and the local id
        (position in ``dst_nodes``) of their row, grouped by row in ``dst_nodes`` order; ``redo``
        a 0-dim tensor, nonzero when fast draws met a rejection (then redo with ``exact=True``).
    """
    dev = dst_nodes.device
    if fanout > 0 and total is not None and triton_available(dev, "sample_hop"):
        try:
            from ._triton_hop import sample_hop_triton  # the whole hop in one kernel, exact

            src, row = sample_hop_triton(
                indptr, indices, dst_nodes, fanout, hop_key, total, count, row_off, theta=theta
            )
            kernel_ran("hop", "triton")
            return src, row, torch.zeros((), dtype=torch.int64, device=dev)
        except Exception as e:  # noqa: BLE001 - a Triton that cannot build it: the torch path
            kernel_failed("sample_hop", e, "sampling with torch ops instead (same batches)")
    kernel_ran("hop", "torch")
    start = indptr[dst_nodes]
    deg = indptr[dst_nodes + 1] - start
    n = int(dst_nodes.shape[0])
    if count is not None:  # padding rows draw nothing
        deg = torch.where(torch.arange(n, device=dev) < count, deg, 0)
    if fanout < 0:
        theta = 0  # (all neighbours: never pruned)
    k = _kcount(deg, min(fanout, theta) if theta > 0 else fanout)
    if total is None:
        total = int(k.sum())
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
    st, span = None, deg  # the window's start and length (the whole row without pruning)
    if theta > 0:
        st, span, state0, bad = _window(state0, deg, theta, exact)
    draws, redo = _floyd_draws(state0, span, fanout, exact)
    if st is not None:
        redo = redo + bad
    for i in range(fanout):  # Floyd: j = span - k + i runs over the last k positions
        j = span - fanout + i
        t = draws[:, i]
        if i:
            seen = (picks[:, :i] == t[:, None]).any(1)
            t = torch.where(seen, j, t)
        picks[:, i] = t
    pos = torch.where(span[:, None] <= fanout, col[None, :], picks)  # short rows: all of them
    if st is not None:  # the window is circular: past the row's end it wraps to its start
        pos = st[:, None] + pos
        pos = torch.where(pos >= deg[:, None], pos - deg[:, None], pos)
    valid = col[None, :] < k[:, None]
    row_off = torch.cumsum(k, 0) - k
    dest = row_off[:, None] + col[None, :]
    target = torch.where(valid & (dest < total), dest, total).flatten()
    flat = (torch.empty if count is None else torch.zeros)(total + 1, dtype=torch.int64, device=dev)
    flat.scatter_(0, target, (start[:, None] + pos).flatten())
    rows = (torch.empty if count is None else torch.zeros)(total + 1, dtype=torch.int64, device=dev)
    rows.scatter_(0, target, torch.arange(n, device=dev)[:, None].expand(n, fanout).flatten())
    return indices[flat[:total]].to(torch.int64), rows[:total], redo
