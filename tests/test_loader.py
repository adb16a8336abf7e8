"""NodeLoader: correct batches, overlap bookkeeping, buffer ring, errors and shutdown."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from gnnio.features import InMemoryFeatureStore, MmapFeatureStore
from gnnio.graph import CSRGraph
from gnnio.ordering import RandomOrder
from gnnio.pipeline.loader import LoaderStats, NodeLoader
from gnnio.sampling import MiniBatch, UniformSampler

N, F = 600, 12


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, N, 4000), rng.integers(0, N, 4000)
    graph = CSRGraph.from_edges(src, dst, N)
    feats = rng.standard_normal((N, F)).astype(np.float32)
    labels = rng.integers(0, 5, N).astype(np.int64)
    train = np.sort(rng.choice(N, 300, replace=False)).astype(np.int64)
    return graph, feats, labels, train


def make_loader(data, batch_size=32, store=None, **kw):
    graph, feats, labels, train = data
    sampler = kw.pop("sampler", None) or UniformSampler(graph, [4, 3], seed=1)
    store = store or InMemoryFeatureStore(feats)
    order = RandomOrder(train, batch_size, seed=2)
    return NodeLoader(sampler, store, order, labels=labels, **kw)


def check_batch(mb: MiniBatch, feats, labels):
    ids = mb.input_nodes.numpy()
    assert torch.equal(mb.input_nodes[: len(mb.seeds)], mb.seeds)
    assert np.array_equal(mb.x.numpy(), feats[ids])
    assert np.array_equal(mb.labels.numpy(), labels[mb.seeds.numpy()])


def wait_threads_gone(timeout=5.0) -> list[str]:
    """Names of loader threads still alive after ``timeout`` seconds."""
    end = time.time() + timeout
    while time.time() < end:
        alive = [t.name for t in threading.enumerate() if t.name.startswith("gnnio-")]
        if not alive:
            return []
        time.sleep(0.02)
    return alive


class FlakySampler(UniformSampler):
    """Raises on batch index ``fail_at`` of an epoch (the loader's key is epoch << 32 | index);
    counts calls."""

    def __init__(self, *a, fail_at=None, **kw):
        super().__init__(*a, **kw)
        self.fail_at, self.calls = fail_at, 0

    def sample(self, seeds, epoch_seed=None):
        self.calls += 1
        if self.fail_at is not None and (epoch_seed & 0xFFFFFFFF) == self.fail_at:
            raise KeyError("sampler broke on purpose")
        return super().sample(seeds, epoch_seed=epoch_seed)


# ---- correctness -----------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [1, 3])
@pytest.mark.parametrize("prefetch", [1, 2])
def test_batches_have_right_features_labels_and_order(data, num_workers, prefetch):
    graph, feats, labels, train = data
    loader = make_loader(data, num_workers=num_workers, prefetch=prefetch)
    expected = list(loader.order.batches(0))
    seen = []
    for mb in loader.epoch(0):
        check_batch(mb, feats, labels)  # checked while held: its slot is not refilled meanwhile
        seen.append(mb.seeds.clone())
    assert len(seen) == len(loader) == len(expected)
    for a, b in zip(seen, expected):
        assert torch.equal(a, b)
    assert sorted(torch.cat(seen).tolist()) == train.tolist()


def test_same_batches_whatever_the_worker_count(data):
    """The sampler gets a per-batch key, so the sample does not depend on thread scheduling."""
    graph, feats, labels, train = data
    one = [mb.input_nodes.clone() for mb in make_loader(data, num_workers=1).epoch(3)]
    three = [mb.input_nodes.clone() for mb in make_loader(data, num_workers=3).epoch(3)]
    assert len(one) == len(three) and all(torch.equal(a, b) for a, b in zip(one, three))


def test_set_epoch_and_iter(data):
    loader = make_loader(data)
    loader.set_epoch(5)
    a = [mb.seeds.clone() for mb in loader]
    b = [mb.seeds.clone() for mb in loader.epoch(5)]
    c = [mb.seeds.clone() for mb in loader.epoch(6)]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))


def test_mmap_store_and_no_labels(data, tmp_path):
    graph, feats, labels, train = data
    np.save(tmp_path / "f.npy", feats)
    loader = make_loader(data, store=MmapFeatureStore(tmp_path / "f.npy"))
    loader.labels = None
    for mb in loader.epoch(0):
        assert mb.labels is None
        assert np.array_equal(mb.x.numpy(), feats[mb.input_nodes.numpy()])
    assert loader.store.counters.snapshot()["rows"]["disk"] == loader.stats.num_input_nodes


# ---- stats -----------------------------------------------------------------------------------


def test_stats_after_epoch(data):
    loader = make_loader(data)
    assert loader.stats is None
    n_in = 0
    for mb in loader.epoch(1):
        n_in += len(mb.input_nodes)
    st = loader.stats
    assert isinstance(st, LoaderStats) and st.complete and st.epoch == 1
    assert st.num_batches == len(loader) and st.num_seeds == 300 and st.num_input_nodes == n_in
    assert st.sample_s > 0 and st.gather_s > 0 and st.transfer_s >= 0 and st.wait_s >= 0
    assert st.epoch_s >= st.wait_s
    assert st.stage_sum_s == pytest.approx(st.sample_s + st.gather_s + st.transfer_s)
    assert set(st.as_dict()) >= {"sample_s", "gather_s", "transfer_s", "wait_s", "epoch_s"}


def test_stages_overlap_with_a_slow_consumer(data):
    """While the consumer 'trains', the stages run ahead: it barely waits after the first batch."""
    loader = make_loader(data, prefetch=2)
    for _ in loader.epoch(0):  # warm-up: JIT compilation would count as waiting
        pass
    it = loader.epoch(1)
    for _ in it:
        # a step of 20 ms, and as long as the stages need for the next batch while it is held
        # (a fixed 20 ms was shorter than a batch's stages on a loaded machine, 3 runs in 30 with
        # two busy cores: the consumer then waited for them, overlap or not). A loader whose
        # stages do not run ahead never has it: 1 s per batch, then the wait below counts it
        time.sleep(0.02)
        end = time.monotonic() + 1.0
        while it._run is not None and it._run.out.empty() and time.monotonic() < end:
            time.sleep(0.002)
    st = loader.stats
    assert st.wait_s < 0.5 * st.stage_sum_s + 0.05, st


# ---- buffer ring -----------------------------------------------------------------------------


def test_slots_are_recycled_and_not_overwritten_while_held(data):
    graph, feats, labels, train = data
    loader = make_loader(data, batch_size=16, prefetch=2)
    ptrs = set()
    for mb in loader.epoch(0):
        ptrs.add(mb.x.untyped_storage().data_ptr())
        time.sleep(0.003)  # let the gather thread fill every other free slot meanwhile
        check_batch(mb, feats, labels)  # still intact: our slot was not handed out again
    assert len(ptrs) <= loader.prefetch + 2  # a ring, not a fresh buffer per batch


def test_reuse_buffers_off_keeps_old_batches_valid(data):
    graph, feats, labels, train = data
    batches = list(make_loader(data, reuse_buffers=False).epoch(0))
    for mb in batches:
        check_batch(mb, feats, labels)


def test_prefetch_bounds_work_ahead(data):
    graph, feats, labels, train = data
    sampler = FlakySampler(graph, [4, 3], seed=1)
    loader = make_loader(data, batch_size=8, sampler=sampler, prefetch=1)
    it = loader.epoch(0)
    next(it)
    time.sleep(0.3)  # give the stages every chance to run ahead
    # consumer 1 + out queue 1 + gather thread 1 + sample queue 1 + sampler blocked on put 1
    assert sampler.calls <= 5 < len(loader)
    it.close()


# ---- failures and shutdown -------------------------------------------------------------------


def test_sampler_exception_reaches_consumer(data):
    graph, feats, labels, train = data
    loader = make_loader(data, sampler=FlakySampler(graph, [4, 3], fail_at=2), num_workers=2)
    got = 0
    with pytest.raises(KeyError, match="on purpose"):
        for _ in loader.epoch(0):
            got += 1
    assert got == 2  # batches before the failing one were delivered, in order
    assert loader.stats is not None and not loader.stats.complete
    assert wait_threads_gone() == []


def test_store_exception_reaches_consumer(data):
    graph, feats, labels, train = data

    class BrokenStore(InMemoryFeatureStore):
        def gather(self, ids, out=None):
            raise OSError("disk on fire")

    loader = make_loader(data, store=BrokenStore(feats))
    with pytest.raises(OSError, match="disk on fire"):
        next(iter(loader))
    assert wait_threads_gone() == []


def test_break_mid_epoch_does_not_leak_threads(data):
    loader = make_loader(data, batch_size=8, num_workers=2)
    for i, _ in enumerate(loader.epoch(0)):
        if i == 2:
            break
    assert wait_threads_gone() == []
    assert loader.stats.num_batches == 3 and not loader.stats.complete
    # and the loader still works afterwards
    assert sum(1 for _ in loader.epoch(1)) == len(loader)
    assert wait_threads_gone() == []


def test_new_epoch_closes_the_previous_one(data):
    loader = make_loader(data, batch_size=8)
    first = loader.epoch(0)
    next(first)
    second = loader.epoch(1)  # first is closed here
    assert list(first) == []
    assert sum(1 for _ in second) == len(loader)
    assert wait_threads_gone() == []


def test_context_manager_and_bad_arguments(data):
    loader = make_loader(data)
    with loader.epoch(0) as it:
        next(it)
    assert wait_threads_gone() == []
    with pytest.raises(ValueError, match="prefetch"):
        make_loader(data, prefetch=0)
    with pytest.raises(ValueError, match="num_workers"):
        make_loader(data, num_workers=0)


# ---- GPU -------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("store_device", ["cpu", "cuda"])
def test_cuda_device_batches(data, store_device):
    graph, feats, labels, train = data
    store = InMemoryFeatureStore(feats, device=store_device)
    kept = []
    loader = make_loader(data, store=store, device="cuda")
    for mb in loader.epoch(0):
        assert mb.x.is_cuda and mb.labels.is_cuda and mb.blocks[0].edge_index.is_cuda
        kept.append(mb)  # device batches own their memory: keeping them is fine
    torch.cuda.synchronize()
    for mb in kept:
        ids = mb.input_nodes.cpu().numpy()
        assert np.array_equal(mb.x.cpu().numpy(), feats[ids])
        assert np.array_equal(mb.labels.cpu().numpy(), labels[mb.seeds.cpu().numpy()])
    assert loader.stats.transfer_s > 0


# ---- the benches (smoke: they run and report consistent keys) --------------------------------


@pytest.mark.parametrize("store", ["memory", "mmap"])
def test_bench_gather_and_loader_run(tmp_path, store):
    import argparse

    from gnnio.bench import gather as bench_gather
    from gnnio.bench import loader as bench_loader
    from tests.helpers import write_tiny_dataset

    path = write_tiny_dataset(tmp_path / "d", num_nodes=200, num_edges=1500, feat_dim=128)
    common = [str(path), "--batch-size", "16", "--fanouts", "3,2", "--batches", "3"]
    common += ["--threads", "1", "--passes", "2", "--store", store, "--no-progress"]
    for mod, extra in [
        (bench_gather, ["--ceiling-gib", "0.002", "--evict-mib", "2"]),
        (bench_loader, []),
    ]:
        p = argparse.ArgumentParser()
        mod.add_arguments(p)
        res = mod.run(p.parse_args(common + extra))
        assert res["ms_per_batch"] > 0
        if mod is bench_gather:
            assert res["row_bytes"] == 512
            assert res["gb_per_s"] > 0 and res["ceiling_gb_per_s"] > 0
            rows = res["counters"]["rows"]["disk" if store == "mmap" else "host"]
            assert rows == res["rows_per_batch"] * 3 * (1 + 2)  # warm-up + 2 timed passes
        else:
            assert res["batches"] == 3 and res["seeds_per_s"] > 0
            assert res["stage_sum_ms_per_batch"] > 0 and res["sequential_ms_per_batch"] > 0
            assert res["store_device"] == "cpu" and res["sampler_device"] == "cpu"


def test_bench_loader_store_device_errors(tmp_path):
    import argparse

    from gnnio.bench import loader as bench_loader
    from gnnio.errors import UsageError
    from tests.helpers import write_tiny_dataset

    path = write_tiny_dataset(tmp_path / "d", num_nodes=50, num_edges=200, feat_dim=8)
    p = argparse.ArgumentParser()
    bench_loader.add_arguments(p)
    base = [str(path), "--batches", "1", "--passes", "1", "--no-progress"]
    with pytest.raises(UsageError, match="--store-device"):
        bench_loader.run(p.parse_args(base + ["--store", "mmap", "--store-device", "meta"]))
    with pytest.raises(UsageError, match="--sampler-device 'meta!'"):
        bench_loader.run(p.parse_args(base + ["--sampler-device", "meta!"]))
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="CUDA is not available"):
            bench_loader.run(p.parse_args(base + ["--store-device", "cuda"]))
        with pytest.raises(UsageError, match="--sampler-device cuda: CUDA is not available"):
            bench_loader.run(p.parse_args(base + ["--sampler-device", "cuda"]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bench_loader_with_gpu_resident_store(tmp_path):
    import argparse

    from gnnio.bench import loader as bench_loader
    from tests.helpers import write_tiny_dataset

    path = write_tiny_dataset(tmp_path / "d", num_nodes=200, num_edges=1500, feat_dim=32)
    p = argparse.ArgumentParser()
    bench_loader.add_arguments(p)
    args = [str(path), "--batch-size", "16", "--fanouts", "3,2", "--batches", "3", "--passes", "1"]
    args += ["--device", "cuda", "--store-device", "cuda", "--no-progress"]
    res = bench_loader.run(p.parse_args(args))
    assert res["store_device"].startswith("cuda") and res["ms_per_batch"] > 0
    res = bench_loader.run(p.parse_args([*args, "--sampler-device", "cuda"]))
    assert res["sampler_device"].startswith("cuda") and res["ms_per_batch"] > 0


def test_a_map_of_the_seeds_labels_is_looked_up_not_converted(data):
    """A rank's labels are a map of its seeds' labels (SeedLabels, no ``[N]`` array): the loader
    keeps the map and looks each batch's seeds up in it (converting it as an array of all
    labels failed)."""
    from gnnio.distributed.labels import SeedLabels

    graph, feats, labels, train = data
    seed_labels = SeedLabels(torch.from_numpy(train), torch.from_numpy(labels[train]))
    loader = make_loader(data)
    loader = NodeLoader(loader.sampler, loader.store, loader.order, labels=seed_labels)
    assert loader.labels is seed_labels
    n = 0
    for mb in loader.epoch(0):
        check_batch(mb, feats, labels)
        n += 1
    assert n == len(loader)


def test_sample_seconds_sum_every_workers_calls(data):
    """``sample_s`` is summed over the sampling workers: with 3 workers and a sampler that takes
    at least 50 ms a batch, at least 50 ms per batch of the epoch (worker 0's share alone is a
    third of that). Epoch 0 compiles the sampler's kernels; epoch 1 is measured."""

    class Slow(UniformSampler):
        def sample(self, seeds, epoch_seed=None):
            time.sleep(0.05)
            return super().sample(seeds, epoch_seed=epoch_seed)

    graph = data[0]
    loader = make_loader(data, batch_size=34, num_workers=3, sampler=Slow(graph, [4, 3], seed=1))
    for e in (0, 1):
        n = sum(1 for _ in loader.epoch(e))
    assert n == len(loader) == 9
    assert loader.stats.sample_s >= 0.05 * n
