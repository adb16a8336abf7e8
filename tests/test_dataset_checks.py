"""What ``gnnio info`` reports (:func:`gnnio.graph.dataset.info_stats`, against numbers computed by
hand) and the dataset checks the format tests leave out: the writer's own ``num_classes``, the
largest label against ``num_classes``, the chunked min/max of ``indices``, and ``require_labels``
on a split emptied by hand."""

from __future__ import annotations

import json
import re
import subprocess

import numpy as np
import pytest

import gnnio
from gnnio.errors import DatasetError
from gnnio.graph import DatasetWriter
from gnnio.graph.dataset import info_stats
from gnnio.graph.format import META_FILE, _min_max, sha256_file

from .helpers import write_tiny_dataset


def write(out, indptr, indices, feats, labels=None, splits=None, **kw):
    with DatasetWriter(out, name="t", **kw) as w:
        w.save_array("indptr", np.asarray(indptr, dtype=np.int64))
        w.save_array("indices", np.asarray(indices, dtype=np.int32))
        w.save_array("features", feats)
        if labels is not None:
            w.save_array("labels", np.asarray(labels, dtype=np.int64))
        for key, ids in (splits or {}).items():
            w.save_array(key, np.asarray(ids, dtype=np.int64))
    return out


def test_info_stats_by_hand(tmp_path):
    # 6 nodes; edges (src -> dst): 0->1, 2->1, 3->1, 1->0, 4->4; node 5 touches no edge, node 2 and
    # node 3 only send: in-degrees [1, 3, 0, 0, 1, 0], out-degrees [1, 1, 1, 1, 1, 0]
    indptr = [0, 1, 4, 4, 4, 5, 5]
    indices = [1, 0, 2, 3, 4]
    labels = [0, 1, -1, 0, 1, -1]
    out = write(tmp_path / "d", indptr, indices, np.zeros((6, 2), np.float32), labels,
                {"train_idx": [0, 1], "valid_idx": [3], "test_idx": [4]})  # fmt: skip
    s = info_stats(gnnio.load(out))
    assert s["num_nodes"] == 6 and s["num_edges"] == 5 and s["num_classes"] == 2
    assert s["isolated_nodes"] == 1  # node 5; nodes 2 and 3 have out-edges
    assert s["in_degree"]["min"] == 0 and s["in_degree"]["max"] == 3
    assert s["in_degree"]["median"] == 0.5 and s["in_degree"]["mean"] == 5 / 6
    # the top 1% of 6 nodes is one node, the one of in-degree 3: 3 of the 5 edges
    assert s["in_degree"]["top1pct_edge_share"] == pytest.approx(3 / 5)
    assert s["num_labeled"] == 4  # label 0 counts, -1 does not
    assert (s["num_train"], s["num_valid"], s["num_test"]) == (2, 1, 1)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_info_stats_counts_nonfinite_values_in_every_chunk(tmp_path, dtype):
    feats = np.ones((5, 3), np.float32)
    feats[0, 1] = np.nan  # the first chunk
    feats[4, 2] = np.nan  # the last chunk (chunk_rows=2: rows 4..4)
    feats[3, 0] = -np.inf
    out = write(tmp_path / "d", [0] * 6, [], feats, allow_nonfinite=True, feature_dtype=dtype)
    ds = gnnio.load(out)
    assert ds.feat_dtype == dtype
    s = info_stats(ds, check_values=True, chunk_rows=2)
    assert (s["features_nan"], s["features_inf"]) == (2, 1)


def test_writer_sets_num_classes_from_the_largest_label(tmp_path):
    out = write(tmp_path / "d", [0, 0, 0, 0], [], np.zeros((3, 1), np.float32), [2, -1, 0])
    assert gnnio.load(out).num_classes == 3


def test_num_classes_one_more_than_the_labels_need_is_refused(tmp_path):
    ds_dir = write_tiny_dataset(tmp_path / "ds", num_classes=3)
    hi = int(np.load(ds_dir / "labels.npy").max())
    meta = json.loads((ds_dir / META_FILE).read_text())
    meta["num_classes"] = hi + 2  # the smallest wrong value
    (ds_dir / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match=f"num_classes is {hi + 2} but the largest label"):
        gnnio.load(ds_dir)


def test_min_max_over_several_chunks():
    a = np.array([5, 0, 9, 3, 7], dtype=np.int32)
    for chunk in (1, 2, 3, 5, 8):
        assert _min_max(a, drop=False, chunk=chunk) == (0, 9)


