"""Checkpoints of a distributed run (issue 16): every rank writes its own file at the same
positions; a run whose rank was SIGKILLed, resumed with the same world size, ends bit-identical
(CPU, gloo) to the uninterrupted run; the ranks agree on the newest position they all hold;
another world size is refused with one line.

Two-rank runs on a 1,200-node graph, each bounded by a timeout (a hang fails the test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gnnio.errors import UsageError
from gnnio.train import TrainConfig
from gnnio.train.checkpoint import checkpoint_files, load_resume
from tests.helpers import run_gnnio_in_process

ROOT = Path(__file__).resolve().parents[1]
#: per-epoch fields that are wall-clock measurements (they differ between any two runs)
TIMED = {"epoch_time_s", "seeds_per_s", "breakdown_s", "hidden_fraction", "eval_s", "rss_mb",
         "collective_s", "gradient_allreduce_s", "fetch_hidden_share"}  # fmt: skip
# the intra-machine reuse level: its group lists are part of what a resumed rank must restore
# (the default level's checkpoints: test_dist_comm.py, test_dist_options.py)
ARGS = ["--nproc", "2", "--epochs", "3", "--seed", "5", "--fanouts", "5,5", "--batch-size",
        "64", "--hidden", "16", "--reuse-level", "machine", "--quiet"]  # fmt: skip


def gnnio(*args, env=None, timeout=240):
    e = {k: v for k, v in os.environ.items() if k != "GNNIO_FAULT"}
    e.update(PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run([sys.executable, "-m", "gnnio", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=e, cwd=ROOT)  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from gnnio.importers.synthetic import prepare_synthetic

    out = tmp_path_factory.mktemp("data") / "tiny"
    prepare_synthetic(out, num_nodes=1200, avg_degree=8, feat_dim=16, num_classes=4, seed=0,
                      split=(0.5, 0.2, 0.3), progress=False)  # fmt: skip
    return out


@pytest.fixture(scope="module")
def full(tiny, tmp_path_factory):
    """The uninterrupted run: its summary and checkpoint directory."""
    d = tmp_path_factory.mktemp("full")
    r = gnnio("train", tiny, *ARGS, "--checkpoint-dir", d / "c", "--summary", d / "s.json")
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((d / "s.json").read_text()), d / "c"


def results(s: dict) -> dict:
    """Everything but wall-clock times: losses, accuracies, bytes per tier and link, per rank."""
    hist = [{k: v for k, v in h.items() if k not in TIMED} for h in s["history"]]
    keep = ("loss_history", "test_acc", "best_valid_acc", "best_epoch", "epochs", "bytes_by_tier",
            "rows_by_tier", "bytes_by_link", "feature_bytes_by_link", "gradient_bytes_by_link",
            "modeled_bytes_by_link", "params_identical")  # fmt: skip
    ranks = [{k: r[k] for k in ("feature_bytes_by_link", "control_bytes", "rows_by_tier")}
             for r in s["per_rank"]]  # fmt: skip
    return {"history": hist, "ranks": ranks, **{k: s[k] for k in keep}}


def final_params(ckdir: Path, rank: int) -> dict[str, torch.Tensor]:
    *_, path = checkpoint_files(ckdir, rank, 2)[-1]
    return torch.load(path, weights_only=True)["model"]


def same_params(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_every_rank_writes_its_own_files_newest_two(full):
    s, c = full
    assert s["world_size"] == 2 and len(s["loss_history"]) == 3
    names = sorted(p.name for p in c.iterdir())
    assert names == ["ckpt-e000002-b000000000-r0of2.pt", "ckpt-e000002-b000000000-r1of2.pt",
                     "ckpt-e000003-b000000000-r0of2.pt", "ckpt-e000003-b000000000-r1of2.pt",
                     "lock", "lock-r0", "lock-r1"]  # fmt: skip
    assert same_params(final_params(c, 0), final_params(c, 1))  # DDP: one model


def test_a_sigkilled_rank_then_resume_equals_uninterrupted(tiny, full, tmp_path):
    s_full, c_full = full
    c, out = tmp_path / "c", tmp_path / "s.json"
    # rank 1 SIGKILLs itself at its 14th feature gather (epoch 2, mid-epoch): the launcher
    # stops rank 0 and the run ends with one line; checkpoints every batch before that
    r = gnnio("train", tiny, *ARGS, "--checkpoint-dir", c, "--checkpoint-every", "1",
              "--summary", out, env={"GNNIO_FAULT": "1:13:kill"})  # fmt: skip
    assert r.returncode != 0 and not out.exists()
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("gnnio:")]
    assert len(lines) == 1 and "rank 1" in lines[0] and "SIGKILL" in lines[0], r.stderr[-2000:]
    assert checkpoint_files(c, 0, 2) and checkpoint_files(c, 1, 2)
    r = gnnio("train", tiny, *ARGS, "--resume", c, "--summary", out)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(out.read_text())
    assert s["resumed_from"] is not None and "-r0of2.pt" in s["resumed_from"]
    assert s["loss_history"] == s_full["loss_history"]
    assert results(s) == results(s_full)
    for rank in (0, 1):
        assert same_params(final_params(c, rank), final_params(c_full, rank))


def test_ranks_resume_from_the_newest_position_all_hold(tiny, full, tmp_path):
    """A run that checkpoints every batch, with rank 0's newest file gone (killed before it
    was written): both ranks continue mid-epoch from the position before, exactly."""
    s_full, c_full = full
    c, out = tmp_path / "c", tmp_path / "s.json"
    r = gnnio("train", tiny, *ARGS, "--checkpoint-dir", c, "--checkpoint-every", "1",
              "--summary", out)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert results(json.loads(out.read_text())) == results(s_full)  # checkpoints change nothing
    assert [(e, b) for e, b, _ in checkpoint_files(c, 1, 2)] == [(2, 4), (3, 0)]
    (c / "ckpt-e000003-b000000000-r0of2.pt").unlink()
    r = gnnio("train", tiny, *ARGS, "--resume", c, "--summary", out)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(out.read_text())
    assert s["resumed_from"].endswith("ckpt-e000002-b000000004-r0of2.pt")
    assert results(s) == results(s_full)
    for rank in (0, 1):
        assert same_params(final_params(c, rank), final_params(c_full, rank))


def test_another_world_size_is_refused_with_one_line(tiny, full, monkeypatch):
    """(in this process: refused before any rank starts)"""
    ran = run_gnnio_in_process(monkeypatch)
    _, c = full
    for nproc in ("1", "3"):
        args = [a if a != "2" else nproc for a in ARGS]  # --nproc 2 -> nproc
        if nproc == "1":  # (one process: --reuse-level is refused first, as a rank option)
            args = [a for a in args if a not in ("--reuse-level", "machine")]
        r = gnnio("train", tiny, *args, "--resume", c, timeout=120)
        assert r.returncode == 2
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1, r.stderr[-2000:]
        assert "written by 2 ranks" in lines[0] and "resume with --nproc 2" in lines[0]
    assert len(ran) == 2


def test_fresh_run_into_another_runs_checkpoints_is_refused_with_one_line(tiny, full, monkeypatch):
    """(in this process: refused before any rank starts)"""
    ran = run_gnnio_in_process(monkeypatch)
    _, c = full
    before = sorted(p.name for p in c.iterdir())
    r = gnnio("train", tiny, *ARGS, "--seed", "6", "--checkpoint-dir", c, timeout=120)
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr[-2000:]
    assert f"--checkpoint-dir {c}: already holds checkpoints" in lines[0]
    assert f"--resume {c}" in lines[0]
    assert sorted(p.name for p in c.iterdir()) == before and len(ran) == 1


def test_bad_checkpoint_dir_or_changed_option_is_refused_before_any_rank_starts(
    tiny, full, tmp_path, monkeypatch
):
    """``--nproc``: a ``--checkpoint-dir`` that is a file or lies under one, and a ``--resume``
    with an option that changes results, are one line from the launcher. Each rank had found
    them after its start-up (seconds), as ``rank 0 (pid N) failed: UsageError: ...``."""
    from gnnio.distributed import launch as launcher

    ran = run_gnnio_in_process(monkeypatch)
    started: list = []
    monkeypatch.setattr(launcher, "launch", lambda *a, **k: started.append(a))
    _, c = full
    f = tmp_path / "a-file"
    f.write_text("")
    cases = [
        (["--checkpoint-dir", f], f"--checkpoint-dir {f}: exists and is not a directory"),
        (["--checkpoint-dir", f / "sub"], f"--checkpoint-dir {f / 'sub'}: cannot create it"),
        (["--resume", c, "--lr", "0.5"], f"--resume {c}: an option that changes results differs"),
    ]
    for extra, want in cases:
        r = gnnio("train", tiny, *ARGS, *extra, timeout=120)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1, (extra, r.stderr[-2000:])
        assert lines[0].startswith(f"gnnio: error: {want}"), lines[0]
    assert started == [] and len(ran) == len(cases)
    assert not (f.parent / "sub").exists()


def test_a_checkpoint_dir_in_use_is_refused_before_any_rank_starts(tiny, tmp_path, monkeypatch):
    """``--nproc``: a ``--checkpoint-dir`` (or ``--resume`` dir) that a running run holds, one
    process or the ranks of another ``--nproc`` run, is one line from the launcher; each rank
    had found it after its start-up, as ``rank 0 (pid N) failed: UsageError: ...``."""
    from gnnio.distributed import launch as launcher
    from gnnio.train.checkpoint import CheckpointDir

    ran = run_gnnio_in_process(monkeypatch)
    started: list = []
    monkeypatch.setattr(launcher, "launch", lambda *a, **k: started.append(a))
    for held in ({}, {"rank": 0, "world_size": 2}):
        c = tmp_path / f"c{len(held)}"
        claim = CheckpointDir(c, **held)  # the running run
        r = gnnio("train", tiny, *ARGS, "--checkpoint-dir", c, timeout=120)
        claim.close()
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1, (held, r.stderr[-2000:])
        assert (
            lines[0]
            == f"gnnio: error: --checkpoint-dir {c}: in use by another running training run"
        )
    assert started == [] and len(ran) == 2
    r = gnnio("train", tiny, *ARGS, "--checkpoint-dir", c, timeout=120)  # released: it starts
    assert r.returncode == 0 and len(started) == 1, r.stderr[-2000:]


class FakeRanks:
    """``all_gather_object`` across simulated ranks: each rank's first call records its
    answer; a rank's call returns what every rank recorded for that step (ranks run in turn)."""

    def __init__(self, answers: list[list]) -> None:
        self.answers = answers

    def run(self, rank: int):
        calls = iter(self.answers)
        return SimpleNamespace(rank=rank, world_size=2, all_gather_object=lambda obj: next(calls))


