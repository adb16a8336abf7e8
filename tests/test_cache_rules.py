"""Feature-cache rules found unguarded by a mutation pass over caches/cache.py, policy.py,
lookahead.py, nosync.py, nosync_lookahead.py: errors users hit, the stack's bottom store, the
cache's byte count, the clock, and the lookahead window after ``reset_window``."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from gnnio.features import InMemoryFeatureStore
from gnnio.features.caches.cache import FeatureCache, capacity_rows, make_policy, two_level_cache
from gnnio.features.caches.lookahead import LookaheadPolicy
from tests.test_cache import reference_simulation


def _store(n: int = 40, dim: int = 4) -> InMemoryFeatureStore:
    return InMemoryFeatureStore(np.arange(n * dim, dtype=np.float32).reshape(n, dim))


# ---- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [-0.5, -2, -1.0])
def test_a_negative_cache_size_is_refused_as_a_cache_size(size):
    """A negative size, fraction or row count, is refused with the cache's own message."""
    with pytest.raises(ValueError, match="cache size must be >= 0"):
        capacity_rows(size, 100)


def test_a_static_key_equal_to_the_row_count_is_refused():
    """A static cache's hot id N (one past the last row) is a ValueError naming it, not an
    index error from the map."""
    with pytest.raises(ValueError, match=r"static cache key 40 out of \[0, 40\)"):
        FeatureCache(_store(40), 3, "static", hot_ids=[0, 40, 1])


def test_a_negative_policy_capacity_is_refused():
    """make_policy refuses a negative capacity with a ValueError (not a tensor-size error)."""
    for name in ("fifo", "lru", "lfu"):
        with pytest.raises(ValueError, match="capacity and num_keys must be >= 0"):
            make_policy(name, -1, 10)


def test_static_capacity_beyond_the_hot_keys_is_refused():
    """A lookahead cache's static part larger than the hot_keys given is a ValueError."""
    with pytest.raises(ValueError, match="static_capacity: needs at least that many hot_keys"):
        LookaheadPolicy(10, 40, hot_keys=[3, 4, 5], static_capacity=4)
    LookaheadPolicy(10, 40, hot_keys=[3, 4, 5, 6], static_capacity=4)  # exactly enough


def test_a_negative_lookahead_window_is_refused():
    """A lookahead window below 0 batches is a ValueError (0 is allowed: nothing announced)."""
    with pytest.raises(ValueError, match="lookahead: must be >= 0"):
        LookaheadPolicy(4, 20, lookahead=-1)
    assert LookaheadPolicy(4, 20, lookahead=0).lookahead == 0


def test_optimal_is_an_unbounded_window_and_keeps_its_name():
    """The "optimal" policy is MIN over an unbounded window (lookahead None), named so in its
    checkpoint, which a "lookahead" cache then refuses."""
    opt = FeatureCache(_store(20), 4, "optimal")
    assert opt.policy.name == "optimal" and opt.policy.lookahead is None
    opt.gather(torch.tensor([1, 2, 3]))
    state = opt.state_dict()
    assert state["policy"] == "optimal"
    with pytest.raises(ValueError, match="cache state"):
        FeatureCache(_store(20), 4, "lookahead").load_state_dict(state)


# ---- the stack and its books -----------------------------------------------------------------


def test_a_static_part_is_loaded_from_the_bottom_of_a_three_level_stack():
    """A static cache over a two-level cache loads its rows from the store at the bottom, not
    through the caches between (which would admit those rows and count them)."""
    store = _store(40)
    mid = two_level_cache(store, 5, 8, "fifo")
    top = FeatureCache(mid, 6, "static", hot_ids=np.arange(39, -1, -1), tier="static_cache")
    for c in (mid, mid.backing):
        assert c.cached_ids().numel() == 0
        assert c.stats.as_dict()["queries"] == 0 and c.counters.snapshot()["rows"] == {}
    assert torch.equal(top.buffer, store.gather(torch.arange(39, 33, -1)))


def test_nbytes_counts_buffer_maps_and_dedup_scratch():
    """nbytes of a FIFO cache of 10 rows over 100 float32 rows of width 4: the buffer (10*4*4),
    the int32 key->slot map (100*4), the int64 slot->key map (10*8), the int32 dedup scratch
    (100*4)."""
    c = FeatureCache(_store(100), 10, "fifo")
    assert c.nbytes() == 10 * 4 * 4 + 100 * 4 + 10 * 8 + 100 * 4


