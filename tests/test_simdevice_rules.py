"""Rules of the simulated device, the pin stand-ins, the CPU-side pinning helpers of ``uva`` and the
multi-device store's set-up that the broader tests leave open (one rule per test; CPU only)."""

from __future__ import annotations

import gc
import io

import numpy as np
import pytest
import torch

from gnnio.features.tiers import uva
from gnnio.features.tiers.multidevice import MultiDeviceFeatureStore
from gnnio.features.tiers.simdevice import (
    SimulatedDevice,
    SimulatedOutOfMemory,
    pin_limit,
    simulated_pin,
)

# ---- SimulatedDevice: capacity and peak ----------------------------------------------------------


def test_an_allocation_that_exactly_fills_the_device_succeeds():
    """Capacity is the most bytes held: filling it exactly is allowed, one byte more is not."""
    dev = SimulatedDevice(capacity_bytes=64)
    t = dev.empty((16,), torch.float32)  # 64 B
    assert dev.allocated_bytes == 64
    with pytest.raises(SimulatedOutOfMemory):
        dev.empty((1,), torch.uint8)
    del t


def test_capacity_counts_what_is_already_allocated():
    """A second allocation is refused when together with the live first it exceeds the capacity."""
    dev = SimulatedDevice("sim:cuda:3", capacity_bytes=64)
    first = dev.empty((10,), torch.float32)  # 40 B
    with pytest.raises(
        SimulatedOutOfMemory, match=r"sim:cuda:3: cannot allocate 40 B \(40 B of 64 B"
    ):
        dev.empty((10,), torch.float32)
    assert dev.allocated_bytes == 40
    del first
    gc.collect()
    dev.empty((10,), torch.float32)  # fits once the first is freed


def test_peak_bytes_is_the_high_water_mark():
    """``peak_bytes`` keeps the largest amount ever held, not the amount at the last allocation."""
    dev = SimulatedDevice()
    big = dev.empty((100,), torch.float32)  # 400 B
    del big
    gc.collect()
    small = dev.empty((2,), torch.float32)  # 8 B
    assert dev.allocated_bytes == 8 and dev.peak_bytes == 400
    del small


def test_a_negative_capacity_is_refused():
    """A simulated device cannot have a negative memory size."""
    with pytest.raises(ValueError, match="capacity_bytes must be >= 0"):
        SimulatedDevice(capacity_bytes=-1)
    assert SimulatedDevice(capacity_bytes=0).capacity_bytes == 0


# ---- pin stand-ins --------------------------------------------------------------------------------


def test_simulated_pin_refuses_a_strided_tensor():
    """Like the real pin, the stand-in refuses a non-contiguous tensor (it is never copied)."""
    with pytest.raises(ValueError, match="contiguous"):
        simulated_pin(torch.zeros(4, 3).t())


def test_pin_limit_allows_exactly_the_limit():
    """``pin_limit(n)`` fails only for tensors *above* n bytes: n bytes pin, n + 1 do not."""
    pin = pin_limit(64)
    assert pin(torch.zeros(64, dtype=torch.uint8)).nbytes == 64
    with pytest.raises(uva.PinError, match="cannot pin 65 B .*limit: 64 B pinnable"):
        pin(torch.zeros(65, dtype=torch.uint8))


# ---- uva helpers that run without a GPU ----------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ("1.5KiB", 1536),
        ("2T", 2 * 2**40),
        ("3tib", 3 * 2**40),
        ("8G", 8 * 2**30),
        ("512 mib", 512 * 2**20),
        ("4096", 4096),
        ("1e9", 10**9),
        ("1.5E3k", 1536000),
        (".5 GiB", 2**29),
    ],
)
def test_pin_limit_env_sizes_and_units(monkeypatch, env, expected):
    """``GNNIO_PIN_LIMIT`` reads decimal sizes with binary units, any case, as bytes."""
    monkeypatch.setenv("GNNIO_PIN_LIMIT", env)
    assert uva.pin_limit() == (expected, "GNNIO_PIN_LIMIT")


def test_host_limits_report_available_not_free_memory(monkeypatch):
    """The pin-failure line reports MemAvailable (what can be had), not the smaller MemFree."""
    info = {"MemTotal": 8 * 2**30, "MemAvailable": 3 * 2**30, "MemFree": 2**30}
    monkeypatch.setattr(uva, "_meminfo", lambda: info)
    assert uva.host_memory_limits() == "host RAM available 3.00 GiB of 8.00 GiB"
    info.pop("MemAvailable")  # old kernels: MemFree is the fallback
    assert uva.host_memory_limits() == "host RAM available 1.00 GiB of 8.00 GiB"


def test_meminfo_scales_only_values_with_a_unit(monkeypatch):
    """``/proc/meminfo`` values in kB become bytes; unitless counts (huge pages) stay counts."""
    text = "MemTotal:       16384 kB\nMemAvailable:    8192 kB\nHugePages_Total:       7\n"
    monkeypatch.setattr(uva, "open", lambda *a, **k: io.StringIO(text), raising=False)
    assert uva._meminfo() == {
        "MemTotal": 16384 * 1024,
        "MemAvailable": 8192 * 1024,
        "HugePages_Total": 7,
    }


# ---- MultiDeviceFeatureStore set-up ----------------------------------------------------------------


def _placement(n: int = 10):
    feats = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
    return feats, MultiDeviceFeatureStore.simulated(feats, "2", "alg1", buffer=0.3).placement


def test_more_devices_than_the_placement_has_are_refused():
    """One device per GPU of the placement: a longer device list is refused, not truncated."""
    feats, pl = _placement()
    with pytest.raises(ValueError, match="need 2 devices, got 3"):
        MultiDeviceFeatureStore(feats, pl, devices=["cpu", "cpu", "cpu"])


def test_features_with_more_rows_than_the_placement_are_refused():
    """Features and placement must cover the same nodes: extra feature rows are refused too."""
    feats, pl = _placement(10)
    more = np.zeros((12, 2), dtype=np.float32)
    with pytest.raises(ValueError, match="12 rows but the placement covers 10 nodes"):
        MultiDeviceFeatureStore(more, pl)


def _buffers(store: MultiDeviceFeatureStore) -> list[list[int]]:
    return [sorted(b.tolist()) for b in store.placement.buffers]


def test_simulated_random_probs_follow_the_seed():
    """Without ``probs``, the access probabilities (hence the buffers) are drawn from ``seed``:
    same seed, same buffers; another seed, other buffers."""
    feats = np.zeros((400, 1), dtype=np.float32)
    a = MultiDeviceFeatureStore.simulated(feats, "2", "alg1", buffer=0.1, seed=1)
    b = MultiDeviceFeatureStore.simulated(feats, "2", "alg1", buffer=0.1, seed=1)
    c = MultiDeviceFeatureStore.simulated(feats, "2", "alg1", buffer=0.1, seed=2)
    assert _buffers(a) == _buffers(b) and _buffers(a) != _buffers(c)


def test_simulated_random_strategy_follows_the_seed():
    """With fixed ``probs``, the ``random`` strategy's choice still follows ``seed``."""
    feats = np.zeros((400, 1), dtype=np.float32)
    probs = np.ones(400)
    a, b, c = (
        MultiDeviceFeatureStore.simulated(feats, "2", "random", buffer=0.1, probs=probs, seed=s)
        for s in (5, 5, 6)
    )
    assert _buffers(a) == _buffers(b) and _buffers(a) != _buffers(c)
