"""``gnnio plan --memory-budget`` (issue 25, item 1): the strategies that do not call METIS give
the same placements (sha256 of every saved array) and costs within the budget; a budget too small
is refused with one line before anything starts or is written."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from gnnio.cli.main import main
from gnnio.graph.dataset import load
from gnnio.importers.synthetic import prepare_synthetic
from gnnio.placement.plan_budget import plan_fixed_bytes
from gnnio.placement.planner import buffer_rows_from
from gnnio.placement.topology import load_topology
from gnnio.preprocess.budget import MIN_CHUNK
from gnnio.preprocess.hotness import score_fixed_bytes

STRATEGIES = "alg1,rule1,interleaved,mod,naive,random,pagraph"


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "g"
    prepare_synthetic(out, num_nodes=3000, avg_degree=8, feat_dim=8, num_classes=4, seed=6,
                      progress=False)  # fmt: skip
    return out


def _arrays(path) -> dict[str, str]:
    with np.load(path, allow_pickle=False) as z:
        return {
            k: hashlib.sha256(np.ascontiguousarray(z[k]).tobytes()).hexdigest()
            for k in z.files
            if k != "prep_s"  # seconds
        }


def _need(graph, strategies: str, score: str = "sj") -> int:
    ds = load(graph)
    rows = buffer_rows_from(0.1, ds.num_nodes, 32, load_topology("2+2"))
    fixed = plan_fixed_bytes(ds.graph, 4, rows, strategies.split(","))
    return max(fixed, score_fixed_bytes(score, ds.graph))


def _plan(graph, out, capsys, *extra) -> dict:
    rc = main(["plan", str(graph), "--topology", "2+2", "--buffer", "0.1", "--fanouts", "4,3",
               "--strategies", STRATEGIES, "--json", "--save", str(out), *extra])  # fmt: skip
    assert rc == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.parametrize("score", ["sj", "wrpr"])
def test_bounded_plan_gives_the_same_placements(graph, tmp_path, capsys, score):
    one = _plan(graph, tmp_path / "a.npz", capsys, "--score", score)
    tiny = str(_need(graph, STRATEGIES, score) + MIN_CHUNK)
    two = _plan(graph, tmp_path / "b.npz", capsys, "--score", score, "--memory-budget", tiny)
    assert _arrays(tmp_path / "a.npz") == _arrays(tmp_path / "b.npz")
    assert one["best"] == two["best"]
    for name, s in one["strategies"].items():
        t = two["strategies"][name]
        for key in ("max_cost_s", "predicted_max_cost_s", "local", "peer", "host"):
            assert s[key] == t[key], (name, key)


@pytest.mark.parametrize(
    "strategies, words", [(STRATEGIES, "a plan of 7"), ("alg1,metis", "metis")]
)
def test_too_small_a_budget_is_refused_before_starting(graph, tmp_path, capsys, strategies, words):
    budget = str(_need(graph, strategies))  # no room for a chunk
    out = tmp_path / "p.npz"
    rc = main(["plan", str(graph), "--topology", "2+2", "--buffer", "0.1", "--strategies",
               strategies, "--save", str(out), "--memory-budget", budget])  # fmt: skip
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gnnio: error: --memory-budget:") and "\n" not in err
    assert words in err
    assert not out.exists()


def test_the_plan_counts_its_buffers_and_gpus(graph):
    g = load(graph).graph
    few = plan_fixed_bytes(g, 2, 100, ["alg1"])
    assert plan_fixed_bytes(g, 8, 100, ["alg1"]) > few
    assert plan_fixed_bytes(g, 2, 1000, ["alg1"]) - few == 8 * 900 * 2
    assert plan_fixed_bytes(g, 2, 100, ["alg1", "metis"]) > few + g.num_edges * 8
