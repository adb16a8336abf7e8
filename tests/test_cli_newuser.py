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


KILLER = """
import os, signal, time

if os.environ.get("GNNIO_TEST_FLAG") and os.environ.get("GNNIO_TEST_CTRL_C") == "1":
    try:  # the first rank to import this module: Ctrl-C, to the run's whole process group
        os.close(os.open(os.environ["GNNIO_TEST_FLAG"], os.O_CREAT | os.O_EXCL))
        os.killpg(0, signal.SIGINT)
    except FileExistsError:
        pass
    time.sleep(3)  # still starting when the Ctrl-C comes (it ends the rank once it has started)


def entry(argv):
    return 0
"""

RUN = """
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import killer  # (imported here with the Ctrl-C off: the ranks import it with it on)
from gnnio.distributed.launch import launch

if __name__ == "__main__":  # (a spawned rank runs this file again, as __mp_main__)
    os.environ["GNNIO_TEST_CTRL_C"] = "1"
    try:
        launch(2, killer.entry, [], timeout_s=60)
    except KeyboardInterrupt:
        print("interrupted")
        sys.exit(130)
    sys.exit(0)
"""


def test_ctrl_c_while_the_ranks_start_prints_no_traceback(tmp_path):
    """Ctrl-C while the ``--nproc`` ranks still import torch (a spawned rank unpickles its
    entrypoint there, before any gnnio code runs in it): the launcher's one line, no rank's
    KeyboardInterrupt traceback (there was one per rank, ~40 lines each), no rank left running.
    Here the Ctrl-C is sent by the first rank from inside that import, to the whole group."""
    import os
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "killer.py").write_text(KILLER)
    (tmp_path / "run.py").write_text(RUN)
    flag = tmp_path / "sent"
    env = {**os.environ, "GNNIO_TEST_FLAG": str(flag)}
    p = subprocess.Popen([sys.executable, str(tmp_path / "run.py")], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)  # fmt: skip
    try:
        out, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        pytest.fail("the launcher did not stop within 120 s")
    assert flag.exists(), err[-2000:]  # the Ctrl-C was sent while a rank was starting
    assert p.returncode == 130 and out.strip() == "interrupted", (out, err[-2000:])
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    time.sleep(1)
    left = subprocess.run(["pgrep", "-f", "multiprocessing.spawn"], capture_output=True,
                          text=True).stdout.split()  # fmt: skip
    assert all(not _in_session(pid, p.pid) for pid in left), "ranks left running"


def _in_session(pid: str, sid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[4]) == sid
    except (OSError, IndexError, ValueError):
        return False


def test_features_of_zero_columns_are_refused_by_prepare(tmp_path, capsys):
    """``prepare npy --features`` of shape [N, 0] (a slicing slip) was written, and train then
    failed naming the model ("model dims must be >= 1, got in=0"); ``prepare synthetic
    --feat-dim 0`` was already refused. Now the input is named, before anything is written.
    (``from_pyg`` keeps taking an ``x`` of no columns: NeighborLoader converts a ``Data`` without
    ``x`` that way.)"""
    import numpy as np

    np.save(tmp_path / "x.npy", np.zeros((4, 0), np.float32))
    np.save(tmp_path / "e.npy", np.array([[0, 1, 2], [1, 2, 3]]))
    out = tmp_path / "ds"
    argv = ["prepare", "npy", "--edges", str(tmp_path / "e.npy"), "--features"]
    assert main([*argv, str(tmp_path / "x.npy"), "--out", str(out), "--quiet"]) == 2
    err = one_line(capsys)
    assert "x.npy: has 0 feature columns, shape [4, 0]" in err, err
    assert not out.exists()


def test_a_missing_placement_file_is_refused_before_the_features_are_read(tmp_path):
    """``gnnio train DS --placement MISSING``: refused by the options' check, not after the
    features were read into RAM (seconds on a large dataset)."""
    from gnnio.errors import UsageError
    from gnnio.train import TrainConfig

    for path in (tmp_path / "none.npz", tmp_path):
        with pytest.raises(UsageError, match=f"^{path}: placement file not found$"):
            TrainConfig(placement=str(path)).validate()


GLOO_PEER_GONE = (
    "Got the following error when running the callback: RuntimeError: [/__w/pytorch/pytorch/"
    "third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:63638. This is typically caused by a remote worker crashing. Check the logs of "
    "the remote worker before reporting an error. GLHF!\n\nAt:\n  gnnio/distributed/ddp.py(55): done"
)


def test_a_torchrun_rank_whose_peer_died_prints_one_line(tmp_path, capsys, monkeypatch):
    """``torchrun ... -m gnnio train`` (README, two machines), one node's rank killed with -9:
    the other rank printed a 40-line traceback through the training loop ending in gloo's
    ``Connection closed by peer``; it prints one line naming itself and what gloo said
    (torchrun's own report follows it). Another RuntimeError still raises."""
    import gnnio.cli.train

    ds = synthetic(tmp_path, ["0.5", "0.25", "0.25"])
    capsys.readouterr()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")

    def gone(dataset, cfg):
        raise RuntimeError(GLOO_PEER_GONE)

    monkeypatch.setattr(gnnio.cli.train, "train_rank", gone)
    assert main(["train", ds, "--epochs", "1", "--quiet"]) == 1
    err = one_line(capsys)
    assert "rank 1 of 2: another rank is gone" in err, err
    assert "(Connection closed by peer [127.0.0.1]:63638)" in err, err

    def bug(dataset, cfg):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setattr(gnnio.cli.train, "train_rank", bug)
    with pytest.raises(RuntimeError, match="shapes"):
        main(["train", ds, "--epochs", "1", "--quiet"])
