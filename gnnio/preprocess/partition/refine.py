"""Optional refinement of a partition: size-constrained label propagation (``--refine R``).

**Not part of BGL's algorithm** (§3.3 ends with the greedy block assignment); a documented
deviation, off by default, so that ``bfs-block`` stays the paper's partitioner as printed. It is
what multilevel partitioners such as METIS do after uncoarsening (boundary refinement), here in its
simplest form, size-constrained label propagation (Meyerhenke, Sanders, Schulz, "Partitioning
complex networks via size-constrained clustering", 2014):

* ``R`` rounds; each round visits every node once in a seeded random order (a fresh order per
  round) and counts its neighbours per part over both edge directions (in- and out-neighbour
  lists; a symmetric graph counts each edge twice, which scales every count equally);
* the node moves to the part holding most of its neighbours when that beats its current part
  strictly (gain > 0; ties keep it where it is, so no move is ever undone within a round) and the
  move keeps the target part within the caps ``(1 + eps) * N / k`` nodes and
  ``(1 + eps) * |T| / k`` training nodes (or within the part's load before refinement, if that was
  already higher: refinement never worsens a balance beyond where it found it);
* moves take effect at once (the next node sees them), so two neighbours never swap into each
  other's part in the same step. A round with no move ends the refinement early.

Each move lowers the edge cut by its gain, so the cut never rises. Cost per round O(N + E) in one
numba loop (serial, random access), plus one transpose of the CSR before the first round.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...graph.csr import CSRGraph
from ...graph.transpose import transpose_csr

__all__ = ["refine_parts"]


@njit(cache=True, nogil=True)
def _lp_round(
    indptr, indices, rptr, ridx, order, parts, is_train, n_load, t_load, n_cap, t_cap, k
):  # pragma: no cover  # noqa: E501
    cnt = np.zeros(k, dtype=np.int64)
    moves = 0
    gain_sum = 0
    for i in range(order.shape[0]):
        v = order[i]
        cnt[:] = 0
        for e in range(indptr[v], indptr[v + 1]):
            u = indices[e]
            if u != v:
                cnt[parts[u]] += 1
        for e in range(rptr[v], rptr[v + 1]):
            u = ridx[e]
            if u != v:
                cnt[parts[u]] += 1
        cur = parts[v]
        best = cur
        best_c = cnt[cur]
        tv = is_train[v]
        for p in range(k):
            if p == cur or cnt[p] <= best_c:
                continue
            if n_load[p] + 1 > n_cap[p] or t_load[p] + tv > t_cap[p]:
                continue
            best = p
            best_c = cnt[p]
        if best != cur:
            gain_sum += best_c - cnt[cur]
            parts[v] = best
            n_load[cur] -= 1
            n_load[best] += 1
            t_load[cur] -= tv
            t_load[best] += tv
            moves += 1
    return moves, gain_sum


def refine_parts(
    graph: CSRGraph,
    parts: np.ndarray,
    nparts: int,
    train_idx: np.ndarray | None,
    rounds: int,
    seed: int = 0,
    eps: float = 0.03,
) -> tuple[np.ndarray, dict]:
    """Refine ``parts`` (int ``[N]``) by ``rounds`` of size-constrained label propagation (module
    docstring). Returns the new int16 parts and facts: moves and counted cut gain per round."""
    n = graph.num_nodes
    out = np.asarray(parts, dtype=np.int64).copy()
    facts: dict = {"refine": int(rounds), "refine_eps": float(eps), "refine_moves": []}
    if rounds <= 0 or n == 0 or nparts < 2:
        return out.astype(np.int16), facts
    indptr = np.asarray(graph.indptr, dtype=np.int64)
    indices = np.asarray(graph.indices)
    rptr, ridx = transpose_csr(graph)
    is_train = np.zeros(n, dtype=np.int64)
    if train_idx is not None and len(train_idx):
        is_train[np.asarray(train_idx, dtype=np.int64)] = 1
    n_load = np.bincount(out, minlength=nparts).astype(np.int64)
    t_load = np.bincount(out, weights=is_train, minlength=nparts).astype(np.int64)
    n_cap = np.maximum(np.floor((1 + eps) * n / nparts), n_load).astype(np.int64)
    t_tot = int(is_train.sum())
    t_cap = np.maximum(np.floor((1 + eps) * t_tot / nparts), t_load).astype(np.int64)
    rng = np.random.default_rng(seed)
    gains = []
    for _ in range(int(rounds)):
        order = rng.permutation(n).astype(np.int64)
        moves, gain = _lp_round(
            indptr, indices, rptr, ridx, order, out, is_train, n_load, t_load, n_cap, t_cap,
            int(nparts),
        )  # fmt: skip
        facts["refine_moves"].append(int(moves))
        gains.append(int(gain))
        if moves == 0:
            break
    facts["refine_gain"] = gains  # neighbour-list entries that stopped crossing parts
    return out.astype(np.int16), facts
