"""Hostile input to ``--resume`` and the checkpoint directory (issue 27, item 4): a checkpoint's
contents, not its name, give the position; tampered, foreign, too-far and non-regular files end
with one ``gnnio: error:`` line; temporaries of killed writers are removed."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from gnnio.cli.main import main
from gnnio.train.checkpoint import checkpoint_files
from tests.helpers import write_tiny_dataset
from tests.test_bad_input_prepare import dead_pid, one_line_error
from tests.test_hostile_input import _fsize_limit, assert_one_line, gnnio_proc

TRAIN = ["--batch-size", "16", "--hidden", "8", "--quiet"]


@pytest.fixture(scope="module")
def run2(tmp_path_factory):
    """A tiny dataset and the checkpoint directory of a finished 2-epoch run on it."""
    root = tmp_path_factory.mktemp("resume")
    ds = write_tiny_dataset(root / "tiny", num_nodes=60, num_edges=300)
    assert (
        main(["train", str(ds), *TRAIN, "--epochs", "2", "--checkpoint-dir", str(root / "c")]) == 0
    )
    return ds, root / "c"


def _copy(run2, tmp_path):
    ds, c = run2
    shutil.copytree(c, tmp_path / "c")
    (tmp_path / "c" / "lock").unlink(missing_ok=True)
    return ds, tmp_path / "c"


def _resume(ds, c, epochs=2, *extra):
    return main(["train", str(ds), *TRAIN, "--epochs", str(epochs), "--resume", str(c), *extra])


def test_name_is_not_the_position(run2, tmp_path, capsys):
    """A checkpoint copied to a later name resumed as finished (rc 0, a worse model) before."""
    ds, c = _copy(run2, tmp_path)
    *_, newest = checkpoint_files(c)[-1]
    shutil.copy(newest, c / "ckpt-e999999-b000000000.pt")
    assert _resume(ds, c, 3) == 2
    one_line_error(capsys, "ckpt-e999999-b000000000.pt", "holds epoch 2 batch 0",
                   "name says epoch 999999")  # fmt: skip


def test_checkpoint_past_epochs_refused(run2, tmp_path, capsys):
    """A checkpoint of a longer run (same options) under a later name ran 4 epochs of
    ``--epochs 3``: the position must lie within ``--epochs``."""
    ds, c = _copy(run2, tmp_path)
    other = tmp_path / "other"
    assert main(["train", str(ds), *TRAIN, "--epochs", "4", "--checkpoint-dir", str(other)]) == 0
    shutil.rmtree(c)
    c.mkdir()
    *_, p4 = checkpoint_files(other)[-1]
    (c / p4.name).symlink_to(p4)
    assert _resume(ds, c, 3) == 2
    one_line_error(capsys, "ckpt-e000004-b000000000.pt", "at epoch 4, past --epochs 3")
    assert _resume(ds, c, 4) == 0  # the same run's fingerprint: it continues exactly
    capsys.readouterr()


def _tamper(path, edit):
    raw = torch.load(path, weights_only=True)
    edit(raw)
    torch.save(raw, path)


def _first_param(raw):
    k = next(iter(raw["model"]))
    raw["model"][k] = torch.zeros(3, 3)


@pytest.mark.parametrize(
    "edit, words",
    [
        (_first_param, ["not a valid checkpoint", "RuntimeError", "size mismatch"]),
        (lambda r: r["model"].pop(next(iter(r["model"]))), ["RuntimeError", "Missing key"]),
        (lambda r: r.pop("rng"), ["no 'rng'"]),
        (lambda r: r.__setitem__("history", "[1, 2"), ["malformed JSON"]),
        (lambda r: r.__setitem__("history", "[]"), ["history of 0 epochs at epoch 2"]),
        (lambda r: r.__setitem__("history", json.dumps([1, 2])), ["history record 0"]),
        (lambda r: r.__setitem__("epoch", "2"), ["'epoch' is a str"]),
        (lambda r: r["rng"].pop("numpy"), ["KeyError", "numpy"]),
        (lambda r: r["optimizer"].__setitem__("state", 5), ["not a valid checkpoint"]),
        (lambda r: r.__setitem__("partial", "{}"), ["epoch 2 batch 0 and its partial sums"]),
        (
            lambda r: r.__setitem__("history", json.dumps([{"epoch": 1}, {"epoch": 0}])),
            ["history record 0 is not epoch 0's"],
        ),  # fmt: skip
        (
            lambda r: r.__setitem__("history", json.dumps([{"epoch": i} for i in range(3)])),
            ["a history of 3 epochs at epoch 2"],
        ),  # fmt: skip
        (lambda r: r.__setitem__("best_epoch", True), ["'best_epoch' is a bool"]),
        (lambda r: r["model"].__setitem__(next(iter(r["model"])), 5), ["not a tensor"]),
        (lambda r: r["binding"].pop("options"), ["incomplete binding"]),
    ],
)
def test_tampered_checkpoint_is_one_line(run2, tmp_path, capsys, edit, words):
    ds, c = _copy(run2, tmp_path)
    *_, newest = checkpoint_files(c)[-1]
    _tamper(newest, edit)
    assert _resume(ds, c, 3) == 2
    one_line_error(capsys, "--resume", newest.name, *words)


def test_fifo_under_a_checkpoint_name_does_not_hang(run2, tmp_path):
    ds, c = _copy(run2, tmp_path)
    os.mkfifo(c / "ckpt-e000009-b000000000.pt")
    proc = gnnio_proc("train", str(ds), *TRAIN, "--epochs", "3", "--resume", str(c), timeout=90)
    assert_one_line(proc, "ckpt-e000009-b000000000.pt", "not a regular file")


def test_checkpoint_temporaries_of_killed_writers_removed(run2, tmp_path):
    ds, c = _copy(run2, tmp_path)
    stale = c / f".ckpt-e000003-b000000000.pt.tmp-{dead_pid()}-0a1b2c3d"
    live = c / f".ckpt-e000003-b000000000.pt.tmp-{os.getpid()}-0a1b2c3d"
    stale.write_bytes(b"cut")
    live.write_bytes(b"being written")
    assert _resume(ds, c, 3) == 0
    assert not stale.exists() and live.exists()


def test_file_size_limit_on_checkpoint_dir_is_one_line(run2, tmp_path):
    ds, _ = run2
    c = tmp_path / "c"
    proc = gnnio_proc("train", str(ds), *TRAIN, "--epochs", "1", "--checkpoint-dir", str(c),
                      preexec_fn=_fsize_limit(16 << 10))  # fmt: skip
    assert_one_line(proc, "--checkpoint-dir", "cannot write it", "too large")
    assert sorted(p.name for p in c.iterdir()) == ["lock"]


def test_mid_epoch_checkpoint_of_the_last_epoch_needs_one_more(run2, tmp_path, capsys):
    """A checkpoint inside epoch ``E`` (batch > 0) lies past ``--epochs E``: the run would
    report an epoch more than asked for; ``--epochs E + 1`` is what to give."""
    ds, c = _copy(run2, tmp_path)
    *_, newest = checkpoint_files(c)[-1]  # epoch 2, batch 0
    raw = torch.load(newest, weights_only=True)
    raw["batch"] = 1
    raw["partial"] = json.dumps({"loss_sum": 0.0, "correct": 0, "seen": 16, "wait": 0.0,
                                 "counted": None, "store_mark": None})  # fmt: skip
    torch.save(raw, c / "ckpt-e000002-b000000001.pt")
    assert _resume(ds, c, 2) == 2
    one_line_error(capsys, "ckpt-e000002-b000000001.pt", "past --epochs 2", "--epochs 3")


def test_checkpoint_dir_spelled_otherwise_is_the_resumed_one(run2, tmp_path, capsys):
    """``--checkpoint-dir`` naming the ``--resume`` directory by another path (a trailing
    ``/.``) continues its checkpoints: not refused as another run's."""
    ds, c = _copy(run2, tmp_path)
    assert _resume(ds, c, 3, "--checkpoint-dir", f"{c}/.") == 0
    assert checkpoint_files(c)[-1][:2] == (3, 0)
    capsys.readouterr()
