"""Edges of the feature-row path that the broad tests did not reach: unsigned ids beyond 32 bits,
the tier names of a static part over a dynamic cache, and the tiered store's CPU-gather staging
buffer when a batch's cold rows outgrow it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnio.features import InMemoryFeatureStore
from gnnio.features._gather import as_index_array
from gnnio.features.caches.cache import static_plus_dynamic
from gnnio.features.tiers.tiered import TieredFeatureStore


def test_wide_unsigned_ids_are_not_wrapped_into_range():
    """A uint64 id of 2^32 + 5 is out of range for 10 rows (narrowed to 32 bits it would read
    row 5)."""
    with pytest.raises(IndexError, match="out of range"):
        as_index_array(np.array([2**32 + 5], dtype=np.uint64), 10)
    got = as_index_array(np.array([7, 2], dtype=np.uint16), 10)
    assert got.tolist() == [7, 2]


def test_static_and_dynamic_parts_count_under_their_own_tiers():
    feats = np.random.default_rng(0).standard_normal((20, 3)).astype(np.float32)
    c = static_plus_dynamic(InMemoryFeatureStore(feats), 4, 4, np.arange(20), "fifo")
    c.gather(np.array([0, 1, 10, 11]))  # 2 static hits, 2 misses (now in the dynamic part)
    c.gather(np.array([0, 10, 11, 12]))  # 1 static hit, 2 dynamic hits, 1 miss
    assert c.counters.snapshot()["rows"] == {"static_cache": 3, "dynamic_cache": 2, "host": 3}


@pytest.mark.parametrize("batches", [[1500], [600, 3000], [3000, 600, 5000]])
def test_cpu_gather_cold_rows_beyond_the_staging_buffer(batches):
    """cold_mode="cpu_gather" with hot and cold ids mixed: the cold rows go through a reused
    staging buffer, grown to hold each batch's cold rows (1024 rows first, then doubled or to
    the batch)."""
    n = 6000
    feats = np.random.default_rng(1).standard_normal((n, 4)).astype(np.float32)
    store = TieredFeatureStore(feats, hot=100, cold_mode="cpu_gather")
    rng = np.random.default_rng(2)
    for m in batches:
        ids = rng.integers(0, n, m + 50)
        ids[:50] = np.arange(50)  # some hot ids: the cold ones are scattered into the output
        assert torch.equal(store.gather(ids), torch.from_numpy(feats[ids]))


def test_a_static_part_is_loaded_from_the_bottom_store():
    """The static rows come from the store at the bottom of the stack: the dynamic part below
    them neither admits them (no row cached twice) nor counts the load as traffic."""
    feats = np.random.default_rng(0).standard_normal((20, 3)).astype(np.float32)
    c = static_plus_dynamic(InMemoryFeatureStore(feats), 4, 4, np.arange(20), "fifo")
    assert c.backing.cached_ids().numel() == 0
    assert not c.backing.counters.snapshot()["rows"]
    assert torch.equal(c.buffer, torch.from_numpy(feats[:4]))


def test_one_cold_row_still_gets_the_zero_copy_path():
    """Only a store with every row hot has no cold path: with one cold row it is read zero-copy
    (simulated here) and counted as host traffic."""
    feats = np.arange(40, dtype=np.float32).reshape(10, 4)
    store = TieredFeatureStore(feats, hot=9)
    assert store.cold_mode_used == "zero_copy"
    assert torch.equal(store.gather([9, 0]), torch.from_numpy(feats[[9, 0]]))
    assert store.counters.snapshot()["rows"] == {"gpu": 1, "host": 1}
    assert TieredFeatureStore(feats, hot=10).cold_mode_used == "none"
