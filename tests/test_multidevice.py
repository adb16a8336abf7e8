"""The multi-device gather store on simulated devices: same rows as a plain store, exact counters,
agreement with the cost model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnnio.features import InMemoryFeatureStore
from gnnio.features.tiers.multidevice import MultiDeviceFeatureStore
from gnnio.placement import PlacementRequest, place
from gnnio.placement.costmodel import placement_cost
from gnnio.placement.topology import load_topology

HYP = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
GRAPHLESS = ("alg1", "rule1", "interleaved", "mod", "naive", "random")


@HYP
@given(
    strategy=st.sampled_from(GRAPHLESS),
    spec=st.sampled_from(["2", "2+2", "4", "1+1", "2*3"]),
    n=st.integers(1, 50),
    frac=st.floats(0.0, 1.0),
    dtype=st.sampled_from([np.float32, np.float16]),
    seed=st.integers(0, 2**31),
    num_ids=st.integers(0, 80),
    as_tensor=st.booleans(),
)
def test_gather_equals_plain_store(strategy, spec, n, frac, dtype, seed, num_ids, as_tensor):
    rng = np.random.default_rng(seed)
    feats = rng.standard_normal((n, 5)).astype(dtype)
    topo = load_topology(spec)
    pl = place(strategy, PlacementRequest(rng.pareto(1.3, n), topo, int(frac * n), seed=seed))
    reader = int(rng.integers(0, topo.num_gpus))
    store = MultiDeviceFeatureStore(feats, pl, reader=reader, topology=topo)
    plain = InMemoryFeatureStore(feats)
    ids = rng.integers(0, n, num_ids)
    ids = torch.from_numpy(ids) if as_tensor else ids
    got = store.gather(ids)
    assert torch.equal(got, plain.gather(ids))
    # counters add up to the rows requested, per tier and per source
    rows = store.counters.snapshot()["rows"]
    assert set(rows) == {"local", "peer", "host"}
    assert sum(rows.values()) == num_ids
    src = store.source_counters.snapshot()["rows"]
    assert sum(src.values()) == num_ids
    assert src.get(f"gpu{reader}", 0) == rows["local"]
    assert src.get("host", 0) == rows["host"]
    assert store.counters.snapshot()["bytes"]["host"] == rows["host"] * store.row_bytes
    # which tier each row came from follows the placement
    ids_np = np.asarray(ids)
    own = np.isin(ids_np, pl.buffers[reader])
    on_peer = np.zeros(len(ids_np), dtype=bool)
    for k in topo.peers(reader):
        on_peer |= np.isin(ids_np, pl.buffers[k])
    if not pl.peer_reads:
        on_peer[:] = False
    assert rows["local"] == int(own.sum())
    assert rows["peer"] == int((~own & on_peer).sum())


def test_for_reader_shares_shards_and_counts_apart():
    feats = np.arange(60, dtype=np.float32).reshape(20, 3)
    s0 = MultiDeviceFeatureStore.simulated(feats, "2+2", "interleaved", buffer=0.2, reader=0)
    s3 = s0.for_reader(3)
    assert s3._s is s0._s and s3.reader == 3
    ids = np.arange(20)
    assert torch.equal(s3.gather(ids), torch.from_numpy(feats))
    assert sum(s0.counters.snapshot()["rows"].values()) == 0
    # reader 3 reads GPU 2's shard (its group) but never GPUs 0 or 1
    src = s3.source_counters.snapshot()["rows"]
    assert "gpu0" not in src and "gpu1" not in src and src["gpu2"] == 4 and src["gpu3"] == 4


def test_no_peer_reads_when_peers_are_slower():
    feats = np.ones((30, 2), dtype=np.float32)
    topo = load_topology("2", peer_bw="1GB/s", host_bw="10GB/s")
    pl = place("naive", PlacementRequest(np.ones(30), load_topology("2"), 10))
    store = MultiDeviceFeatureStore(feats, pl, reader=0, topology=topo)
    store.gather(np.arange(30))
    assert store.counters.snapshot()["rows"] == {"local": 10, "peer": 0, "host": 20}


def test_out_buffer_and_errors():
    feats = np.arange(40, dtype=np.float32).reshape(10, 4)
    store = MultiDeviceFeatureStore.simulated(feats, "2", "alg1", buffer=0.3)
    out = torch.zeros((6, 4))
    got = store.gather([9, 0, 0], out=out)
    assert got.data_ptr() == out.data_ptr() and torch.equal(
        out[:3], torch.from_numpy(feats[[9, 0, 0]])
    )
    assert (out[3:] == 0).all()
    with pytest.raises(IndexError, match="out of range"):
        store.gather([10])
    with pytest.raises(ValueError):
        MultiDeviceFeatureStore(feats[:5], store.placement)
    with pytest.raises(ValueError):
        MultiDeviceFeatureStore(feats, store.placement, reader=2)
    with pytest.raises(ValueError):
        MultiDeviceFeatureStore(feats, store.placement, topology=load_topology("4"))


def test_counted_reads_match_the_cost_model():
    """Gathering every GPU's batches through the store counts exactly the rows the cost model
    charges for the same reads: the cost model and the store share one routing rule."""
    rng = np.random.default_rng(7)
    n, topo = 400, load_topology("2+2")
    feats = rng.standard_normal((n, 16)).astype(np.float32)
    pl = place("alg1", PlacementRequest(rng.pareto(1.1, n), topo, 60))
    counts = np.zeros((4, n))
    stores = [MultiDeviceFeatureStore(feats, pl, reader=0, topology=topo)]
    stores += [stores[0].for_reader(d) for d in range(1, 4)]
    for d in range(4):
        for _ in range(5):
            batch = np.unique(rng.zipf(1.5, 100) % n)
            stores[d].gather(batch)
            counts[d, batch] += 1
    rep = placement_cost(pl, topo, counts, row_bytes=stores[0].row_bytes)
    for d in range(4):
        rows = stores[d].counters.snapshot()["rows"]
        assert rows == {k: int(v) for k, v in rep.devices[d].rows.items()}
        got_s = topo.c_peer(64) * rows["peer"] + topo.c_host(64) * rows["host"]
        assert rep.devices[d].seconds == pytest.approx(got_s)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_real_devices():  # pragma: no cover - GPU only
    feats = np.random.default_rng(0).standard_normal((1000, 8)).astype(np.float32)
    pl = place("alg1", PlacementRequest(np.arange(1000.0), load_topology("2"), 200))
    store = MultiDeviceFeatureStore(feats, pl, reader=1, devices=["cuda:0", "cuda:1"])
    ids = torch.arange(1000, device="cuda:1")
    got = store.gather(ids)
    assert got.device == torch.device("cuda:1")
    assert torch.equal(got.cpu(), torch.from_numpy(feats))
    assert not store.simulated


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_shards_on_one_real_gpu():  # pragma: no cover - GPU only
    """Four logical GPUs sharing cuda:0: the CUDA code path (shards, peer copies, host rows copied
    over) with a single device."""
    feats = np.random.default_rng(1).standard_normal((500, 6)).astype(np.float32)
    topo = load_topology("2+2")
    pl = place("interleaved", PlacementRequest(np.arange(500.0), topo, 60))
    store = MultiDeviceFeatureStore(feats, pl, reader=2, devices=["cuda:0"] * 4, topology=topo)
    ids = torch.randint(0, 500, (3000,), device="cuda:0")
    got = store.gather(ids)
    assert got.device.type == "cuda"
    assert torch.equal(got.cpu(), torch.from_numpy(feats[ids.cpu().numpy()]))
    assert sum(store.counters.snapshot()["rows"].values()) == 3000


# ---- the routed read (issue 15, fault 8): stream order checked on the CPU ----------------------


def _routed_store(streams):
    feats = np.random.default_rng(2).standard_normal((400, 5)).astype(np.float32)
    topo = load_topology("2+2")
    pl = place("interleaved", PlacementRequest(np.arange(400.0)[::-1].copy(), topo, 60))
    plain = MultiDeviceFeatureStore(feats, pl, reader=1, topology=topo)
    routed = MultiDeviceFeatureStore(feats, pl, reader=1, topology=topo, streams=streams)
    return feats, plain, routed


def test_routed_read_waits_for_the_peer_stream():
    from gnnio.utils.streams import RecordingStreams

    streams = RecordingStreams()
    feats, plain, routed = _routed_store(streams)
    ids = torch.from_numpy(np.random.default_rng(3).integers(0, 400, 2000))
    got = routed.gather(ids)
    assert torch.equal(got, torch.from_numpy(feats[ids.numpy()]))
    plain.gather(ids)
    assert routed.counters.snapshot() == plain.counters.snapshot()
    assert routed.source_counters.snapshot() == plain.source_counters.snapshot()
    assert routed.counters.rows["peer"] > 0 and streams.violations == []
    waits = [(s, ev) for op, s, ev in streams.log if op == "wait"]
    assert any(s.startswith("peer") and ev == "default" for s, ev in waits)
    assert any(s == "default" and ev.startswith("peer") for s, ev in waits)
    other = routed.for_reader(0)
    assert torch.equal(other.gather(ids), got)


def test_routed_read_without_the_reader_wait_fails():
    from gnnio.utils.streams import RecordingStreams, StreamOrderError

    class ForgetsPeerWait(RecordingStreams):
        def wait(self, stream, event):
            if not event.stream.startswith("peer"):
                super().wait(stream, event)

    _, _, routed = _routed_store(ForgetsPeerWait())
    with pytest.raises(StreamOrderError, match="default reads rows of source"):
        routed.gather(torch.arange(400))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_real_routed_read_matches_the_simulated_store():  # pragma: no cover - GPU only
    """Four logical GPUs on cuda:0: host rows zero-copy, peers on their own streams; the same
    rows and the same counts per tier and per source as the simulated store."""
    feats, plain, _ = _routed_store(None)
    real = MultiDeviceFeatureStore(
        feats, plain.placement, reader=1, devices=["cuda:0"] * 4, topology=plain.topology
    )
    ids = torch.from_numpy(np.random.default_rng(4).integers(0, 400, 3000))
    got = real.gather(ids.cuda())
    assert got.device == torch.device("cuda", 0)
    assert torch.equal(got.cpu(), torch.from_numpy(feats[ids.numpy()]))
    plain.gather(ids)
    assert real.counters.snapshot() == plain.counters.snapshot()
    assert real.source_counters.snapshot() == plain.source_counters.snapshot()
    assert real._route_state()[3] is not None  # host rows read zero-copy
