"""The lookahead cache's sync-free batch (gnnio.features.caches.nosync_lookahead; issue 24): the
``lookahead`` and ``optimal`` policies give what the host path gives -- rows, maps, per-key ranks,
fallbacks and last serials, window cursors, stats, counters -- batch by batch (against the CPU
kernels and the host torch path), with no operation that would make the host wait for a GPU
(counted on the CPU by OpCounter); the window reset, checkpoints and the announce protocol as on
the host path; ties broken alike on both paths."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnnio.features import InMemoryFeatureStore
from gnnio.features.caches import cache as cache_mod
from gnnio.features.caches.cache import FeatureCache
from gnnio.features.caches.lookahead import kept_smallest
from gnnio.utils.syncs import OpCounter
from tests.helpers import TIERED_SPY, run_in_triton_interpreter

HYP = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
COUNTS = ("batches", "queries", "unique_queries", "hits", "misses", "insertions", "evictions",
          "fetched_bytes", "hit_bytes")  # fmt: skip
PATHS = ("kernels", "torch", "free")  # host path with the CPU kernels, host torch ops, sync-free


def _caches(feats, cap, policy, k, hot, static):
    out = {}
    for path in PATHS:
        c = FeatureCache(InMemoryFeatureStore(feats), cap, policy, hot_ids=hot, lookahead=k,
                         static_capacity=static, sync_free=path == "free")  # fmt: skip
        c.policy.use_kernels = path == "kernels"
        out[path] = c
    assert out["free"].sync_free and not out["kernels"].sync_free
    return out


def _same(caches, sync: bool = True) -> None:
    """The state of every path equals the CPU kernels'; the cursors too with ``sync`` (read back
    from the device: the window's pending batches then go on as ints, the other branch)."""
    ref = caches["kernels"]
    a = ref.policy
    for path in PATHS[1:]:
        c = caches[path]
        b = c.policy
        assert torch.equal(a.key_of, b.key_of), path
        assert torch.equal(a.keystate, b.keystate), path  # ranks, last serials, fallbacks, slots
        if not sync:
            continue
        b.sync_cursors()
        for k in ("next_serial", "consumed", "filled", "announced"):
            assert getattr(a, k) == getattr(b, k), (path, k)
        assert [e[:3] for e in a.pending] == [e[:3] for e in b.pending], path
        sa, sb = ref.stats.as_dict(), c.stats.as_dict()
        assert {k: sa[k] for k in COUNTS} == {k: sb[k] for k in COUNTS}, path
        assert sa["hit_ratio"] == pytest.approx(sb["hit_ratio"], rel=1e-12)
        assert ref.counters.snapshot() == c.counters.snapshot(), path
        c._fold_clock()
        assert ref._clock == c._clock


def _replay(caches, feats, batches, ahead, reset_at=None) -> None:
    """Announce ``ahead`` batches ahead (all of them first for ``optimal``), gather each, compare
    after every batch; ``reset_at``: the window forgotten after that batch (an epoch closed
    early), then announced afresh."""
    for c in caches.values():
        c.announced_upto = 0
    for t, b in enumerate(batches):
        ids = torch.tensor(b, dtype=torch.int64)
        for c in caches.values():
            c.announced_upto = max(c.announced_upto, t)  # (K = 0: served unannounced)
            while c.announced_upto < min(len(batches), t + ahead):
                c.announce(torch.tensor(batches[c.announced_upto], dtype=torch.int64))
                c.announced_upto += 1
        want = torch.from_numpy(feats[np.asarray(b, dtype=np.int64)])
        for c in caches.values():
            assert torch.equal(c.gather(ids), want)
        if t == reset_at:
            for c in caches.values():
                c.reset_window()
                c.announced_upto = t + 1
        _same(caches, sync=t % 3 == 2 or t == len(batches) - 1)