def test_load_resume_agrees_on_a_position_every_rank_can_read(tiny, full, tmp_path, monkeypatch):
    import shutil

    from gnnio.train import checkpoint

    monkeypatch.setattr(checkpoint, "check_binding", lambda *a: None)  # tested in one process
    _, c_full = full
    c = tmp_path / "c"
    shutil.copytree(c_full, c)
    cfg = TrainConfig(fanouts=(5, 5), batch_size=64, epochs=3, hidden=16, seed=5, nproc=2,
                      progress=False)  # fmt: skip
    from gnnio.graph.dataset import load

    ds = load(tiny)
    # rank 0 lost its newest file: both take epoch 2 (the newest position both hold)
    (c / "ckpt-e000003-b000000000-r0of2.pt").unlink()
    held = [[(2, 0)], [(2, 0), (3, 0)]]
    ranks = FakeRanks([held, [True, True]])
    got = load_resume(c, ds, cfg, 1, 2, run=ranks.run(1))
    assert (got.epoch, got.batch) == (2, 0) and got.path.name.endswith("-r1of2.pt")
    # rank 1's file of that position is damaged: no position left that both can read
    (c / "ckpt-e000002-b000000000-r1of2.pt").write_bytes(b"cut short")
    ranks = FakeRanks([held, [True, False]])
    with pytest.raises(UsageError, match="no checkpoint position that all 2 ranks hold"):
        load_resume(c, ds, cfg, 0, 2, run=ranks.run(0))
