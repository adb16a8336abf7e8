"""``gnnio train --edge-weight-norm mean|sum`` (issue 27): how SAGE combines the Horvitz-Thompson
edge weights of LABOR, LADIES and locality-aware sampling. ``sum`` reaches the samplers (weights
``1 / (deg q)``) and the model, and changes what it computes; ``mean`` stays the default; options
it cannot apply to are refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gnnio.cli.main import main
from gnnio.sampling import LaborSampler
from gnnio.train import TrainConfig
from gnnio.train.models import aggregate
from gnnio.train.setup import build_sampler, edge_weights

from .helpers import random_graph, write_tiny_dataset


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("ewn") / "tiny", num_nodes=120,
                              num_edges=900, num_classes=3)  # fmt: skip


BASE = ["--fanouts", "3,2", "--epochs", "2", "--batch-size", "8", "--hidden", "8", "--quiet"]


def run(tiny, tmp_path, *extra) -> dict:
    out = tmp_path / f"s{len(list(tmp_path.iterdir()))}.json"
    assert main(["train", str(tiny), *BASE, *extra, "--summary", str(out)]) == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize(
    "extra,differs",
    [
        (["--locality-scale", "2", "--gpu-cache-fraction", "0.2"], True),
        (["--sampler", "ladies", "--layer-size", "16"], True),
        (["--sampler", "labor"], False),  # LABOR-0: a row's weights are all equal, 1/min(d, k)
    ],
)
def test_sum_reaches_the_model_and_changes_the_run(tiny, tmp_path, monkeypatch, extra, differs):
    """With unequal weights in a row (locality-aware, LADIES) the two forms train differently;
    with LABOR-0 the Horvitz-Thompson mean is the plain mean of the sampled neighbours, which the
    ratio form also gives, so the runs agree."""
    from gnnio.train import models

    seen = []  # the edge_weight_norm of every SAGE layer the runs build
    init = models.SAGELayer.__init__

    def spy(self, *a, **k):
        init(self, *a, **k)
        seen.append(self.edge_weight_norm)

    monkeypatch.setattr(models.SAGELayer, "__init__", spy)
    default = run(tiny, tmp_path, *extra)
    mean = run(tiny, tmp_path, *extra, "--edge-weight-norm", "mean")
    total = run(tiny, tmp_path, *extra, "--edge-weight-norm", "sum")
    assert seen == ["mean"] * 4 + ["sum"] * 2  # two layers (fanouts 3,2) per run
    assert default["config"]["edge_weight_norm"] == "mean"
    assert total["config"]["edge_weight_norm"] == "sum"
    assert default["loss_history"] == mean["loss_history"]  # mean is the default
    if differs:
        assert total["loss_history"] != pytest.approx(mean["loss_history"], rel=1e-4)
    else:
        assert total["loss_history"] == pytest.approx(mean["loss_history"], rel=1e-4)


def test_samplers_get_ht_mean_weights_for_sage_sum_only(tiny):
    import gnnio

    ds = gnnio.load(tiny)
    for model, norm, want in (
        ("sage", "sum", "ht_mean"),
        ("sage", "mean", "ht"),
        ("gin", "mean", "ht"),
    ):
        cfg = TrainConfig(model=model, edge_weight_norm=norm, sampler="labor", fanouts=(3, 2))
        assert edge_weights(cfg) == want
        sampler, _ = build_sampler(ds, cfg, [3, 2], setup=None)
        assert sampler.weights == want, (model, norm)


def test_sum_form_averages_to_the_neighbour_mean_and_mean_form_is_the_hajek_ratio():
    """Over LABOR batches of one row set, SAGE's ``sum`` aggregation with ``ht_mean`` weights
    averages to the exact neighbour mean (|z| < 5 per row, 800 batches), and ``mean`` with ``ht``
    weights is ``sum_j w_j x_j / sum_j w_j`` on each of the first 50."""
    g = random_graph(60, 900, seed=4)
    seeds = np.arange(10)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((60, 1)) + 3.0).float()
    indptr, indices = np.asarray(g.indptr), np.asarray(g.indices)
    exact = np.array([x[indices[indptr[s] : indptr[s + 1]], 0].double().mean() for s in seeds])
    s_ht, s_mean = LaborSampler(g, [4], seed=1), LaborSampler(g, [4], seed=1, weights="ht_mean")
    est = []
    for b in range(800):
        blk = s_mean.sample(seeds, epoch_seed=b)
        est.append(aggregate(x[blk.input_nodes], blk.blocks[0], "sum")[:, 0].double().numpy())
        if b >= 50:
            continue
        h = s_ht.sample(seeds, epoch_seed=b)
        blk0 = h.blocks[0]
        src, dst = blk0.edge_index
        w = blk0.edge_weight.double()
        xs = x[h.input_nodes[src], 0].double()
        ratio = torch.zeros(10, dtype=torch.float64).index_add_(0, dst, w * xs)
        ratio /= torch.zeros(10, dtype=torch.float64).index_add_(0, dst, w)
        got = aggregate(x[h.input_nodes], blk0, "mean")[:, 0].double()
        torch.testing.assert_close(got, ratio, rtol=1e-5, atol=1e-5)
    e = np.array(est)
    z = (e.mean(0) - exact) / (e.std(0, ddof=1) / np.sqrt(len(e)))
    assert np.abs(z).max() < 5, z


@pytest.mark.parametrize(
    "extra,words",
    [
        ([], "uniform sampler gives no edge weights"),
        (["--sampler", "labor", "--model", "gcn"], "applies to --model sage"),
    ],
)
def test_sum_where_it_cannot_apply_is_one_line(tiny, capsys, extra, words):
    assert main(["train", str(tiny), *BASE, *extra, "--edge-weight-norm", "sum"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gnnio: error:") and words in err[0], err
