"""Rules of the training loop's epoch record (gnnio.train.loop) found by a mutation pass: the
loader waits of every batch are summed into ``wait`` and kept out of ``compute``."""

from __future__ import annotations

import time

import pytest
import torch

import gnnio
from gnnio.train import TrainConfig
from gnnio.train.build import build_training, train_step
from gnnio.train.loop import LocalRun, _train_epoch

from .helpers import write_tiny_dataset

DELAY = 0.05  # seconds the slow loader sleeps before handing out each batch


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("d") / "tiny", num_nodes=60, num_edges=200)


class SlowLoader:
    """Hands out ``inner``'s batches, each after sleeping ``DELAY`` (a loader that is behind)."""

    def __init__(self, inner):
        self.inner = inner

    def epoch(self, epoch, start=0):
        it = self.inner.epoch(epoch)
        try:
            for b in it:
                time.sleep(DELAY)
                yield b
        finally:
            it.close()


def test_wait_sums_every_batch_and_compute_excludes_it(tiny):
    """``wait`` is the sum of the waits for every batch (not the last one's) and ``compute`` the
    bracketed steps only, so with a loader slower than the step, wait > compute."""
    cfg = TrainConfig(fanouts=(2,), batch_size=5, hidden=4, progress=False, seed=0, epochs=1)
    parts = build_training(gnnio.load(tiny), cfg, LocalRun(), torch.device("cpu"))
    steps = []

    def timed(net, opt, batch, timer=None):
        t0 = time.perf_counter()
        out = train_step(net, opt, batch, timer)
        steps.append(time.perf_counter() - t0)
        return out

    rec = _train_epoch(parts.net, parts.opt, SlowLoader(parts.train_loader), parts.store, 0,
                       cfg, torch.device("cpu"), step=timed)  # fmt: skip
    n = rec["batches"]
    assert n == len(steps) >= 3
    bd = rec["breakdown_s"]
    assert bd["wait"] >= n * DELAY
    assert bd["compute"] <= sum(steps) + 1e-6  # the steps' own time, no wait in it
    assert bd["wait"] + bd["compute"] <= rec["epoch_time_s"] + 1e-6
