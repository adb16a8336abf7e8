"""Input checks of ``gnnio plan`` and ``gnnio reorder`` that the other CLI tests leave out (found
by mutation testing): zero counts and an empty strategy list refused in one line, and
``reorder --iterations`` reaching the score it names."""

from __future__ import annotations

import numpy as np
import pytest

from gnnio.cli import reorder as cli_reorder
from gnnio.cli.main import main
from gnnio.graph import DatasetWriter


@pytest.mark.parametrize(
    "extra,words",
    [
        (["--trace-epochs", "0"], "--trace-epochs: must be >= 1, got 0"),
        (["--batch-size", "0"], "--batch-size: must be >= 1, got 0"),
        (["--strategies", ","], "--strategies: unknown (none given)"),
    ],
)
def test_plan_refuses_zero_counts_and_no_strategy(tmp_path, capsys, extra, words):
    # refused before the dataset is opened: DIR need not exist
    assert main(["plan", str(tmp_path / "none"), "--topology", "2+2", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err


@pytest.mark.parametrize("by", ["rpr", "wrpr"])
def test_reorder_iterations_reach_the_score_named(tmp_path, monkeypatch, by):
    seen = {}

    def fake_reorder_path(path, by, **kw):
        seen.update(kw)
        return {"out": "x", "num_nodes": 0, "score_s": 0.0, "reorder_s": 0.0}

    monkeypatch.setattr(cli_reorder, "reorder_path", fake_reorder_path)
    argv = ["reorder", str(tmp_path), "--by", by, "--out", str(tmp_path / "o"), "--quiet"]
    assert main([*argv, "--iterations", "3", "--memory-budget", "none"]) == 0
    assert seen[f"{by}_iterations"] == 3
    assert ("rpr_iterations" if by == "wrpr" else "wrpr_iterations") not in seen


def test_prepare_refuses_a_zero_reorder_batch_size_before_importing(tmp_path, capsys):
    out = tmp_path / "ds"
    argv = ["prepare", "synthetic", "--num-nodes", "64", "--feat-dim", "4", "--out", str(out)]
    assert main([*argv, "--reorder", "presample", "--reorder-batch-size", "0", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--reorder-batch-size: must be >= 1, got 0" in err, err
    assert not out.exists() and not list(tmp_path.iterdir())


def test_prepare_refuses_an_unknown_reorder_score_before_importing(tmp_path, capsys):
    out = tmp_path / "ds"
    argv = ["prepare", "synthetic", "--num-nodes", "64", "--feat-dim", "4", "--out", str(out)]
    assert main([*argv, "--reorder", "pagerank", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--reorder: score 'pagerank' is unknown" in err, err
    assert not list(tmp_path.iterdir())


def test_info_verify_refuses_infinite_features(tmp_path, capsys):
    feats = np.ones((2, 1), np.float32)
    feats[1, 0] = np.inf  # no NaN: the infinity alone must fail the check
    with DatasetWriter(tmp_path / "d", name="d", allow_nonfinite=True) as w:
        w.save_array("indptr", np.zeros(3, np.int64))
        w.save_array("indices", np.zeros(0, np.int32))
        w.save_array("features", feats)
    assert main(["info", str(tmp_path / "d"), "--verify"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "0 NaN and 1 Inf values" in err, err
