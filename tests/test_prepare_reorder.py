"""``gnnio prepare ... --reorder SCORE``: same arrays as prepare + ``gnnio reorder``, hottest first,
atomic on failure, one-line errors."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from gnnio.cli import prepare as cli_prepare
from gnnio.cli.main import build_parser, main
from gnnio.graph import load
from gnnio.graph.format import read_meta
from gnnio.importers import IMPORTERS
from gnnio.preprocess import reorder as reorder_mod
from gnnio.preprocess.hotness import SCORES, compute_score

CORA = Path("/work/shared/datasets/cora")

# tiny synthetic graph: every score (presample included) runs in well under a second
SYN = ["prepare", "synthetic", "--num-nodes", "3000", "--avg-degree", "6", "--feat-dim", "5",
       "--num-classes", "3", "--seed", "4"]  # fmt: skip


def assert_same_dataset(a: Path, b: Path) -> None:
    """Same arrays (names, dtypes, values) and the same metadata except the creation time."""
    ma, mb = read_meta(a), read_meta(b)
    assert sorted(ma["arrays"]) == sorted(mb["arrays"])
    for key in ma["arrays"]:
        x = np.load(a / ma["arrays"][key]["file"])
        y = np.load(b / mb["arrays"][key]["file"])
        assert x.dtype == y.dtype, key
        np.testing.assert_array_equal(x, y, err_msg=key)
        assert ma["arrays"][key]["sha256"] == mb["arrays"][key]["sha256"], key
    for key in set(ma) | set(mb):
        if key not in ("created", "arrays"):
            assert ma.get(key) == mb.get(key), key


def leftovers(parent: Path) -> list[str]:
    """Hidden temporary directories left in ``parent`` (prepare's and DatasetWriter's)."""
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("score", ["degree", "rpr", "wrpr", "sj", "sj_fanout", "presample"])
def test_equals_prepare_then_reorder(tmp_path, score):
    plain, two_step, one_step = tmp_path / "plain", tmp_path / "two", tmp_path / "one"
    assert main([*SYN, "--out", str(plain), "--quiet"]) == 0
    assert main(["reorder", str(plain), "--by", score, "--out", str(two_step), "--quiet"]) == 0
    assert main([*SYN, "--out", str(one_step), "--reorder", score, "--quiet"]) == 0
    assert_same_dataset(one_step, two_step)
    assert leftovers(tmp_path) == []

    ds0, ds = load(plain), load(one_step)
    assert ds.meta["reordered_by"] == score
    new2old, old2new = np.asarray(ds.extra["new2old"]), np.asarray(ds.extra["old2new"])
    np.testing.assert_array_equal(old2new[new2old], np.arange(ds.num_nodes))
    # hottest first: the score of the imported dataset is non-increasing in new id order
    s = compute_score(score, ds0, progress=False)
    assert (np.diff(s[new2old]) <= 0).all()
    # and the maps tie both datasets together: features, labels, splits, edges
    np.testing.assert_array_equal(np.asarray(ds.features), np.asarray(ds0.features)[new2old])
    np.testing.assert_array_equal(ds.labels, ds0.labels[new2old])
    np.testing.assert_array_equal(np.sort(new2old[ds.train_idx]), ds0.train_idx)
    s1, d1 = ds.graph.edges()
    s0, d0 = ds0.graph.edges()
    key = lambda s, d: np.sort(np.asarray(s, np.int64) * ds.num_nodes + d)  # noqa: E731
    np.testing.assert_array_equal(key(new2old[s1], new2old[d1]), key(s0, d0))


def test_degree_of_the_reordered_graph_is_non_increasing(tmp_path):
    out = tmp_path / "r"
    assert main([*SYN, "--out", str(out), "--reorder", "degree", "--quiet"]) == 0
    ds = load(out)
    deg = compute_score("degree", ds, progress=False)  # recomputed in the new id space
    assert deg[0] == deg.max() and (np.diff(deg) <= 0).all()


def test_planetoid_with_reorder(tmp_path):
    if not (CORA / "SOURCE.md").exists():
        pytest.skip(f"needs the Cora files in {CORA}")
    base = ["prepare", "planetoid", "--name", "cora", "--root", str(CORA)]
    assert main([*base, "--out", str(tmp_path / "plain"), "--quiet"]) == 0
    argv = ["reorder", str(tmp_path / "plain"), "--by", "wrpr", "--out", str(tmp_path / "two")]
    assert main([*argv, "--quiet"]) == 0
    assert main([*base, "--out", str(tmp_path / "one"), "--reorder", "wrpr", "--quiet"]) == 0
    assert_same_dataset(tmp_path / "one", tmp_path / "two")


def test_npy_with_reorder_keeps_the_folder_name(tmp_path):
    rng = np.random.default_rng(0)
    n = 50
    np.save(tmp_path / "x.npy", rng.standard_normal((n, 3)).astype(np.float32))
    np.save(tmp_path / "e.npy", rng.integers(0, n, (2, 300)))
    np.save(tmp_path / "t.npy", np.arange(0, n, 5))
    base = ["prepare", "npy", "--features", str(tmp_path / "x.npy"), "--edges",
            str(tmp_path / "e.npy"), "--train-idx", str(tmp_path / "t.npy"), "--quiet"]  # fmt: skip
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert main([*base, "--out", str(tmp_path / "a" / "mygraph")]) == 0
    plain = tmp_path / "a" / "mygraph"
    assert main(["reorder", str(plain), "--by", "wrpr", "--out", str(tmp_path / "b" / "mygraph"),
                 "--quiet"]) == 0  # fmt: skip
    one = tmp_path / "one" / "mygraph"
    assert main([*base, "--out", str(one), "--reorder", "wrpr"]) == 0
    assert load(one).name == "mygraph"  # npy names the dataset after its folder
    assert_same_dataset(one, tmp_path / "b" / "mygraph")


def _subparsers(parser) -> dict:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_every_importer_has_the_option():
    prepare = _subparsers(build_parser())["prepare"]
    for name, sp in _subparsers(prepare).items():
        opts = {o for a in sp._actions for o in a.option_strings}
        assert {"--reorder", "--reorder-fanouts", "--reorder-batch-size"} <= opts, name
    assert set(_subparsers(prepare)) == set(IMPORTERS)
    assert set(cli_prepare.REORDER_SCORES) == set(SCORES)


def test_bad_score_is_a_one_line_error(tmp_path, capsys):
    out = tmp_path / "r"
    assert main([*SYN, "--out", str(out), "--reorder", "hottest"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gnnio: error: --reorder: score 'hottest'")
    assert "wrpr" in err
    assert not out.exists() and leftovers(tmp_path) == []


def test_existing_out_needs_overwrite(tmp_path, capsys):
    out = tmp_path / "r"
    out.mkdir()
    assert main([*SYN, "--out", str(out), "--reorder", "degree", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already exists" in err
    assert list(out.iterdir()) == []
    assert main([*SYN, "--out", str(out), "--reorder", "degree", "--quiet", "--overwrite"]) == 0
    assert load(out).meta["reordered_by"] == "degree"


@pytest.mark.parametrize("budget", ["none", "default"])
def test_failure_while_reordering_leaves_nothing(tmp_path, monkeypatch, budget):
    """Both reorder paths: one pass in RAM (``--memory-budget none``) and the bounded one that
    ``prepare --reorder`` takes by default."""
    from gnnio.preprocess import reorder_bounded

    out = tmp_path / "r"
    opts = ["--memory-budget", "none"] if budget == "none" else []

    def boom(*a, **k):
        raise RuntimeError("disk full while relabelling")

    def break_it():
        monkeypatch.setattr(reorder_mod, "relabel_csr", boom)
        monkeypatch.setattr(reorder_bounded, "relabel_csr_bounded", boom)

    break_it()
    with pytest.raises(RuntimeError, match="disk full"):
        main([*SYN, "--out", str(out), "--reorder", "degree", "--quiet", *opts])
    assert not out.exists() and leftovers(tmp_path) == []

    # with --overwrite the old dataset survives a failed replacement untouched
    monkeypatch.undo()
    assert main([*SYN, "--out", str(out), "--quiet"]) == 0
    before = read_meta(out)
    break_it()
    with pytest.raises(RuntimeError, match="disk full"):
        main([*SYN, "--out", str(out), "--reorder", "degree", "--quiet", "--overwrite", *opts])
    assert read_meta(out) == before and "reordered_by" not in before
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_output_directories_follow_the_umask(tmp_path, mask):
    """Every output directory was drwx------ whatever the umask (its temporary directory was
    made 0700 and renamed into place), its files 0644: now the umask gives both, as for mkdir."""
    import os
    import stat

    syn, re_, part = tmp_path / "syn", tmp_path / "re", tmp_path / "part"
    small = ["prepare", "synthetic", "--num-nodes", "300", "--feat-dim", "4", "--quiet"]
    old = os.umask(mask)
    try:
        assert main([*small, "--out", str(syn)]) == 0
        assert main(["reorder", str(syn), "--by", "degree", "--out", str(re_), "--quiet"]) == 0
        assert main(["partition", str(syn), "--parts", "2", "--out", str(part), "--quiet"]) == 0
        assert main([*small, "--seed", "1", "--out", str(re_), "--overwrite"]) == 0  # replaced
    finally:
        os.umask(old)
    for d in (syn, re_, part, part / "part0"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o777 & ~mask, d
    assert stat.S_IMODE((syn / "meta.json").stat().st_mode) == 0o666 & ~mask