def test_require_labels_refuses_a_train_split_emptied_by_hand(tmp_path):
    ds_dir = write_tiny_dataset(tmp_path / "ds")
    np.save(ds_dir / "train_idx.npy", np.zeros(0, np.int64))
    meta = json.loads((ds_dir / META_FILE).read_text())
    meta["arrays"]["train_idx"].update(shape=[0], sha256=sha256_file(ds_dir / "train_idx.npy"))
    meta["arrays"]["train_idx"].pop("sample_sha256", None)
    (ds_dir / META_FILE).write_text(json.dumps(meta))
    ds = gnnio.load(ds_dir)  # a valid dataset, for benchmarks
    with pytest.raises(DatasetError, match="no labels or no train split"):
        ds.require_labels()


def test_split_with_a_repeated_node_is_refused_at_open(tmp_path):
    ds_dir = write_tiny_dataset(tmp_path / "ds")
    tr = np.load(ds_dir / "train_idx.npy")
    tr = np.concatenate([tr, tr[:1]])
    np.save(ds_dir / "train_idx.npy", tr)
    meta = json.loads((ds_dir / META_FILE).read_text())
    meta["arrays"]["train_idx"].update(
        shape=[tr.size], sha256=sha256_file(ds_dir / "train_idx.npy")
    )
    meta["arrays"]["train_idx"].pop("sample_sha256", None)
    (ds_dir / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match="train_idx.npy: contains repeated node ids"):
        gnnio.load(ds_dir)


def test_train_split_labeled_only_with_class_zero_is_trainable(tmp_path):
    out = write(tmp_path / "d", [0, 0, 0], [], np.zeros((2, 1), np.float32), [0, 1],
                {"train_idx": [0]})  # fmt: skip
    gnnio.load(out).require_labels()
    with pytest.raises(DatasetError, match="no labeled training node"):
        write(tmp_path / "e", [0, 0, 0], [], np.zeros((2, 1), np.float32), [-1, 1],
              {"train_idx": [0]})  # fmt: skip


def test_array_file_symlinked_outside_the_dataset_is_refused(tmp_path):
    ds_dir = write_tiny_dataset(tmp_path / "ds")
    outside = tmp_path / "labels_elsewhere.npy"
    (ds_dir / "labels.npy").rename(outside)  # the same bytes: only the link is wrong
    (ds_dir / "labels.npy").symlink_to(outside)
    with pytest.raises(DatasetError, match="outside the dataset directory"):
        gnnio.load(ds_dir)


def edit_meta(ds_dir, fn):
    meta = json.loads((ds_dir / META_FILE).read_text())
    fn(meta)
    (ds_dir / META_FILE).write_text(json.dumps(meta))


def test_feat_dim_in_meta_must_match_the_features(tmp_path):
    ds_dir = write_tiny_dataset(tmp_path / "ds", feat_dim=4)
    edit_meta(ds_dir, lambda m: m.update(feat_dim=5))
    with pytest.raises(DatasetError, match="does not match meta.json feat_dim=5"):
        gnnio.load(ds_dir)


def test_int64_indices_of_a_small_graph_are_refused_even_if_meta_agrees(tmp_path):
    ds_dir = write_tiny_dataset(tmp_path / "ds")
    ix = np.load(ds_dir / "indices.npy").astype(np.int64)
    np.save(ds_dir / "indices.npy", ix)
    f = ds_dir / "indices.npy"
    edit_meta(ds_dir, lambda m: m["arrays"]["indices"].update(dtype="int64", sha256=sha256_file(f)))
    with pytest.raises(DatasetError, match="indices.npy: must be int32"):
        gnnio.load(ds_dir)


def test_an_extra_array_whose_dtype_differs_from_meta_is_refused(tmp_path):
    with DatasetWriter(tmp_path / "d", name="t") as w:
        w.save_array("indptr", np.zeros(3, np.int64))
        w.save_array("indices", np.zeros(0, np.int32))
        w.save_array("features", np.zeros((2, 1), np.float32))
        w.save_array("weights", np.ones(2, np.float32))  # no check of its own but meta's
    f = tmp_path / "d" / "weights.npy"
    np.save(f, np.ones(2, np.float64))
    edit_meta(tmp_path / "d", lambda m: m["arrays"]["weights"].update(sha256=sha256_file(f)))
    with pytest.raises(DatasetError, match="weights.npy: dtype float64 does not match meta.json"):
        gnnio.load(tmp_path / "d")


