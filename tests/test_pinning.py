"""Pinned-memory registrations (issue 15, fault 6), on the CPU with a recording CUDA runtime.

The fake runtime keeps registered address ranges as CUDA does; ``is_pinned`` answers for the
pointer asked about (as ``cudaPointerGetAttributes`` does), so a larger tensor starting at a
registered address looks pinned at its first byte only.
"""

from __future__ import annotations

import gc

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
    log = fake_events(monkeypatch)
    return install_runtime(monkeypatch, FakeCudaRuntime(log))


def test_a_larger_tensor_at_a_registered_address_is_not_taken_as_pinned(runtime):
    big = torch.zeros(1000)
    small = uva.pin_host_tensor(big[:100])
    assert small.registered and runtime.ranges == [(big.data_ptr(), big.data_ptr() + 400)]
    with pytest.raises(uva.PinError, match="overlaps a registered range"):
        uva.pin_host_tensor(big)  # its first page is pinned, the rest is not
    inner = uva.pin_host_tensor(big[10:50])  # inside the registration: shares it
    assert inner.registered and len(runtime.ranges) == 1
    small.release()
    assert len(runtime.ranges) == 1  # still used by `inner`
    inner.release()
    assert runtime.ranges == []
    whole = uva.pin_host_tensor(big)  # now the whole tensor can be registered
    assert runtime.ranges == [(big.data_ptr(), big.data_ptr() + 4000)]
    whole.release()


def test_someone_elses_pin_must_cover_the_whole_tensor(runtime):
    big = torch.zeros(1000)
    runtime.cudaHostRegister(big.data_ptr(), 400, 0)  # registered outside gnnio, 100 floats
    h = uva.pin_host_tensor(big)
    assert h.registered  # gnnio registered it itself instead of trusting the first page
    assert runtime.log[-1][0] == "register"


def test_release_waits_for_queued_reads_then_unregisters(runtime):
    t = torch.zeros(64)
    h = uva.pin_host_tensor(t)
    h.note_use()  # a zero-copy gather was queued on the current stream
    h.note_use()  # the same stream again: one event kept per stream
    h.release()
    ops = [e[0] for e in runtime.log]
    assert ops[-2:] == ["synchronize", "unregister"]
    assert ops.count("synchronize") == 1
    h.release()  # idempotent
    assert [e[0] for e in runtime.log].count("unregister") == 1


def test_the_finalizer_waits_too(runtime):
    h = uva.pin_host_tensor(torch.zeros(64))
    h.note_use()
    del h
    gc.collect()
    ops = [e[0] for e in runtime.log]
    assert ops[-2:] == ["synchronize", "unregister"]


def test_tiered_cold_path_notes_its_zero_copy_reads(runtime, monkeypatch):
    from gnnio.features.tiers.row_source import RowSource
    from gnnio.features.tiers.tiered_cold import ColdPath

    real_as_tensor = torch.as_tensor

    def as_tensor(obj, *a, **k):
        if isinstance(obj, uva._CudaArrayView):
            return obj.owner.view(torch.uint8).as_subclass(FakeCudaTensor)
        return real_as_tensor(obj, *a, **k)

    monkeypatch.setattr(torch, "as_tensor", as_tensor)
    host = torch.arange(40, dtype=torch.float32).reshape(10, 4)
    cold = ColdPath(RowSource(host), torch.device("cuda", 0), simulated=False)
    cold.setup("zero_copy", None, all_hot=False)
    assert cold.mode_used == "zero_copy"
    res = torch.empty(3, 4)
    cold.gather(res, None, torch.tensor([1, 5, 9]))
    assert torch.equal(res, host[[1, 5, 9]])
    cold.release()
    ops = [e[0] for e in runtime.log]
    assert ops[-2:] == ["synchronize", "unregister"]
