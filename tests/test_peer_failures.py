"""The peers' known failures, as tests gnnio passes (issue 16). Each either works or ends with
one clear line naming the limit:

* pinning more than the pinned-memory budget, or than one ``cudaHostRegister`` call takes
  (dgl#3939, dgl#4237, pytorch#152335): a budget check before any call, registration in bounded
  chunks rolled back on a failure, an error naming the size and the limit; a view of another
  tensor is pinned in place, exactly its own bytes;
* a cache smaller than one batch, and larger than the data, in a training run (dgl PR #7646's
  deadlock; quiver#97's zero-byte registration);
* CUDA used before the loader's workers (pyg#5340): gnnio never forks (threads, and ``spawn``
  for ranks);
* the UVA topology path does not copy the CSR (dgl#3918: 5x the index memory).

The CUDA runtime is a recording fake on the CPU (as in ``test_pinning.py``); the ``gpu`` tests
check the real thing and are skipped without a device.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from gnnio.features.tiers import uva
from tests.fake_cuda import (
    FakeCudaRuntime,
    FakeCudaTensor,
    fake_cuda,
    fake_events,
    install_runtime,
)


@pytest.fixture
def runtime(monkeypatch):
    fake_cuda(monkeypatch)
    fake_events(monkeypatch)
    rt = install_runtime(monkeypatch, FakeCudaRuntime())
    monkeypatch.setattr(torch.cuda, "CudaError", lambda code: f"CUDA error {code}")
    monkeypatch.setattr(uva, "clear_last_cuda_error", lambda *a: None)
    monkeypatch.delenv("GNNIO_PIN_LIMIT", raising=False)
    return rt


# ---- pinning ------------------------------------------------------------------------------------


def test_over_the_pin_budget_is_one_line_naming_size_and_limit(runtime, monkeypatch):
    monkeypatch.setenv("GNNIO_PIN_LIMIT", "1MiB")
    first = uva.pin_host_tensor(torch.zeros(160 * 1024, dtype=torch.uint8))  # 160 KiB
    big = torch.zeros(1024 * 1024, dtype=torch.uint8)  # 1 MiB: 1.16 MiB with the first
    with pytest.raises(uva.PinError) as err:
        uva.pin_host_tensor(big)
    msg = str(err.value)
    assert "\n" not in msg
    assert "cannot pin 1.00 MiB" in msg and "pinned-memory limit 1.00 MiB" in msg
    assert "GNNIO_PIN_LIMIT" in msg and "160.00 KiB already pinned by gnnio" in msg
    assert len(runtime.ranges) == 1  # refused before any CUDA call
    first.release()
    h = uva.pin_host_tensor(big)  # within the budget once the first is released
    assert uva.pinned_bytes() == 2**20
    h.release()
    assert uva.pinned_bytes() == 0 and runtime.ranges == []


def test_default_budget_is_a_share_of_host_ram(runtime, monkeypatch):
    limit, where = uva.pin_limit()
    assert limit is not None and "of host RAM" in where
    monkeypatch.setattr(uva, "_meminfo", lambda: {"MemTotal": 10 * 2**20})
    assert uva.pin_limit()[0] == int(10 * 2**20 * uva.PIN_RAM_SHARE)
    with pytest.raises(uva.PinError, match=r"cannot pin 16.00 MiB .* limit 9.00 MiB \(90% of host"):
        uva.pin_host_tensor(torch.zeros(16 * 2**20, dtype=torch.uint8))
    for bad in ("lots", "1e400", "2e18", "8 GB"):  # (GB: decimal units are not taken here)
        monkeypatch.setenv("GNNIO_PIN_LIMIT", bad)
        with pytest.raises(uva.PinError, match="GNNIO_PIN_LIMIT: not a size"):
            uva.pin_limit()


def test_registration_in_bounded_chunks_that_roll_back(runtime, monkeypatch):
    monkeypatch.setattr(uva, "REGISTER_CHUNK", 4096)
    t = torch.zeros(10_000, dtype=torch.uint8)
    h = uva.pin_host_tensor(t)
    p = t.data_ptr()
    regs = [(c[1], c[2]) for c in runtime.calls if c[0] == "register"]
    assert regs == [(p, 4096), (p + 4096, 4096), (p + 8192, 1808)]  # adjacent, all of it
    h.release()
    assert runtime.ranges == [] and [c[1] for c in runtime.calls[3:]] == [p, p + 4096, p + 8192]
    # a chunk that fails: the ones before it are unregistered, one line says where and why
    runtime.calls.clear()
    runtime.fail_at = 2
    with pytest.raises(uva.PinError) as err:
        uva.pin_host_tensor(t)
    msg = str(err.value)
    assert "\n" not in msg and "cannot pin 9.77 KiB" in msg and "at byte 8,192 of it" in msg
    assert "CUDA error 2" in msg and "limit: host RAM" in msg
    assert runtime.ranges == [] and uva.pinned_bytes() == 0


def test_a_view_is_pinned_in_place_exactly_its_bytes(runtime):
    base = torch.arange(4000, dtype=torch.float32).reshape(1000, 4)
    view = base[100:300]  # rows of another tensor, contiguous
    h = uva.pin_host_tensor(view)
    assert h.tensor.data_ptr() == base.data_ptr() + 100 * 16  # no copy
    assert runtime.ranges == [(view.data_ptr(), view.data_ptr() + 200 * 16)]  # not the storage
    with pytest.raises(ValueError, match="contiguous"):
        uva.pin_host_tensor(base[:, 1])  # a strided view: refused, never silently copied
    with pytest.raises(uva.PinError, match="overlaps a registered range"):
        uva.pin_host_tensor(base[200:400])  # overlaps the first view only partly
    h.release()


def test_tiered_cold_path_over_the_budget(runtime, monkeypatch):
    from gnnio.features.tiers.row_source import RowSource
    from gnnio.features.tiers.tiered_cold import ColdPath, TieringWarning

    monkeypatch.setenv("GNNIO_PIN_LIMIT", "1KiB")
    host = torch.zeros(100, 16)  # 6.25 KiB
    cold = ColdPath(RowSource(host), torch.device("cuda", 0), simulated=False)
    with pytest.raises(uva.PinError, match=r"cannot pin 6.25 KiB .* limit 1.00 KiB"):
        cold.setup("zero_copy", None, all_hot=False)
    with pytest.warns(TieringWarning, match="pinned-memory limit"):
        cold.setup("auto", None, all_hot=False)
    assert cold.mode_used == "cpu_gather" and runtime.calls == []


# ---- caches of edge sizes in a training run --------------------------------------------------


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    from gnnio.importers.synthetic import prepare_synthetic

    out = tmp_path_factory.mktemp("peers") / "g"
    prepare_synthetic(out, num_nodes=800, avg_degree=6, feat_dim=8, num_classes=3, seed=0,
                      split=(0.5, 0.2, 0.3), progress=False)  # fmt: skip
    return out


def _cfg(**kw):
    from gnnio.train import TrainConfig

    base = dict(fanouts=(4, 4), batch_size=64, epochs=2, hidden=8, progress=False, seed=1)
    return TrainConfig(**{**base, **kw})


@pytest.mark.parametrize("policy", ["lru", "fifo", "static"])
def test_cache_smaller_than_a_batch_and_larger_than_the_data(small, policy):
    from gnnio.train import train

    plain = train(small, _cfg())
    # 2 of 800 rows (less than any batch), and every row (capacity past the data: the
    # FeatureCache tests in test_cache.py, --cache-size is a fraction of the rows)
    tiny = train(small, _cfg(cache_policy=policy, cache_size=2 / 800))
    huge = train(small, _cfg(cache_policy=policy, cache_size=1.0))
    for s in (tiny, huge):  # a cache changes where rows come from, never the rows
        assert s["loss_history"] == plain["loss_history"]
        assert s["test_acc"] == plain["test_acc"]
    rows = sum(plain["rows_by_tier"].values())
    assert sum(tiny["rows_by_tier"].values()) == rows == sum(huge["rows_by_tier"].values())
    assert huge["data_setup"]["cache"]["capacity"] == 800
    assert tiny["data_setup"]["cache"]["capacity"] == 2


# ---- no fork after CUDA: threads for loader stages, spawn for ranks ----------------------------


def test_gnnio_never_forks(small, monkeypatch):
    from gnnio.train import train

    def no_fork(*a, **k):
        raise AssertionError("gnnio forked a process")

    monkeypatch.setattr(os, "fork", no_fork)
    monkeypatch.setattr(os, "forkpty", no_fork)
    s = train(small, _cfg(prefetch=3))  # loader stages, evaluation loaders, checkpoints
    assert len(s["loss_history"]) == 2
    # ranks (gnnio train --nproc N) are started with spawn, never fork
    import torch.distributed.launcher.api as api

    from gnnio.distributed import launch

    seen = {}

    def fake_launch(config, entry):
        seen["start_method"] = config.start_method
        return lambda entry, argv: {0: 0, 1: 0}

    monkeypatch.setattr(api, "elastic_launch", fake_launch)
    launch.launch(2, print, ["train"])
    assert seen["start_method"] == "spawn"


@pytest.mark.parametrize("fails", [False, True])
def test_launch_sets_thread_counts_for_the_ranks_only(monkeypatch, fails):
    """The ranks get OMP/NUMBA_NUM_THREADS = cores // nproc (unless the user set them); the
    caller's environment is put back after the launch, also when a rank fails: left there, numba
    refused every later compile in the caller ("Cannot set NUMBA_NUM_THREADS to a different value
    once the threads have been launched": 18 gpu tests after an in-process launch, H200 run of
    2026-11-26)."""
    import torch.distributed.launcher.api as api

    from gnnio.distributed import launch

    monkeypatch.delenv("NUMBA_NUM_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's own: kept, also for the ranks
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    seen = {}

    def fake_launch(config, entry):
        def run(entry, argv):
            seen["env"] = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS")}
            if fails:
                raise RuntimeError("rank 1 failed")
            return {0: 0, 1: 0}

        return run

    monkeypatch.setattr(api, "elastic_launch", fake_launch)
    if fails:
        with pytest.raises(RuntimeError):
            launch.launch(2, print, ["train"])
    else:
        launch.launch(2, print, ["train"])
    assert seen["env"] == {"OMP_NUM_THREADS": "3", "NUMBA_NUM_THREADS": "8"}
    assert "NUMBA_NUM_THREADS" not in os.environ
    assert os.environ["OMP_NUM_THREADS"] == "3"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_loader_works_after_cuda_is_initialised(small):
    import gnnio
    from gnnio.features import InMemoryFeatureStore
    from gnnio.ordering import RandomOrder
    from gnnio.pipeline.loader import NodeLoader
    from gnnio.sampling import UniformSampler

    torch.cuda.init()
    torch.zeros(1, device="cuda").add_(1)  # a CUDA context exists before the loader starts
    ds = gnnio.load(small)
    order = RandomOrder(torch.from_numpy(np.asarray(ds.train_idx)), 64, seed=0)
    ld = NodeLoader(UniformSampler(ds.graph, [4, 4], seed=0),
                    InMemoryFeatureStore(np.asarray(ds.features)), order, labels=ds.labels,
                    device="cuda", num_workers=2)  # fmt: skip
    n = 0
    for b in ld.epoch(0):
        assert b.x.is_cuda and b.x.shape[0] == b.input_nodes.shape[0]
        n += 1
    assert n == order.num_batches


# ---- the UVA topology path does not copy the CSR -----------------------------------------------


@pytest.fixture
def views(runtime, monkeypatch):
    real = torch.as_tensor

    def as_tensor(obj, *a, **k):
        if isinstance(obj, uva._CudaArrayView):
            return obj.owner.view(torch.uint8).as_subclass(FakeCudaTensor)
        return real(obj, *a, **k)

    monkeypatch.setattr(torch, "as_tensor", as_tensor)
    return runtime


def test_uva_topology_pins_the_csr_in_place(views):
    from gnnio.sampling.gpu import pinned_csr

    rng = np.random.default_rng(0)
    indptr = torch.from_numpy(np.cumsum(np.r_[0, rng.integers(0, 9, 5000)]).astype(np.int64))
    indices = torch.from_numpy(rng.integers(0, 5000, int(indptr[-1])).astype(np.int64))
    ip, ix, handles = pinned_csr(indptr, indices, torch.device("cuda", 0))
    # the kernels' views alias the host arrays: no byte of the CSR copied, on host or device
    assert ip.data_ptr() == indptr.data_ptr() and ix.data_ptr() == indices.data_ptr()
    nbytes = [t.numel() * t.element_size() for t in (indptr, indices)]
    assert sorted(views.ranges) == sorted(
        (t.data_ptr(), t.data_ptr() + n) for t, n in zip((indptr, indices), nbytes)
    )
    assert uva.pinned_bytes() == sum(nbytes)
    for h in handles:
        h.release()


def test_uva_topology_of_a_file_mapping_copies_it_at_most_once(views, tmp_path, monkeypatch):
    """A CSR that cannot be registered where it is (here: its registration fails) is copied once
    into host memory and that copy is pinned: never more than one extra copy of the index."""
    from gnnio.sampling.gpu import pinned_csr

    indices = torch.arange(3000, dtype=torch.int64)
    indptr = torch.arange(0, 3001, 3, dtype=torch.int64)
    orig = views.cudaHostRegister
    refused = {indptr.data_ptr(), indices.data_ptr()}

    def register(ptr, nbytes, flags):
        return 1 if ptr in refused else orig(ptr, nbytes, flags)

    monkeypatch.setattr(views, "cudaHostRegister", register)
    ip, ix, handles = pinned_csr(indptr, indices, torch.device("cuda", 0))
    assert torch.equal(ip, indptr) and torch.equal(ix, indices)
    assert uva.pinned_bytes() == 8 * (3000 + 1001)  # exactly one copy of each array
    for h in handles:
        h.release()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_uva_sampler_allocates_no_csr_on_the_device():
    from gnnio.graph import CSRGraph
    from gnnio.sampling import UniformSampler

    rng = np.random.default_rng(0)
    n = 200_000
    indptr = np.cumsum(np.r_[0, rng.integers(0, 20, n)]).astype(np.int64)
    indices = rng.integers(0, n, int(indptr[-1])).astype(np.int64)
    csr_bytes = indptr.nbytes + indices.nbytes
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    s = UniformSampler(CSRGraph(indptr, indices), [5, 5], device="cuda", graph_in="host")
    torch.cuda.synchronize()
    extra = torch.cuda.memory_allocated() - before
    assert extra < 0.05 * csr_bytes, f"{extra} bytes on the device for a {csr_bytes}-byte CSR"
    assert s._torch.indices.data_ptr() == indices.ctypes.data  # the host array, viewed
    s.sample(torch.arange(100))
    s.close()
