"""What a new user trips on, walking the README's commands with the obvious mistakes: each test
is one fault found that way, kept fixed (the one line names the problem and how to get past it)."""

from __future__ import annotations

import pytest

from gnnio.cli.main import main

from .test_bad_input_prepare import write_facebook


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("gnnio: error: ") and err.count("\n") == 1, err
    return err


def synthetic(tmp_path, split: list[str]) -> str:
    out = str(tmp_path / "ds")
    argv = ["prepare", "synthetic", "--num-nodes", "400", "--avg-degree", "4", "--feat-dim", "4"]
    assert main([*argv, "--num-classes", "2", "--split", *split, "--out", out, "--quiet"]) == 0
    return out


@pytest.mark.parametrize(
    "split,words",
    [
        (["0.5", "0.5", "0"], "has no test split; train needs one (prepare synthetic --split"),
        (["0.5", "0", "0.5"], "has no valid split; train needs one (prepare synthetic --split"),
    ],
)
def test_train_without_an_eval_split_names_the_importers_option(tmp_path, capsys, split, words):
    """A synthetic dataset prepared with an empty valid or test split: train's line names
    ``prepare synthetic --split`` (it named ``prepare npy --test-idx``, an option this
    dataset's importer does not have)."""
    ds = synthetic(tmp_path, split)
    capsys.readouterr()
    assert main(["train", ds, "--epochs", "1", "--quiet"]) == 2
    err = one_line(capsys)
    assert words in err and "npy" not in err, err


def test_train_without_a_test_split_facebook(tmp_path, capsys):
    """``prepare facebook --split 0.5,0.5`` leaves no test node: train says how to leave some."""
    root = write_facebook(tmp_path / "fb", [[0], [1], [0, 1], [1], [0], [1]])
    out = str(tmp_path / "ds")
    argv = ["prepare", "facebook", "--root", str(root), "--split", "0.5,0.5", "--out", out]
    assert main([*argv, "--quiet"]) == 0
    assert main(["train", out, "--epochs", "1", "--quiet"]) == 2
    err = one_line(capsys)
    assert "has no test split" in err and "prepare facebook --split TRAIN,VALID" in err, err


def test_nproc_refuses_an_empty_split_before_starting_ranks(tmp_path, capsys, monkeypatch):
    """``train --nproc 2`` on a dataset with no test split: refused by the launcher in the same
    line, before any rank starts (it started both and reported rank 0's failure)."""
    from gnnio.distributed import launch

    ds = synthetic(tmp_path, ["0.5", "0.5", "0"])
    capsys.readouterr()

    def no_launch(*a, **k):
        raise AssertionError("ranks started")

    monkeypatch.setattr(launch, "launch", no_launch)
    assert main(["train", ds, "--epochs", "1", "--nproc", "2", "--quiet"]) == 2
    err = one_line(capsys)
    assert "has no test split; train needs one (prepare synthetic --split" in err, err
