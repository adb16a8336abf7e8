"""Rules of the distributed feature store, partitioned sampler, shared shards and ``pread`` host
rows (gnnio/distributed/store.py, sampling.py, shm.py, hostrows.py) that a mutation pass found
unguarded by the fast tests: a store that does not match the run is refused, rows from several
owners land where they belong, the fault spec is parsed strictly, several hops and pruned hops on
thread-ranks are exactly the single-process batches (weights too) and a pruned peer list is
counted by its window, and a ``pread`` reader clamps its threads and closes its file. All run on
thread-ranks (tests/fake_dist.py) or in this process."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
import torch

from gnnio.distributed.store import ShardedFeatureStore, fault_from_env
from gnnio.features import InMemoryFeatureStore, MmapFeatureStore
from gnnio.placement import Placement
from gnnio.placement.topology import load_topology
from gnnio.preprocess.partition import load_partition
from gnnio.sampling import PrunedUniformSampler, UniformSampler
from tests.fake_dist import run_ranks
from tests.test_dist_sampling_counts import parted  # noqa: F401 - the module's fixture

N, DIM = 30, 2
FEATS = torch.arange(N * DIM, dtype=torch.float32).reshape(N, DIM)


# -- the sharded store ----------------------------------------------------------------------


def test_a_placement_for_another_run_is_refused():
    """A placement with a buffer per device of another world size, or over another number of
    nodes than the features have, is a ValueError naming both numbers; the host store's counts
    of filling the shard are set-up, not traffic."""
    ok = Placement("hand", N, ((0, 1),), [np.arange(5), np.arange(5, 10)])

    def body(ctx):
        wrong_world = Placement("hand", N, ((0, 1, 2),), [np.arange(3)] * 3)
        wrong_rows = Placement("hand", N + 1, ((0, 1),), [np.arange(3)] * 2)
        with pytest.raises(ValueError, match="3 devices, the run has 2 ranks"):
            ShardedFeatureStore(InMemoryFeatureStore(FEATS), wrong_world, ctx)
        with pytest.raises(ValueError, match=f"covers {N + 1} nodes, the features have {N}"):
            ShardedFeatureStore(InMemoryFeatureStore(FEATS), wrong_rows, ctx)
        host = InMemoryFeatureStore(FEATS)
        ShardedFeatureStore(host, ok, ctx)
        return sum(host.counters.rows.values())

    assert run_ranks(2, body, load_topology("2")) == [0, 0]


def test_rows_of_several_owners_land_in_their_places():
    """Three ranks, each batch asking rows of both other ranks' shards interleaved (owners not in
    id order: rank 1 holds 10-14, rank 2 holds 5-9): the rows are grouped by owner for the
    exchange and put back where the batch asked for them."""
    placement = Placement("hand", N, ((0, 1, 2),), [np.arange(0, 5), np.arange(10, 15),
                                                     np.arange(5, 10)])  # fmt: skip
    asks = {0: [12, 7, 11, 2, 6, 20, 13, 5], 1: [3, 14, 2, 10, 0], 2: [9, 1, 8, 4, 22, 0]}

    def body(ctx):
        store = ShardedFeatureStore(InMemoryFeatureStore(FEATS), placement, ctx)
        ids = asks[ctx.rank]
        ok = torch.equal(store.gather(torch.tensor(ids)), FEATS[ids])
        rows = {
            t: float(store.counters.rows.get(t, 0)) for t in ("local", "peer", "host", "network")
        }
        return ok, rows, store.modeled_rows()

    # ranks 0 and 1 on one machine, rank 2 on another: the model splits peer and network rows
    # by the owner's machine as the exchange counts them
    ranks = run_ranks(3, body, load_topology("3"), machine_of=[0, 0, 1])
    for ok, rows, modeled in ranks:
        assert ok and rows == modeled
    assert ranks[0][1] == {"local": 1.0, "peer": 3.0, "host": 1.0, "network": 3.0}


def test_reuse_serves_the_previous_batch_rows_and_only_those():
    """With ``reuse``, a non-local row of the previous batch is copied from it (and not fetched
    again); every other row is read from its own place: the rows are the features, by hand."""
    from tests.test_dist_store_links import FEATS as F40
    from tests.test_dist_store_links import PLACEMENT as P40  # rank r: rows 10r..10r+9

    def body(ctx):
        store = ShardedFeatureStore(InMemoryFeatureStore(F40), P40, ctx, reuse=True)
        o, p = 10 * ctx.rank, 10 * (1 - ctx.rank)  # own and peer rows
        ok = True
        for ids in ([p + 2, 30, o], [p + 2, 31, 30, o + 1, p + 3], [p + 3, 30, o + 2, 33]):
            ok &= torch.equal(store.gather(torch.tensor(ids)), F40[ids])
        return ok, {t: store.counters.rows.get(t, 0) for t in ("local", "peer", "host", "reuse")}

    for ok, rows in run_ranks(2, body, load_topology("2")):
        assert ok
        assert rows == {"local": 3, "peer": 2, "host": 3, "reuse": 4}


def test_rows_a_cache_before_host_memory_serves_count_as_cache():
    """A cache in front of host memory: its hits are ``cache`` rows, its misses ``host`` rows."""
    from gnnio.features.caches.cache import FeatureCache
    from tests.test_dist_store_links import FEATS as F40
    from tests.test_dist_store_links import PLACEMENT as P40

    def body(ctx):
        cache = FeatureCache(InMemoryFeatureStore(F40), 8, "fifo", tier="cache")
        store = ShardedFeatureStore(cache, P40, ctx)
        for ids in ([30, 31, 1], [31, 30, 32]):
            assert torch.equal(store.gather(torch.tensor(ids)), F40[ids])
        return "cache" in store.tiers, {t: store.counters.rows.get(t, 0) for t in ("host", "cache")}

    for listed, rows in run_ranks(2, body, load_topology("2")):
        assert listed and rows == {"host": 3, "cache": 2}


def test_a_store_loaded_from_a_checkpoint_cannot_rewind_past_it():
    """Loading a state drops the gathers logged before it: a rewind to before the load is
    refused, never served from the log of the run the store had before."""
    from tests.test_dist_store_links import FEATS as F40
    from tests.test_dist_store_links import PLACEMENT as P40

    def body(ctx):
        store = ShardedFeatureStore(InMemoryFeatureStore(F40), P40, ctx, reuse=True)
        store.keep_log = True
        batches = [[12, 30, 0], [13, 31, 1], [14, 32, 2]]
        for ids in batches:
            store.gather(torch.tensor(ids))
        store.load_state_dict(store.state_dict(upto=2))
        store.gather(torch.tensor(batches[2]))
        with pytest.raises(RuntimeError, match="cannot rewind from gather 3 to 1"):
            store.state_dict(upto=1)
        return True

    assert run_ranks(2, body, load_topology("2")) == [True, True]


def test_a_rewind_to_a_gather_not_made_yet_is_refused_in_one_line():
    """``state_dict(upto)`` past the gathers made (a mark from another run) is the one-line
    RuntimeError, not a KeyError out of the log."""
    from tests.test_dist_store_links import FEATS as F40
    from tests.test_dist_store_links import PLACEMENT as P40

    def body(ctx):
        store = ShardedFeatureStore(InMemoryFeatureStore(F40), P40, ctx, reuse=True)
        store.keep_log = True
        store.gather(torch.tensor([12, 30, 0]))
        with pytest.raises(RuntimeError, match="cannot rewind from gather 1 to 2"):
            store.state_dict(upto=2)
        return True

    assert run_ranks(2, body, load_topology("2")) == [True, True]


def test_a_store_without_reuse_loads_no_previous_rows():
    """A checkpoint of a run with ``reuse`` loaded by a store without it: no previous batch is
    kept (none read from host memory, none saved again in the next checkpoint)."""
    from tests.test_dist_store_links import FEATS as F40
    from tests.test_dist_store_links import PLACEMENT as P40

    class Counting(InMemoryFeatureStore):
        reads = 0

        def gather(self, ids, out=None):
            Counting.reads += 1
            return super().gather(ids, out=out)

    def body(ctx):
        src = ShardedFeatureStore(InMemoryFeatureStore(F40), P40, ctx, reuse=True)
        src.gather(torch.tensor([12, 30, 0]))
        state = src.state_dict()
        assert state["prev_ids"] is not None and state["prev_ids"].numel() == 2
        store = ShardedFeatureStore(Counting(F40), P40, ctx)
        before = Counting.reads
        store.load_state_dict(state)
        return Counting.reads == before and store.state_dict()["prev_ids"] is None

    assert run_ranks(2, body, load_topology("2")) == [True, True]


@pytest.mark.parametrize(
    ("spec", "want"),
    [("1:4:kill", (4, "kill")), ("1:0:raise", (0, "raise")), ("0:4:kill", None), ("", None)],
)
def test_the_fault_spec_names_its_rank_gather_and_kind(monkeypatch, spec, want):
    monkeypatch.setenv("GNNIO_FAULT", spec)
    assert fault_from_env(1) == want


@pytest.mark.parametrize("spec", ["1:4:explode", "1:4", "x:4:kill"])
def test_a_bad_fault_spec_is_refused(monkeypatch, spec):
    monkeypatch.setenv("GNNIO_FAULT", spec)
    with pytest.raises(ValueError, match="RANK:GATHER:kill|raise"):
        fault_from_env(1)


# -- the partitioned sampler ----------------------------------------------------------------

PRUNE = (0.5, 0.5)  # on the 60-node graph of 400 edges: a window of 5 entries, fanout 3


def _seeds(ds, rank: int) -> np.ndarray:
    """Two of the rank's own nodes and the three longest lists of the other part (0-29 | 30-59)."""
    deg = ds.graph.in_degrees()
    other = np.arange(30, 60) if rank == 0 else np.arange(0, 30)
    hubs = other[np.argsort(-deg[other], kind="stable")[:3]]
    own = np.array([3, 11]) + 30 * rank
    return np.concatenate([hubs[:1], own, hubs[1:]])


