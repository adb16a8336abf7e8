"""The loader's stream ordering, checked on the CPU (issue 15, fault 4).

:class:`~gnnio.utils.streams.RecordingStreams` keeps CUDA's ordering rules on the CPU. A
sampler double declares its output written on its (sampling) stream, as a GPU sampler's queued
kernels are; a store double declares that it reads the ids on the gather stream and that the host
overwrites the staging slot. The loader passes when every handover waits; each test below that
removes one wait from the recording layer shows the check would catch the loader forgetting it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnio.features import InMemoryFeatureStore
from gnnio.features.base import FeatureStore
from gnnio.graph import CSRGraph
from gnnio.ordering import RandomOrder
from gnnio.pipeline.loader import NodeLoader
from gnnio.sampling import UniformSampler
from gnnio.utils.streams import RecordingStreams, StreamOrderError, batch_tensors

N, F = 400, 8


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    graph = CSRGraph.from_edges(rng.integers(0, N, 3000), rng.integers(0, N, 3000), N)
    feats = rng.standard_normal((N, F)).astype(np.float32)
    labels = rng.integers(0, 5, N).astype(np.int64)
    train = np.sort(rng.choice(N, 200, replace=False)).astype(np.int64)
    return graph, feats, labels, train


class StreamSampler:
    """A sampler whose batches are written on the calling thread's current stream."""

    def __init__(self, inner, streams: RecordingStreams) -> None:
        self.inner, self.streams = inner, streams

    def sample(self, seeds, epoch_seed=None):
        mb = self.inner.sample(seeds, epoch_seed=epoch_seed)
        self.streams.produce(*batch_tensors(mb))
        return mb


class StreamStore(FeatureStore):
    """Reads ``ids`` on the current stream; writes ``out`` from the host (a CPU gather)."""

    def __init__(self, inner: FeatureStore, streams: RecordingStreams) -> None:
        super().__init__()
        self.inner, self.streams = inner, streams
        self.num_rows, self.dim, self.dtype, self.device = (
            inner.num_rows,
            inner.dim,
            inner.dtype,
            inner.device,
        )

    def gather(self, ids, out=None):
        self.streams.check_read(ids, what="input_nodes")
        if out is not None:
            self.streams.check_host_write(out, what="a staging slot")
        return self.inner.gather(ids, out=out)


def run_epochs(data, streams, epochs=2, workers=2, prefetch=1):
    graph, feats, labels, train = data
    sampler = StreamSampler(UniformSampler(graph, [3, 2], seed=1), streams)
    store = StreamStore(InMemoryFeatureStore(feats), streams)
    order = RandomOrder(train, 16, seed=2)
    loader = NodeLoader(
        sampler, store, order, labels=labels, prefetch=prefetch, num_workers=workers,
        streams=streams,
    )  # fmt: skip
    kept = []
    for e in range(epochs):
        for mb in loader.epoch(e):
            streams.check_read(*batch_tensors(mb), what="the batch")  # the consumer's stream
            kept.append(mb)
    for mb in kept:  # batches are copies: they stay valid after later batches were gathered
        ids = mb.input_nodes.numpy()
        assert np.array_equal(mb.x.numpy(), feats[ids])
        assert np.array_equal(mb.labels.numpy(), labels[mb.seeds.numpy()])
    return loader, kept


def test_every_handover_waits(data):
    streams = RecordingStreams()
    loader, kept = run_epochs(data, streams)
    assert streams.violations == []
    assert len(kept) == 2 * 13 and loader.stats.complete
    waits = [(s, ev) for op, s, ev in streams.log if op == "wait"]
    assert any(s.startswith("gather") and ev.startswith("sample") for s, ev in waits)
    assert any(s == "default" and ev.startswith("gather") for s, ev in waits)
    # slots go back to the ring with their copy's event, synchronized before the next refill
    assert any(op == "synchronize" and ev.startswith("gather") for op, _, ev in streams.log)
    assert not any(op == "synchronize" and ev.startswith("sample") for op, _, ev in streams.log)
    assert 0.0 <= loader.stats.hidden_fraction <= 1.0


class ForgetsSampleWait(RecordingStreams):
    def wait(self, stream, event):
        if not event.stream.startswith("sample"):
            super().wait(stream, event)


class ForgetsConsumerWait(RecordingStreams):
    def wait(self, stream, event):
        if stream.name != "default":
            super().wait(stream, event)


class ForgetsSlotSync(RecordingStreams):
    def synchronize(self, event):
        pass


@pytest.mark.parametrize(
    "layer,match",
    [
        (ForgetsSampleWait, "reads input_nodes written on sample"),
        (ForgetsConsumerWait, "default reads the batch written on"),
        (ForgetsSlotSync, "overwrites a staging slot"),
    ],
)
def test_a_missing_wait_fails_on_the_cpu(data, layer, match):
    streams = layer()
    with pytest.raises(StreamOrderError, match=match):
        run_epochs(data, streams)
    assert streams.violations


def test_cpu_loader_without_streams_hands_out_slots(data):
    """Without CUDA and without a recording layer nothing changes: no streams, slots lent."""
    graph, feats, labels, train = data
    loader = NodeLoader(
        UniformSampler(graph, [3, 2], seed=1),
        InMemoryFeatureStore(feats),
        RandomOrder(train, 16, seed=2),
        labels=labels,
    )
    assert loader._streams is None
    ptrs = {mb.x.untyped_storage().data_ptr() for mb in loader.epoch(0)}
    assert len(ptrs) <= loader.prefetch + 2
    assert loader.stats.as_dict()["hidden_fraction"] == loader.stats.hidden_fraction
    assert torch.get_num_threads() >= 1


def test_batch_tensors_include_each_blocks_csr_pointer(data):
    """A block's ``ptr`` is memory of its own where a sampler made it apart from the edges (the
    CPU sampler's, copied to the GPU on the side stream; a GPU sampler's fallback batch): the
    consumer adopts what :func:`batch_tensors` lists, so a ``ptr`` left out could be handed to
    the side stream's next allocation while the model's SpMM still reads it."""
    graph, *_ = data
    mb = UniformSampler(graph, [3, 2], seed=1).sample(torch.arange(8))
    assert all(b.ptr is not None for b in mb.blocks)
    listed = {id(t) for t in batch_tensors(mb)}
    assert all(id(b.ptr) in listed for b in mb.blocks)