@st.composite
def lookahead_workloads(draw):
    n = draw(st.integers(1, 30))
    cap = draw(st.integers(0, n + 3))
    batches = draw(st.lists(st.lists(st.integers(0, n - 1), max_size=30), min_size=1, max_size=9))
    policy = draw(st.sampled_from(["lookahead", "optimal"]))
    k = draw(st.integers(0, 4))
    with_hot = draw(st.booleans())
    static = draw(st.integers(0, min(cap, n))) if with_hot and draw(st.booleans()) else 0
    reset_at = draw(st.none() | st.integers(0, len(batches) - 1))
    return n, cap, batches, policy, k, with_hot, static, reset_at, draw(st.integers(0, 2**31))


@HYP
@given(w=lookahead_workloads())
def test_the_sync_free_path_equals_the_host_paths(w):
    """Random traces (repeats, empty batches, a full and a not-full cache, K = 0 and K > 0,
    ``optimal``, hot keys with and without a static part, the window reset mid-window)."""
    n, cap, batches, policy, k, with_hot, static, reset_at, seed = w
    rng = np.random.default_rng(seed)
    feats = rng.standard_normal((n, 3)).astype(np.float32)
    hot = rng.permutation(n) if with_hot else None
    caches = _caches(feats, cap, policy, k, hot, static)
    ahead = len(batches) if policy == "optimal" else k
    _replay(caches, feats, batches, ahead, None if policy == "optimal" else reset_at)


@pytest.mark.parametrize("policy,k,static", [("lookahead", 0, 0), ("lookahead", 3, 0),
                                             ("lookahead", 5, 12), ("optimal", 0, 0)])  # fmt: skip
def test_longer_traces_with_many_ties(policy, k, static):
    """Bigger random traces with many equal ranks (ids next used in the same batch, equal
    fallbacks), the cache full most of the time: both paths keep the same ids."""
    rng = np.random.default_rng(k + static)
    n = 400
    feats = rng.standard_normal((n, 4)).astype(np.float32)
    batches = [rng.zipf(1.4, int(rng.integers(1, 120))) % n for _ in range(40)]
    caches = _caches(feats, 60, policy, k, rng.permutation(n) if static else None, static)
    _replay(caches, feats, [b.tolist() for b in batches], 40 if policy == "optimal" else k, 20)
    assert caches["free"].stats.as_dict()["evictions"] > 50


def test_free_slots_are_filled_before_the_evicted_ones():
    """A batch that both fills the last free slots and evicts (the cache not full before it): the
    misses go to the free slots first, then to the evicted slots, in slot order."""
    feats = np.arange(20, dtype=np.float32).reshape(10, 2)
    caches = _caches(feats, 4, "lookahead", 1, None, 0)
    # batch 1's ids are used again in batch 2 (inside the window): they displace key 1, the
    # later of the two cached ids tied on their fallback
    _replay(caches, feats, [[0, 1], [2, 3, 4], [4, 3, 2]], ahead=2)
    for c in caches.values():
        assert c.policy.key_of.tolist() == [0, 4, 2, 3]
        assert c.stats.as_dict()["evictions"] == 1


def test_a_batch_makes_no_host_sync(monkeypatch):
    """announce + gather of a sync-free lookahead cache: 0 host syncs per batch. The ids come as
    a GPU's loader hands them (already int64 on the cache's device and vouched, so ``ids_on``
    returns them as they are: on the CPU it copies them, and the in-place check would compare)."""
    monkeypatch.setattr(cache_mod, "ids_on", lambda store, ids, device: ids.long())
    rng = np.random.default_rng(1)
    n = 500
    feats = rng.standard_normal((n, 8)).astype(np.float32)
    for policy, k in (("lookahead", 0), ("lookahead", 3), ("optimal", 0)):
        c = FeatureCache(InMemoryFeatureStore(feats), 60, policy, hot_ids=rng.permutation(n),
                         lookahead=k, static_capacity=10, sync_free=True)  # fmt: skip
        trace = [torch.from_numpy(rng.integers(0, n, 120)) for _ in range(8)]
        ahead = len(trace) if policy == "optimal" else k
        for t in range(ahead):
            c.announce(trace[t])
        for t, ids in enumerate(trace):
            with OpCounter() as oc:
                rows = c.gather(ids)
                if policy == "lookahead" and k and t + k < len(trace):
                    c.announce(trace[t + k])
            assert oc.syncs == 0, (policy, dict(oc.sync_ops))
            assert oc.ops < 250, oc.ops  # (~200 ATen ops, views included, on the CPU)
            assert torch.equal(rows, torch.from_numpy(feats[ids.numpy()]))
        st = c.stats.as_dict()
        assert st["hits"] > 0 and (st["evictions"] > 0 or not ahead)  # (K = 0: the hot stay)


