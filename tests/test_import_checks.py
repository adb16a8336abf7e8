"""Input checks of the importers that test_importers.py leaves out (found by mutation testing):
the bounds on sparse id spaces, CSV column counts, and the importers' split and label rules,
each against a value worked out by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest

import gnnio
from gnnio.errors import DatasetError, UsageError
from gnnio.importers._common import (
    DENSE_FLOOR,
    check_dense_ids,
    labels_to_int64,
    parse_csv_block,
)
from gnnio.importers.facebook import prepare_facebook
from gnnio.importers.npy import prepare_npy
from gnnio.importers.ogb import prepare_ogb
from gnnio.importers.planetoid import prepare_planetoid

from .test_importers import check_tiny_ogb, gap_layout, write_gz, write_planetoid, write_tiny_ogb


def test_labels_just_past_the_dense_floor_are_bounded():
    # largest label 1024 means 1025 classes > DENSE_FLOOR, with only 2 in use: refused
    assert DENSE_FLOOR == 1024
    with pytest.raises(DatasetError, match="label 1,024 implies 1,025 classes"):
        labels_to_int64(np.array([0, 1024]), "lab.npy")
    assert labels_to_int64(np.array([0, 1023]), "lab.npy").tolist() == [0, 1023]  # 1024 classes


def test_dense_ids_accept_up_to_twice_the_distinct_count():
    check_dense_ids(1199, 600, "f", "label", "classes")  # 1200 ids for 600 in use: accepted
    with pytest.raises(DatasetError, match="1,201 classes, but only 600 distinct labels"):
        check_dense_ids(1200, 600, "f", "label", "classes")


def test_csv_block_with_the_wrong_column_count_is_refused():
    block = b"0,1,7\n2,3,7\n"  # three consistent columns where two are expected
    with pytest.raises(DatasetError, match="expected 2 comma-separated columns, found 3"):
        parse_csv_block(block, np.int64, 2, "edge.csv", first_line=4)
    assert parse_csv_block(block, np.int64, 3, "edge.csv").tolist() == [[0, 1, 7], [2, 3, 7]]


def npy_inputs():
    """3 nodes, edges 0->1, 1->2, labels for all."""
    return np.zeros((3, 2), np.float32), np.array([[0, 1], [1, 2]]), np.array([0, 1, 1])


def test_npy_split_mask_of_the_wrong_length_is_refused(tmp_path):
    feats, edges, lab = npy_inputs()
    with pytest.raises(
        DatasetError, match=r"train_idx \(array\): a bool mask must have shape \[3\]"
    ):
        prepare_npy(feats, tmp_path / "d", edges=edges, labels=lab,
                    train_idx=np.array([True, False]), progress=False)  # fmt: skip


def test_npy_repeated_split_ids_name_the_input(tmp_path):
    feats, edges, lab = npy_inputs()
    with pytest.raises(DatasetError, match=r"^test_idx \(array\): contains repeated node ids"):
        prepare_npy(feats, tmp_path / "d", edges=edges, labels=lab, train_idx=np.array([0]),
                    test_idx=np.array([2, 2]), progress=False)  # fmt: skip


def test_npy_indptr_that_ends_before_the_indices_is_refused(tmp_path):
    feats = np.zeros((2, 1), np.float32)
    with pytest.raises(DatasetError, match=r"indptr \(array\): ends at 1 but indices"):
        prepare_npy(feats, tmp_path / "d", indptr=np.array([0, 1, 1]),
                    indices=np.array([1, 0]), progress=False)  # fmt: skip


def test_npy_indptr_that_decreases_by_one_is_refused(tmp_path):
    feats = np.zeros((3, 1), np.float32)
    with pytest.raises(DatasetError, match=r"indptr \(array\): decreases at position 2"):
        prepare_npy(feats, tmp_path / "d", indptr=np.array([0, 2, 1, 3]),
                    indices=np.array([1, 0, 2]), progress=False)  # fmt: skip


def test_npy_negative_num_nodes_is_a_usage_error(tmp_path):
    feats, edges, _ = npy_inputs()
    with pytest.raises(UsageError, match="--num-nodes -1: must be >= 0"):
        prepare_npy(feats, tmp_path / "d", edges=edges, num_nodes=-1, progress=False)


def test_planetoid_test_node_on_the_last_allx_row_is_refused(tmp_path):
    parts, _, _ = gap_layout()  # 5 allx rows: ids 0..4
    parts["test.index"] = [8, 4, 7]
    write_planetoid(tmp_path, "g", parts)
    with pytest.raises(DatasetError, match=r"test node 4 overlaps the allx rows \[0, 5\)"):
        prepare_planetoid("g", tmp_path, tmp_path / "out", progress=False)


def test_planetoid_repeated_test_ids_name_the_test_index(tmp_path):
    parts, _, _ = gap_layout()
    parts["test.index"] = [8, 5, 8]
    write_planetoid(tmp_path, "g", parts)
    with pytest.raises(DatasetError, match=r"ind\.g\.test\.index: contains repeated node ids"):
        prepare_planetoid("g", tmp_path, tmp_path / "out", progress=False)


def write_facebook(root, ids, types):
    """A tiny Facebook Page-Page layout: target rows in the order given, edges 0-1 and 1-2."""
    root.mkdir(parents=True, exist_ok=True)
    rows = "".join(f'{i},{100 + i},"page, {i}",{t}\n' for i, t in zip(ids, types))
    (root / "facebook_target.csv").write_text("id,facebook_id,page_name,page_type\n" + rows)
    (root / "facebook_edges.csv").write_text("id_1,id_2\n0,1\n1,2\n")
    (root / "facebook.json").write_text(json.dumps({str(i): [i % 2] for i in ids}))
    return root


def test_facebook_labels_follow_the_id_column_not_the_row_order(tmp_path):
    root = write_facebook(tmp_path / "fb", [2, 0, 1], ["tvshow", "company", "politician"])
    ds = gnnio.load(prepare_facebook(root, tmp_path / "out", split=(1.0, 0.0), progress=False))
    # classes in sorted name order: company 0, politician 1, tvshow 2
    assert ds.labels.tolist() == [0, 1, 2]
    assert ds.meta["class_names"] == ["company", "politician", "tvshow"]


@pytest.mark.parametrize("ids", [[0, 2, 3], [0, 1, 1]])
def test_facebook_ids_must_number_the_rows(tmp_path, ids):
    root = write_facebook(tmp_path / "fb", ids, ["a", "b", "a"])
    with pytest.raises(DatasetError, match=r"ids must be 0\.\.2, each exactly once"):
        prepare_facebook(root, tmp_path / "out", progress=False)


@pytest.mark.parametrize(
    "ids,needle",
    [([0, 7], r"node id 7 is out of range \[0, 7\)"), ([0, 1, 0], "contains repeated node ids")],
)
def test_ogb_split_errors_name_the_split_file(tmp_path, ids, needle):
    folder = write_tiny_ogb(tmp_path / "ogbn_tiny")  # 7 nodes
    write_gz(folder / "split" / "time" / "train.csv.gz", "".join(f"{i}\n" for i in ids))
    with pytest.raises(DatasetError, match=r"train\.csv\.gz: " + needle):
        prepare_ogb(folder, tmp_path / "out", progress=False)


@pytest.mark.parametrize("symmetrize", [False, True])
def test_ogb_in_ram_keeps_one_way_edges_unless_symmetrized(tmp_path, symmetrize):
    # the CLI runs OGB within its default budget; this is the in-RAM path (memory_budget None)
    folder = write_tiny_ogb(tmp_path / "ogbn_tiny")
    out = prepare_ogb(folder, tmp_path / "out", symmetrize=symmetrize, progress=False)
    check_tiny_ogb(gnnio.load(out), symmetric=symmetrize)


def test_ogb_multi_label_csv_is_refused_with_its_reason(tmp_path):
    folder = write_tiny_ogb(tmp_path / "ogbn_tiny")
    write_gz(folder / "raw" / "node-label.csv.gz", "1,0\n" * 7)
    with pytest.raises(DatasetError, match="several label columns"):
        prepare_ogb(folder, tmp_path / "out", progress=False)


@pytest.mark.parametrize("budget", [None, 256 << 20])
def test_ogb_binary_features_that_are_not_numbers_are_one_line(tmp_path, budget):
    # a node_feat of strings used to end in numpy's ValueError (a traceback from the CLI)
    raw = tmp_path / "ogbn_x" / "raw"
    raw.mkdir(parents=True)
    np.savez(raw / "data.npz", num_nodes_list=np.array([3]), edge_index=np.array([[0, 1], [1, 2]]),
             node_feat=np.array([["a", "b"], ["c", "d"], ["e", "f"]]))  # fmt: skip
    with pytest.raises(DatasetError, match=r"node_feat\]: expected a C-ordered 2-D numeric array"):
        prepare_ogb(tmp_path / "ogbn_x", tmp_path / "out", progress=False, memory_budget=budget)
    assert not (tmp_path / "out").exists()
