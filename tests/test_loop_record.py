"""The training loop's record against scripted evaluations: the best epoch is the first with the
highest valid accuracy (a tie does not improve), early stopping after ``patience`` epochs without
improvement, ``stopped_early`` only when epochs were left, the summary's accuracies from the best
epoch; and mid-epoch checkpoints only within an epoch."""

from __future__ import annotations

import pytest

from gnnio.train import TrainConfig, train
from gnnio.train.checkpoint import checkpoint_files
from gnnio.train.loop import LocalRun

from .helpers import write_tiny_dataset

VALID = [0.5, 0.5, 0.7, 0.7, 0.6, 0.6, 0.6, 0.6]
TEST = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]


class Scripted(LocalRun):
    """Evaluation returns the scripted accuracies of the epoch (no model is evaluated)."""

    def evaluate(self, model, loaders, epoch, bars=False):
        return {"valid": VALID[epoch], "test": TEST[epoch]}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("d") / "tiny", num_nodes=60, num_edges=200)


def _cfg(**kw) -> TrainConfig:
    base = dict(fanouts=(2,), batch_size=8, hidden=4, progress=False, seed=0)
    return TrainConfig(**{**base, **kw})


@pytest.mark.parametrize(
    "epochs,patience,ran,stopped",
    [
        (8, 2, 5, True),  # best epoch 2 (epoch 3 ties it); no gain at 3, 4: stop after epoch 4
        (5, 2, 5, False),  # the same stop, at the last epoch: not early
        (8, None, 8, False),
        (8, 3, 6, True),
    ],
)
def test_best_epoch_patience_and_stopped_early(tiny, epochs, patience, ran, stopped):
    s = train(tiny, _cfg(epochs=epochs, patience=patience), run=Scripted())
    assert (s["best_epoch"], s["best_valid_acc"], s["test_acc"]) == (2, 0.7, 0.3)
    assert (s["epochs"], s["stopped_early"]) == (ran, stopped)
    assert [h["best_valid_acc"] for h in s["history"]] == [0.5, 0.5] + [0.7] * (ran - 2)


def test_mid_epoch_checkpoints_stop_before_the_epochs_last_batch(tiny, tmp_path):
    """``checkpoint_every`` writes within an epoch only: a multiple of it that is the epoch's
    last batch is the epoch-end checkpoint's position, written once, as ``(epoch + 1, 0)``."""
    s = train(tiny, _cfg(epochs=1, batch_size=5, checkpoint_dir=str(tmp_path / "c"),
                         checkpoint_every=3))  # fmt: skip
    assert s["history"][0]["batches"] == 3  # 15 training seeds
    assert [(e, b) for e, b, _ in checkpoint_files(tmp_path / "c")] == [(1, 0)]


def test_a_run_that_stopped_early_stays_stopped_when_resumed(tiny, tmp_path):
    """The epoch-end checkpoint of the epoch that triggered early stopping says so: resumed with
    more ``--epochs``, the run trains no further and reports the same record (best epoch,
    ``stopped_early``)."""
    ck = str(tmp_path / "c")
    first = train(tiny, _cfg(epochs=8, patience=2, checkpoint_dir=ck), run=Scripted())
    assert (first["epochs"], first["stopped_early"]) == (5, True)
    again = train(tiny, _cfg(epochs=8, patience=2, resume=ck), run=Scripted())
    more = train(tiny, _cfg(epochs=20, patience=2, resume=ck), run=Scripted())
    for s in (again, more):
        assert (s["epochs"], s["stopped_early"], s["best_epoch"], s["test_acc"]) == (
            5,
            True,
            2,
            0.3,
        )
        assert s["loss_history"] == first["loss_history"]


def test_resumed_best_epoch_and_patience_continue_the_record(tiny, tmp_path):
    """Resumed after epoch 3 (best epoch 2, valid 0.7), the run keeps that best: epoch 3's tie and
    epoch 4's lower accuracy do not improve on it, and it stops after epoch 4 as the
    uninterrupted run does."""
    ck = str(tmp_path / "c")
    train(tiny, _cfg(epochs=4, patience=2, checkpoint_dir=ck), run=Scripted())
    whole = train(tiny, _cfg(epochs=8, patience=2), run=Scripted())
    s = train(tiny, _cfg(epochs=8, patience=2, resume=ck), run=Scripted())
    keys = ("epochs", "stopped_early", "best_epoch", "best_valid_acc", "test_acc")
    assert [s[k] for k in keys] == [whole[k] for k in keys] == [5, True, 2, 0.7, 0.3]


