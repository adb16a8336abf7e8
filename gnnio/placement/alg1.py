"""Song & Jiang Algorithm 1: spread rows over GPUs with fast interconnects, replicating the hottest.

Cost model (§3.1; Eq. 6, the case ``C_gpu < C_cpu``)::

    max_i E[C_i] = C_cpu E|S| - (C_cpu - C_gpu) E|S ∩ B_gpu| - min_i C_gpu E|S_i ∩ B_i|

The last term wants every GPU to hold the same hottest rows, the middle term wants as many distinct
rows on the GPUs as possible. Algorithm 1 starts from the first extreme (every GPU holds
``V[0..BSIZE-1]``, ``V`` = nodes by descending ``p``) and, round by round, replaces the lowest
still-duplicated row ``old = V[BSIZE-1-r]`` on all GPUs but one by the next rows ``new`` of ``V``
not yet on any GPU, as long as (Eq. 7, with ``alpha`` standing for ``C_gpu / C_cpu``)::

    p(new) > alpha * p(old)

Each round visits the GPUs in ascending order of ``p_sum`` (the summed ``p`` of the rows they have
received), skipping the one with the largest ``p_sum`` -- it keeps ``old`` so one copy stays on the
GPUs. The first failed test ends the algorithm.

Reading of the printed pseudo-code. Its loop index ``i`` counts visits including the skipped one
per round (the worked example's "second iteration is skipped"), while ``new_node = V[i + BSIZE]``
would then skip a node of ``V``; the worked example takes node-4 (= ``V[3]``) in the third
iteration, so the new node is the next *unused* one. We follow the example: rounds ``r = 0, 1, ...``
of ``n`` visits, ``old_idx = BSIZE - 1 - r``, new nodes taken in order from ``V[BSIZE]`` until
``min(N, n * BSIZE)`` rows are stored. Ties in ``p`` and in ``p_sum`` go to the lower node id /
device index. The result reproduces the §3.2 example exactly (see tests).

Time O(N log N) for the sort plus O(N * n) for the loop (numba); :func:`algorithm1_reference`
is the plain-Python transcription used to test the kernel.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from . import Placement, PlacementRequest, hottest_order

__all__ = ["algorithm1", "algorithm1_reference", "place_alg1", "paper_alpha", "resolve_alpha"]


def paper_alpha(topology) -> float:
    """The alpha Song & Jiang use (§5.1): 0 on all-connected GPUs ('2GPU', '4GPU', '8GPU'), 0.2
    on NVLink pairs ('(2+2)GPU', '(2*4)GPU'), i.e. 0.2 whenever there are several groups."""
    return 0.2 if len(topology.groups) > 1 else 0.0


def resolve_alpha(spec, topology, option: str = "--alpha") -> float | None:
    """``"paper"`` -> :func:`paper_alpha`; ``"eq7"`` / None -> None (= C_gpu / C_cpu, Eq. 7, taken
    by :func:`place_alg1`); a number in [0, 1] -> itself. Raises UsageError naming ``option``
    otherwise."""
    from ..errors import UsageError

    if spec is None or spec == "eq7":
        return None
    if spec == "paper":
        return paper_alpha(topology)
    try:
        a = float(spec)
    except (TypeError, ValueError):
        raise UsageError(f"{option}: 'paper', 'eq7' or a number in [0, 1], got {spec!r}") from None
    if not 0.0 <= a <= 1.0:
        raise UsageError(f"{option}: must be in [0, 1], got {spec}")
    return a


@njit(cache=True)
def _alg1_kernel(p, order, n, bsize, alpha, buffers, p_sum):  # pragma: no cover - compiled
    """Fill ``buffers[n, bsize]`` (pre-set to ``order[:bsize]`` on every row) in place.

    Returns the number of replacements made."""
    num = order.shape[0]
    limit = min(num, n * bsize)
    nxt = bsize
    devs = np.empty(n, dtype=np.int64)
    r = 0
    done = False
    while nxt < limit and not done:
        # sort devices by p_sum ascending, ties by index (insertion sort: n is small)
        for d in range(n):
            devs[d] = d
        for a in range(1, n):
            x = devs[a]
            b = a - 1
            while b >= 0 and (p_sum[devs[b]] > p_sum[x]):
                devs[b + 1] = devs[b]
                b -= 1
            devs[b + 1] = x
        old_idx = bsize - 1 - r
        p_old = p[order[old_idx]]
        for j in range(n - 1):  # the last device of the round keeps old (one copy stays)
            if nxt >= limit:
                done = True
                break
            new = order[nxt]
            if p[new] > alpha * p_old:
                dev = devs[j]
                buffers[dev, old_idx] = new
                p_sum[dev] += p[new]
                nxt += 1
            else:
                done = True
                break
        r += 1
    return nxt - bsize


def algorithm1(
    probs: np.ndarray, n: int, bsize: int, alpha: float, order: np.ndarray | None = None
) -> tuple[np.ndarray, dict]:
    """Algorithm 1 for one group of ``n`` GPUs that all reach each other.

    Args:
        probs: float64 ``[N]`` sampling probability ``p`` by global id.
        n: number of GPUs in the group (``n = 1`` gives Rule 1).
        bsize: ``BSIZE``, rows per GPU (clipped to ``N``).
        alpha: the threshold of Eq. 7 in ``[0, 1]``.
        order: ``V`` if already computed (node ids by descending ``p``; its first
            ``min(N, n * bsize)`` entries suffice).

    Returns:
        ``(buffers, info)``: int64 ``[n, min(bsize, N)]`` with ``buffers[i, k]`` the node at slot
        ``k`` of GPU ``i`` of the group, and ``info`` with ``replaced`` (rows replaced = distinct
        rows beyond ``BSIZE``) and ``p_sum`` per GPU.
    """
    p = np.ascontiguousarray(probs, dtype=np.float64)
    bs = min(int(bsize), int(p.shape[0]))
    if order is None:  # only the first min(N, n * BSIZE) nodes of V can be stored
        V = hottest_order(p, k=min(p.shape[0], n * bs))
    else:
        V = np.ascontiguousarray(order, dtype=np.int64)
    buffers = np.empty((n, bs), dtype=np.int64)
    buffers[:] = V[:bs]
    p_sum = np.zeros(n, dtype=np.float64)
    replaced = 0
    if n > 1 and bs > 0:
        replaced = int(_alg1_kernel(p, V, np.int64(n), np.int64(bs), float(alpha), buffers, p_sum))
    return buffers, {"replaced": replaced, "p_sum": p_sum.tolist()}


def algorithm1_reference(probs, n: int, bsize: int, alpha: float) -> list[list[int]]:
    """Plain-Python Algorithm 1, line by line (loop index ``i`` counts the skipped visits too);
    see the module docstring for how ``new_node`` is read. Returns ``B_1..B_n`` as lists."""
    p = [float(x) for x in probs]
    N = len(p)
    V = sorted(range(N), key=lambda j: (-p[j], j))  # line 2
    bs = min(bsize, N)
    B = [list(V[:bs]) for _ in range(n)]  # lines 4-5
    p_sum = [0.0] * n  # line 6
    limit = min(N, n * bs)
    next_new = bs
    ordered = list(range(n))
    i = 0
    while next_new < limit:  # line 7
        if i % n == 0:  # lines 8-10
            ordered = sorted(range(n), key=lambda d: (p_sum[d], d))
        if i % n == n - 1:  # line 12: the last device of the round keeps old_node
            i += 1
            continue
        device = ordered[i % n]  # line 14
        new_node = V[next_new]  # line 16 (next node of V not yet placed)
        old_node_idx = bs - 1 - i // n  # line 18
        old_node = V[old_node_idx]
        if p[new_node] > alpha * p[old_node]:  # line 21
            B[device][old_node_idx] = new_node  # line 23
            p_sum[device] += p[new_node]  # line 25
            next_new += 1
        else:
            break  # line 26
        i += 1
    return B


def place_alg1(req: PlacementRequest) -> Placement:
    """Rule 2: Algorithm 1 within every NVLink group (a group of one GPU gets Rule 1).

    ``alpha`` defaults to ``C_gpu / C_cpu`` of the topology (Eq. 7). That test compares
    probabilities, so it needs a calibrated ``p`` (e.g. pre-sampled counts); with a walk-count
    estimate such as ``sj``, which exaggerates the skew, it stops too early and keeps too many
    duplicates -- use the paper's tuned values (:func:`paper_alpha`) then (see
    docs/benchmarks.md, "Alpha and the probability estimate"). When peer links are not faster than host reads
    (``C_gpu >= C_cpu``) every GPU gets Rule 1 (Eq. 5)."""
    topo = req.topology
    alpha = float(topo.alpha if req.alpha is None else req.alpha)
    gmax = max(len(g) for g in topo.groups) if topo.peers_cheaper else 1
    V = hottest_order(req.probs, k=gmax * req.buffer_rows)
    buffers: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * topo.num_gpus
    info: dict[int, dict] = {}
    by_size: dict[int, np.ndarray] = {}
    for g in topo.groups:
        size = len(g) if topo.peers_cheaper else 1
        if size not in by_size:
            by_size[size], info[size] = algorithm1(req.probs, size, req.buffer_rows, alpha, V)
        for j, d in enumerate(g):
            buffers[d] = by_size[size][j % size].copy()
    return Placement(
        strategy="alg1",
        num_nodes=req.num_nodes,
        groups=topo.groups,
        buffers=buffers,
        peer_reads=topo.peers_cheaper,
        params={
            "alpha": alpha,
            "replaced": {str(k): v["replaced"] for k, v in info.items()},
        },
    )
