"""``gnnio partition --memory-budget`` (issue 25, item 1): random, range and hdr write the same
files, bit for bit, with the edge cut and the shards chunked; metis and bfs-block stay in memory
and are refused with one line before starting when they would not fit."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from gnnio.cli.main import main
from gnnio.graph.csr import CSRGraph
from gnnio.graph.dataset import load
from gnnio.importers.synthetic import prepare_synthetic
from gnnio.preprocess.budget import FAULT, MIN_CHUNK
from gnnio.preprocess.partition import bounded
from gnnio.preprocess.partition.store import _shard_rows, shard_of
from tests.helpers import random_graph


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "g"
    prepare_synthetic(out, num_nodes=3000, avg_degree=8, feat_dim=8, num_classes=4, seed=5,
                      progress=False)  # fmt: skip
    return out


def _hashes(path) -> dict[str, str]:
    return {
        str(f.relative_to(path)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(path.rglob("*.npy"))
    }


def _need(graph) -> int:
    g = load(graph).graph
    return bounded.NODE_BYTES * (g.num_nodes + 1) + g.indptr.nbytes + g.indices.nbytes


@pytest.mark.parametrize(
    "args", [["random"], ["range"], ["hdr", "--replicate", "0.05"], ["hdr", "--base", "random"]]
)
def test_bounded_partition_writes_the_same_files(graph, tmp_path, capsys, args):
    common = ["partition", str(graph), "--parts", "3", "--method", *args, "--json",
              "--fanouts", "4,3"]  # fmt: skip
    assert main([*common, "--out", str(tmp_path / "a")]) == 0
    one = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    tiny = str(_need(graph) + MIN_CHUNK)
    assert main([*common, "--out", str(tmp_path / "b"), "--memory-budget", tiny]) == 0
    two = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    a, b = _hashes(tmp_path / "a"), _hashes(tmp_path / "b")
    assert "part2/indices.npy" in a and a == b
    for key in ("edge_cut", "node_balance", "remote_fraction", "memory_increase"):
        assert one[key] == two[key]


@pytest.mark.parametrize("chunk", [2 * FAULT + 40, 2 * FAULT + 4000, 1 << 30])
def test_chunked_edge_cut_and_shard_lists(tmp_path, chunk):
    g = random_graph(700, 9000, seed=2)
    parts = np.random.default_rng(1).integers(0, 4, 700).astype(np.int16)
    assert bounded.edge_cut(g, parts, chunk) == bounded.edge_cut(g, parts, None)

    class P:  # the two fields shard_of reads
        pass

    p = P()
    p.parts, p.replicated = parts, np.array([3, 50, 699], dtype=np.int64)
    for k in range(4):
        nodes, indptr, want = shard_of(g, p, k)
        n2, ip2 = _shard_rows(g, p, k)
        assert np.array_equal(nodes, n2) and np.array_equal(indptr, ip2)
        bounded.write_lists(tmp_path / "i.npy", g, nodes, indptr, chunk)
        np.save(tmp_path / "w.npy", want)
        assert (tmp_path / "i.npy").read_bytes() == (tmp_path / "w.npy").read_bytes()
    empty = CSRGraph(np.zeros(3, dtype=np.int64), np.zeros(0, dtype=np.int32))
    bounded.write_lists(tmp_path / "e.npy", empty, np.arange(2), np.zeros(3, np.int64), chunk)
    assert np.load(tmp_path / "e.npy").shape == (0,)


@pytest.mark.parametrize(
    "args, words",
    [
        (["random"], "a random partition"),
        (["metis"], "metis runs in memory"),
        (["bfs-block"], "bfs-block runs in memory"),
        (["hdr", "--base", "bfs-block"], "bfs-block runs in memory"),
    ],
)
def test_too_small_a_budget_is_refused_before_starting(graph, tmp_path, capsys, args, words):
    budget = str(_need(graph))  # the fixed bytes, no room for a chunk or the method
    out = tmp_path / "p"
    rc = main(["partition", str(graph), "--parts", "2", "--method", *args, "--out", str(out),
               "--memory-budget", budget])  # fmt: skip
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gnnio: error: --memory-budget:") and "\n" not in err
    assert words in err
    assert not out.exists()


def test_in_memory_methods_run_when_they_fit(graph, tmp_path):
    assert main(["partition", str(graph), "--parts", "2", "--method", "bfs-block", "--out",
                 str(tmp_path / "p"), "--memory-budget", "2GiB", "--quiet"]) == 0  # fmt: skip
    assert main(["partition", str(graph), "--parts", "2", "--method", "bfs-block", "--out",
                 str(tmp_path / "q"), "--quiet"]) == 0  # fmt: skip
    assert _hashes(tmp_path / "p") == _hashes(tmp_path / "q")


def test_refine_is_refused_under_a_budget(graph, tmp_path, capsys):
    rc = main(["partition", str(graph), "--parts", "2", "--method", "random", "--refine", "2",
               "--out", str(tmp_path / "p"), "--memory-budget", "2GiB"])  # fmt: skip
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gnnio: error: --refine:") and "\n" not in err
    assert not (tmp_path / "p").exists()
