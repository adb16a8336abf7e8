"""``gnnio prepare synthetic|npy|ogb --memory-budget`` (issue 25, item 1): the same files as the
in-memory path, bit for bit, with budgets small enough that every chunked step runs in many
pieces; a budget too small is refused in one line before anything is written."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from gnnio.cli.main import main
from gnnio.graph.format import DatasetWriter
from gnnio.importers import _synthetic_bounded as sb
from gnnio.importers._common import edges_to_graph
from gnnio.importers._synthetic_graph import _trim
from gnnio.importers.ogb import prepare_ogb
from gnnio.preprocess import chunked
from tests.test_importers import (
    TINY_EDGES,
    TINY_FEATS,
    TINY_N,
    TINY_SPLIT,
    write_gz,
    write_tiny_ogb,
)


def _hashes(path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.glob("*.npy"))}


def _same_dataset(a, b) -> None:
    ha, hb = _hashes(a), _hashes(b)
    assert {"indptr.npy", "indices.npy", "features.npy"} <= set(ha)
    assert ha == hb
    ma, mb = (json.loads((p / "meta.json").read_text()) for p in (a, b))
    assert {k: v["sha256"] for k, v in ma["arrays"].items()} == {
        k: v["sha256"] for k, v in mb["arrays"].items()
    }
    assert ma.get("generator") == mb.get("generator")
    assert ma["source"] == mb["source"]


def _prepare(args, out, *extra) -> int:
    return main(["prepare", *args, "--out", str(out), "--quiet", *extra])


# --------------------------------------------------------------------------- synthetic

SYN = ["synthetic", "--num-nodes", "3000", "--avg-degree", "12", "--feat-dim", "6",
       "--num-classes", "5", "--seed", "4"]  # fmt: skip


@pytest.mark.parametrize("pieces", ["one", "many", "grow"])
def test_bounded_synthetic_writes_the_same_files(tmp_path, monkeypatch, pieces):
    """``many``: rounds merged 700 keys at a time, CSR buckets of 2,000 keys; ``grow``: the key
    buffer starts too small and grows. Breaking the in-place merge (``_merge_back`` keeping a
    duplicate), the trim's codes or the bucket fill makes the files differ."""
    assert _prepare(SYN, tmp_path / "a", "--memory-budget", "none") == 0
    if pieces != "one":
        monkeypatch.setattr(sb, "_round_keys", lambda budget, cap, n: 700)
        monkeypatch.setattr(sb, "BUCKET_KEYS_MAX", 2000)
    if pieces == "grow":
        monkeypatch.setattr(sb, "_capacity", lambda target: 1000)
    need = sb.need_bytes(3000, 18000)
    assert _prepare(SYN, tmp_path / "b", "--memory-budget", str(need)) == 0
    _same_dataset(tmp_path / "a", tmp_path / "b")
    meta = json.loads((tmp_path / "b" / "meta.json").read_text())
    assert meta["generator"]["trimmed_pairs"] > 0 and meta["generator"]["rounds"] >= 1


def test_default_budget_is_bounded_and_the_same(tmp_path, monkeypatch):
    """Without --memory-budget, prepare synthetic runs the bounded path (half the available RAM)."""
    seen = []
    real = sb.generate_bounded
    monkeypatch.setattr(
        sb, "generate_bounded", lambda w, budget, *a: seen.append(budget) or real(w, budget, *a)
    )
    assert _prepare(SYN, tmp_path / "a") == 0
    assert seen == [chunked.default_budget()] or abs(seen[0] - chunked.default_budget()) < 2**28
    assert _prepare(SYN, tmp_path / "b", "--memory-budget", "none") == 0
    _same_dataset(tmp_path / "a", tmp_path / "b")


