"""Importer rules found untested by a mutation-testing pass: edge direction of a ``[2, E]``
edge list, float labels below zero, complex features, OGB label count,
Facebook edge symmetrization."""

from __future__ import annotations

import numpy as np
import pytest

import gnnio
from gnnio.errors import DatasetError
from gnnio.importers._common import labels_to_int64, load_npy
from gnnio.importers.facebook import prepare_facebook
from gnnio.importers.npy import prepare_npy
from gnnio.importers.ogb import prepare_ogb

from .test_import_checks import write_facebook
from .test_importers import write_gz, write_tiny_ogb


def test_npy_two_by_e_edges_give_in_neighbour_rows(tmp_path):
    """A ``[2, E]`` edge list is rows src/dst: edge ``u -> v`` puts ``u`` in row ``v``."""
    edges = np.array([[0, 0, 1], [1, 2, 2]])  # 0->1, 0->2, 1->2 (one-way)
    out = prepare_npy(np.zeros((3, 1), np.float32), tmp_path / "o", edges=edges, progress=False)
    g = gnnio.load(out).graph
    assert g.indptr.tolist() == [0, 0, 1, 3]
    assert g.indices.tolist() == [0, 0, 1]


def test_npy_e_by_two_edges_give_in_neighbour_rows(tmp_path):
    """An ``[E, 2]`` edge list is columns src/dst: edge ``u -> v`` puts ``u`` in row ``v``."""
    edges = np.array([[0, 1], [0, 2], [1, 2]])
    out = prepare_npy(np.zeros((3, 1), np.float32), tmp_path / "o", edges=edges, progress=False)
    g = gnnio.load(out).graph
    assert g.indptr.tolist() == [0, 0, 1, 3]
    assert g.indices.tolist() == [0, 0, 1]


@pytest.mark.parametrize("bad", [-1.0, -2.0])
def test_negative_float_labels_are_refused(bad):
    """Float labels must be non-negative whole numbers or NaN: -1.0 or -2.0 is an error."""
    with pytest.raises(DatasetError, match="non-negative whole numbers"):
        labels_to_int64(np.array([0.0, bad, np.nan]), "--labels x.npy")


def test_npy_complex_features_are_refused(tmp_path):
    """Complex features would lose their imaginary part in the float32 copy: an error instead."""
    feats = np.zeros((2, 1), np.complex64)
    with pytest.raises(DatasetError, match="expected numeric features, got complex64"):
        prepare_npy(feats, tmp_path / "o", edges=np.array([[0], [1]]), progress=False)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("rows", [6, 8])
def test_ogb_label_count_must_match_the_node_count(tmp_path, rows):
    """node-label.csv with fewer or more rows than num-node-list (7) names the file, writes nothing."""
    folder = write_tiny_ogb(tmp_path / "ogbn_tiny")
    write_gz(folder / "raw" / "node-label.csv.gz", "1\n" * rows)
    with pytest.raises(DatasetError, match=rf"node-label\.csv\.gz: {rows} labels for 7 nodes"):
        prepare_ogb(folder, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_facebook_edges_are_symmetrized_without_self_loops(tmp_path):
    """Facebook's undirected edge rows become both directions, and a self-loop row is dropped."""
    root = write_facebook(tmp_path / "fb", [0, 1, 2], ["company", "tvshow", "company"])
    (root / "facebook_edges.csv").write_text("id_1,id_2\n0,1\n1,2\n2,2\n")
    g = gnnio.load(prepare_facebook(root, tmp_path / "o", split=(1.0, 0.0), progress=False)).graph
    assert g.indptr.tolist() == [0, 1, 3, 4]
    assert g.indices.tolist() == [1, 0, 2, 1]


def test_a_directory_given_as_an_input_file_says_so(tmp_path):
    """A folder passed as ``--features`` is "not a regular file", not an unreadable .npy."""
    with pytest.raises(DatasetError, match=r"^--features .*: not a regular file$"):
        load_npy(tmp_path, "--features")


def test_facebook_edge_to_node_n_is_out_of_range(tmp_path):
    """An edge naming node id N (one past the last target row) is refused, naming the edge file."""
    root = write_facebook(tmp_path / "fb", [0, 1, 2], ["company", "tvshow", "company"])
    (root / "facebook_edges.csv").write_text("id_1,id_2\n0,1\n1,3\n")
    with pytest.raises(DatasetError, match=r"facebook_edges\.csv: node id 3 is out of range"):
        prepare_facebook(root, tmp_path / "o", progress=False)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("source", ["facebook", "npy"])
def test_prepare_into_an_existing_dataset_refuses_before_reading_any_input(
    source, tmp_path, monkeypatch, capsys
):
    """`gnnio prepare` without --overwrite into an existing dataset is one line before the
    importer reads anything (a multi-GB OGB import read its input first, then refused)."""
    from gnnio.cli.main import main
    from gnnio.importers import facebook, npy
    from tests.pyg_common import random_data

    out = tmp_path / "out"
    gnnio.from_pyg(random_data(), out, progress=False)
    read = []
    mod = facebook if source == "facebook" else npy
    name = "prepare_facebook" if source == "facebook" else "prepare_npy"
    monkeypatch.setattr(mod, name, lambda *a, **k: read.append(1))
    argv = (
        ["prepare", "facebook", "--root", str(tmp_path)]
        if source == "facebook"
        else [
            "prepare",
            "npy",
            "--indptr",
            "a.npy",
            "--indices",
            "b.npy",
            "--features",
            "c.npy",
            "--labels",
            "d.npy",
            "--train-idx",
            "e.npy",
            "--valid-idx",
            "f.npy",
            "--test-idx",
            "g.npy",
        ]  # fmt: skip
    )
    assert main([*argv, "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already exists" in err and read == []
