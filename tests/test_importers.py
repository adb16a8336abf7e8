"""Importers other than synthetic: planetoid, facebook, ogb, npy (and their shared helpers)."""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import gnnio
from gnnio.cli.main import main
from gnnio.errors import DatasetError, UsageError
from gnnio.graph.csr import edges_to_csr
from gnnio.importers import _common, npy, ogb
from gnnio.importers._common import (
    edges_to_graph,
    iter_line_blocks,
    labels_to_int64,
    parse_fractions,
    stratified_split,
)
from gnnio.importers.npy import prepare_npy
from gnnio.importers.ogb import prepare_ogb
from gnnio.importers.planetoid import load_planetoid_pickle, prepare_planetoid

DATASETS = Path(__file__).resolve().parents[2] / "shared" / "datasets"
CORA = DATASETS / "cora"
FACEBOOK = DATASETS / "facebook_page_page"
needs_cora = pytest.mark.skipif(not CORA.is_dir(), reason=f"{CORA} not present")
needs_facebook = pytest.mark.skipif(not FACEBOOK.is_dir(), reason=f"{FACEBOOK} not present")


def info_json(path: Path, capsys) -> dict:
    capsys.readouterr()
    assert main(["info", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def assert_no_leftovers(out: Path) -> None:
    """``out`` does not exist and no temporary sibling directory is left behind."""
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]


def edge_set(ds) -> set[tuple[int, int]]:
    src, dst = ds.graph.edges()
    return set(zip(src.tolist(), dst.tolist()))


# --- planetoid ---------------------------------------------------------------------------------


@needs_cora
def test_cora_cli_end_to_end(tmp_path, capsys):
    out = tmp_path / "cora"
    argv = ["prepare", "planetoid", "--name", "cora", "--root", str(CORA), "--out", str(out)]
    assert main([*argv, "--quiet"]) == 0
    s = info_json(out, capsys)
    assert (s["num_nodes"], s["num_edges"], s["feat_dim"], s["num_classes"]) == (
        2708,
        10556,
        1433,
        7,
    )
    assert (s["num_train"], s["num_valid"], s["num_test"]) == (140, 500, 1000)

    ds = gnnio.load(out, verify=True)
    feats = np.asarray(ds.features)
    assert feats.dtype == np.float32 and set(np.unique(feats).tolist()) == {0.0, 1.0}
    # labels are the argmax of the one-hot rows, in the standard assembly
    ally = load_planetoid_pickle(CORA / "ind.cora.ally")
    ty = load_planetoid_pickle(CORA / "ind.cora.ty")
    test_index = np.loadtxt(CORA / "ind.cora.test.index", dtype=np.int64)
    assert np.array_equal(ds.labels[:1708], ally.argmax(1))
    assert np.array_equal(ds.labels[test_index], ty.argmax(1))
    allx = load_planetoid_pickle(CORA / "ind.cora.allx").toarray()
    tx = load_planetoid_pickle(CORA / "ind.cora.tx").toarray()
    assert np.array_equal(feats[:1708], allx) and np.array_equal(feats[test_index], tx)
    assert np.array_equal(ds.train_idx, np.arange(140))
    assert np.array_equal(ds.valid_idx, np.arange(140, 640))
    assert np.array_equal(ds.test_idx, np.sort(test_index))
    # symmetric, no self-loops
    edges = edge_set(ds)
    assert all((v, u) in edges for u, v in edges) and all(u != v for u, v in edges)
    assert ds.meta["source"]["importer"] == "planetoid"

    # a second run without --overwrite is a one-line error, with it a success
    assert main([*argv, "--quiet"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main([*argv, "--quiet", "--overwrite"]) == 0


@needs_cora
def test_cora_matches_pyg(tmp_path):
    """Same features, labels, masks and edge set as PyG's own Planetoid reader."""
    pyg_io = pytest.importorskip("torch_geometric.io")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = pyg_io.read_planetoid_data(str(CORA), "cora")
    ds = gnnio.load(prepare_planetoid("cora", CORA, tmp_path / "c", progress=False))
    assert np.array_equal(ref.x.numpy(), ds.features)
    assert np.array_equal(ref.y.numpy(), ds.labels)
    assert np.array_equal(np.flatnonzero(ref.train_mask.numpy()), ds.train_idx)
    assert np.array_equal(np.flatnonzero(ref.val_mask.numpy()), ds.valid_idx)
    assert np.array_equal(np.flatnonzero(ref.test_mask.numpy()), ds.test_idx)
    assert edge_set(ds) == set(zip(*ref.edge_index.tolist()))


def write_planetoid(root: Path, name: str, parts: dict) -> None:
    """Write ``ind.<name>.*`` as protocol-2 pickles (and test.index as text)."""
    root.mkdir(parents=True, exist_ok=True)
    for key, obj in parts.items():
        if key == "test.index":
            (root / f"ind.{name}.test.index").write_text("".join(f"{i}\n" for i in obj))
        else:
            with open(root / f"ind.{name}.{key}", "wb") as f:
                pickle.dump(obj, f, protocol=2)


def onehot(labels, c):
    y = np.zeros((len(labels), c), dtype=np.int32)
    for i, lab in enumerate(labels):
        if lab >= 0:
            y[i, lab] = 1
    return y


def gap_layout():
    """A citeseer-like layout: 5 allx rows, test ids 5, 7, 8 (6 is a hole), node 9 only in graph."""
    rng = np.random.default_rng(0)
    allx = (rng.random((5, 4)) < 0.5).astype(np.float32)
    tx = (rng.random((3, 4)) < 0.5).astype(np.float32)
    ally = onehot([0, 2, 1, -1, 2], 3)  # node 3 has an all-zero label row
    ty = onehot([1, 0, 2], 3)
    graph = defaultdict(list)
    for u, vs in {0: [1, 1], 1: [0, 2], 2: [2, 4], 5: [7], 8: [9, 3], 6: []}.items():
        graph[u] = vs
    parts = {
        "x": sp.csr_matrix(allx[:2]),
        "y": ally[:2],
        "allx": sp.csr_matrix(allx),
        "ally": ally,
        "tx": sp.csr_matrix(tx),
        "ty": ty,
        "graph": graph,
        "test.index": [8, 5, 7],
    }
    return parts, allx, tx


def test_planetoid_gap_layout(tmp_path):
    parts, allx, tx = gap_layout()
    write_planetoid(tmp_path / "raw", "fakeciteseer", parts)  # found under --root/raw too
    ds = gnnio.load(prepare_planetoid("FakeCiteseer", tmp_path, tmp_path / "out", progress=False))
    assert ds.num_nodes == 10 and ds.feat_dim == 4 and ds.num_classes == 3
    want = np.zeros((10, 4), np.float32)
    want[:5] = allx
    want[[8, 5, 7]] = tx
    assert np.array_equal(ds.features, want)
    assert not ds.features[6].any() and not ds.features[9].any()
    assert ds.labels.tolist() == [0, 2, 1, -1, 2, 0, -1, 2, 1, -1]
    assert ds.train_idx.tolist() == [0, 1]
    assert ds.valid_idx.tolist() == [2, 4]  # allx rows after train; node 3 is unlabeled
    assert ds.test_idx.tolist() == [5, 7, 8]
    und = {(0, 1), (1, 2), (2, 4), (5, 7), (8, 9), (3, 8)}
    assert edge_set(ds) == und | {(v, u) for u, v in und}


def test_planetoid_valid_split_stops_at_test_range(tmp_path):
    """valid = the 500 nodes after train, but never a test node or an unlabeled node."""
    parts, _, _ = gap_layout()
    write_planetoid(tmp_path, "g", parts)
    ds = gnnio.load(prepare_planetoid("g", tmp_path, tmp_path / "out", progress=False))
    assert set(ds.valid_idx.tolist()).isdisjoint(ds.test_idx.tolist())


def test_planetoid_errors(tmp_path):
    parts, _, _ = gap_layout()
    write_planetoid(tmp_path, "g", parts)
    (tmp_path / "ind.g.tx").unlink()
    with pytest.raises(DatasetError, match=r"ind\.g\.tx: no such file"):
        prepare_planetoid("g", tmp_path, tmp_path / "out", progress=False)
    assert_no_leftovers(tmp_path / "out")
    with pytest.raises(DatasetError, match="no such file"):
        prepare_planetoid("nothere", tmp_path, tmp_path / "out", progress=False)
    # shape mismatch names the file
    parts["ty"] = onehot([1, 0], 3)
    write_planetoid(tmp_path, "g", parts)
    with pytest.raises(DatasetError, match=r"ind\.g\.ty: shape \[2, 3\]"):
        prepare_planetoid("g", tmp_path, tmp_path / "out", progress=False)
    assert_no_leftovers(tmp_path / "out")


class _Evil:
    def __reduce__(self):
        return (os.getcwd, ())


def test_planetoid_unpickler_refuses_other_globals(tmp_path):
    f = tmp_path / "ind.evil.x"
    f.write_bytes(pickle.dumps(_Evil(), protocol=2))
    with pytest.raises(DatasetError, match="refusing"):
        load_planetoid_pickle(f)
    f.write_bytes(b"not a pickle at all")
    with pytest.raises(DatasetError, match="not a readable Planetoid pickle"):
        load_planetoid_pickle(f)


# --- facebook ----------------------------------------------------------------------------------


@needs_facebook
def test_facebook_cli(tmp_path, capsys):
    out = tmp_path / "fb"
    argv = ["prepare", "facebook", "--root", str(FACEBOOK), "--out", str(out), "--quiet"]
    assert main([*argv, "--split", "0.1,0.1", "--seed", "3"]) == 0
    s = info_json(out, capsys)
    assert (s["num_nodes"], s["num_edges"], s["feat_dim"], s["num_classes"]) == (
        22470,
        2 * (171002 - 179),
        4714,
        4,
    )
    ds = gnnio.load(out)
    assert ds.meta["class_names"] == ["company", "government", "politician", "tvshow"]
    assert np.bincount(ds.labels).tolist() == [6495, 6880, 5768, 3327]
    # stratified: per class round(0.1 * n_c) train and valid nodes, the rest test
    for c, n_c in enumerate(np.bincount(ds.labels)):
        got = [int(np.count_nonzero(ds.labels[idx] == c)) for idx in (ds.train_idx, ds.valid_idx)]
        assert got == [round(0.1 * n_c)] * 2
    assert s["num_train"] + s["num_valid"] + s["num_test"] == 22470
    # the split is the seeded one
    tr, va, te = stratified_split(np.asarray(ds.labels), 0.1, 0.1, seed=3)
    assert np.array_equal(tr, ds.train_idx) and np.array_equal(te, ds.test_idx)
    assert not np.array_equal(stratified_split(np.asarray(ds.labels), 0.1, 0.1, seed=4)[0], tr)
    # features: binary rows equal to the JSON lists
    lists = json.loads((FACEBOOK / "facebook.json").read_text())
    for v in (0, 1, 554, 22469):
        assert np.flatnonzero(ds.features[v]).tolist() == sorted(lists[str(v)])
    assert ds.features.dtype == np.float32
    assert int(np.asarray(ds.features[:5000]).sum()) == sum(len(lists[str(v)]) for v in range(5000))
    # labels follow page_type in sorted order
    assert ds.labels[0] == 3 and ds.labels[1] == 1  # tvshow, government
    assert ds.graph.num_edges == len(edge_set(ds))
    src, dst = ds.graph.edges()
    assert not np.any(src == dst)


def test_facebook_bad_split_is_usage_error():
    with pytest.raises(UsageError, match="--split"):
        parse_fractions("0.7,0.5")
    with pytest.raises(UsageError, match="--split"):
        parse_fractions("0.1")
    assert parse_fractions("0.6, 0.2") == (0.6, 0.2)


def test_facebook_missing_file(tmp_path, capsys):
    out = tmp_path / "fb"
    assert main(["prepare", "facebook", "--root", str(tmp_path), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "facebook_edges.csv: no such file" in err
    assert_no_leftovers(out)


# --- ogb ---------------------------------------------------------------------------------------


def write_gz(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write(text)


TINY_N = 7
TINY_EDGES = np.array([[0, 1], [1, 2], [2, 0], [3, 4], [1, 2], [5, 5], [6, 0], [4, 3]])
TINY_FEATS = np.array(
    [
        [0.5, -1.25, 3.0],
        [1, 2, 3],
        [0, 0, 0],
        [-0.125, 8, 1e-3],
        [7, 7, 7],
        [2.5, 0, -4],
        [1, 1, 1],
    ],
    dtype=np.float32,
)
TINY_LABELS = ["3", "0", "nan", "1", "", "2", "0"]  # unlabeled as 'nan' and as an empty line
TINY_SPLIT = {"train": [0, 1, 3], "valid": [5], "test": [6]}


def write_tiny_ogb(folder: Path) -> Path:
    raw = folder / "raw"
    write_gz(raw / "num-node-list.csv.gz", f"{TINY_N}\n")
    write_gz(raw / "num-edge-list.csv.gz", f"{len(TINY_EDGES)}\n")
    write_gz(raw / "edge.csv.gz", "".join(f"{u},{v}\n" for u, v in TINY_EDGES))
    feat_lines = (",".join(repr(float(x)) for x in row) for row in TINY_FEATS)
    write_gz(raw / "node-feat.csv.gz", "\n".join(feat_lines) + "\n")
    write_gz(raw / "node-label.csv.gz", "\n".join(TINY_LABELS) + "\n")
    for part, ids in TINY_SPLIT.items():
        write_gz(folder / "split" / "time" / f"{part}.csv.gz", "".join(f"{i}\n" for i in ids))
    # a split_dict.pt that would blow up if anything unpickled it
    (folder / "split" / "time" / "split_dict.pt").write_bytes(pickle.dumps(_Evil(), protocol=2))
    return folder


def check_tiny_ogb(ds, symmetric: bool) -> None:
    src, dst = TINY_EDGES[:, 0], TINY_EDGES[:, 1]
    if symmetric:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    indptr, indices = edges_to_csr(src, dst, TINY_N)
    assert np.array_equal(ds.graph.indptr, indptr) and np.array_equal(ds.graph.indices, indices)
    assert ds.graph.indices.dtype == np.int32
    assert ds.features.dtype == np.float32 and np.array_equal(ds.features, TINY_FEATS)
    assert ds.labels.dtype == np.int64 and ds.labels.tolist() == [3, 0, -1, 1, -1, 2, 0]
    assert ds.num_classes == 4
    for part, ids in TINY_SPLIT.items():
        got = getattr(ds, f"{part}_idx")
        assert got.dtype == np.int64 and got.tolist() == ids


@pytest.mark.parametrize(
    "block_bytes", [1 << 20, 5]
)  # 5 bytes: many blocks, lines split across reads
def test_ogb_tiny_layout(tmp_path, monkeypatch, capsys, block_bytes):
    monkeypatch.setattr(ogb, "BLOCK_BYTES", block_bytes)
    write_tiny_ogb(tmp_path / "root" / "ogbn_tiny")
    out = tmp_path / "out"
    argv = ["prepare", "ogb", "--root", str(tmp_path / "root"), "--name", "ogbn-tiny"]
    assert main([*argv, "--out", str(out), "--quiet"]) == 0
    ds = gnnio.load(out, verify=True)
    check_tiny_ogb(ds, symmetric=True)
    assert ds.name == "ogbn-tiny" and ds.meta["source"]["split_scheme"] == "time"
    assert ds.meta["source"]["self_loops_kept"] == 1

    out2 = tmp_path / "out2"  # --root at the dataset folder itself, one-way edges
    argv = ["prepare", "ogb", "--root", str(tmp_path / "root" / "ogbn_tiny"), "--no-symmetrize"]
    assert main([*argv, "--out", str(out2), "--quiet"]) == 0
    check_tiny_ogb(gnnio.load(out2), symmetric=False)


def test_ogb_binary_layout(tmp_path):
    folder = tmp_path / "ogbn_papers100M"
    (folder / "raw").mkdir(parents=True)
    np.savez_compressed(
        folder / "raw" / "data.npz",
        edge_index=TINY_EDGES.T.astype(np.int64),
        num_nodes_list=np.array([TINY_N]),
        num_edges_list=np.array([len(TINY_EDGES)]),
        node_feat=TINY_FEATS,
        node_year=np.arange(TINY_N)[:, None],
    )
    lab = np.array([3, 0, np.nan, 1, np.nan, 2, 0])[:, None]
    np.savez_compressed(folder / "raw" / "node-label.npz", node_label=lab)
    for part, ids in TINY_SPLIT.items():
        write_gz(folder / "split" / "time" / f"{part}.csv.gz", "".join(f"{i}\n" for i in ids))
    ds = gnnio.load(prepare_ogb(tmp_path, tmp_path / "out", progress=False))
    check_tiny_ogb(ds, symmetric=True)
    assert ds.name == "ogbn-papers100M" and ds.meta["source"]["layout"] == "binary npz"


def test_ogb_errors(tmp_path, capsys):
    folder = write_tiny_ogb(tmp_path / "ogbn_tiny")
    out = tmp_path / "out"

    def fails(match: str, exc=DatasetError, **kw):
        with pytest.raises(exc, match=match):
            prepare_ogb(folder, out, progress=False, **kw)
        assert_no_leftovers(out)

    fails(r"split[/\\]nope: no such directory", split_scheme="nope")
    (folder / "split" / "sales_ranking").mkdir()
    fails("several split schemes", exc=UsageError)  # 'ogbn-tiny' has no default scheme
    (folder / "split" / "sales_ranking").rmdir()
    # a feature row with a missing column fails mid-stream, after the writer has started
    rows = [",".join(repr(float(x)) for x in r) for r in TINY_FEATS]
    rows[4] = "1.0,2.0"
    write_gz(folder / "raw" / "node-feat.csv.gz", "\n".join(rows) + "\n")
    fails(r"node-feat\.csv\.gz: .*columns")
    write_gz(folder / "raw" / "node-feat.csv.gz", "\n".join(rows[:4] + rows[5:]) + "\n")
    fails(r"node-feat\.csv\.gz: 6 rows, but num-node-list says 7")
    write_gz(folder / "raw" / "edge.csv.gz", "0,1\n1,7\n")
    fails(r"edge\.csv\.gz: 2 edges, but num-edge-list says 8")
    (folder / "raw" / "num-edge-list.csv.gz").unlink()
    fails(r"edge\.csv\.gz: node id 7 is out of range \[0, 7\)")
    (folder / "raw" / "edge.csv.gz").unlink()
    fails(r"edge\.csv\.gz: no such file")
    # only split_dict.pt, no CSVs: a clear error, never an unpickle
    write_gz(folder / "raw" / "edge.csv.gz", "0,1\n")
    write_gz(folder / "raw" / "node-feat.csv.gz", "\n".join(rows[:4] + ["1,1,1"] + rows[5:]) + "\n")
    (folder / "split" / "time" / "train.csv.gz").unlink()
    fails("split_dict.pt is a pickle")
    # CLI: one line on stderr, exit 2
    assert main(["prepare", "ogb", "--root", str(tmp_path / "none"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gnnio: error: --root") and "\n" not in err


def test_ogb_root_with_several_datasets(tmp_path):
    write_tiny_ogb(tmp_path / "ogbn_a")
    write_tiny_ogb(tmp_path / "ogbn_b")
    with pytest.raises(UsageError, match="--name"):
        prepare_ogb(tmp_path, tmp_path / "out", progress=False)
    ds = gnnio.load(prepare_ogb(tmp_path, tmp_path / "out", name="ogbn-b", progress=False))
    assert ds.name == "ogbn-b"


def test_ogb_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    folder = write_tiny_ogb(tmp_path / "ogbn_tiny")
    monkeypatch.setattr(ogb, "BLOCK_BYTES", 8)
    real = _common.parse_csv_block
    calls = {"features": 0}

    def flaky(block, dtype, ncols, where, first_line=0):
        if "node-feat" in where:
            calls["features"] += 1
            if calls["features"] == 3:
                raise KeyboardInterrupt
        return real(block, dtype, ncols, where, first_line)

    monkeypatch.setattr(ogb, "parse_csv_block", flaky)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        prepare_ogb(folder, out, progress=False)
    assert calls["features"] == 3
    assert_no_leftovers(out)


# --- npy ---------------------------------------------------------------------------------------


def npy_inputs(tmp_path: Path, n=6, f=3, dtype=np.float64):
    rng = np.random.default_rng(5)
    src = np.array([0, 1, 2, 2, 4, 5, 1, 3])
    dst = np.array([1, 2, 0, 0, 3, 5, 0, 2])
    indptr, indices = edges_to_csr(src, dst, n, dedup=False)
    arrays = {
        "indptr": indptr,
        "indices": indices.astype(np.int64),
        "edges": np.stack([src, dst]),
        "edges_t": np.stack([src, dst], axis=1),
        "features": rng.standard_normal((n, f)).astype(dtype),
        "labels": np.array([0, 1, -1, 2, 1, 0]),
        "train": np.array([0, 1]),
        "valid": np.array([False, False, False, True, False, False]),
        "test": np.array([4, 5]),
    }
    paths = {}
    for k, a in arrays.items():
        paths[k] = tmp_path / f"{k}.npy"
        np.save(paths[k], a)
    return arrays, paths


def npy_argv(p: dict, out: Path, topo: str = "csr") -> list[str]:
    argv = ["prepare", "npy", "--features", str(p["features"]), "--labels", str(p["labels"])]
    argv += ["--train-idx", str(p["train"]), "--valid-idx", str(p["valid"])]
    argv += ["--test-idx", str(p["test"]), "--out", str(out), "--quiet"]
    if topo == "csr":
        return [*argv, "--indptr", str(p["indptr"]), "--indices", str(p["indices"])]
    return [*argv, "--edges", str(p[topo])]


@pytest.mark.parametrize("topo", ["csr", "edges", "edges_t"])
def test_npy_cli_forms(tmp_path, monkeypatch, topo):
    monkeypatch.setattr(_common, "CHUNK_BYTES", 2 * 3 * 8)  # two float64 rows per chunk
    arrays, p = npy_inputs(tmp_path)
    out = tmp_path / "out"
    assert main(npy_argv(p, out, topo)) == 0
    ds = gnnio.load(out, verify=True)
    ip, ix = edges_to_csr(arrays["edges"][0], arrays["edges"][1], 6)  # deduplicated
    assert np.array_equal(ds.graph.indptr, ip) and np.array_equal(ds.graph.indices, ix)
    assert ds.features.dtype == np.float32
    assert np.array_equal(ds.features, arrays["features"].astype(np.float32))
    assert ds.labels.tolist() == [0, 1, -1, 2, 1, 0] and ds.num_classes == 3
    assert ds.train_idx.tolist() == [0, 1] and ds.valid_idx.tolist() == [3]
    assert ds.test_idx.tolist() == [4, 5]
    assert (
        ds.meta["source"]["topology"] == {"csr": "csr", "edges": "[2,E]", "edges_t": "[E,2]"}[topo]
    )


@pytest.mark.parametrize("split", ["valid", "test"])
def test_npy_without_a_split_train_names_the_option(tmp_path, capsys, split):
    """Prepared with no valid or no test split: train's one line names the option to add."""
    _, p = npy_inputs(tmp_path)
    argv = npy_argv(p, tmp_path / "out")
    i = argv.index(f"--{split}-idx")
    assert main(argv[:i] + argv[i + 2 :]) == 0
    capsys.readouterr()
    assert main(["train", str(tmp_path / "out"), "--epochs", "1", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gnnio: error: ") and "\n" not in err
    assert f"has no {split} split" in err and f"prepare npy --{split}-idx F" in err


def test_npy_minimal_symmetrize_and_ambiguous_edges(tmp_path):
    feats = np.ones((3, 2), np.float16)
    edges = np.array([[0, 1], [2, 2]])  # [2, 2]: read as [2, E] = edges 0->2, 1->2
    ds = gnnio.load(prepare_npy(feats, tmp_path / "a", edges=edges, progress=False))
    assert edge_set(ds) == {(0, 2), (1, 2)}
    assert ds.features.dtype == np.float16 and ds.labels is None and ds.train_idx is None
    assert ds.num_classes == 0
    with pytest.raises(DatasetError, match="no labels"):
        ds.require_labels()
    ds = gnnio.load(
        prepare_npy(feats, tmp_path / "b", edges=edges, symmetrize=True, progress=False)
    )
    assert edge_set(ds) == {(0, 2), (1, 2), (2, 0), (2, 1)}
    # --num-nodes larger than the feature rows is an error naming --features
    with pytest.raises(DatasetError, match="features .*3 rows but --num-nodes gives 4"):
        prepare_npy(feats, tmp_path / "c", edges=edges, num_nodes=4, progress=False)


def test_npy_float_labels_with_nan(tmp_path):
    lab = np.array([1.0, np.nan, 0.0])
    ds = gnnio.load(
        prepare_npy(
            np.zeros((3, 1)),
            tmp_path / "o",
            edges=np.zeros((2, 0), np.int64),
            labels=lab,
            progress=False,
        )
    )
    assert ds.labels.tolist() == [1, -1, 0] and ds.num_edges == 0


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(features="missing"), r"--features .*missing\.npy: no such file"),
        (dict(features="labels"), r"--features .*: expected a 2-D \[N, F\] array"),
        (dict(indices="features"), r"--indices .*: expected a 1-D array"),
        (dict(labels="test"), r"--labels .*: has 2 labels for 6 nodes"),
        (dict(test="train"), r"--test-idx .*: node 0 is also in train_idx"),
        (dict(indptr="indices"), r"--indptr .*: must start at 0"),
        (dict(valid="bad_ids"), r"--valid-idx .*: node id 6 is out of range \[0, 6\)"),
        (dict(indices="bad_ids"), r"--indptr .*: ends at 8 but --indices .* has 1 entries"),
        (dict(features="text"), r"--features .*: not a readable \.npy file \(no NumPy header;"),
        (dict(features="short_feats"), r"--features .*: has 5 rows but the topology gives 6"),
    ],
)
def test_npy_errors(tmp_path, capsys, change, match):
    _, p = npy_inputs(tmp_path)
    np.save(tmp_path / "bad_ids.npy", np.array([6]))
    np.save(tmp_path / "short_feats.npy", np.zeros((5, 3)))
    (tmp_path / "text.npy").write_text("hello")
    p = dict(p)
    for key, src in change.items():
        p[key] = tmp_path / f"{src}.npy"
    out = tmp_path / "out"
    with pytest.raises(DatasetError, match=match):
        npy.run(_parse(npy_argv(p, out)))
    assert_no_leftovers(out)
    assert main(npy_argv(p, out)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gnnio: error: ") and "\n" not in err
    assert_no_leftovers(out)


def test_npy_edge_errors(tmp_path):
    feats = np.zeros((3, 2), np.float32)
    with pytest.raises(DatasetError, match=r"edges \(array\): node id 3 is out of range \[0, 3\)"):
        prepare_npy(feats, tmp_path / "o", edges=np.array([[0, 3]]).T, progress=False)
    with pytest.raises(DatasetError, match=r"expected shape \[2, E\] or \[E, 2\]"):
        prepare_npy(feats, tmp_path / "o", edges=np.zeros((3, 3), np.int64), progress=False)
    with pytest.raises(DatasetError, match="expected an integer array"):
        prepare_npy(feats, tmp_path / "o", edges=np.zeros((2, 3), np.float32), progress=False)
    with pytest.raises(UsageError, match="not both"):
        prepare_npy(
            feats, tmp_path / "o", edges=np.zeros((2, 0), np.int64), indptr=np.zeros(4, np.int64)
        )
    with pytest.raises(UsageError, match="--indices: is required"):
        prepare_npy(feats, tmp_path / "o", indptr=np.zeros(4, np.int64))
    with pytest.raises(UsageError, match="--indptr and --indices, or --edges"):
        prepare_npy(feats, tmp_path / "o")
    assert_no_leftovers(tmp_path / "o")


def _parse(argv: list[str]):
    from gnnio.cli.main import build_parser

    return build_parser().parse_args(argv)


def test_npy_interrupted_write_leaves_nothing(tmp_path, monkeypatch, capsys):
    _, p = npy_inputs(tmp_path)
    out = tmp_path / "out"
    real = _common.copy_rows

    def half_then_fail(src, dst, **kw):
        real(src[:3], dst[:3], **kw)
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(npy, "copy_rows", half_then_fail)
    with pytest.raises(OSError, match="simulated"):
        main(npy_argv(p, out))
    assert_no_leftovers(out)

    def interrupt(src, dst, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(npy, "copy_rows", interrupt)
    assert main(npy_argv(p, out)) == 130
    assert_no_leftovers(out)


# --- shared helpers: invariants ----------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 30),
    edges=st.lists(st.tuples(st.integers(0, 29), st.integers(0, 29)), max_size=80),
    symmetrize=st.booleans(),
    drop=st.booleans(),
    chunk=st.integers(1, 9),
)
def test_edges_to_graph_matches_reference(n, edges, symmetrize, drop, chunk):
    e = np.array([(u % n, v % n) for u, v in edges], dtype=np.int64).reshape(-1, 2)
    src, dst = e[:, 0], e[:, 1]
    indptr, indices = edges_to_graph(src, dst, n, symmetrize, drop, chunk=chunk)
    if drop:
        keep = src != dst
        src, dst = src[keep], dst[keep]
    if symmetrize:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    ref_ptr, ref_idx = edges_to_csr(src, dst, n)
    assert indptr.dtype == np.int64 and indices.dtype == ref_idx.dtype
    assert np.array_equal(indptr, ref_ptr) and np.array_equal(indices, ref_idx)


@settings(max_examples=60, deadline=None)
@given(
    labels=st.lists(st.integers(-1, 4), max_size=200),
    fr=st.tuples(st.floats(0, 1), st.floats(0, 1)).filter(lambda t: t[0] + t[1] <= 1),
    seed=st.integers(0, 2**31),
)
def test_stratified_split_invariants(labels, fr, seed):
    lab = np.array(labels, dtype=np.int64)
    tr, va, te = stratified_split(lab, fr[0], fr[1], seed)
    allids = np.concatenate([tr, va, te])
    assert np.array_equal(np.sort(allids), np.flatnonzero(lab >= 0))  # disjoint, covers labeled
    for c in np.unique(lab[lab >= 0]):
        n_c = int(np.count_nonzero(lab == c))
        assert np.count_nonzero(lab[tr] == c) == min(n_c, round(fr[0] * n_c))
    again = stratified_split(lab, fr[0], fr[1], seed)
    assert all(np.array_equal(a, b) for a, b in zip((tr, va, te), again))


@settings(max_examples=60, deadline=None)
@given(
    lines=st.lists(st.text("0123456789,", max_size=12), max_size=30),
    block=st.integers(1, 20),
    final_newline=st.booleans(),
)
def test_iter_line_blocks_roundtrip(lines, block, final_newline):
    data = "\n".join(lines).encode() + (b"\n" if final_newline and lines else b"")
    got = list(iter_line_blocks(io.BytesIO(data), block))
    joined = b"".join(b for _, b in got)
    assert joined == (data if data.endswith(b"\n") or not data else data + b"\n")
    seen = 0
    for first, b in got:  # blocks end on a line boundary and know their first line's number
        assert b.endswith(b"\n") and first == seen
        seen += b.count(b"\n")


def test_labels_to_int64():
    assert labels_to_int64(np.array([[2], [0]]), "x").tolist() == [2, 0]
    assert labels_to_int64(np.array([np.nan, 1.0]), "x").tolist() == [-1, 1]
    with pytest.raises(DatasetError, match="whole numbers"):
        labels_to_int64(np.array([0.5]), "lab.npy")
    with pytest.raises(DatasetError, match="negative"):
        labels_to_int64(np.array([-2]), "lab.npy")
    with pytest.raises(DatasetError, match="multi-label"):
        labels_to_int64(np.zeros((3, 2)), "lab.npy")
