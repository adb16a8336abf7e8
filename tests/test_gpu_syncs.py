"""Host synchronisations on the GPU path outside the training thread (issue 24, item 2), checked
on the CPU with fake CUDA events: ``fake_events`` makes ``torch.cuda.synchronize()`` fail the
test, since a device-wide sync waits for every stream (training and the loader's copies)."""

from __future__ import annotations

import torch

from gnnio.features import accounting
from gnnio.features.base import TierCounters
from tests.fake_cuda import FakeStream, fake_events


def test_the_deferred_split_waits_for_its_adds_not_for_the_device(monkeypatch):
    """The tiered store's fused gather counts hot rows on the device; the loader reads the
    counters after every batch from its gather thread, so the flush must wait only for the
    streams that added (their last events), never for the device."""
    log = fake_events(monkeypatch)
    split = accounting.DeferredSplit(torch.device("cpu"))
    split.device = torch.device("cuda", 0)  # the CUDA branch, on a CPU counter
    streams = iter([FakeStream("side"), FakeStream("side"), FakeStream("main")])
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: next(streams))
    split.add(torch.tensor([True, False, True]))
    split.add(torch.tensor([False, False]))
    split.add(torch.tensor([True]))
    counters = TierCounters()
    split.flush(counters, "gpu", "host", 8)  # raises if it synchronizes the device
    assert counters.rows == {"gpu": 3, "host": 3} and counters.bytes == {"gpu": 24, "host": 24}
    recorded = [(eid, s) for op, eid, s in log if op == "record"]
    synced = [eid for op, eid, _ in log if op == "synchronize"]
    assert [s for _, s in recorded] == ["side", "side", "main"]
    assert synced == [recorded[1][0], recorded[2][0]]  # the last add of each stream
    split.flush(counters, "gpu", "host", 8)  # nothing added since: no wait
    assert [op for op, *_ in log].count("synchronize") == 2
