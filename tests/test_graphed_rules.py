"""Rules of the padded ``--cuda-graph`` step (gnnio.train.graphed) found by a mutation pass: the
capacities keep a padding row past the input level and nest, and a batch fits them exactly up to
the boundary the module's docstring names (input rows and edge slots may fill their buffers, the
levels past the input must leave their last row to the padding)."""

from __future__ import annotations

import copy

import pytest
import torch

import gnnio
from gnnio.train import TrainConfig
from gnnio.train.build import build_training, train_step
from gnnio.train.graphed import ROUND, GraphedStep
from gnnio.train.loop import LocalRun

from .helpers import write_tiny_dataset


def _parts_and_batches(tmp_path_factory, model: str):
    """The training parts of a tiny graph and its first two batches (copied out of the ring)."""
    path = write_tiny_dataset(tmp_path_factory.mktemp("d") / "t", num_nodes=120, num_edges=600)
    cfg = TrainConfig(model=model, fanouts=(3, 2), batch_size=8, epochs=1, hidden=8, lr=0.01,
                      dropout=0.0, progress=False, seed=0)  # fmt: skip
    parts = build_training(gnnio.load(path), cfg, LocalRun(), torch.device("cpu"))
    it = iter(parts.train_loader.epoch(0))
    batches = [next(it), next(it)]
    it.close()
    for b in batches:
        b.x = b.x.clone()
    return parts, batches


@pytest.fixture(scope="module")
def parts_and_batch(tmp_path_factory):
    return _parts_and_batches(tmp_path_factory, "sage")


def _shape(rows, edges):
    return (rows, edges, (False,) * len(edges), (4,), torch.float32, True)


@pytest.mark.parametrize("margin", [1.0, 1.5])
def test_capacities_keep_a_padding_row_past_the_input_and_nest(margin):
    """Sized from batches whose largest levels are exact multiples of the rounding, every level
    past the input still gets a row more than ``margin`` x its largest, each level's capacity is
    at least the next one's (a prefix), and edge slots cover ``margin`` x the largest count."""
    step = GraphedStep("cpu", warmup=2, capture=False, margin=margin)
    step._seen = [_shape([ROUND, ROUND, 100], [ROUND, 100]), _shape([200, 2 * ROUND, 50], [10, 90])]
    step._size()
    rows, edges = step.caps["rows"], step.caps["edges"]
    top = [ROUND, 2 * ROUND, 100]
    assert rows[0] >= top[0] * margin
    assert all(rows[k] > top[k] * margin for k in (1, 2))
    assert rows == sorted(rows, reverse=True)
    assert edges[0] >= ROUND * margin and edges[1] >= 100 * margin
    assert all(v % ROUND == 0 for v in rows + edges)


def _tight(step, b, extra_last, extra_edges=0):
    rows = [b.blocks[0].num_src] + [blk.num_dst for blk in b.blocks]
    step.caps = {"rows": [rows[0]] + [r + 1 for r in rows[1:-1]] + [rows[-1] + extra_last],
                 "edges": [blk.num_edges + extra_edges for blk in b.blocks], "weighted": (False, False),
                 "feat": tuple(b.x.shape[1:]), "dtype": b.x.dtype}  # fmt: skip
    assert step.caps["rows"] == sorted(step.caps["rows"], reverse=True)
    step._alloc()


def test_a_batch_without_room_for_the_padding_row_runs_eagerly(parts_and_batch):
    """Seeds equal to the last level's capacity leave no row for the padding edges (they would
    land on a real seed): the batch runs the eager step."""
    parts, (b0, b) = parts_and_batch
    net = copy.deepcopy(parts.net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    step = GraphedStep("cpu", warmup=1, capture=False)
    step(net, opt, b0)
    _tight(step, b, extra_last=0)
    step(net, opt, b)
    assert (step.graphed, step.eager) == (0, 2)


@pytest.fixture(scope="module")
def gat_parts_and_batch(tmp_path_factory):
    return _parts_and_batches(tmp_path_factory, "gat")


@pytest.mark.parametrize("extra_edges", [0, 5])
@pytest.mark.parametrize("impl", ["numba", "torch"])
@pytest.mark.parametrize("which", ["sage", "gat"])
def test_a_tightest_fit_batch_runs_padded_and_trains_as_the_eager_step(
    which, impl, extra_edges, parts_and_batch, gat_parts_and_batch, monkeypatch
):
    """Input rows and edge slots equal to their capacities fit (no padding row is needed there),
    with one padding row on every later level: the batch runs padded and trains as the eager step
    does -- loss, logits and the parameters after the step. With padding edges
    (``extra_edges``), their destination must be that last row in ``edge_index[1]`` as in the
    pointer: the torch aggregation (the GPU's) reads the destinations in its backward (GAT's edge
    gradients, the transpose), so padding edges aimed at the last real row send gradients to a
    real source, which only the parameters show (the loss is computed before the backward)."""
    monkeypatch.setenv("GNNIO_SPMM", "" if impl == "numba" else "torch")
    parts, (b0, b) = parts_and_batch if which == "sage" else gat_parts_and_batch
    net = copy.deepcopy(parts.net)
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    net2 = copy.deepcopy(net)
    opt2 = torch.optim.SGD(net2.parameters(), lr=0.5)
    step = GraphedStep("cpu", warmup=1, capture=False)
    step(net, opt, b0)
    train_step(net2, opt2, b0)
    _tight(step, b, extra_last=1, extra_edges=extra_edges)
    lg, loss = step(net, opt, b)
    lg2, loss2 = train_step(net2, opt2, b)
    assert (step.graphed, step.eager) == (1, 1)
    assert loss.item() == pytest.approx(loss2.item(), rel=1e-5, abs=1e-6)
    torch.testing.assert_close(lg, lg2, rtol=1e-4, atol=1e-5)
    for (name, p), p2 in zip(net.named_parameters(), net2.parameters(), strict=True):
        torch.testing.assert_close(p, p2, rtol=1e-4, atol=1e-6, msg=name)
