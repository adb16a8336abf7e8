"""Evaluation's counts (gnnio.train.evaluate) with stand-in models and loaders: unlabelled seeds
(label -1) count neither as right nor in the total, and the model's mode is put back; the CPU
compute timer sums every step."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gnnio.train.evaluate import evaluate_full, evaluate_sampled, evaluate_sampled_counts
from gnnio.train.timing import ComputeTimer


class Fixed(torch.nn.Module):
    """Predicts class ``pred[i]`` for the ``i``-th row of ``x`` (``x`` holds row numbers)."""

    def __init__(self, pred):
        super().__init__()
        self.pred = torch.as_tensor(pred)
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x, blocks):
        return torch.nn.functional.one_hot(self.pred[x.long().view(-1)], 3).float()

    def inference(self, graph, features, batch_size, device, progress):
        return torch.nn.functional.one_hot(self.pred, 3).float()


class Loader:
    def __init__(self, batches):
        self.batches = batches

    def epoch(self, e):
        for rows, labels in self.batches:
            yield SimpleNamespace(x=torch.tensor(rows), blocks=[], labels=torch.tensor(labels))


@pytest.mark.parametrize("training", [True, False])
def test_sampled_evaluation_skips_unlabelled_seeds_and_restores_the_mode(training):
    model = Fixed([0, 1, 2, 0, 1, 2]).train(training)
    loader = Loader([([0, 1, 2], [0, -1, 1]), ([3, 4, 5], [-1, 1, 2])])  # right: 0, 4, 5
    assert evaluate_sampled_counts(model, loader) == (3, 4)
    assert evaluate_sampled(model, loader) == 0.75
    assert model.training is training
    assert evaluate_sampled_counts(model, Loader([])) == (0, 0)
    assert evaluate_sampled(model, Loader([])) == 0.0


def test_full_evaluation_skips_unlabelled_nodes():
    model = Fixed([0, 1, 2, 0, 1, 2])
    ds = SimpleNamespace(graph=None, features=None, labels=np.array([0, -1, 1, -1, 1, 2]))
    accs = evaluate_full(model, ds, {"valid": np.array([0, 1, 2]), "test": np.array([3, 4, 5]),
                                     "none": np.array([1, 3])}, 4, torch.device("cpu"), False)  # fmt: skip
    assert accs == {"valid": 0.5, "test": 1.0, "none": 0.0}


def test_cpu_compute_timer_sums_every_step():
    timer = ComputeTimer(torch.device("cpu"))
    t0 = time.perf_counter()
    for _ in range(3):
        timer.start()
        time.sleep(0.02)
        timer.stop()
        time.sleep(0.02)  # between steps: not counted
    wall = time.perf_counter() - t0
    assert 0.06 <= timer.total_s() <= wall - 0.06  # (sleeps last at least as asked)
