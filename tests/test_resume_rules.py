"""``--resume``'s smaller rules (mutation pass over ``gnnio/train/checkpoint.py`` and
``checkpoint_checks.py``): a directory with nothing to resume, checkpoints of another world size,
files under a checkpoint's name that are not gnnio checkpoints (or of another format version), a
name whose batch is not the file's, a stray backup copy: each is one ``gnnio: error:`` line that
says which, or, for the backup, no error at all."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import torch

from gnnio.cli.main import main
from gnnio.train.checkpoint import FORMAT_VERSION, checkpoint_files
from tests.helpers import write_tiny_dataset
from tests.test_bad_input_prepare import one_line_error

TRAIN = ["--batch-size", "16", "--hidden", "8", "--quiet"]


@pytest.fixture(scope="module")
def run2(tmp_path_factory):
    """A tiny dataset and the checkpoint directory of a finished 2-epoch run on it."""
    root = tmp_path_factory.mktemp("resume")
    ds = write_tiny_dataset(root / "tiny", num_nodes=60, num_edges=300)
    c = root / "c"
    assert main(["train", str(ds), *TRAIN, "--epochs", "2", "--checkpoint-dir", str(c)]) == 0
    return ds, c


@pytest.fixture
def copy(run2, tmp_path):
    """The dataset, a copy of the run's checkpoint directory and its newest file (epoch 2)."""
    ds, c = run2
    shutil.copytree(c, tmp_path / "c")
    (tmp_path / "c" / "lock").unlink(missing_ok=True)
    *_, newest = checkpoint_files(tmp_path / "c")[-1]
    return ds, tmp_path / "c", newest


def _resume(ds, c, epochs=3):
    return main(["train", str(ds), *TRAIN, "--epochs", str(epochs), "--resume", str(c)])


def test_a_directory_without_checkpoints_is_one_line(run2, tmp_path, capsys):
    ds, _ = run2
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not a checkpoint")
    assert _resume(ds, tmp_path / "empty") == 2
    one_line_error(capsys, "no complete checkpoint in it")


def test_only_damaged_checkpoints_is_no_complete_checkpoint(copy, capsys):
    """Every file skipped (damaged): one process is told there is no complete checkpoint, not
    of a position its ranks do not share."""
    ds, c, _ = copy
    for *_, p in checkpoint_files(c):
        p.write_bytes(b"PK\x03\x04 cut short")
    with pytest.warns(UserWarning, match="skipping"):
        assert _resume(ds, c) == 2
    err = one_line_error(capsys, "no complete checkpoint in it")
    assert "ranks" not in err


def test_ranks_checkpoints_resumed_by_one_process(run2, tmp_path, capsys):
    ds, _ = run2
    c = tmp_path / "c"
    c.mkdir()
    for r in (0, 1):
        (c / f"ckpt-e000001-b000000000-r{r}of2.pt").write_bytes(b"")
    assert _resume(ds, c) == 2
    one_line_error(capsys, "written by 2 ranks, this run has one process; resume with --nproc 2")


@pytest.mark.parametrize(
    "content",
    [[1, 2, 3], {"weight": torch.zeros(2)}],  # a list; a plain state_dict (no format tag)
)
def test_a_foreign_file_under_a_checkpoint_name(copy, capsys, content):
    ds, c, newest = copy
    torch.save(content, c / "ckpt-e000003-b000000000.pt")
    assert _resume(ds, c) == 2
    one_line_error(capsys, "ckpt-e000003-b000000000.pt is not a gnnio training checkpoint")


def _tamper(path, edit) -> None:
    raw = torch.load(path, weights_only=True)
    edit(raw)
    torch.save(raw, path)


def test_another_format_version_is_named_whatever_its_fields(copy, capsys):
    """A checkpoint of another layout version is refused for its version, also when its fields
    are not this version's (it is not checked as if it were this version's)."""
    ds, c, newest = copy

    def newer(raw):
        raw["format_version"] = FORMAT_VERSION + 1
        raw["random_states"] = raw.pop("rng")

    _tamper(newest, newer)
    assert _resume(ds, c) == 2
    one_line_error(capsys, f"format version {FORMAT_VERSION + 1}, this gnnio reads version")


def test_a_ranks_checkpoint_renamed_to_one_process_is_refused(copy, capsys):
    """The file's binding, not its name, says how many ranks wrote it."""
    ds, c, newest = copy
    _tamper(newest, lambda raw: raw["binding"].__setitem__("world_size", 2))
    assert _resume(ds, c) == 2
    one_line_error(capsys, "written by 2 rank(s), this run has 1")


def test_a_name_whose_batch_is_not_the_files_is_refused(copy, capsys):
    """Copied to a mid-epoch name, an epoch-end checkpoint would resume at batch 5 of epoch 2
    with no partial sums."""
    ds, c, newest = copy
    shutil.copy(newest, c / "ckpt-e000002-b000000005.pt")
    assert _resume(ds, c) == 2
    one_line_error(capsys, "ckpt-e000002-b000000005.pt", "holds epoch 2 batch 0",
                   "name says epoch 2 batch 5")  # fmt: skip


def test_a_malformed_adaptive_state_is_one_line(copy, capsys):
    ds, c, newest = copy
    _tamper(newest, lambda raw: raw.__setitem__("adaptive", json.dumps([1, 2])))
    assert _resume(ds, c) == 2
    one_line_error(capsys, newest.name, "malformed adaptive state")


def test_a_backup_copy_beside_the_checkpoints_is_not_one(copy, capsys):
    """``ckpt-...pt.bak`` (or ``.pt~``) is not a checkpoint's name: the run resumes from the
    newest checkpoint, not from the copy under a later position."""
    ds, c, newest = copy
    shutil.copy(newest, c / "ckpt-e000009-b000000000.pt.bak")
    shutil.copy(newest, c / "ckpt-e000009-b000000000.pt~")
    assert _resume(ds, c) == 0
    assert checkpoint_files(c)[-1][:2] == (3, 0)
    capsys.readouterr()


def test_ranks_resume_from_a_position_every_rank_holds(copy, monkeypatch):
    """Rank 0 holds epochs 1 and 2, rank 1 only epoch 1 (killed before it wrote epoch 2): rank 0
    resumes from epoch 1 as its peer must (alone at epoch 2 it would train on from another
    position than its peer)."""
    import gnnio
    from gnnio.train import TrainConfig, checkpoint
    from gnnio.train.checkpoint import load_resume

    monkeypatch.setattr(checkpoint, "check_binding", lambda *a: None)  # (a one-process run's)
    ds, c, _ = copy
    for e, b, p in checkpoint_files(c):
        p.rename(c / f"ckpt-e{e:06d}-b{b:09d}-r0of2.pt")
    held = [[(1, 0), (2, 0)], [(1, 0)]]
    run = SimpleNamespace(
        all_gather_object=lambda obj: held if isinstance(obj, list) else [True] * 2
    )
    cfg = TrainConfig(epochs=3, progress=False)
    got = load_resume(c, gnnio.load(ds), cfg, rank=0, world_size=2, run=run)
    assert (got.epoch, got.batch) == (1, 0) and got.path.name.endswith("-r0of2.pt")