@pytest.mark.parametrize("k", [0, 3])
def test_the_loader_with_a_sync_free_lookahead_cache(k, monkeypatch):
    """The loader's announce-then-gather protocol over the sync-free path: the same rows as a
    loader without a cache, the same hits as the host path, and every announcement made with the
    ids vouched for (on a GPU an unvouched id check reads the ids' range back: a sync)."""
    from gnnio.features.base import ids_vouched
    from gnnio.ordering import RandomOrder
    from gnnio.pipeline.loader import NodeLoader
    from gnnio.sampling import UniformSampler
    from tests.helpers import random_graph

    vouched = []
    real = FeatureCache.announce
    monkeypatch.setattr(FeatureCache, "announce",
                        lambda self, ids: (vouched.append(ids_vouched()), real(self, ids)))  # fmt: skip
    g = random_graph(800, 6000, seed=4)
    store = InMemoryFeatureStore(np.random.default_rng(0).standard_normal((800, 4)).astype("f4"))
    order = RandomOrder(np.arange(800), 64, seed=1)
    loaders = [NodeLoader(UniformSampler(g, [4, 3], seed=2), s, order, num_workers=2)
               for s in (store, *(FeatureCache(store, 120, "lookahead", lookahead=k, sync_free=f)
                                  for f in (True, False)))]  # fmt: skip
    for epoch in range(2):
        for a, b, c in zip(*(ld.epoch(epoch) for ld in loaders), strict=True):
            assert torch.equal(a.x, b.x) and torch.equal(a.x, c.x)
    free, host = loaders[1].store, loaders[2].store
    assert free.stats.as_dict()["hits"] == host.stats.as_dict()["hits"] > 0
    assert all(vouched) and (len(vouched) > 0) == (k > 0)


def test_a_batch_not_announced_next_is_refused_and_changes_nothing():
    feats = np.arange(40, dtype=np.float32).reshape(20, 2)
    c = FeatureCache(InMemoryFeatureStore(feats), 5, "lookahead", lookahead=2, sync_free=True)
    c.announce(torch.tensor([1, 2, 3]))
    before = c.policy.keystate.clone()
    with pytest.raises(ValueError, match="not the batch announced next"):
        c.gather(torch.tensor([1, 2, 4]))
    assert torch.equal(c.policy.keystate, before) and c.policy.window == 1
    # the same ids in another tensor are the batch announced: served
    assert torch.equal(c.gather(torch.tensor([1, 2, 3])), torch.from_numpy(feats[[1, 2, 3]]))


def test_checkpoints_of_both_paths_are_the_same_and_resume_either_way():
    rng = np.random.default_rng(4)
    n = 200
    feats = rng.standard_normal((n, 4)).astype(np.float32)
    hot = rng.permutation(n)
    caches = _caches(feats, 30, "lookahead", 3, hot, 5)
    trace = [rng.integers(0, n, 50).tolist() for _ in range(10)]
    for c in caches.values():
        for t in range(3):
            c.announce(torch.tensor(trace[t]))
    for t in range(5):  # mid-window: batches 5..7 announced, not served
        for c in caches.values():
            c.gather(torch.tensor(trace[t]))
            c.announce(torch.tensor(trace[t + 3]))
    sh, sf = caches["kernels"].state_dict(), caches["free"].state_dict()
    assert sh.keys() == sf.keys() and sh["clock"] == sf["clock"]
    for k, v in sh["maps"].items():
        same = torch.equal(v, sf["maps"][k]) if isinstance(v, torch.Tensor) else v == sf["maps"][k]
        assert same, k
    assert not any(k.startswith("_") for k in sf["maps"])
    # resume each path from the other's checkpoint (an empty window) and go on in step
    free = FeatureCache(InMemoryFeatureStore(feats), 30, "lookahead", hot_ids=hot, lookahead=3,
                        static_capacity=5, sync_free=True)  # fmt: skip
    free.load_state_dict(sh)
    host = FeatureCache(InMemoryFeatureStore(feats), 30, "lookahead", hot_ids=hot, lookahead=3,
                        static_capacity=5)  # fmt: skip
    host.load_state_dict(sf)
    for c in (free, host):
        for t in range(5, 8):
            c.announce(torch.tensor(trace[t]))
    for t in range(5, 10):
        a, b = free.gather(torch.tensor(trace[t])), host.gather(torch.tensor(trace[t]))
        assert torch.equal(a, b) and torch.equal(a, torch.from_numpy(feats[trace[t]]))
        if t + 3 < 10:
            free.announce(torch.tensor(trace[t + 3]))
            host.announce(torch.tensor(trace[t + 3]))
    free.policy.sync_cursors()
    assert torch.equal(free.policy.keystate, host.policy.keystate)
    assert torch.equal(free.policy.key_of, host.policy.key_of)


