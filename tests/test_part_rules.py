"""Rules of the partitioners, the partition quality report, the bounded reorder, locality-aware
LADIES and the LABOR-0 kernel that a mutation pass (branch mut-part) found unguarded: the training
balance counts a part that holds no training node; METIS ignores self loops and one part needs no
pymetis; the bounded relabel closes its file and counts a resident input against the chunk, and a
short read of the features raises instead of hanging; the
seeds' hop of LocalityLadiesSampler favours its layer's set Q'_L, not B; LABOR-0 (poisson) refuses
a row that keeps fewer or more neighbours than counted, before writing past its slots."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from gnnio.graph import CSRGraph
from gnnio.preprocess.partition.methods import metis_parts
from gnnio.preprocess.partition.quality import partition_quality
from gnnio.sampling.ladies_locality import LocalityLadiesSampler

from .helpers import in_forked_child, random_graph
from .test_ladies import figure_2a_graph
from .test_reorder_rules import mapped_relabel_input, spy_row_chunks


def _chain() -> CSRGraph:
    """2 -> 0, 3 -> 2 (the graph of test_partition_rules.test_quality_report_by_hand)."""
    return CSRGraph.from_edges(np.array([2, 3]), np.array([0, 2]), 4)


def test_train_balance_counts_a_part_without_training_nodes():
    """All training nodes in part 0 of 2: max / mean = 1 / 0.5 = 2 (the empty part counts)."""
    parts = np.array([0, 0, 1, 1], dtype=np.int16)
    none = np.zeros(0, dtype=np.int64)
    q = partition_quality(_chain(), parts, none, np.array([0]), fanouts=(1, 1))
    assert q["train_per_part"] == [1, 0] and q["train_balance"] == 2.0


def test_metis_ignores_self_loops():
    """METIS partitions the symmetrized graph without self loops: adding a loop on every node
    changes nothing (kept, they weigh the nodes and shift METIS's balance)."""
    g = random_graph(300, 2000, seed=1)
    dst = np.repeat(np.arange(300), np.diff(np.asarray(g.indptr)))
    loops = CSRGraph.from_edges(
        np.concatenate([np.asarray(g.indices), np.arange(300)]),
        np.concatenate([dst, np.arange(300)]),
        300,
    )
    assert np.array_equal(metis_parts(loops, 4), metis_parts(g, 4))


def test_metis_with_one_part_needs_no_pymetis(monkeypatch):
    monkeypatch.setitem(sys.modules, "pymetis", None)  # (import pymetis raises ImportError)
    assert metis_parts(random_graph(20, 50, seed=0), 1).tolist() == [0] * 20


def test_the_seeds_hop_favours_the_layer_set_not_b():
    """Figure 2a, B = {1, 2, 3, 4}, Q'_2 = {1, 2, 3}: a hop from row 2 (candidates 1, 3, 4, 5 with
    equal LADIES weights, K = 1) at s = 2 favours Q'_2 (the seeds' hop is layer 2), not B: pi =
    (2, 2, 1, 1) / 6, so every drawn candidate's edge weight is 1 / pi = 3, 3, 6, 6."""
    g = figure_2a_graph()
    s = LocalityLadiesSampler(g, [1, 1], hot_ids=[1, 2, 3, 4], scale=2.0, q_size=3, seed=1)
    want = {1: 3.0, 3: 3.0, 4: 6.0, 5: 6.0}
    seen = set()
    for e in range(12):
        mb = s.sample([2], epoch_seed=e)
        blk = mb.blocks[-1]
        src = mb.input_nodes.numpy()[blk.edge_index[0].numpy()]
        for j, w in zip(src.tolist(), blk.edge_weight.numpy().tolist()):
            if j != 2:
                assert w == pytest.approx(want[j]), (j, w)
                seen.add(j)
    assert seen & {1, 3} and seen & {4, 5}


def test_bounded_relabel_by_runs_closes_its_file(tmp_path):
    """The run path (a mapped input larger than the chunk) opens the indices file for preadv and
    closes it again: no descriptor is left behind per call."""
    from gnnio.preprocess import reorder_bounded as rb
    from gnnio.preprocess.reorder import relabel_csr

    g = random_graph(200, 1500, seed=2)
    perm = np.random.default_rng(0).permutation(200).astype(np.int64)
    want_ptr, want_ind = relabel_csr(g.indptr, g.indices, perm)
    np.save(tmp_path / "i.npy", np.asarray(g.indices))
    ind = np.load(tmp_path / "i.npy", mmap_mode="c")
    out = np.lib.format.open_memmap(tmp_path / "o.npy", "w+", want_ind.dtype, want_ind.shape)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        rb.relabel_csr_bounded(g.indptr, ind, perm, out, 1)
    assert len(os.listdir("/proc/self/fd")) == before
    assert np.array_equal(np.asarray(out), want_ind)


def test_bounded_relabel_counts_a_resident_input_against_the_chunk(tmp_path, monkeypatch):
    """A mapped ``indices`` that fits the chunk is read in place and stays resident, so the output
    edges of a chunk get only what it leaves: ``chunk - (input + 2 fault windows)``."""
    from gnnio.preprocess import reorder_bounded as rb
    from gnnio.preprocess.budget import FAULT, MIN_CHUNK

    n, m = 1 << 12, 1 << 20  # 4 MiB of int32 edges
    indptr, ind, perm, out = mapped_relabel_input(tmp_path, n, m)
    seen = spy_row_chunks(monkeypatch)
    left = MIN_CHUNK  # the resident path, with 1 MiB left for the output
    ptr = rb.relabel_csr_bounded(indptr, ind, perm, out, 4 * m + 2 * FAULT + left)
    assert len(seen) >= 4 and seen[-1][1] == n
    assert all(4 * (int(ptr[b]) - int(ptr[a])) <= left for a, b in seen)


def _labor_poisson_row(count_key: int, sample_key: int):
    """One row of 40 distinct neighbours, fanout 8, LABOR-0 poisson: offs counted under
    ``count_key``, sampled under ``sample_key`` into ``src`` padded with -5 past the count."""
    from gnnio.sampling import _labor_kernels as LK

    d, fanout = 40, 8
    indptr = np.array([0, d], dtype=np.int64)
    indices = np.arange(1, d + 1, dtype=np.int64)
    rows = np.empty((2, 1), dtype=np.int64)
    offs = np.empty(2, dtype=np.int64)
    nodes = np.zeros(1, dtype=np.int64)
    e = LK.count_part(indptr, indices, nodes, 0, 1, fanout, np.uint64(count_key), True, rows, offs)
    src = np.full(e + d, -5, dtype=np.int64)
    args = (indices, 1, rows, offs, fanout, np.uint64(sample_key), True, src,
            np.full(d + 1, -1, dtype=np.int64), 0, np.zeros(1, dtype=np.uint8), True, 0,
            np.empty(e + d, dtype=np.int64))  # fmt: skip
    return e, src, lambda: LK.sample_part(*args)


def test_labor_poisson_refuses_a_row_that_keeps_fewer_or_more_than_counted():
    """A row keeping fewer neighbours than counted is refused (not relabelled with unwritten
    slots); one keeping more is refused before it writes past its own slots."""
    counts = {k: _labor_poisson_row(k, k)[0] for k in range(40)}
    lo = min(counts, key=counts.get)
    hi = max(counts, key=counts.get)
    assert counts[lo] < counts[hi]
    _, _, fewer = _labor_poisson_row(hi, lo)  # counted under hi, keeps fewer under lo
    with pytest.raises(ValueError, match="count_part"):
        fewer()
    e, src, more = _labor_poisson_row(lo, hi)
    with pytest.raises(ValueError, match="count_part"):
        more()
    assert (src[e:] == -5).all()  # nothing written past the row's counted slots


def test_feature_read_past_the_end_of_the_file_is_an_error_not_a_hang(tmp_path):
    """``preadv`` at EOF returns 0: the bounded feature copy's reader raises (a truncated features
    file), instead of asking again forever (run in a forked child, 20 s)."""
    from gnnio.preprocess import reorder_bounded as rb

    path = tmp_path / "x.bin"
    path.write_bytes(b"\1" * 100)

    def short_read() -> bool:
        fd = os.open(path, os.O_RDONLY)
        try:
            rb._pread_rows(fd, memoryview(bytearray(64)), 80, 64)  # 20 bytes left
        except OSError as e:
            return "short read" in str(e)
        finally:
            os.close(fd)
        return False

    assert in_forked_child(short_read, timeout=20) is True
