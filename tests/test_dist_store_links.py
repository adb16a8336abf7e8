"""The sharded feature store's bookkeeping, on two thread-ranks (tests/fake_dist.py): rows per
link by hand, request bytes, slow peers, ranks on two machines, and a checkpoint rewound to an
earlier gather. Each test guards a mutation the gloo test of test_dist.py let through."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnio.distributed.store import ShardedFeatureStore
from gnnio.features import InMemoryFeatureStore
from gnnio.placement import Placement
from gnnio.placement.topology import load_topology
from tests.fake_dist import run_ranks

N, DIM = 40, 3
FEATS = torch.arange(N * DIM, dtype=torch.float32).reshape(N, DIM)
# rank 0 holds rows 0-9, rank 1 rows 10-19; 20-39 only in host memory
PLACEMENT = Placement("hand", N, ((0, 1),), [np.arange(10), np.arange(10, 20)])
BATCHES = {0: [[0, 1, 12, 13, 14, 30, 12], [13, 31]], 1: [[15, 2, 31], [2, 3]]}
LINKS = ("local", "peer", "host", "network")


def _gather_all(ctx, **kw) -> dict:
    store = ShardedFeatureStore(InMemoryFeatureStore(FEATS), PLACEMENT, ctx, **kw)
    ok, controls = True, []
    for ids in BATCHES[ctx.rank]:
        ok &= bool(torch.equal(store.gather(torch.tensor(ids)), FEATS[ids]))
        controls.append(store.control_bytes)
    rows = {t: store.counters.rows.get(t, 0) for t in (*LINKS, "reuse")}
    return {"ok": ok, "rows": rows, "control": controls, "store": store}


def test_rows_per_link_and_request_bytes_by_hand():
    r0, r1 = run_ranks(2, _gather_all, load_topology("2"))
    assert r0["ok"] and r1["ok"]
    # rank 0: batch 1 local 0, 1; peer 12, 13, 14 (12 twice: read once); host 30. batch 2: 13, 31
    assert r0["rows"] == {"local": 2, "peer": 4, "host": 2, "network": 0, "reuse": 0}
    assert r1["rows"] == {"local": 1, "peer": 3, "host": 1, "network": 0, "reuse": 0}
    # request bytes: the counts message (8 B per rank) plus 8 B per requested position
    assert r0["control"] == [8 * (2 + 3), 8 * (2 + 3) + 8 * (2 + 1)]
    assert r1["control"] == [8 * (2 + 1), 8 * (2 + 1) + 8 * (2 + 2)]
    assert r0["store"].modeled_rows() == {k: float(v) for k, v in r0["rows"].items() if k in LINKS}


def test_slow_peers_read_from_host_even_when_the_placement_allows_peers():
    """C_gpu >= C_cpu: a row on a peer's shard is read from host memory (Eq. 3, second case)."""
    slow = load_topology("2", peer_bw="5GB/s", host_bw="12GB/s")
    r0, _ = run_ranks(2, _gather_all, slow)
    assert r0["ok"]
    assert r0["rows"] == {"local": 2, "peer": 0, "host": 6, "network": 0, "reuse": 0}


def test_rows_from_another_machine_count_on_the_network():
    topo = load_topology("2", host_bw=100.0, peer_bw=1000.0, network_bw=10.0)
    r0, _ = run_ranks(2, _gather_all, topo, machine_of=[0, 1])
    assert r0["ok"]
    assert r0["rows"] == {"local": 2, "peer": 0, "host": 2, "network": 4, "reuse": 0}
    store = r0["store"]
    modeled = store.modeled_rows()
    assert modeled == {"local": 2.0, "peer": 0.0, "host": 2.0, "network": 4.0}
    rb = store.row_bytes
    assert store.modeled_seconds() == pytest.approx(2 * rb / 100.0 + 4 * rb / 10.0)


def _rewind(ctx) -> dict:
    store = ShardedFeatureStore(InMemoryFeatureStore(FEATS), PLACEMENT, ctx, reuse=True)
    store.keep_log = True
    batches = [[12, 13, 30, 0], [13, 14, 31, 30], [12, 33, 1]]
    store.gather(torch.tensor(batches[0]))
    after1 = store.state_dict()
    for ids in batches[1:]:
        store.gather(torch.tensor(ids))
    back = store.state_dict(upto=1)
    # a fresh store resumed from the rewound state, then the last two batches again
    fresh = ShardedFeatureStore(InMemoryFeatureStore(FEATS), PLACEMENT, ctx, reuse=True)
    fresh.load_state_dict(back)
    resumed = (fresh.num_gathers, fresh.control_bytes)
    for ids in batches[1:]:
        fresh.gather(torch.tensor(ids))
    return {"after1": after1, "back": back, "resumed": resumed, "store": store, "fresh": fresh}


