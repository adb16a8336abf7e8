"""Per-rank memory that shrinks with the shard (issue 26, item 5): what a rank holds for the
partitioned sampler and the sharded store is sized by its shard, except the documented per-node
arrays, at their narrowest dtypes."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gnnio.distributed.sampling import _Shard
from tests.test_dist_sampling import _write


def test_a_shard_holds_nothing_sized_by_the_graph(tmp_path):
    d, pdirs = _write(tmp_path)
    n = 300
    for k in (0, 1):
        sh = _Shard(pdirs[0], k, n)
        stored = int(sh.nodes.shape[0])
        assert 0 < stored < n
        arrays = [v for k, v in vars(sh).items() if isinstance(v, np.ndarray) and k != "indices"]
        assert all(a.shape[0] <= stored + 1 for a in arrays), [a.shape for a in arrays]
        # the binary search finds every stored node's row, and -1 for the others
        rows = sh.rows_of(np.arange(n))
        dense = np.full(n, -1)
        dense[np.asarray(sh.nodes)] = np.arange(stored)
        assert np.array_equal(rows, dense)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 10_000), unique=True, max_size=60),
       st.lists(st.integers(0, 10_000), max_size=60))  # fmt: skip
def test_rows_of_matches_a_dense_map(nodes, ask):
    sh = _Shard.__new__(_Shard)
    nodes_a = np.asarray(nodes, dtype=np.int64)
    sh._order = np.argsort(nodes_a, kind="stable")
    sh._sorted = nodes_a[sh._order]
    dense = np.full(10_001, -1)
    dense[nodes_a] = np.arange(nodes_a.size)
    assert np.array_equal(sh.rows_of(np.asarray(ask, dtype=np.int64)), dense[ask])


def test_a_shard_held_as_tensors_samples_exactly_as_the_files(tmp_path):
    """The CUDA IPC reader (a peer's shard as tensors, its rows copied into a compact CSR),
    run on CPU tensors: the same counts and neighbours, pruned or not, and the same degrees."""
    from gnnio.sampling.threaded import _hop_key

    d, pdirs = _write(tmp_path)
    files = _Shard(pdirs[1], 0, 300)
    arrays = {n: torch.from_numpy(np.array(getattr(files, n))) for n in ("indptr", "indices")}
    held = _Shard(pdirs[1], 0, 300, arrays={"nodes": files.nodes, **arrays})
    assert held.tensors and not files.tensors
    rows = np.asarray(files.nodes)[::3].astype(np.int64)
    key = _hop_key(12345, 0)
    for theta in (None, 0, 5):
        a, b = files.sample(rows, 4, key, theta), held.sample(rows, 4, key, theta)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
        assert a[1].size > 0
    assert np.array_equal(files.degrees(rows), held.degrees(rows))