def _run_sampler(parted, tmp_path, monkeypatch, mode, fanouts, prune, seeds_of):  # noqa: F811
    from gnnio.distributed import shm
    from gnnio.distributed.sampling import ShardedSampler

    ds, pdir = parted
    monkeypatch.setattr(shm, "SHM_DIR", tmp_path)
    avg = ds.num_edges / ds.num_nodes

    def body(ctx):
        part = load_partition(pdir, ds, 2)
        s = ShardedSampler(part, pdir, ctx, fanouts, seed=3, mode=mode, prune=prune,
                           avg_degree=avg)  # fmt: skip
        seeds = torch.from_numpy(seeds_of(ctx.rank))
        return s, [s.sample(seeds, epoch_seed=e) for e in range(2)]

    return run_ranks(2, body, load_topology("2"))


@pytest.mark.parametrize("prune", [None, PRUNE])
@pytest.mark.parametrize("mode", ["dsp", "shared"])
def test_two_hops_on_thread_ranks_are_the_single_process_batches(
    parted,  # noqa: F811
    tmp_path,
    monkeypatch,
    mode,
    prune,
):
    """Each hop's new nodes in first-seen order, the blocks outermost hop first, and (pruned)
    the HT weights ``deg / min(deg, fanout)`` of the single-process sampler, bit for bit."""
    ds, _ = parted
    fanouts = [3, 2]
    kw = {"seed": 3, "num_threads": 1}
    ref = (UniformSampler(ds.graph, fanouts, **kw) if prune is None
           else PrunedUniformSampler(ds.graph, fanouts, prune=prune, **kw))  # fmt: skip
    ranks = _run_sampler(parted, tmp_path, monkeypatch, mode, fanouts, prune,
                         lambda r: _seeds(ds, r))  # fmt: skip
    for r, (_, got) in enumerate(ranks):
        seeds = torch.from_numpy(_seeds(ds, r))
        for e, mb in enumerate(got):
            want = ref.sample(seeds, epoch_seed=e)
            assert torch.equal(mb.input_nodes, want.input_nodes)
            assert len(mb.blocks) == len(want.blocks) == 2
            for a, b in zip(mb.blocks, want.blocks):
                assert torch.equal(a.edge_index, b.edge_index)
                assert (a.num_src, a.num_dst) == (b.num_src, b.num_dst)
                if prune is None:
                    assert a.edge_weight is None
                else:
                    assert torch.equal(a.edge_weight, b.edge_weight)
            if prune is not None:  # the weights are not all 1: the rule is exercised
                assert any(bool((blk.edge_weight > 1).any()) for blk in mb.blocks)


