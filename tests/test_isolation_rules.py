"""Rules of ``--isolation auto`` (gnnio.train.isolate, issue 24 item 6) found by a mutation pass:
profiling samples the first ``batches`` batches of epoch 0, reads the innermost store with a
thread knob (never a wrapper above it), and :func:`restore` puts back every thread setting."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gnnio
from gnnio.features.base import FeatureStore
from gnnio.features.stores.memory import InMemoryFeatureStore
from gnnio.ordering.shuffle import RandomOrder
from gnnio.sampling import UniformSampler
from gnnio.train import isolate as iso_mod
from gnnio.train.models import build_model

from .helpers import write_tiny_dataset


class Cache(FeatureStore):
    """A wrapper with a thread knob of its own that counts its reads (a cache profiling must not
    warm)."""

    def __init__(self, backing):
        super().__init__()
        self.backing = backing
        self.num_rows, self.dim, self.dtype = backing.num_rows, backing.dim, backing.dtype
        self.num_threads = 1
        self.reads = 0

    def gather(self, ids, out=None):
        self.reads += 1
        return self.backing.gather(ids, out)


class Recording(UniformSampler):
    """Records the seed batches it was asked to sample."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.asked = []

    def sample(self, seeds, *a, **kw):
        self.asked.append(tuple(torch.as_tensor(seeds).tolist()))
        return super().sample(seeds, *a, **kw)


@pytest.fixture
def setup(tmp_path, monkeypatch):
    monkeypatch.setattr(iso_mod, "available_cores", lambda: list(range(8)))
    monkeypatch.setattr(iso_mod, "activate", lambda plan: None)  # (no real pinning here)
    monkeypatch.setattr(iso_mod, "pin_current_thread", lambda stage: None)
    real_solve = iso_mod.solve

    def solve(fits, n, fixed):
        alloc = real_solve(fits, n, fixed)
        alloc.threads = {"sample": 2, "gather": 3, "compute": 2}  # all differ from the start
        return alloc

    monkeypatch.setattr(iso_mod, "solve", solve)
    ds = gnnio.load(write_tiny_dataset(tmp_path / "d", num_nodes=200, num_edges=1200, feat_dim=8))
    inner = InMemoryFeatureStore(np.asarray(ds.features), num_threads=1)
    sampler = Recording(ds.graph, [3, 2], num_threads=1)
    model = build_model("sage", 8, 8, int(np.asarray(ds.labels).max()) + 1, 2)
    order = RandomOrder(ds.train_idx, 8, seed=0)
    threads = torch.get_num_threads()
    yield ds, inner, sampler, model, order
    torch.set_num_threads(threads)
    sampler.close()


def test_profiling_samples_the_first_batches_and_reads_below_a_cache(setup):
    """The profiled seeds are exactly the first ``batches`` batches of epoch 0, and the gather
    stage is timed on the innermost store with a thread knob: the cache above it is not read."""
    ds, inner, sampler, model, order = setup
    cache = Cache(inner)
    first = [tuple(b.tolist()) for b in order.batches(0)][:3]
    assert order.num_batches > 3
    iso_mod.isolate(sampler, cache, model, order, torch.as_tensor(ds.labels),
                    torch.device("cpu"), batches=3)  # fmt: skip
    assert set(sampler.asked) == set(first)
    assert cache.reads == 0
    assert (cache.num_threads, inner.num_threads) == (3, 3)  # both knobs get the gather threads


def test_restore_puts_back_every_thread_setting(setup, monkeypatch):
    """After :func:`restore` the sampler, every gather store in the chain and torch have the
    thread counts they had before :func:`isolate`, and the training thread its old cores."""
    ds, inner, sampler, model, order = setup
    cache = Cache(inner)
    set_aff = []
    monkeypatch.setattr(iso_mod.os, "sched_setaffinity", lambda pid, cores: set_aff.append(cores))
    torch.set_num_threads(3)
    alloc, undo = iso_mod.isolate(sampler, cache, model, order, torch.as_tensor(ds.labels),
                                  torch.device("cpu"))  # fmt: skip
    assert (sampler.num_threads, inner.num_threads, torch.get_num_threads()) == (2, 3, 2)
    iso_mod.restore(undo, sampler, cache)
    assert (sampler.num_threads, cache.num_threads, inner.num_threads) == (1, 1, 1)
    assert torch.get_num_threads() == 3 and set_aff == [list(range(8))]


def test_the_gather_threads_reach_a_store_below_a_wrapper_without_a_knob(setup):
    """A wrapper without ``num_threads`` (a reuse layer) does not hide the store below it: the
    ``backing`` chain is walked, each stage gets its threads, and the profiling reads leave the
    store's counters at zero (the run's traffic figures must not count them)."""
    ds, inner, sampler, model, order = setup

    class Wrapper(FeatureStore):
        def __init__(self, backing):
            super().__init__()
            self.backing = backing
            self.num_rows, self.dim, self.dtype = backing.num_rows, backing.dim, backing.dtype

        def gather(self, ids, out=None):
            return self.backing.gather(ids, out)

    alloc, undo = iso_mod.isolate(sampler, Wrapper(inner), model, order,
                                  torch.as_tensor(ds.labels), torch.device("cpu"))  # fmt: skip
    assert alloc.threads["gather"] == 3 and inner.num_threads == 3
    assert sampler.num_threads == 2 and torch.get_num_threads() == 2
    assert sum(inner.counters.rows.values()) == 0
    assert undo["gather"] == [1] and undo["sampler"] == 1