def test_the_temporary_directory_of_an_interrupted_write_does_not_open(tmp_path):
    # a writer killed after its meta.json and before the rename leaves a complete-looking copy
    tmp = write_tiny_dataset(tmp_path / ".ds.tmp-123-0badcafe")
    with pytest.raises(DatasetError, match="temporary directory of an interrupted write"):
        gnnio.load(tmp)


@pytest.mark.parametrize(
    "edit,needle",
    [
        (lambda m: m.update(num_classes=True), "num_classes must be an integer >= 0, got True"),
        (lambda m: m.update(format_version=True), "format_version must be the integer 1"),
        (lambda m: m["arrays"]["labels"].update(file=".."), "file '..' is not a file name"),
        (lambda m: m["arrays"]["labels"].update(file="."), "file '.' is not a file name"),
        (lambda m: m["arrays"]["labels"].update(file="x\\labels.npy"), "is not a file name"),
    ],
)
def test_meta_booleans_and_odd_file_names_are_refused(tmp_path, edit, needle):
    ds_dir = write_tiny_dataset(tmp_path / "ds")
    edit_meta(ds_dir, edit)
    with pytest.raises(DatasetError, match=re.escape(needle)):
        gnnio.load(ds_dir)


def test_an_output_that_appears_during_the_write_is_not_replaced(tmp_path):
    out = tmp_path / "d"
    with pytest.raises(DatasetError, match="appeared while it was written"):
        with DatasetWriter(out, name="t") as w:
            w.save_array("indptr", np.zeros(3, np.int64))
            w.save_array("indices", np.zeros(0, np.int32))
            w.save_array("features", np.zeros((2, 1), np.float32))
            out.mkdir()  # someone else's directory, made while this writer worked
            (out / "theirs.txt").write_text("keep")
    assert (out / "theirs.txt").read_text() == "keep" and not (out / META_FILE).exists()


def test_overwrite_never_replaces_a_directory_that_is_not_a_dataset(tmp_path):
    out = tmp_path / "d"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(DatasetError, match="not a gnnio dataset; --overwrite replaces only"):
        write(out, [0, 0], [], np.zeros((1, 1), np.float32), overwrite=True)
    assert (out / "notes.txt").read_text() == "mine"


def test_stale_cleanup_keeps_the_dataset_moved_aside_while_the_target_is_missing(tmp_path):
    from gnnio.graph import output_dir

    p = subprocess.Popen(["true"])
    p.wait()  # a pid no process has any more: its temporaries are stale
    out = tmp_path / "d"
    old = write_tiny_dataset(tmp_path / f".d.old-{p.pid}-0badcafe")  # the only copy of `out`
    tmp = tmp_path / f".d.tmp-{p.pid}-0badcafe"
    tmp.mkdir()
    assert output_dir.remove_stale(out) == [tmp]
    assert (old / META_FILE).is_file()
    out.mkdir()  # with the target back, the moved-aside copy is stale too
    assert output_dir.remove_stale(out) == [old]


def test_info_says_what_a_dataset_was_reordered_by(tmp_path, capsys):
    """``gnnio info`` shows ``reordered_by`` and ``reorder_score`` (what ``gnnio train --score``
    compares against), and says when an older reorder did not record the parameters."""
    from gnnio.cli.main import main
    from gnnio.preprocess.reorder import reorder_path

    src = write_tiny_dataset(tmp_path / "a")
    reorder_path(src, "rpr", out=tmp_path / "b", progress=False, damping=0.5)
    assert main(["info", str(tmp_path / "b"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert d["reordered_by"] == "rpr"
    assert d["reorder_score"] == {"name": "rpr", "damping": 0.5, "iterations": 20}
    assert main(["info", str(tmp_path / "b")]) == 0
    assert "reordered   by rpr (damping 0.5, iterations 20)" in capsys.readouterr().out
    meta_path = tmp_path / "b" / META_FILE
    meta = json.loads(meta_path.read_text())
    del meta["reorder_score"]  # as written before the parameters were recorded
    meta_path.write_text(json.dumps(meta))
    assert main(["info", str(tmp_path / "b")]) == 0
    assert "reordered   by rpr (parameters not recorded)" in capsys.readouterr().out
    assert main(["info", str(src), "--json"]) == 0
    assert "reordered_by" not in json.loads(capsys.readouterr().out)