def test_a_pruned_peer_list_is_counted_by_its_window(parted, tmp_path, monkeypatch):  # noqa: F811
    """Shared mode, pruned: a peer's row costs its window (``min(deg, threshold)`` entries), not
    its whole list, plus the ``indptr`` pair."""
    ds, _ = parted
    ranks = _run_sampler(parted, tmp_path, monkeypatch, "shared", [3], PRUNE,
                         lambda r: _seeds(ds, r))  # fmt: skip
    deg = ds.graph.in_degrees()
    for r, (s, _) in enumerate(ranks):
        theta = s.thresholds[0]
        peer = _seeds(ds, r)[[0, 3, 4]]
        assert (deg[peer] > theta).any()  # a list longer than its window
        window = np.minimum(deg[peer], theta)
        assert s.bytes_by_link["peer"] == 2 * int(window.sum() * s.own.itemsize + 16 * 3)
        assert s.stats["requests"] == 2 * 3


def test_a_pruned_hop_of_every_neighbour_has_weights_one(parted, tmp_path, monkeypatch):  # noqa: F811
    """A pruned sampler's hop of fanout -1 takes whole lists, unpruned: each edge weighs
    ``deg / deg = 1``, as in the single-process sampler (a weight computed with ``k = min(n,
    fanout) = -1`` was ``-deg``)."""
    ds, _ = parted
    fanouts = [3, -1]
    ref = PrunedUniformSampler(ds.graph, fanouts, prune=PRUNE, seed=3, num_threads=1)
    ranks = _run_sampler(parted, tmp_path, monkeypatch, "dsp", fanouts, PRUNE,
                         lambda r: _seeds(ds, r))  # fmt: skip
    for r, (_, got) in enumerate(ranks):
        for e, mb in enumerate(got):
            want = ref.sample(torch.from_numpy(_seeds(ds, r)), epoch_seed=e)
            assert torch.equal(mb.input_nodes, want.input_nodes)
            for a, b in zip(mb.blocks, want.blocks):
                assert torch.equal(a.edge_index, b.edge_index)
                assert torch.equal(a.edge_weight, b.edge_weight)
            assert torch.equal(mb.blocks[0].edge_weight, torch.ones(mb.blocks[0].num_edges))