@pytest.mark.parametrize("fraction,empty", [(0.0, "gpu"), (1.0, "host")])
def test_every_tier_of_the_store_is_in_each_epochs_record(tiny, fraction, empty):
    """A tier that served no row in an epoch is still listed, with 0 rows and bytes."""
    s = train(tiny, _cfg(epochs=1, gpu_cache_fraction=fraction))
    for key in ("bytes_by_tier", "rows_by_tier"):
        tiers = s["history"][0][key]
        assert set(tiers) == {"gpu", "host"} and tiers[empty] == 0 and sum(tiers.values()) > 0
        assert s[key] == tiers


def test_the_epochs_loss_and_accuracy_are_over_its_labelled_seeds(tmp_path):
    """A train split may hold unlabelled nodes (label -1): the epoch's ``loss`` is the mean over
    the labelled seeds (each batch's mean weighted by its labelled count) and ``train_acc`` their
    share predicted right; unlabelled seeds were counted in both denominators before, which
    pulled the accuracy down by their share. ``seeds`` still counts every seed."""
    import numpy as np
    import torch

    import gnnio
    from gnnio.graph import DatasetWriter, edges_to_csr
    from gnnio.train.build import build_training, train_step
    from gnnio.train.loop import _train_epoch

    rng = np.random.default_rng(3)
    n = 48
    indptr, indices = edges_to_csr(rng.integers(0, n, 200), rng.integers(0, n, 200), n)
    labels = rng.integers(0, 3, n).astype(np.int64)
    labels[: n // 2 : 2] = -1  # every other node of the first half unlabelled
    path = tmp_path / "half"
    with DatasetWriter(path, name="half") as w:
        w.save_array("indptr", indptr)
        w.save_array("indices", indices)
        w.save_array("features", rng.standard_normal((n, 4)).astype(np.float32))
        w.save_array("labels", labels)
        w.save_array("train_idx", np.arange(0, n // 2, dtype=np.int64))
        w.save_array("valid_idx", np.arange(n // 2, 3 * n // 4, dtype=np.int64))
        w.save_array("test_idx", np.arange(3 * n // 4, n, dtype=np.int64))
        w.meta["num_classes"] = 3
    cfg = _cfg(epochs=1, batch_size=5)
    parts = build_training(gnnio.load(path), cfg, LocalRun(), torch.device("cpu"))
    seen = []

    def recording(net, opt, batch, timer=None):
        logits, loss = train_step(net, opt, batch, timer)
        y = batch.labels
        seen.append((float(loss), int((y >= 0).sum()), int((logits.argmax(1) == y).sum())))
        return logits, loss

    rec = _train_epoch(parts.net, parts.opt, parts.train_loader, parts.store, 0, cfg,
                       torch.device("cpu"), step=recording)  # fmt: skip
    lab = sum(k for _, k, _ in seen)
    assert rec["seeds"] == n // 2 and 0 < lab < n // 2
    assert rec["loss"] == pytest.approx(sum(v * k for v, k, _ in seen) / lab, rel=1e-12)
    assert rec["train_acc"] == sum(c for _, _, c in seen) / lab


@pytest.mark.parametrize("labelled", [None, 5])
def test_a_resumed_epoch_keeps_its_checkpoints_denominator(tiny, labelled):
    """A mid-epoch checkpoint carries the labelled seeds counted so far; one written before that
    count existed resumes with its old denominator, all the seeds seen (as its sums were)."""
    import torch

    import gnnio
    from gnnio.train.build import build_training
    from gnnio.train.loop import _train_epoch

    cfg = _cfg(epochs=1)
    parts = build_training(gnnio.load(tiny), cfg, LocalRun(), torch.device("cpu"))
    nb = parts.train_loader.order.num_batches
    partial = {"loss_sum": 10.0, "correct": 3, "seen": 8, "wait": 0.0, "counted": None}
    if labelled is not None:
        partial["labelled"] = labelled
    rec = _train_epoch(parts.net, parts.opt, parts.train_loader, parts.store, 0, cfg,
                       torch.device("cpu"), start=nb, partial=partial)  # fmt: skip
    den = 8 if labelled is None else labelled
    assert rec["batches"] == nb and rec["seeds"] == 8
    assert rec["loss"] == 10.0 / den and rec["train_acc"] == 3 / den
