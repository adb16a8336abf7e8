"""Device names resolved in one place (issue 15, faults 1 and 2), checked on the CPU with a faked
CUDA runtime and a CPU tensor that reports ``cuda:0`` as real CUDA tensors do."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gnnio.features._gather import check_out
from gnnio.features.tiers import uva
from gnnio.utils.devices import resolve_device, same_device
from tests.fake_cuda import FakeCudaTensor, fake_cuda


def test_resolve_device_gives_the_index_cuda_tensors_report(monkeypatch):
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(None) == torch.device("cpu")
    if not torch.cuda.is_available():  # without CUDA the name stays as given
        assert resolve_device("cuda") == torch.device("cuda")
    fake_cuda(monkeypatch, current=1)
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device(torch.device("cuda")) == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    assert resolve_device(0) == torch.device("cuda", 0)
    assert same_device("cuda", "cuda:1") and not same_device("cuda", "cuda:0")
    assert torch.device("cuda", 1) != torch.device("cuda")  # the trap resolve_device avoids


def test_a_real_cuda_out_buffer_matches_a_resolved_store_device(monkeypatch):
    fake_cuda(monkeypatch)
    out = torch.zeros(4, 3).as_subclass(FakeCudaTensor)
    assert out.device == torch.device("cuda", 0)
    view = check_out(out, 2, 3, torch.float32, resolve_device("cuda"))
    assert view.shape == (2, 3)
    with pytest.raises(ValueError, match="out is on cuda:0"):  # what an unresolved name did
        check_out(out, 2, 3, torch.float32, torch.device("cuda"))


def test_ids_already_on_the_device_stay_there(monkeypatch):
    from gnnio.features import batch_ops

    fake_cuda(monkeypatch)

    class Store:
        num_rows = 10

    def no_round_trip(*a, **k):
        raise AssertionError("ids went through the host")

    monkeypatch.setattr(batch_ops, "as_index_array", no_round_trip)
    ids = torch.tensor([1, 5, 9]).as_subclass(FakeCudaTensor)
    out = batch_ops.ids_on(Store(), ids, resolve_device("cuda"))
    assert out.tolist() == [1, 5, 9]
    with pytest.raises(IndexError):
        batch_ops.ids_on(Store(), torch.tensor([10]).as_subclass(FakeCudaTensor), resolve_device(0))


def _spy(monkeypatch, module, calls: list):
    def spy(device):
        calls.append(device)
        return torch.device("cpu")  # the spy stands in for the real GPU: build on the CPU

    monkeypatch.setattr(module, "resolve_device", spy)


def test_every_store_resolves_its_device_through_resolve_device(monkeypatch):
    """Each store, cache, policy and the loader call the one helper with the name they were
    given (before issue 15, three of them kept ``torch.device("cuda")`` unresolved)."""
    from gnnio.features.caches import cache, reuse
    from gnnio.features.caches import multi as cache_multi
    from gnnio.features.caches import policy as cache_policy
    from gnnio.features.caches.cache import FeatureCache
    from gnnio.features.caches.reuse import CrossBatchReuse
    from gnnio.features.stores import memory
    from gnnio.features.stores.memory import InMemoryFeatureStore
    from gnnio.features.tiers import multidevice
    from gnnio.pipeline import loader as loader_mod

    feats = np.arange(40, dtype=np.float32).reshape(10, 4)
    calls: list = []
    for mod in (memory, cache, cache_policy, reuse, cache_multi, multidevice, loader_mod):
        _spy(monkeypatch, mod, calls)
    base = InMemoryFeatureStore(feats, device="cuda")
    assert calls == ["cuda"]
    calls.clear()
    c = FeatureCache(base, 4, "fifo", device="cuda")
    assert "cuda" in calls and c.device == torch.device("cpu")
    calls.clear()
    CrossBatchReuse(base, device="cuda")
    assert calls and calls[0] == "cuda"
    calls.clear()
    loader_mod.NodeLoader(SimpleNamespace(sample=lambda s: None), base, order=None, device="cuda:0")
    assert calls == ["cuda:0"]


def test_tiered_store_resolves_its_device_through_resolve_device(monkeypatch):
    from gnnio.features.tiers import tiered

    fake_cuda(monkeypatch)
    calls: list = []
    _spy(monkeypatch, tiered, calls)
    feats = np.arange(40, dtype=np.float32).reshape(10, 4)
    st = tiered.TieredFeatureStore(feats, hot=3, device="cuda", cold_mode="cpu_gather")
    assert calls == [torch.device("cuda")] and not st.simulated


def test_device_view_accepts_an_unindexed_cuda_name(monkeypatch):
    """``device_view(host, "cuda")`` compared the view's ``cuda:0`` with ``cuda`` and raised."""
    fake_cuda(monkeypatch)
    real_as_tensor = torch.as_tensor

    def as_tensor(obj, *a, **k):  # what torch does with __cuda_array_interface__: alias, no copy
        if isinstance(obj, uva._CudaArrayView):
            return obj.owner.view(torch.uint8).as_subclass(FakeCudaTensor)
        return real_as_tensor(obj, *a, **k)

    monkeypatch.setattr(torch, "as_tensor", as_tensor)
    host = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    view = uva.device_view(host, "cuda")
    assert view.device == torch.device("cuda", 0) and view.data_ptr() == host.data_ptr()
    assert view.dtype == torch.float32 and view.shape == (4, 3)