def test_the_clock_advances_by_the_unique_ids_of_a_batch():
    """The clock (saved in state_dict) advances by a batch's unique ids, not its length."""
    c = FeatureCache(_store(40), 5, "lru")
    c.gather(torch.tensor([3, 3, 7, 3, 9, 7]))
    assert c.state_dict()["clock"] == 3
    c.gather(torch.tensor([1, 1]))
    assert c.state_dict()["clock"] == 4


def test_lfu_breaks_frequency_ties_by_recency_not_by_slot():
    """LFU among equally frequent entries evicts the least recently used: after [0, 1, 2] and
    the hits [2, 0, 1] all have frequency 2 and key 2 (slot 2) is the least recent, so the miss 5
    replaces key 2, not key 0 in slot 0."""
    c = FeatureCache(_store(10), 3, "lfu")
    for b in ([0, 1, 2], [2, 0, 1], [5]):
        c.gather(torch.tensor(b))
    assert c.policy.key_of.tolist() == [0, 1, 5]
    assert c.stats.as_dict()["evictions"] == 1


@pytest.mark.parametrize("policy", ["fifo", "lru", "lfu"])
def test_long_skewed_replay_matches_the_per_id_reference(policy):
    """Over 60 skewed batches (many frequency ties once entries age) every batch's hits, misses,
    insertions, evictions and the final contents equal the per-id reference's."""
    rng = np.random.default_rng(7)
    n, cap = 30, 7
    batches = [(rng.zipf(1.3, int(rng.integers(1, 12))) % n).tolist() for _ in range(60)]
    want, final = reference_simulation(policy, cap, batches, n)
    c = FeatureCache(_store(n), cap, policy)
    keys = ("hits", "misses", "insertions", "evictions")
    for b, w in zip(batches, want, strict=True):
        before = c.stats.as_dict()
        c.gather(torch.tensor(b))
        after = c.stats.as_dict()
        assert {k: after[k] - before[k] for k in keys} == w
    assert set(c.cached_ids().tolist()) == final


# ---- the lookahead window --------------------------------------------------------------------


@pytest.mark.parametrize("path", ["kernels", "torch", "sync_free"])
@pytest.mark.parametrize("announce_dropped", [True, False])
def test_reset_window_forgets_the_unserved_batches(path, announce_dropped):
    """After reset_window, ids of the dropped batches announced again get their new next use
    (hand-worked: capacity 2, window 2, cached [1, 0]; batch [2, 3] is served while [0, 2] is
    announced next, so MIN keeps 0 and 2 over 1 and 3, and [0, 2] hits twice)."""
    c = FeatureCache(_store(20), 2, "lookahead", lookahead=2, sync_free=path == "sync_free")
    c.policy.use_kernels = path == "kernels"
    c.gather(torch.tensor([1, 0]))  # slots: 1 -> 0, 0 -> 1
    if announce_dropped:  # an epoch closed early: [0] announced, never served
        c.announce(torch.tensor([0]))
        c.reset_window()
    c.announce(torch.tensor([2, 3]))
    c.announce(torch.tensor([0, 2]))
    c.gather(torch.tensor([2, 3]))
    assert sorted(c.cached_ids().tolist()) == [0, 2]
    before = c.stats.as_dict()["hits"]  # (read back: the sync-free path books on the device)
    c.gather(torch.tensor([0, 2]))
    assert c.stats.as_dict()["hits"] - before == 2


class _SlowStore(InMemoryFeatureStore):
    """Rows after a wait of ``wait`` seconds: data movement a cache must book as copy time."""

    wait = 0.0

    def gather(self, ids, out=None):
        time.sleep(self.wait)
        return super().gather(ids, out)

    def gather_into(self, ids, out, mask):
        time.sleep(self.wait)
        return super().gather_into(ids, out, mask)


@pytest.mark.parametrize(
    "policy, sync_free",
    [("static", False), ("static", True), ("fifo", False), ("fifo", True), ("lru", False),
     ("lookahead", False), ("lookahead", True)],
)  # fmt: skip
def test_the_backing_gather_is_booked_as_copy_time(policy, sync_free):
    """The misses' backing gather is data movement: it lands in copy_s, not in manage_s."""
    store = _SlowStore(np.arange(80, dtype=np.float32).reshape(20, 4))
    c = FeatureCache(store, 4, policy, hot_ids=np.arange(20), sync_free=sync_free, lookahead=1)
    c.gather(torch.tensor([10, 11, 12]))  # (a first batch: any kernel compiled is not timed)
    c.reset_stats()
    store.wait = 0.2  # (a margin a loaded 2-core machine's pauses in a 3-id manage stay under)
    c.gather(torch.tensor([13, 14, 15]))  # misses in every policy (the static part: 0..3)
    st = c.stats.as_dict()
    assert st["copy_s"] >= 0.2 > st["manage_s"]
