"""A stand-in for pyg-lib's ``torch.ops.pyg.neighbor_sample`` (pyg-lib and torch-sparse do not
install on this project's machines), so PyG's own ``NeighborLoader`` runs here.

It follows pyg-lib's homogeneous algorithm (the PyG tests use it too, through
``tests/pyg_common.py``): hop ``h + 1`` expands the nodes new at hop ``h``; a node takes all its neighbours in CSC order when ``k < 0`` or
``k >= deg``, else ``k`` distinct random ones. It draws from torch's global generator (as pyg-lib
does), so ``seed_everything`` seeds it and every batch draws anew, and it implements ``disjoint=True`` (nodes are ``(subgraph, node)`` pairs, returned as pyg-lib
returns them: a ``[N, 2]`` tensor of ``(batch, node)``). Pure Python: slow, but exact.

:func:`install` patches PyG in this process; ``sitecustomize.py`` beside this file calls it in
every Python process started with ``GNNIO_PYG_STANDIN=1`` and this folder on ``PYTHONPATH``
(``mp.spawn``'s ranks included).
"""

from __future__ import annotations

import torch


def neighbor_sample(colptr, row, seed, num_neighbors, node_time, seed_time, csc, replace,
                    directed, disjoint, temporal_strategy, return_edge_id,
                    generator=None):  # fmt: skip
    """pyg-lib's signature; ``generator`` (not pyg-lib's) draws instead of torch's global one
    (the PyG tests pass a fixed one per call, so its batches are fixed)."""
    assert csc and directed and not replace and node_time is None
    seeds = seed.tolist()
    keys = [(i if disjoint else 0, v) for i, v in enumerate(seeds)]
    local = {k: i for i, k in enumerate(keys)}
    rows, cols, edges = [], [], []
    num_nodes, num_edges = [len(keys)], []
    begin, end = 0, len(keys)
    for k in num_neighbors:
        e0 = len(edges)
        for i in range(begin, end):
            b, v = keys[i]
            start, stop = int(colptr[v]), int(colptr[v + 1])
            if k < 0 or k >= stop - start:
                picks = range(start, stop)
            else:
                picks = (start + torch.randperm(stop - start, generator=generator)[:k]).tolist()
            for p in picks:
                key = (b, int(row[p]))
                if key not in local:
                    local[key] = len(keys)
                    keys.append(key)
                rows.append(local[key])
                cols.append(i)
                edges.append(p)
        num_edges.append(len(edges) - e0)
        num_nodes.append(len(keys) - end)
        begin, end = end, len(keys)

    def t(a):
        return torch.tensor(a, dtype=torch.long)

    node = t(keys) if disjoint else t([v for _, v in keys])
    return t(rows), t(cols), node.view(-1, 2) if disjoint else node, t(edges), num_nodes, num_edges


def install() -> None:
    """Make PyG's samplers call :func:`neighbor_sample` (and a stable sort, as pyg-lib's)."""
    import torch_geometric.sampler.utils as sampler_utils
    import torch_geometric.typing

    torch_geometric.typing.WITH_PYG_LIB = True
    torch.ops.pyg.neighbor_sample = neighbor_sample
    sampler_utils.index_sort = lambda x, max_value=None: torch.sort(x, stable=True)