def test_device_cursors_are_made_without_a_copy_from_the_host():
    """The cursors go to the device by in-place fills (a kernel argument each), not as a tensor
    built on the host and copied up (``lift_fresh``: on CUDA a blocking copy, a sync inside the
    batch after every read-back of the cursors)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from gnnio.features.caches.lookahead import LookaheadPolicy

    class Names(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    pol = LookaheadPolicy(5, 20, lookahead=2)
    pol.next_serial, pol.consumed, pol.filled = 7, 3, 4
    with Names() as seen:
        cur = pol.device_cursors()
    assert cur.tolist() == [7, 3, 4]
    assert not any("lift_fresh" in n or "copy" in n for n in seen.names), seen.names


def test_ties_are_kept_in_position_order():
    """The host path's selection keeps what a stable sort keeps (the sync-free path's)."""
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        size = int(torch.randint(1, 60, (1,), generator=g))
        ranks = torch.randint(0, 5, (size,), generator=g) * (1 << 58)
        keep = int(torch.randint(1, size + 1, (1,), generator=g))
        want = torch.zeros(size, dtype=torch.bool)
        want[torch.sort(ranks, stable=True).indices[:keep]] = True
        assert torch.equal(kept_smallest(ranks, keep), want)


def test_sync_free_covers_the_lookahead_policies_and_is_off_on_the_cpu():
    feats = np.zeros((20, 2), dtype=np.float32)
    for policy in ("lookahead", "optimal"):
        assert not FeatureCache(InMemoryFeatureStore(feats), 5, policy).sync_free
        c = FeatureCache(InMemoryFeatureStore(feats), 5, policy, sync_free=True)
        assert c.sync_free and not c.policy.use_kernels


# On a GPU: the sync-free lookahead cache over a tiered store (its misses read by the masked
# Triton kernels) against the host path with the CPU kernels, batch by batch; CUDA's own sync
# check around announce + gather. The same script runs here in Triton's interpreter (smaller).
LOOK_ON_CUDA = (
    TIERED_SPY
    + r"""
import contextlib
from gnnio.features import InMemoryFeatureStore
from gnnio.features.base import ids_in_range
from gnnio.features.caches import cache as cache_mod
from gnnio.features.caches import _triton_lookahead_rows as TR
from gnnio.features.caches.cache import FeatureCache

served = []
real_finish = TR.finish
TR.finish = lambda *a: (served.append(1), real_finish(*a))
CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
ON = {"device": "cuda"} if CUDA else {"simulate": SimulatedDevice()}
N, B, NB = (20_000, 3000, 12) if CUDA else (400, 90, 8)
if not CUDA:  # as a GPU's loader hands the ids: on the device already (no copy to compare)
    cache_mod.ids_on = lambda store, ids, device: ids.long()


@contextlib.contextmanager
def no_sync():
    if CUDA:  # CUDA's own check: a synchronizing call raises
        torch.cuda.set_sync_debug_mode("error")
        try:
            with ids_in_range():
                yield
        finally:
            torch.cuda.set_sync_debug_mode("default")
    else:
        with OpCounter() as c:
            yield
        assert c.syncs == 0, dict(c.sync_ops)