def test_a_named_budget_bounds_the_reorder_too(tmp_path, monkeypatch):
    seen = []
    from gnnio.preprocess import reorder

    real = reorder.reorder_path
    monkeypatch.setattr(reorder, "reorder_path", lambda *a, **k: seen.append(k) or real(*a, **k))
    budget = str(sb.need_bytes(3000, 18000))
    assert _prepare([*SYN, "--reorder", "degree"], tmp_path / "a", "--memory-budget", "none") == 0
    assert _prepare([*SYN, "--reorder", "degree"], tmp_path / "b", "--memory-budget", budget) == 0
    monkeypatch.setattr(chunked, "default_budget", lambda: 64 << 20)
    assert _prepare([*SYN, "--reorder", "degree"], tmp_path / "c") == 0  # the default budget
    assert [k["memory_budget"] for k in seen] == [None, int(budget), 64 << 20]
    _same_dataset(tmp_path / "a", tmp_path / "b")
    _same_dataset(tmp_path / "a", tmp_path / "c")


def random_pair_keys(n: int, draws: int, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct undirected pairs of ``n`` nodes as sorted keys ``min * n + max`` (no self
    pairs) from ``draws`` random draws, and a random class of ``classes`` per node (seed 0)."""
    rng = np.random.default_rng(0)
    u, v = rng.integers(0, n, draws), rng.integers(0, n, draws)
    keys = np.unique(np.minimum(u, v) * n + np.maximum(u, v))
    keys = keys[keys // n != keys % n]
    return keys, rng.integers(0, classes, n).astype(np.int16)


def test_trim_bounded_draws_as_the_in_memory_trim():
    n = 400
    keys, cls = random_pair_keys(n, 6000, 3)
    target = keys.size - 900
    r1, r2 = np.random.default_rng(7), np.random.default_rng(7)
    want, dropped = _trim(r1, keys.copy(), cls, n, target, int(0.6 * target))
    store = sb.BoundedKeys(keys, keys.size, 1024, cls, n)
    assert sb.trim_bounded(r2, store, cls, n, target, int(0.6 * target)) == dropped
    assert np.array_equal(store.keys, want)
    assert r1.random() == r2.random()  # the same numbers were drawn


def test_too_small_a_budget_is_refused_before_writing(tmp_path, capsys):
    out = tmp_path / "c"
    assert _prepare(SYN, out, "--memory-budget", "64KiB") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gnnio: error: --memory-budget:") and "\n" not in err
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert _prepare(SYN, out, "--memory-budget", "lots") == 2
    assert _prepare([*SYN, "--model", "dcsbm"], out, "--memory-budget", "1GiB") == 2
    assert "dcsbm" in capsys.readouterr().err
    assert _prepare([*SYN, "--model", "dcsbm", "--communities", "4"], out) == 0  # in RAM


def test_prepare_help_names_the_default_budget(capsys):
    with pytest.raises(SystemExit):
        main(["prepare", "npy", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--memory-budget" in text and "50% of the available RAM" in text


# --------------------------------------------------------------------------- the CSR builder


@pytest.mark.parametrize("symmetrize", [False, True])
@pytest.mark.parametrize("bucket", [1, 7, 100, None])
def test_build_csr_equals_edges_to_graph(tmp_path, monkeypatch, symmetrize, bucket):
    """Duplicates, self-loops, empty rows, a hub row larger than a bucket; breaking the dedup
    (``_unique_sorted_inplace`` returning the full length) fails the duplicate cases."""
    rng = np.random.default_rng(1)
    n = 60
    src = np.concatenate([rng.integers(0, n, 500), np.full(40, 3), [5, 5, 5]])
    dst = np.concatenate([rng.integers(0, n - 10, 500), rng.integers(0, n, 40), [5, 5, 9]])
    monkeypatch.setattr(chunked, "CHUNK_EDGES", 37)
    want_ptr, want_ind = edges_to_graph(src, dst, n, symmetrize=symmetrize)
    with DatasetWriter(tmp_path / "g", name="g") as w:
        e = chunked.build_csr(w, chunked.EdgeArrays(src, dst), n, 1 << 20, symmetrize=symmetrize,
                              max_bucket_keys=bucket)  # fmt: skip
        w.save_array("features", np.zeros((n, 1), np.float32))
    assert e == want_ind.size
    assert np.array_equal(np.load(tmp_path / "g" / "indptr.npy"), want_ptr)
    got = np.load(tmp_path / "g" / "indices.npy")
    assert got.dtype == want_ind.dtype and np.array_equal(got, want_ind)
    assert sorted(p.name for p in (tmp_path / "g").iterdir()) == [
        "features.npy", "indices.npy", "indptr.npy", "meta.json"
    ]  # fmt: skip


@pytest.mark.parametrize("later", ["more", "fewer"])
def test_build_csr_refuses_edges_that_change_between_passes(tmp_path, later):
    """The counting pass sizes each bucket; a later pass with more edges (the bucket overflows)
    or fewer ones (part of it never written) must fail, never write a wrong CSR."""
    passes = []

    def edges():
        passes.append(None)
        src, dst = np.array([0, 1, 2, 2]), np.array([1, 2, 0, 1])
        if len(passes) > 1:  # the passes after the counting one
            k = 5 if later == "more" else 3
            src, dst = np.resize(src, k), np.resize(dst, k)
        return [(src, dst)]

    with pytest.raises(RuntimeError, match="changed between two passes"):
        with DatasetWriter(tmp_path / "g", name="g") as w:
            chunked.build_csr(w, edges, 3, 1 << 20)
    assert not (tmp_path / "g").exists()


# --------------------------------------------------------------------------- npy


@pytest.fixture
def npy_inputs(tmp_path):
    rng = np.random.default_rng(3)
    n, e = 500, 4000
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    d = tmp_path / "in"
    d.mkdir()
    np.save(d / "edges.npy", np.stack([src, dst]).astype(np.int32))
    np.save(d / "edges_t.npy", np.stack([src, dst], axis=1))
    ptr, ind = edges_to_graph(src, dst, n)
    np.save(d / "indptr.npy", ptr)
    np.save(d / "indices.npy", ind)
    np.save(d / "x.npy", rng.standard_normal((n, 5)))  # float64: cast to float32 per chunk
    np.save(d / "y.npy", rng.integers(-1, 4, n))
    np.save(d / "tr.npy", np.arange(0, 100))
    return d


@pytest.mark.parametrize("topology", ["csr", "[2,E]", "[E,2]", "[2,E] sym"])
def test_bounded_npy_writes_the_same_files(npy_inputs, tmp_path, monkeypatch, topology):
    d = npy_inputs
    args = ["npy", "--features", str(d / "x.npy"), "--labels", str(d / "y.npy"),
            "--train-idx", str(d / "tr.npy")]  # fmt: skip
    if topology == "csr":
        args += ["--indptr", str(d / "indptr.npy"), "--indices", str(d / "indices.npy")]
    else:
        args += ["--edges", str(d / ("edges_t.npy" if topology == "[E,2]" else "edges.npy"))]
    if topology.endswith("sym"):
        args.append("--symmetrize")
    assert _prepare(args, tmp_path / "a", "--memory-budget", "none") == 0
    monkeypatch.setattr(chunked, "CHUNK_EDGES", 333)
    assert _prepare(args, tmp_path / "b", "--memory-budget", "2MiB") == 0  # 1-2 buckets
    _same_dataset(tmp_path / "a", tmp_path / "b")
    assert _prepare(args, tmp_path / "c", "--memory-budget", "100KiB") == 2


def test_bounded_npy_checks_ids_chunk_by_chunk(npy_inputs, tmp_path, monkeypatch, capsys):
    d = npy_inputs
    bad = np.load(d / "edges.npy")
    bad[1, 3001] = 500
    np.save(d / "bad.npy", bad)
    monkeypatch.setattr(chunked, "CHUNK_EDGES", 333)
    args = ["npy", "--features", str(d / "x.npy"), "--edges", str(d / "bad.npy")]
    assert _prepare(args, tmp_path / "a", "--memory-budget", "4MiB") == 2
    err = capsys.readouterr().err
    assert "node id 500 is out of range [0, 500)" in err and not (tmp_path / "a").exists()


# --------------------------------------------------------------------------- ogb


def _no_temporaries(parent) -> None:
    assert [p.name for p in parent.iterdir() if p.name.startswith(".")] == []


def test_bounded_ogb_csv_writes_the_same_files(tmp_path, monkeypatch):
    write_tiny_ogb(tmp_path / "root" / "ogbn_tiny")
    args = ["ogb", "--root", str(tmp_path / "root"), "--name", "ogbn-tiny"]
    assert _prepare(args, tmp_path / "o" / "a", "--memory-budget", "none") == 0
    monkeypatch.setattr(chunked, "CHUNK_EDGES", 3)
    assert _prepare(args, tmp_path / "o" / "b", "--memory-budget", "200MiB") == 0
    _same_dataset(tmp_path / "o" / "a", tmp_path / "o" / "b")
    (tmp_path / "root" / "ogbn_tiny" / "raw" / "num-edge-list.csv.gz").unlink()  # E unknown
    assert _prepare(args, tmp_path / "o" / "c", "--memory-budget", "200MiB") == 0
    assert _hashes(tmp_path / "o" / "c") == _hashes(tmp_path / "o" / "a")
    _no_temporaries(tmp_path / "o")


def test_bounded_ogb_binary_writes_the_same_files(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "ogbn_papers100M"
    (folder / "raw").mkdir(parents=True)
    np.savez(folder / "raw" / "data.npz", edge_index=TINY_EDGES.T.astype(np.int64),
             num_nodes_list=np.array([TINY_N]), node_feat=TINY_FEATS)  # fmt: skip
    for part, ids in TINY_SPLIT.items():
        write_gz(folder / "split" / "time" / f"{part}.csv.gz", "".join(f"{i}\n" for i in ids))
    monkeypatch.setattr(chunked, "CHUNK_EDGES", 2)
    prepare_ogb(tmp_path, tmp_path / "o" / "a", progress=False)
    prepare_ogb(tmp_path, tmp_path / "o" / "b", progress=False, memory_budget=200 << 20)
    _same_dataset(tmp_path / "o" / "a", tmp_path / "o" / "b")
    _no_temporaries(tmp_path / "o")
    bad = TINY_EDGES.T.astype(np.int64).copy()
    bad[0, 5] = TINY_N
    np.savez(folder / "raw" / "data.npz", edge_index=bad, num_nodes_list=np.array([TINY_N]),
             node_feat=TINY_FEATS)  # fmt: skip
    argv = ["ogb", "--root", str(tmp_path), "--memory-budget", "200MiB"]
    assert _prepare(argv, tmp_path / "o" / "c") == 2
    assert "node id 7 is out of range [0, 7)" in capsys.readouterr().err
    _no_temporaries(tmp_path / "o")


def test_copy_rows_within_a_budget_drops_the_pages(tmp_path):
    """``copy_rows(drop=True)`` (prepare npy within a budget) leaves neither the 64 MiB input
    nor the output resident; without ``drop`` both stay (removing the drop fails this)."""
    from gnnio.importers._common import copy_rows
    from gnnio.utils.rss import rss_bytes

    np.save(tmp_path / "x.npy", np.ones((1 << 16, 256), dtype=np.float32))
    for drop, key in ((True, "a"), (False, "b")):
        src = np.load(tmp_path / "x.npy", mmap_mode="r")
        dst = np.lib.format.open_memmap(tmp_path / f"{key}.npy", "w+", np.float32, src.shape)
        before = rss_bytes()
        copy_rows(src, dst, progress=False, chunk_rows=4096, drop=drop)
        grown = rss_bytes() - before
        assert (grown < 16 << 20) if drop else (grown > 96 << 20), (drop, grown)
        del src, dst
