"""``gnnio reorder --memory-budget`` (issue 25, item 1): the same files as the in-memory path,
bit for bit, in chunks whose pages are dropped; a budget too small is refused before writing."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from gnnio.cli.main import main
from gnnio.graph.dataset import load
from gnnio.importers.synthetic import prepare_synthetic
from gnnio.preprocess import reorder_bounded as rb
from gnnio.preprocess.hotness import score_fixed_bytes
from gnnio.preprocess.reorder import order_by_score, relabel_csr
from gnnio.utils.rss import rss_bytes
from tests.helpers import random_graph


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "g"
    prepare_synthetic(out, num_nodes=3000, avg_degree=8, feat_dim=24, num_classes=4, seed=3,
                      progress=False)  # fmt: skip
    return out


def _hashes(path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.glob("*.npy"))}


@pytest.mark.parametrize("by", ["degree", "wrpr", "sj", "presample"])
def test_bounded_reorder_writes_the_same_files(graph, tmp_path, by):
    g = load(graph).graph
    # the larger of what the score and the reorder hold: ~120 rows of the graph per chunk
    tiny = max(rb.fixed_bytes(g.num_nodes), score_fixed_bytes(by, g)) + rb.MIN_CHUNK
    assert main(["reorder", str(graph), "--by", by, "--out", str(tmp_path / "a"), "--quiet"]) == 0
    rc = main(["reorder", str(graph), "--by", by, "--out", str(tmp_path / "b"), "--quiet",
               "--memory-budget", str(tiny)])  # fmt: skip
    assert rc == 0
    a, b = _hashes(tmp_path / "a"), _hashes(tmp_path / "b")
    assert set(a) >= {"indptr.npy", "indices.npy", "features.npy", "labels.npy", "new2old.npy"}
    assert a == b


@pytest.mark.parametrize("mapped", [False, True])
@pytest.mark.parametrize("chunk", [1, 9000, 50_000, 1 << 30])
def test_chunked_relabel_equals_relabel_csr(tmp_path, chunk, mapped):
    """In RAM, or mapped from a file: resident, or read in sorted runs (rows longer than a run
    included) when the file does not fit the chunk."""
    g = random_graph(500, 4000, seed=1)
    perm = order_by_score(np.random.default_rng(0).random(500))
    want_ptr, want_ind = relabel_csr(g.indptr, g.indices, perm)
    ind = g.indices
    if mapped:
        np.save(tmp_path / "i.npy", np.asarray(g.indices))
        ind = np.load(tmp_path / "i.npy", mmap_mode="c")
    out = np.lib.format.open_memmap(tmp_path / "o.npy", "w+", want_ind.dtype, want_ind.shape)
    got_ptr = rb.relabel_csr_bounded(g.indptr, ind, perm, out, chunk)
    assert np.array_equal(got_ptr, want_ptr)
    assert np.array_equal(np.asarray(out), want_ind)


def test_row_chunks_cover_every_row_within_the_cost():
    cost = np.concatenate([[0], np.cumsum([5, 1, 1, 30, 2, 2, 2])])
    chunks = list(rb.row_chunks(cost, 6))
    assert chunks == [(0, 2), (2, 3), (3, 4), (4, 7)]  # a row above the limit stands alone


def test_too_small_a_budget_is_refused_before_writing(graph, tmp_path, capsys):
    out = tmp_path / "c"
    rc = main(["reorder", str(graph), "--by", "degree", "--out", str(out), "--quiet",
               "--memory-budget", "100KiB"])  # fmt: skip
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gnnio: error: --memory-budget:") and "\n" not in err
    assert not out.exists()
    assert main(["reorder", str(graph), "--by", "degree", "--out", str(out), "--quiet",
                 "--memory-budget", "lots"]) == 2  # fmt: skip


def test_release_drops_the_pages_of_a_mapping(tmp_path):
    path = tmp_path / "big.npy"
    np.save(path, np.ones(16 << 20, dtype=np.uint8))  # 16 MiB
    arr = np.load(path, mmap_mode="r")
    before = rss_bytes()
    assert int(arr[::4096].sum()) == 4096  # touches every page
    touched = rss_bytes()
    rb.release(arr)
    after = rss_bytes()
    assert touched - before > (12 << 20)
    assert touched - after > (12 << 20)
    assert int(arr[-1]) == 1  # still readable afterwards


@pytest.mark.parametrize("chunk", [1, 5000, 70_000, 1 << 30])
def test_chunked_feature_copy_equals_the_gather(tmp_path, chunk):
    """The external permutation (sorted runs read with preadv, scattered into the chunk) writes
    ``src[new2old]``, whatever the chunk; rows wider than a read run included."""
    rng = np.random.default_rng(2)
    for shape, dt in (((3001, 24), np.float32), ((257, 3000), np.float64), ((999,), np.int64)):
        x = rng.random(shape).astype(dt)
        np.save(tmp_path / "x.npy", x)
        src = np.load(tmp_path / "x.npy", mmap_mode="c")
        perm = rng.permutation(shape[0]).astype(np.int64)
        dst = np.lib.format.open_memmap(tmp_path / "y.npy", "w+", dt, shape)
        rb.copy_feature_rows_bounded(src, dst, perm, chunk, progress=False)
        assert np.asarray(dst).tobytes() == x[perm].tobytes()
        del dst
