"""Checkpoint and resume (issue 16): a run killed at any point and resumed from ``--resume C``
ends with the same parameters, losses, accuracies and bytes per tier as an uninterrupted run
(bit-identical on the CPU); what a checkpoint is bound to; same seed, same summary."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnio.errors import GnnioError, UsageError
from gnnio.graph import DatasetWriter, edges_to_csr
from gnnio.importers.synthetic import prepare_synthetic
from gnnio.train import TrainConfig, train
from gnnio.train.checkpoint import FORMAT_VERSION, CheckpointDir, checkpoint_files
from tests.helpers import final_params, results, same_params


@pytest.fixture(scope="module")
def easy(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "easy"
    prepare_synthetic(
        out, num_nodes=1200, avg_degree=8, feat_dim=16, num_classes=4, seed=0,
        split=(0.5, 0.2, 0.3), progress=False,
    )  # fmt: skip
    return out


def cfg(**kw) -> TrainConfig:
    base = dict(fanouts=(5, 5), batch_size=64, epochs=3, hidden=16, lr=0.01, progress=False)
    base.update(kw)
    return TrainConfig(**base)


@pytest.mark.parametrize("cache", ["none", "lru"])
def test_resume_at_epoch_end_equals_uninterrupted(easy, tmp_path, cache):
    full = train(easy, cfg(cache_policy=cache, checkpoint_dir=str(tmp_path / "a")))
    train(easy, cfg(cache_policy=cache, epochs=1, checkpoint_dir=str(tmp_path / "b")))
    resumed = train(easy, cfg(cache_policy=cache, resume=str(tmp_path / "b")))
    assert resumed["resumed_from"].endswith("ckpt-e000001-b000000000.pt")
    assert results(resumed) == results(full)
    assert len(resumed["loss_history"]) == 3
    assert same_params(final_params(tmp_path / "a"), final_params(tmp_path / "b"))
    # the newest two are kept, written atomically (no temporary left)
    names = sorted(p.name for p in (tmp_path / "b").iterdir())
    assert names == ["ckpt-e000002-b000000000.pt", "ckpt-e000003-b000000000.pt", "lock"]


def test_resume_mid_epoch_equals_uninterrupted(easy, tmp_path):
    full = train(easy, cfg(checkpoint_dir=str(tmp_path / "a")))
    train(easy, cfg(epochs=2, checkpoint_dir=str(tmp_path / "b"), checkpoint_every=4))
    files = checkpoint_files(tmp_path / "b")
    assert [(e, b) for e, b, _ in files] == [(1, 8), (2, 0)]  # 9 batches per epoch
    files[-1][2].unlink()  # as if killed between batch 8 and the end of epoch 1
    resumed = train(easy, cfg(resume=str(tmp_path / "b")))
    assert resumed["resumed_from"].endswith("ckpt-e000001-b000000008.pt")
    assert results(resumed) == results(full)
    assert same_params(final_params(tmp_path / "a"), final_params(tmp_path / "b"))


def test_resume_keeps_algorithm_2s_adaptive_state(easy, tmp_path):
    """``--locality-scale auto`` (modeled loading share, a fixed compute time so that s doubles
    every epoch: 1, 2, 4, 8) checkpointed after epoch 2 and resumed equals the uninterrupted run:
    s, the shares, losses, bytes and parameters. Without Algorithm 2's state (s, pre, fixed,
    history) the resumed run restarts at s = 1 or doubles from the wrong value."""
    kw = dict(gpu_cache_fraction=0.1, locality_scale="auto", locality_compute_s=1e-5, epochs=4)
    full = train(easy, cfg(**kw, checkpoint_dir=str(tmp_path / "a")))
    assert [h["locality_scale"] for h in full["history"]] == [1.0, 2.0, 4.0, 8.0]
    train(easy, cfg(**{**kw, "epochs": 2}, checkpoint_dir=str(tmp_path / "b")))
    resumed = train(easy, cfg(**kw, resume=str(tmp_path / "b")))
    assert resumed["resumed_from"].endswith("ckpt-e000002-b000000000.pt")
    assert results(resumed) == results(full)
    assert same_params(final_params(tmp_path / "a"), final_params(tmp_path / "b"))


def test_resume_finished_run_and_damaged_newest(easy, tmp_path):
    c = tmp_path / "c"
    full = train(easy, cfg(epochs=2, checkpoint_dir=str(c)))
    again = train(easy, cfg(epochs=2, resume=str(c)))  # nothing left to run
    assert results(again) == results(full)
    (c / "ckpt-e000009-b000000000.pt").write_bytes(b"PK\x03\x04 cut short")
    with pytest.warns(UserWarning, match="skipping"):
        more = train(easy, cfg(epochs=3, resume=str(c)))
    assert more["resumed_from"].endswith("ckpt-e000002-b000000000.pt")
    assert more["loss_history"][:2] == full["loss_history"]


def test_refusals_name_what_differs(easy, tmp_path):
    c = tmp_path / "c"
    train(easy, cfg(epochs=1, checkpoint_dir=str(c)))
    with pytest.raises(UsageError, match=r"model configuration \(--hidden 16 .* 32 now\)"):
        train(easy, cfg(hidden=32, resume=str(c)))
    with pytest.raises(UsageError, match=r"option that changes results differs \(--lr"):
        train(easy, cfg(lr=0.02, resume=str(c)))
    other = tmp_path / "other"
    prepare_synthetic(other, num_nodes=1200, avg_degree=8, feat_dim=16, num_classes=4, seed=1,
                      split=(0.5, 0.2, 0.3), progress=False)  # fmt: skip
    with pytest.raises(UsageError, match="another dataset"):
        train(other, cfg(resume=str(c)))
    *_, path = checkpoint_files(c)[-1]
    raw = torch.load(path, weights_only=True)
    raw["format_version"] = FORMAT_VERSION + 1
    torch.save(raw, path)
    with pytest.raises(UsageError, match=f"format version {FORMAT_VERSION + 1}, this gnnio"):
        train(easy, cfg(resume=str(c)))
    with pytest.raises(UsageError, match="no such checkpoint directory"):
        train(easy, cfg(resume=str(tmp_path / "missing")))
    cfg(checkpoint_dir=str(c)).validate(world_size=2)  # ranks checkpoint too (test_checkpoint_dist)
    from gnnio.train.checkpoint import load_resume

    with pytest.raises(UsageError, match="written by one process, this run has 2 ranks"):
        load_resume(c, None, cfg(), rank=0, world_size=2)
    with pytest.raises(UsageError, match="not with --cache-policy lru"):
        cfg(checkpoint_dir=str(c), checkpoint_every=2, cache_policy="lru").validate()
    claim = CheckpointDir(tmp_path / "busy")
    try:
        with pytest.raises(UsageError, match="in use by another running training run"):
            train(easy, cfg(checkpoint_dir=str(tmp_path / "busy")))
    finally:
        claim.close()


def test_same_seed_same_summary(easy):
    a = train(easy, cfg(seed=3, cache_policy="fifo"))
    b = train(easy, cfg(seed=3, cache_policy="fifo", threads=1))
    assert results(a) == results(b)
    assert train(easy, cfg(seed=4, epochs=1))["loss_history"][0] != a["loss_history"][0]


def test_non_finite_loss_stops_with_one_line(tmp_path):
    rng = np.random.default_rng(0)
    n = 60
    feats = rng.standard_normal((n, 4)).astype(np.float32)
    feats[7, 1] = np.nan
    indptr, indices = edges_to_csr(np.arange(n), (np.arange(n) + 1) % n, n)
    with DatasetWriter(tmp_path / "nan", name="nan", allow_nonfinite=True) as w:
        w.save_array("indptr", indptr)
        w.save_array("indices", indices)
        w.save_array("features", feats)
        w.save_array("labels", (np.arange(n) % 3).astype(np.int64))
        w.save_array("train_idx", np.arange(0, 40, dtype=np.int64))
        w.save_array("valid_idx", np.arange(40, 50, dtype=np.int64))
        w.save_array("test_idx", np.arange(50, 60, dtype=np.int64))
        w.meta["num_classes"] = 3
    best = tmp_path / "best.pt"
    with pytest.raises(
        GnnioError, match=r"^training stopped at epoch 0, batch \d+: the loss is nan"
    ):
        train(tmp_path / "nan", cfg(fanouts=(2,), batch_size=64, checkpoint=str(best)))
    assert not best.exists()


def test_sigkill_mid_epoch_then_resume_equals_uninterrupted(easy, tmp_path):
    from gnnio.cli.main import main

    args = ["train", str(easy), "--epochs", "4", "--seed", "5", "--fanouts", "5,5",
            "--batch-size", "32", "--hidden", "16", "--quiet"]  # fmt: skip
    assert main([*args, "--checkpoint-dir", str(tmp_path / "a"),
                 "--summary", str(tmp_path / "a.json")]) == 0  # fmt: skip
    c, killed_summary = tmp_path / "c", tmp_path / "killed.json"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gnnio", *args, "--checkpoint-dir", str(c),
         "--checkpoint-every", "5", "--summary", str(killed_summary)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not any(e >= 1 and b >= 5 for e, b, _ in checkpoint_files(c)):
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint written"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)  # in epoch 1 (after its batch 5), or just after
    finally:
        proc.kill()
        proc.wait()
    assert not killed_summary.exists()  # it did not finish
    assert main([*args, "--resume", str(c), "--summary", str(tmp_path / "r.json")]) == 0
    full = json.loads((tmp_path / "a.json").read_text())
    resumed = json.loads((tmp_path / "r.json").read_text())
    assert resumed["resumed_from"] is not None
    assert resumed["loss_history"] == full["loss_history"] and len(full["loss_history"]) == 4
    assert results(resumed) == results(full)
    assert same_params(final_params(tmp_path / "a"), final_params(c))


def test_fresh_run_refuses_a_directory_of_another_runs_checkpoints(easy, tmp_path, capsys):
    """A fresh run into a directory holding another run's checkpoints exited 0 and kept only the
    other run's (the newest two of both); now it is refused with one line and nothing changes."""
    from gnnio.cli.main import main

    args = ["train", str(easy), "--fanouts", "5,5", "--batch-size", "64", "--hidden", "16",
            "--quiet"]  # fmt: skip
    c = tmp_path / "ck"
    assert main([*args, "--epochs", "2", "--seed", "1", "--checkpoint-dir", str(c)]) == 0
    before = {p.name: p.stat().st_mtime_ns for p in c.iterdir()}
    capsys.readouterr()
    assert main([*args, "--epochs", "1", "--seed", "5", "--checkpoint-dir", str(c)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gnnio: error: --checkpoint-dir"), err
    assert str(c) in err and f"--resume {c}" in err and "ckpt-e000002-b000000000.pt" in err
    assert {p.name: p.stat().st_mtime_ns for p in c.iterdir()} == before
    # resuming into it (the same run, more epochs) continues it as before
    assert main([*args, "--epochs", "3", "--seed", "1", "--resume", str(c)]) == 0
    assert [(e, b) for e, b, _ in checkpoint_files(c)] == [(2, 0), (3, 0)]
    # a resumed run writing to another directory that holds checkpoints: refused as well
    d = tmp_path / "other"
    d.mkdir()
    (d / "ckpt-e000001-b000000000-r1of2.pt").write_bytes(b"")  # any rank's, any world size
    capsys.readouterr()
    assert main([*args, "--epochs", "3", "--seed", "1", "--resume", str(c),
                 "--checkpoint-dir", str(d)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--checkpoint-dir {d}: already holds" in err, err
    assert f"continue from them with --resume {d}" in err, err  # (a rerun after a crash)


def test_ranks_refuse_together_and_save_never_deletes_its_own(tmp_path):
    """Every rank refuses when any rank's directory holds checkpoints (no rank left waiting in
    a collective); a save keeps the checkpoint it wrote even below a later one."""
    from types import SimpleNamespace

    from gnnio.train.checkpoint import check_fresh_dir

    empty = tmp_path / "r0"
    empty.mkdir()
    other = SimpleNamespace(all_gather_object=lambda obj: [obj, ["ckpt-e000004-b000000000.pt"]])
    with pytest.raises(UsageError, match=r"already holds checkpoints of another run \(ckpt-e00"):
        check_fresh_dir(str(empty), None, other)
    check_fresh_dir(str(empty), str(empty), other)  # resumed from it: continues them
    (tmp_path / "link").symlink_to(empty)
    check_fresh_dir(f"{empty}/", str(tmp_path / "link"), other)  # (the same directory)
    ck = CheckpointDir(tmp_path / "c")
    try:
        for later in (8, 9):  # another run's, say: the old pruning deleted each new file
            (ck.path / f"ckpt-e{later:06d}-b000000000.pt").write_bytes(b"later")
        for epoch in (1, 2, 3):
            ck.save({"epoch": epoch, "batch": 0})
            assert (ck.path / f"ckpt-e{epoch:06d}-b000000000.pt").exists()
        assert [(e, b) for e, b, _ in checkpoint_files(ck.path)] == [(2, 0), (3, 0), (8, 0), (9, 0)]
    finally:
        ck.close()


@pytest.mark.parametrize(
    "key,value",
    [("model", "gcn"), ("fanouts", (5, 5, 5)), ("hidden", 32), ("heads", 2), ("dropout", 0.3),
     ("attn_dropout", 0.1), ("feature_norm", "row"), ("edge_weight_norm", "sum")],
)  # fmt: skip
def test_every_model_field_binds_the_checkpoint(key, value):
    """A checkpoint is refused by a run whose model differs in any shaping field (GAT's heads
    keep its weight's shape, ``att_src`` alone differs), naming the field; free fields (epochs)
    may differ."""
    from types import SimpleNamespace

    from gnnio.train.checkpoint import _TAG, binding, check_binding

    ds = SimpleNamespace(fingerprint="f", name="d")
    base = cfg(model="gat", sampler="labor")
    saved = {"format": _TAG, "format_version": FORMAT_VERSION, "binding": binding(ds, base, 1)}
    check_binding("C", saved, binding(ds, cfg(model="gat", sampler="labor", epochs=9), 1))
    other = cfg(**{"model": "gat", "sampler": "labor", key: value})
    name = "num-layers" if key == "fanouts" else key.replace("_", "-")
    with pytest.raises(UsageError, match=rf"another model configuration \(--{name} "):
        check_binding("C", saved, binding(ds, other, 1))


def test_a_store_that_runs_ahead_is_saved_at_the_last_trained_batchs_mark():
    """Mid-epoch, a store with ``mark`` (the sharded store reads ahead of training) is saved as
    it was at ``partial["store_mark"]``; one without it, as it is."""
    from types import SimpleNamespace

    from gnnio.train.checkpoint import make_state

    class Ahead:
        def mark(self):
            return 9

        def state_dict(self, upto=None):
            return {"upto": upto}

    class Plain:
        def state_dict(self):
            return {"plain": 1}

    ds = SimpleNamespace(fingerprint="f", name="d")
    net = torch.nn.Linear(2, 2)
    kw = dict(ds=ds, cfg=cfg(), world_size=1, epoch=0, batch=3, model=net,
              opt=torch.optim.SGD(net.parameters(), lr=0.1), stores=[Ahead(), Plain()],
              sampler=None, adaptive=None, best_valid=-1.0, best_epoch=-1, stopped=False,
              history=[])  # fmt: skip
    state = make_state(**kw, partial={"store_mark": 5})
    assert state["stores"] == [{"upto": 5}, {"plain": 1}]
    assert make_state(**kw)["stores"] == [{"upto": None}, {"plain": 1}]


def test_a_single_process_and_ranks_exclude_each_other(tmp_path):
    """One process claims ``C/lock``, a rank ``C/lock-r<rank>``: a ``gnnio train`` and a
    ``gnnio train --nproc 2`` into the same ``--checkpoint-dir`` at once both ran, writing
    checkpoints of two world sizes side by side. Now the second is refused whichever came first;
    the ranks of one run still share the directory."""
    c = tmp_path / "c"
    ranks = [CheckpointDir(c, rank=r, world_size=2) for r in (0, 1)]  # one run's ranks: fine
    with pytest.raises(UsageError, match="in use by another running training run"):
        CheckpointDir(c)
    with pytest.raises(UsageError, match="in use by another running training run"):
        CheckpointDir(c, rank=0, world_size=3)  # (another --nproc run: as before)
    for d in ranks:
        d.close()
    one = CheckpointDir(c)
    with pytest.raises(UsageError, match="in use by another running training run"):
        CheckpointDir(c, rank=1, world_size=2)
    one.close()
    CheckpointDir(c, rank=1, world_size=2).close()  # released: free again