g = torch.Generator().manual_seed(7)
feats = torch.randn(N, 16, generator=g)
hot_ids = torch.randperm(N, generator=g).numpy()
for policy, k, static, hot in (("lookahead", 0, 0, 0), ("lookahead", 4, 20, N // 10),
                               ("optimal", 0, 0, N // 2)):
    store = TieredFeatureStore(feats, hot, **ON)
    free = FeatureCache(store, N // 8, policy, hot_ids=hot_ids, lookahead=k,
                        static_capacity=static, device=DEV, sync_free=None if CUDA else True)
    assert free.sync_free and free.device.type == DEV
    ref = FeatureCache(InMemoryFeatureStore(feats), N // 8, policy, hot_ids=hot_ids, lookahead=k,
                       static_capacity=static)
    assert ref.policy.use_kernels and not ref.sync_free
    trace = [(torch.randint(0, N, (B,), generator=g) * torch.rand(B, generator=g) ** 2).long()
             for _ in range(NB)]
    dev_trace = [t.to(DEV) for t in trace]
    ahead = NB if policy == "optimal" else k
    for t in range(ahead):
        free.announce(dev_trace[t])
        ref.announce(trace[t])
    for t in range(NB):
        with no_sync():
            got = free.gather(dev_trace[t])
            if policy == "lookahead" and k and t + k < NB:
                free.announce(dev_trace[t + k])
        if policy == "lookahead" and k and t + k < NB:
            ref.announce(trace[t + k])
        assert torch.equal(got.cpu(), feats[trace[t]]) and torch.equal(ref.gather(trace[t]), got.cpu())
        assert torch.equal(free.policy.keystate.cpu(), ref.policy.keystate), (policy, t)
        assert torch.equal(free.policy.key_of.cpu(), ref.policy.key_of)
        if t % 3 == 2:  # (the cursors read back: the window goes on as ints, the other branch)
            free.policy.sync_cursors()
            assert free.policy.filled == ref.policy.filled
    sa, sb = free.stats.as_dict(), ref.stats.as_dict()
    for key in ("hits", "misses", "insertions", "evictions", "unique_queries"):
        assert sa[key] == sb[key], (policy, key, sa[key], sb[key])
    assert sa["evictions"] > 0 or not ahead, policy  # (K = 0: the hot keys stay)
    store.close()
assert len(served) == 3 * NB, "the rows' kernels did not serve every batch"
assert not triton_kernels._FAILED, triton_kernels._FAILED
print("ok")
"""
)


KERNELS = r"""
import numpy as np
import tests.test_cache_nosync_lookahead as T
from gnnio.features.caches import _triton_lookahead as TL
from gnnio.features.caches import _triton_lookahead_rows as TR
from gnnio.utils import triton_kernels

ran = {}
for mod, name in ((TL, "dedup"), (TL, "announce"), (TL, "begin"), (TL, "admit"), (TR, "serve"),
                  (TR, "finish")):
    def spy(*a, _real=getattr(mod, name), _name=name):
        ran[_name] = ran.get(_name, 0) + 1
        return _real(*a)
    setattr(mod, name, spy)
for args in (("lookahead", 0, 0), ("lookahead", 3, 0), ("lookahead", 5, 12), ("optimal", 0, 0)):
    T.test_longer_traces_with_many_ties(*args)
T.test_free_slots_are_filled_before_the_evicted_ones()
T.test_checkpoints_of_both_paths_are_the_same_and_resume_either_way()
T.test_a_batch_not_announced_next_is_refused_and_changes_nothing()
rng = np.random.default_rng(9)
for policy, k, hot, static in (("lookahead", 2, True, 3), ("optimal", 0, False, 0)):
    feats = rng.standard_normal((40, 3)).astype(np.float32)
    for cap in (0, 1, 7, 45):
        caches = T._caches(feats, cap, policy, k, rng.permutation(40) if hot else None,
                           min(static, cap))
        batches = [rng.integers(0, 40, int(rng.integers(0, 30))).tolist() for _ in range(9)]
        T._replay(caches, feats, batches, 9 if policy == "optimal" else k, 4)
for case in range(40):  # random small workloads, as the hypothesis test draws them
    n = int(rng.integers(1, 30))
    cap = int(rng.integers(0, n + 4))
    policy = ("lookahead", "optimal")[case % 2]
    k = int(rng.integers(0, 5))
    hot = rng.permutation(n) if case % 3 else None
    static = int(rng.integers(0, min(cap, n) + 1)) if hot is not None and case % 4 == 1 else 0
    feats = rng.standard_normal((n, 3)).astype(np.float32)
    batches = [rng.integers(0, n, int(rng.integers(0, 25))).tolist()
               for _ in range(int(rng.integers(1, 9)))]
    ahead = len(batches) if policy == "optimal" else k
    reset = None if policy == "optimal" else int(rng.integers(0, len(batches)))
    T._replay(T._caches(feats, cap, policy, k, hot, static), feats, batches, ahead, reset)
assert min(ran.get(k, 0) for k in ("dedup", "announce", "begin", "admit", "serve", "finish")) > 20, ran
assert not triton_kernels._FAILED, triton_kernels._FAILED
print("ok")
"""


@pytest.mark.parametrize("scalars", ["i32", "i64"])
def test_the_kernels_build_for_a_gpu_on_this_machine(scalars):
    """Every lookahead kernel compiles to an sm_90 cubin (no GPU needed; the interpreter accepts
    code a GPU compiler refuses), with int32 and int64 sizes, with and without a lookup table."""
    pytest.importorskip("triton")
    from gnnio.features.caches import _triton_lookahead as T
    from gnnio.features.caches import _triton_lookahead_rows as R
    from tests.helpers import compile_for_sm90

    rows = {"W": 100, "WP": 128, "BR": 32}
    kernels = [(f, {"BLOCK": 1024}) for f in (T._first, T._place, T._announce, T._begin, T._ranks,
                                              T._flags, T._freed, T._admit)]  # fmt: skip
    kernels += [(R._fetch, rows | {"HAS_TABLE": t}) for t in (False, True)]
    kernels += [(R._out, rows), (R._write, rows)]
    for fn, const in kernels:
        types = {}
        for a in fn.arg_names:
            if a in const:
                types[a] = "constexpr"
            elif a in ("n", "j", "r", "c", "s0", "cap", "prefix", "rb"):
                types[a] = scalars
            elif a in ("buf", "hot", "cold", "dst", "rows_u"):
                types[a] = "*fp32"
            else:
                types[a] = {"kept": "*i8", "stats": "*fp64", "table": "*i32", "pos": "*i32",
                            "valid": "*i1"}.get(a, "*i64")  # fmt: skip
        k = compile_for_sm90(fn, types, const)
        assert "st.global" in k.asm["ptx"], fn.fn.__name__


def test_the_kernels_in_the_triton_interpreter_equal_the_host_path():
    """The lookahead bookkeeping's Triton kernels (gnnio.features.caches._triton_lookahead), run
    in Triton's interpreter: the replays above (ties, free slots, checkpoints, refusal, small and
    full caches, the window reset) give the CPU kernels' state batch by batch with them."""
    pytest.importorskip("triton")
    run_in_triton_interpreter(KERNELS)


def test_the_on_cuda_script_in_the_triton_interpreter():
    """LOOK_ON_CUDA's script itself, on the CPU in Triton's interpreter (smaller): a fault in the
    script is found here, not in a GPU session's few minutes."""
    pytest.importorskip("triton")
    run_in_triton_interpreter(LOOK_ON_CUDA)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_sync_free_lookahead_cache_equals_the_host_path_on_cuda():  # pragma: no cover
    """LOOK_ON_CUDA on a GPU: rows, per-key state, maps and counts equal the CPU kernels' after
    every batch, and announce + gather make no sync (CUDA's sync check)."""
    pytest.importorskip("triton")
    exec(compile(LOOK_ON_CUDA, "LOOK_ON_CUDA", "exec"), {})