def test_the_evaluation_sampler_reads_the_training_samplers_shards(parted, tmp_path, monkeypatch):  # noqa: F811
    """``share_with`` (gnnio train's evaluation sampler): the same own shard and, in shared mode,
    the same mapped peer shards, no second copy; its batches are still the single-process ones
    (without the peer shards its remote rows were never sampled: no edges from them)."""
    from gnnio.distributed import shm
    from gnnio.distributed.sampling import ShardedSampler

    ds, pdir = parted
    monkeypatch.setattr(shm, "SHM_DIR", tmp_path)
    ref = UniformSampler(ds.graph, [3], seed=3, num_threads=1)

    def body(ctx):
        part = load_partition(pdir, ds, 2)
        train = ShardedSampler(part, pdir, ctx, [3], seed=3, mode="shared")
        ev = ShardedSampler(part, pdir, ctx, [3], seed=3, mode="shared", group="eval_sample",
                            share_with=train)  # fmt: skip
        assert ev.own is train.own and ev.peer_shards is train.peer_shards
        assert ev.shared_via == train.shared_via == "shm"
        seeds = torch.from_numpy(_seeds(ds, ctx.rank))
        mb, want = ev.sample(seeds, epoch_seed=1), ref.sample(seeds, epoch_seed=1)
        return torch.equal(mb.input_nodes, want.input_nodes) and torch.equal(
            mb.blocks[0].edge_index, want.blocks[0].edge_index
        )

    assert run_ranks(2, body, load_topology("2")) == [True, True]


# -- host rows by pread ---------------------------------------------------------------------


def _mapped(tmp_path, rows: int = 50, dim: int = 4) -> tuple[MmapFeatureStore, np.ndarray]:
    x = np.arange(rows * dim, dtype=np.float32).reshape(rows, dim)
    f = tmp_path / "features.npy"
    np.save(f, x)
    return MmapFeatureStore(f), x


def test_a_reader_asked_for_more_threads_than_numba_has_takes_numba_s(tmp_path):
    from gnnio.distributed.hostrows import pread_rows_of

    store, x = _mapped(tmp_path)
    reader = pread_rows_of(store, num_threads=10_000)
    ids = torch.tensor([7, 0, 49, 7])
    assert torch.equal(reader.gather(ids, torch.empty((4, 4))), torch.from_numpy(x[ids.numpy()]))


def test_a_collected_reader_closes_its_file(tmp_path):
    from gnnio.distributed.hostrows import pread_rows_of

    store, _ = _mapped(tmp_path)
    reader = pread_rows_of(store)
    fd = reader._fd
    link = f"/proc/self/fd/{fd}"
    assert os.readlink(link) == str(tmp_path / "features.npy")
    del reader
    gc.collect()
    assert not os.path.exists(link) or os.readlink(link) != str(tmp_path / "features.npy")


