"""``gnnio plan``'s refusals and its table (split from test_cli_bench_options.py and
test_placement.py, which hold the rest of its tests)."""

from __future__ import annotations

import json

import pytest

from gnnio.cli.main import main
from tests.helpers import write_tiny_dataset


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("opts") / "d", num_nodes=40, num_edges=160)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    return write_tiny_dataset(
        tmp_path_factory.mktemp("ds") / "tiny", num_nodes=300, num_edges=2400, feat_dim=8
    )


def test_plan_save_with_every_strategy_skipped_is_refused(tiny, tmp_path, capsys):
    """``--save`` where every strategy was skipped (pagraph over its cap) is one error line and
    no file: it printed "saved the None placement to FILE" (the JSON "saved": FILE), exit 0,
    and wrote nothing."""
    f = tmp_path / "p.npz"
    argv = ["plan", str(tiny), "--topology", "2", "--strategies", "pagraph", "--pagraph-max-nodes",
            "10", "--fanouts", "2", "--batch-size", "8", "--save", str(f), "--quiet"]  # fmt: skip
    for extra in ([], ["--json"]):
        assert main([*argv, *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--save: no placement to save, every strategy was" in err
        assert "above its cap of 10" in err and not f.exists()


def test_plan_refuses_a_bad_save_path_before_planning(tiny, tmp_path, monkeypatch, capsys):
    """A ``--save`` path that cannot be written is refused before the plan is computed (minutes
    on a large graph), not by the write after it."""
    import gnnio.cli.plan as cp

    planned: list[int] = []
    monkeypatch.setattr(cp, "make_plan", lambda *a, **kw: planned.append(1))
    (tmp_path / "f").write_text("x")
    argv = ["plan", str(tiny), "--topology", "2", "--save", str(tmp_path / "f" / "p.npz")]
    assert main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a file, not a directory" in err and not planned


def test_plan_table_compares_the_best_with_the_cheapest_partitioning(big, capsys):
    """The "best:" line compares a non-partitioning best with the *cheapest* partitioning
    strategy, and says nothing more when the best is a partitioning itself."""
    argv = [str(big), "--topology", "2+2", "--buffer", "0.1", "--fanouts", "4,3"]
    argv += ["--batch-size", "16", "--quiet", "--strategies", "alg1,naive,random"]
    assert main(["plan", *argv, "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["strategies"]
    cost = {k: v["max_cost_s"] for k, v in res.items()}
    assert cost["naive"] != cost["random"] and cost["alg1"] < min(cost["naive"], cost["random"])
    bp = min(("naive", "random"), key=cost.__getitem__)
    assert main(["plan", *argv]) == 0
    from gnnio.cli.plan import versus

    best_line = capsys.readouterr().out.strip().splitlines()[-1]
    assert best_line == "best: alg1" + versus(cost["alg1"], cost[bp], bp)
    assert main(["plan", *argv[:-1], "naive"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "best: naive"
