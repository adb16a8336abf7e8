"""Cross-batch reuse (HyDRA §III-B1, gnnio/features/caches/reuse.py): rules found by a mutation
pass -- the redundancy rate over distinct ids, which batches have a predecessor, and a batch that
reorders the previous one inside the same ``out`` buffer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnio.features import InMemoryFeatureStore
from gnnio.features.caches.reuse import CrossBatchReuse, redundancy_rates


def _feats(n: int, dim: int = 3) -> np.ndarray:
    return np.arange(n * dim, dtype=np.float32).reshape(n, dim)


def test_eta1_counts_distinct_ids_with_repeats_in_the_batch():
    """eta1 is the share of a batch's *distinct* ids the previous batch had: {2, 3, 9} after
    {0, 1, 2, 3} is 2/3, however often 2 and 9 repeat."""
    batches = [np.array([0, 1, 2, 3]), np.array([2, 2, 2, 3, 9, 9])]
    r = CrossBatchReuse(InMemoryFeatureStore(_feats(10)))
    for b in batches:
        r.gather(b)
    assert r.eta1 == pytest.approx(2 / 3)
    assert r.eta1 == pytest.approx(redundancy_rates(batches, 10)[0])


def test_a_batch_after_reset_has_no_predecessor():
    """After ``reset()`` the next batch reuses nothing and is left out of the eta1 mean."""
    r = CrossBatchReuse(InMemoryFeatureStore(_feats(10)))
    r.gather(np.arange(6))
    r.reset()
    got = r.gather(np.arange(6))
    assert torch.equal(got, torch.from_numpy(_feats(10)[:6]))
    assert r.stats["reused"] == 0 and r.stats["eta1_batches"] == 0 and r.eta1 == 0.0


@pytest.mark.parametrize("order", [[7, 6, 5, 4, 3, 2, 1, 0], [1, 0, 3, 2, 5, 4, 7, 6]])
def test_a_reordered_batch_in_the_same_out_buffer_reads_the_old_rows_first(order):
    """A batch that permutes the previous one, written into the previous batch's own ``out``
    buffer, gets the right rows (the reused rows are read before any is overwritten)."""
    feats = _feats(20)
    r = CrossBatchReuse(InMemoryFeatureStore(feats))
    out = torch.empty(8, 3)
    r.gather(np.arange(8), out=out)
    ids = np.array(order)
    got = r.gather(ids, out=out)
    assert r.stats["reused"] == 8
    assert torch.equal(got, torch.from_numpy(feats[ids]))