def test_the_sampler_refuses_what_it_cannot_sample(parted):  # noqa: F811
    """An unknown mode, pruning without the graph's average degree, seeds given twice, and a
    row asked of a shard that does not store it: each a one-line error."""
    from gnnio.distributed.sampling import ShardedSampler, _Shard

    ds, pdir = parted

    def body(ctx):
        part = load_partition(pdir, ds, 2)
        with pytest.raises(ValueError, match="mode: must be one of dsp, shared"):
            ShardedSampler(part, pdir, ctx, [3], mode="pull")
        with pytest.raises(ValueError, match="avg_degree: needed with prune"):
            ShardedSampler(part, pdir, ctx, [3], prune=PRUNE)
        s = ShardedSampler(part, pdir, ctx, [3])
        with pytest.raises(ValueError, match="seeds: must be distinct"):
            s.sample(torch.tensor([1, 31, 1]))
        shard = _Shard(pdir, ctx.rank, ds.num_nodes)
        missing = np.flatnonzero(shard.rows_of(np.arange(ds.num_nodes)) < 0)[:1]
        assert missing.size == 1  # a node of the other part, not replicated here
        with pytest.raises(RuntimeError, match="not stored in this shard"):
            shard.sample(missing, 3, np.uint64(0))
        return True

    assert run_ranks(2, body, load_topology("2")) == [True, True]


# -- shards shared through /dev/shm ---------------------------------------------------------

ARR = {"nodes": np.arange(4, dtype=np.int64), "indptr": np.array([0, 1, 3, 3, 6], np.int64),
       "indices": np.array([5, 1, 2, 7, 0, 3], np.int32)}  # fmt: skip


def _share(tmp_path, monkeypatch, hold):
    """``share_shards`` on two thread-ranks (shard ``r``: ``ARR``'s values plus ``r``); ``hold``
    (rank, ctx) may wrap rank 1's collectives. Returns what each rank mapped of the other."""
    import threading

    from gnnio.distributed import shm

    monkeypatch.setattr(shm, "SHM_DIR", tmp_path)
    done = threading.Event()

    def body(ctx):
        if ctx.rank == 1:
            hold(ctx, done)
        mine = {k: v + ctx.rank for k, v in ARR.items()}
        mapped, via = shm.share_shards(ctx, mine, [1 - ctx.rank])
        left = sorted(p.name for p in tmp_path.iterdir())
        if ctx.rank == 0:
            done.set()
        return via, mapped[1 - ctx.rank], left

    return run_ranks(2, body, load_topology("2"))


def test_shared_shard_names_are_gone_once_any_rank_returns(tmp_path, monkeypatch):
    """Rank 1 stays between the barrier and its clean-up until rank 0 has returned and looked:
    rank 0 removed every name of its machine, its peer's too."""

    def hold(ctx, done):
        barrier = ctx.barrier

        def late(group="control"):
            barrier(group)
            done.wait(10)

        ctx.barrier = late

    for r, (via, got, left) in enumerate(_share(tmp_path, monkeypatch, hold)):
        assert via == "shm" and left == []
        for k, v in ARR.items():
            np.testing.assert_array_equal(got[k], v + (1 - r))
    assert list(tmp_path.iterdir()) == []


def test_a_shard_is_not_removed_before_its_peer_mapped_it(tmp_path, monkeypatch):
    """Rank 1 maps rank 0's shard late (after rank 0 returned, or 1 s): rank 0 waits for it at
    the barrier, so rank 1 still reads rank 0's values."""

    def hold(ctx, done):
        gather = ctx.all_gather_object

        def late(obj, group="control"):
            out = gather(obj, group)
            done.wait(1)  # (rank 0 returns only after rank 1's barrier: the wait runs out)
            return out

        ctx.all_gather_object = late

    ranks = _share(tmp_path, monkeypatch, hold)
    for k, v in ARR.items():
        np.testing.assert_array_equal(ranks[1][1][k], v)


def test_an_empty_array_goes_to_a_device_as_one_element():
    """CUDA IPC cannot share an empty allocation: an empty shard array is padded to one element
    (the receiver cuts it back by the shape it is sent)."""
    from gnnio.distributed.shm import _to_device

    t = _to_device(np.empty(0, np.int32), torch.device("cpu"))
    assert t.shape == (1,) and t.dtype == torch.int32
    assert torch.equal(_to_device(np.arange(3).reshape(1, 3), torch.device("cpu")), torch.arange(3))
