"""How good a partition is for sampling: edge cut, balance, replication memory, remote reads.

* ``edge_cut``: fraction of edges whose two ends are in different parts (replication ignored).
* ``node_balance`` / ``train_balance``: max over parts ÷ mean over parts of the nodes / training
  nodes a part owns.
* ``memory_increase``: adjacency entries stored over all parts (each part: its own nodes' lists
  plus every replicated list) ÷ the graph's entries; 1.0 without replication.
* ``remote_fraction``: one sampled epoch with the given fanouts (default 15,10,5, batch 1024), each
  part sampling its own training nodes' batches (BGL's samplers sit with their graph store): of
  all neighbour-list reads (every destination node of every block reads its list), the share
  whose list the sampling part does not store (owned elsewhere and not replicated). This is the
  quantity of BGL Fig. 15, counted, not modeled, and the measured share behind HyDRA Eq. 2-3's
  ``(M - 1) / M``; HyDRA Table II is a different number, memory sharing's volume over DSP's
  (``d`` against ``f + 1`` per remote row: the ``peer``/``network`` bytes of the ``shared`` and
  ``dsp`` sampling modes).
"""

from __future__ import annotations

import numpy as np

from ...graph.csr import CSRGraph

__all__ = ["partition_quality", "remote_reads"]


def remote_reads(
    graph: CSRGraph,
    parts: np.ndarray,
    replicated: np.ndarray,
    train_idx: np.ndarray,
    fanouts=(15, 10, 5),
    batch_size: int = 1024,
    seed: int = 0,
    threads: int | None = None,
) -> tuple[int, int]:
    """``(remote, total)`` neighbour-list reads of one sampled epoch (module docstring)."""
    import torch

    from ...sampling import UniformSampler

    nparts = int(parts.max()) + 1 if parts.size else 1
    stored = np.zeros(graph.num_nodes, dtype=bool)
    stored[replicated] = True
    sampler = UniformSampler(graph, list(fanouts), seed=seed, num_threads=threads)
    train_idx = np.asarray(train_idx, dtype=np.int64)
    rng = np.random.default_rng(seed)
    remote = total = 0
    for k in range(nparts):
        mine = train_idx[parts[train_idx] == k]
        mine = mine[rng.permutation(mine.size)]
        for s in range(0, mine.size, batch_size):
            mb = sampler.sample(torch.from_numpy(mine[s : s + batch_size]))
            nodes = mb.input_nodes.numpy()
            for blk in mb.blocks:
                read = nodes[: blk.num_dst]
                total += read.size
                remote += int(((parts[read] != k) & ~stored[read]).sum())
    return remote, total


def partition_quality(
    graph: CSRGraph,
    parts: np.ndarray,
    replicated: np.ndarray,
    train_idx: np.ndarray | None,
    fanouts=(15, 10, 5),
    batch_size: int = 1024,
    seed: int = 0,
    threads: int | None = None,
    chunk_bytes: int | None = None,
) -> dict:
    """The quality report of a partition (module docstring); ``chunk_bytes``: count the edge cut
    in chunks of rows (:func:`gnnio.preprocess.partition.bounded.edge_cut`, the same count)."""
    from .bounded import edge_cut

    n = graph.num_nodes
    nparts = int(parts.max()) + 1 if parts.size else 1
    e = max(graph.num_edges, 1)
    cut = float(edge_cut(graph, parts, chunk_bytes)) / e
    node_counts = np.bincount(parts, minlength=nparts).astype(np.float64)
    out = {
        "num_parts": nparts,
        "edge_cut": cut,
        "node_balance": float(node_counts.max() / node_counts.mean()) if n else 1.0,
        "nodes_per_part": node_counts.astype(int).tolist(),
    }
    deg = graph.in_degrees()
    rep_edges = float(deg[replicated].sum()) if replicated.size else 0.0
    # each part stores its own lists; replicated lists are stored on the other parts too
    out["memory_increase"] = (graph.num_edges + rep_edges * (nparts - 1)) / e
    out["replicated_nodes"] = int(replicated.size)
    if train_idx is not None and len(train_idx):
        t = np.bincount(parts[np.asarray(train_idx, dtype=np.int64)], minlength=nparts)
        out["train_balance"] = float(t.max() / t.mean())
        out["train_per_part"] = t.astype(int).tolist()
        r, tot = remote_reads(
            graph, parts, replicated, train_idx, fanouts, batch_size, seed, threads
        )
        out["remote_fraction"] = r / tot if tot else 0.0
        out["neighbour_list_reads"] = int(tot)
    else:
        out["train_balance"] = 1.0
        out["remote_fraction"] = None
    return out
