"""The caches' sync-free batch path (gnnio.features.caches.nosync; issue 24): FIFO and static give
what the host path gives -- rows, maps, cursors, stats, counters -- batch by batch, with no
operation that would make the host wait for a GPU (counted on the CPU by OpCounter); a backing that
cannot gather masked rows costs exactly one sync; checkpoints of either path are the same."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from gnnio.features import InMemoryFeatureStore
from gnnio.features.base import FeatureStore
from gnnio.features.caches.cache import FeatureCache
from gnnio.features.caches.nosync import dedup_padded
from gnnio.utils.syncs import OpCounter
from tests.helpers import TIERED_SPY, run_in_triton_interpreter
from tests.test_cache import _feats, _hot, workloads

HYP = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
COUNTS = ("batches", "queries", "unique_queries", "hits", "misses", "insertions", "evictions",
          "fetched_bytes", "hit_bytes")  # fmt: skip


def _pair(policy, feats, cap, seed=0):
    mk = lambda free: FeatureCache(  # noqa: E731
        InMemoryFeatureStore(feats), cap, policy, hot_ids=_hot(len(feats), seed), sync_free=free
    )
    return mk(False), mk(True)


def _same_state(host: FeatureCache, free: FeatureCache) -> None:
    a, b = host.policy, free.policy
    assert torch.equal(a.slot_of, b.slot_of) and torch.equal(a.key_of, b.key_of)
    if a.dynamic:
        b.sync_cursors()
        assert (a.head, a.filled) == (b.head, b.filled)
    sa, sb = host.stats.as_dict(), free.stats.as_dict()
    assert {k: sa[k] for k in COUNTS} == {k: sb[k] for k in COUNTS}
    assert sa["hit_ratio"] == pytest.approx(sb["hit_ratio"], rel=1e-12)
    assert host.counters.snapshot() == free.counters.snapshot()


@pytest.mark.parametrize("policy", ["fifo", "static"])
@HYP
@given(w=workloads())
def test_the_sync_free_path_equals_the_host_path(policy, w):
    n, cap, batches, seed = w
    feats = _feats(n, seed=seed)
    host, free = _pair(policy, feats, cap, seed)
    for b in batches:
        out = torch.full((30, 3), 7.0)
        ids = torch.tensor(b, dtype=torch.int64)
        want = host.gather(ids)
        got = free.gather(ids, out=out)
        assert torch.equal(got, want) and torch.equal(got, torch.from_numpy(feats[b]))
        assert (out[len(b) :] == 7).all()
        if policy == "fifo" and len(b):  # cursors checked every batch (they stay on the device)
            _same_state(host, free)
    _same_state(host, free)


@pytest.mark.parametrize("policy", ["fifo", "static"])
def test_a_batch_makes_no_host_sync(policy):
    feats = _feats(500, dim=8, seed=1)
    _, free = _pair(policy, feats, 60)
    g = torch.Generator().manual_seed(0)
    for _ in range(6):
        ids = torch.randint(0, 500, (120,), generator=g)
        ids[:20] = ids[20:40]  # repeats
        with OpCounter() as c:
            rows = free.gather(ids)
        assert c.syncs == 0, dict(c.sync_ops)
        assert torch.equal(rows, torch.from_numpy(feats[ids.numpy()]))
    assert free.stats.as_dict()["hits"] > 0


class _NoMasked(FeatureStore):
    """A backing without :meth:`gather_into` (as a host store under a GPU cache)."""

    def __init__(self, feats):
        super().__init__()
        self._s = InMemoryFeatureStore(feats)
        self.num_rows, self.dim, self.dtype, self.device = (
            self._s.num_rows, self._s.dim, self._s.dtype, self._s.device)  # fmt: skip
        self.tier = "far"

    def gather(self, ids, out=None):
        rows = self._s.gather(ids, out=out)
        self.counters.add(self.tier, len(ids), self.row_bytes)
        return rows


def test_a_backing_without_masked_gathers_costs_one_sync_per_batch():
    feats = _feats(300, dim=4, seed=2)
    host = FeatureCache(_NoMasked(feats), 40, "fifo", sync_free=False)
    free = FeatureCache(_NoMasked(feats), 40, "fifo", sync_free=True)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        ids = torch.randint(0, 300, (80,), generator=g)
        want = host.gather(ids)
        with OpCounter() as c:
            got = free.gather(ids)
        assert c.syncs == 1, dict(c.sync_ops)  # the misses' positions
        assert torch.equal(got, want)
    _same_state(host, free)
    assert free.counters.snapshot()["rows"]["far"] == free.stats.as_dict()["misses"]


def test_checkpoints_of_both_paths_are_the_same_and_resume_either_way():
    feats = _feats(200, dim=4, seed=3)
    host, free = _pair("fifo", feats, 30)
    g = torch.Generator().manual_seed(2)
    batches = [torch.randint(0, 200, (50,), generator=g) for _ in range(8)]
    for ids in batches[:4]:
        host.gather(ids)
        free.gather(ids)
    sh, sf = host.state_dict(), free.state_dict()
    assert sh.keys() == sf.keys() and sh["clock"] == sf["clock"]
    for k, v in sh["maps"].items():
        assert (torch.equal(v, sf["maps"][k]) if isinstance(v, torch.Tensor)
                else v == sf["maps"][k]), k  # fmt: skip
    assert not any(k.startswith("_") for k in sf["maps"])
    # resume the sync-free cache from the host path's checkpoint and go on in step
    resumed = FeatureCache(InMemoryFeatureStore(feats), 30, "fifo", sync_free=True)
    resumed.load_state_dict(sh)
    for ids in batches[4:]:
        assert torch.equal(resumed.gather(ids), host.gather(ids))
    assert torch.equal(resumed.policy.key_of, host.policy.key_of)
    resumed.policy.sync_cursors()
    assert resumed.policy.head == host.policy.head


def test_padded_dedup():
    pos = torch.full((10,), 2**31 - 1, dtype=torch.int32)
    idx = torch.tensor([4, 2, 4, 9, 2, 0])
    u, inv, valid, cnt = dedup_padded(pos, idx)
    assert int(cnt) == 4 and u[:4].tolist() == [4, 2, 9, 0] and valid.tolist() == [1] * 4 + [0] * 2
    assert torch.equal(u[inv], idx) and (pos == 2**31 - 1).all()


def test_sync_free_is_refused_for_the_other_policies_and_is_off_on_the_cpu():
    feats = _feats(20)
    with pytest.raises(ValueError, match="FIFO, static, lookahead"):
        FeatureCache(InMemoryFeatureStore(feats), 5, "lru", sync_free=True)
    assert not FeatureCache(InMemoryFeatureStore(feats), 5, "fifo").sync_free


# On a GPU the misses come from a tiered store's zero-copy host rows through the masked Triton
# kernel: run in Triton's interpreter, a FIFO cache over a tiered store (prefix and lookup, the
# hot part 0-60 %) serves every row right, makes no sync, and books per tier what the host path
# books; the masked kernel really runs and writes nothing where it skips.
NOSYNC_TIERED = (
    TIERED_SPY
    + r"""