def test_a_checkpoint_rewinds_to_the_trained_batch_and_resumes_the_same():
    for r in run_ranks(2, _rewind, load_topology("2")):
        a, b = r["after1"], r["back"]
        assert b["num_gathers"] == a["num_gathers"] == 1
        assert b["control_bytes"] == a["control_bytes"] > 0
        assert torch.equal(b["trace"], a["trace"])
        assert torch.equal(b["prev_ids"], a["prev_ids"])
        assert r["resumed"] == (1, a["control_bytes"])
        s, f = r["store"], r["fresh"]
        assert f.control_bytes == s.control_bytes and (f.trace == s.trace).all()
        # the resumed store reuses what the uninterrupted one reused after batch 1
        s_after = {k: v for k, v in s.counters.rows.items()}
        f_rows = dict(f.counters.rows)
        for t in ("reuse", "peer", "host"):
            assert f_rows.get(t, 0) <= s_after.get(t, 0)
        assert f_rows.get("reuse", 0) > 0


def test_a_static_cache_holds_only_rows_the_rank_reads_from_host(tmp_path):
    """Rows on this rank's shard or a peer's never reach host memory: a static cache in front of
    host memory spends its capacity on the hottest of the others."""
    from gnnio.distributed.train import DistRun
    from gnnio.graph import load
    from gnnio.train.config import TrainConfig
    from tests.helpers import write_tiny_dataset

    ds = load(write_tiny_dataset(tmp_path / "g", num_nodes=200, num_edges=1600, seed=2))
    cfg = TrainConfig(
        fanouts=[3, 2], batch_size=16, score="degree", cache_policy="static", cache_size=0.1,
        placement_strategy="alg1", buffer=0.2, progress=False,
    )  # fmt: skip

    def body(ctx):
        setup = DistRun(ctx).build_store(ds, cfg, torch.device("cpu"))
        store = setup.store
        cached = store.host_store.cached_ids().numpy()
        return cached, store.dev_num.numpy()

    for cached, dev_num in run_ranks(2, body, load_topology("2")):
        assert cached.size == 20
        assert (dev_num[cached] < 0).all()  # every cached row is one this rank reads from host


@pytest.mark.parametrize("host", ["memory", "mmap"])
def test_unique_ids_in_any_order_land_in_place_from_every_link(tmp_path, host):
    """A batch of distinct ids (a sampler's n_id) is written straight into the output, each
    row at its id's place, from the own shard, a peer, host memory (pread for a mapped file)
    and the previous batch; repeated ids take the row buffer. Both against ``FEATS[ids]``."""
    from gnnio.features import MmapFeatureStore

    np.save(tmp_path / "x.npy", FEATS.numpy())
    gen = torch.Generator().manual_seed(3)
    perms = [torch.randperm(N, generator=gen)[:k] for k in (25, 30, 12, 30)]
    batches = [perms[0], perms[1], torch.cat([perms[2], perms[2][:4]]), perms[3]]

    def body(ctx):
        bottom = (
            MmapFeatureStore(tmp_path / "x.npy") if host == "mmap" else InMemoryFeatureStore(FEATS)
        )
        store = ShardedFeatureStore(bottom, PLACEMENT, ctx, reuse=True)
        got = [store.gather(ids) for ids in batches]
        rows = dict(store.counters.rows)
        out = torch.full((40, DIM), -1.0)
        again = store.gather(batches[1], out=out)
        return got, rows, again, out

    for got, rows, again, out in run_ranks(2, body, load_topology("2")):
        for g, ids in zip(got, batches):
            assert torch.equal(g, FEATS[ids])
        assert all(rows.get(t, 0) > 0 for t in ("local", "peer", "host", "reuse"))
        assert torch.equal(again, FEATS[batches[1]]) and again.data_ptr() == out.data_ptr()
        assert (out[30:] == -1).all()  # nothing written past the batch's rows