from gnnio.features._gather import copy_masked
from gnnio.features.caches.cache import FeatureCache
# the torch-op path and its masked kernels: the fused batch (tests/test_cache_fused.py) held off
triton_kernels._FAILED["cache_batch"] = "held off here"
src = torch.arange(40, dtype=torch.float32).reshape(10, 4)
dst = torch.full((5, 4), -1.0)
copy_masked(src, torch.tensor([3, -1, 0, -1, 9]), dst)
assert dst[:, 0].tolist() == [12, -1, 0, -1, 36] and launches == [True], launches
g = torch.Generator().manual_seed(5)
host = torch.randn(300, 20, generator=g)
for kind in ("prefix", "lookup"):
    for h in (0, 60, 180):
        hot = torch.randperm(300, generator=g)[:h]
        def tiered():
            if kind == "prefix":
                return TieredFeatureStore(host, h, simulate=SimulatedDevice())
            return TieredFeatureStore(host, hot_ids=hot, simulate=SimulatedDevice())
        st_free, st_host = tiered(), tiered()
        free = FeatureCache(st_free, 50, "fifo", sync_free=True)
        ref = FeatureCache(st_host, 50, "fifo", sync_free=False)
        for b in range(4):
            ids = torch.randint(0, 300, (90,), generator=g)
            ids[:10] = ids[10:20]
            n0 = len(launches)
            with OpCounter() as c:
                got = free.gather(ids)
            assert c.syncs == 0, dict(c.sync_ops)
            assert len(launches) >= n0 + 2, "the masked kernels did not run"
            assert torch.equal(got, host[ids]) and torch.equal(ref.gather(ids), got)
        assert free.counters.snapshot() == ref.counters.snapshot(), (kind, h)
        assert st_free.counters.snapshot() == st_host.counters.snapshot()
        assert torch.equal(free.policy.key_of, ref.policy.key_of)
        st_free.close(); st_host.close()
# the admission's buffer write: only the inserted rows, by the row kernel with its skip state
rows_launch = spy("_rows", lambda a, kw: kw.get("SKIP"))
base = torch.randn(100, 8, generator=g)
free = FeatureCache(TieredFeatureStore(base, 0, simulate=SimulatedDevice()), 30, "fifo",
                    sync_free=True)
ref = FeatureCache(TieredFeatureStore(base, 0, simulate=SimulatedDevice()), 30, "fifo",
                   sync_free=False)
free._buffer_ext[-1] = 5.0  # the sentinel row: untouched when the scatter skips
for b in range(5):
    ids = torch.randint(0, 100, (40,), generator=g)
    assert torch.equal(free.gather(ids), base[ids]) and torch.equal(ref.gather(ids), base[ids])
assert True in rows_launch, rows_launch
filled = ref.policy.key_of >= 0
assert torch.equal(free.policy.key_of, ref.policy.key_of)
assert torch.equal(free.buffer[filled], ref.buffer[filled])
assert (free._buffer_ext[-1] == 5.0).all(), "the skipped rows were written"
assert set(triton_kernels._FAILED) == {"cache_batch"}, triton_kernels._FAILED
print("ok")
"""
)


def test_the_sync_free_cache_over_a_tiered_store_in_the_triton_interpreter():
    run_in_triton_interpreter(NOSYNC_TIERED)
