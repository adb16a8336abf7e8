"""``gnnio bench tiers``: the oracle is the measured trace, batch caps, summaries, table and plot."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gnnio.bench import tiers
from gnnio.cli.main import main
from gnnio.errors import UsageError
from gnnio.features.tiers.tiered import hot_rows_for_fraction
from gnnio.ordering import RandomOrder
from gnnio.preprocess.hotness import out_degree, presample_counts
from gnnio.sampling import UniformSampler

FANOUTS, BS, SEED = (4, 3), 16, 5
FRACS = (0.0, 0.05, 0.1, 0.25)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import gnnio
    from tests.helpers import write_tiny_dataset

    path = write_tiny_dataset(tmp_path_factory.mktemp("bt") / "tiny", num_nodes=400,
                              num_edges=3000, feat_dim=5)  # fmt: skip
    return gnnio.load(path)


def trace_counts(ds, epochs, max_batches=None):
    """Per-node access counts of the experiment's batches, sampled here independently."""
    sampler = UniformSampler(ds.graph, FANOUTS, seed=SEED)
    order = RandomOrder(np.asarray(ds.train_idx), BS, seed=SEED)
    counts = np.zeros(ds.num_nodes, dtype=np.int64)
    for ep in range(epochs):
        for b, seeds in enumerate(order.batches(ep)):
            if max_batches is not None and b >= max_batches:
                break
            counts[sampler.sample(seeds, epoch_seed=(ep << 32) + b).input_nodes.numpy()] += 1
    return counts


def host_rows(counts, score, f):
    """Host rows of a static hot set = the top round(f N) ids by score (ties by id)."""
    h = hot_rows_for_fraction(f, counts.shape[0])
    hot = np.argsort(-np.asarray(score, dtype=np.float64), kind="stable")[:h]
    return counts.sum() - counts[hot].sum()


def test_oracle_is_the_measured_trace(tiny):
    ds = tiny
    deg = out_degree(ds.graph, progress=False)
    res = tiers.host_traffic_experiment(ds, {"degree": deg}, FRACS, FANOUTS, BS, epochs=2,
                                        seed=SEED, oracle=True, progress=False)  # fmt: skip
    assert res["oracle"] == tiers.ORACLE_SOURCE
    # same rows as passing presample_counts of the same seed as a score
    counts = presample_counts(ds.graph, ds.train_idx, FANOUTS, BS, epochs=2, seed=SEED,
                              progress=False)  # fmt: skip
    ref = tiers.host_traffic_experiment(ds, {"oracle": counts}, FRACS, FANOUTS, BS, epochs=2,
                                        seed=SEED, progress=False)  # fmt: skip
    got = [r for r in res["rows"] if r["score"] == "oracle"]
    assert got == ref["rows"]
    assert res["nodes_accessed"] == np.count_nonzero(counts)
    assert res["mean_rows_per_batch"] == counts.sum() / (2 * res["batches_per_epoch"])
    by = {(r["score"], r["fraction"]): r for r in res["rows"]}
    for f in FRACS:  # a static hot set never beats the oracle
        assert (
            by[("oracle", f)]["host_bytes_per_epoch"] <= by[("degree", f)]["host_bytes_per_epoch"]
        )


def test_max_batches_caps_the_run_and_the_oracle(tiny):
    ds = tiny
    nb_full = -(-len(ds.train_idx) // BS)
    assert nb_full >= 4
    deg = out_degree(ds.graph, progress=False)
    res = tiers.host_traffic_experiment(ds, {"degree": deg}, FRACS, FANOUTS, BS, epochs=1,
                                        seed=SEED, oracle=True, max_batches=2,
                                        progress=False)  # fmt: skip
    counts = trace_counts(ds, 1, max_batches=2)
    full = trace_counts(ds, 1)
    assert res["batches_per_epoch"] == 2 and res["full_batches_per_epoch"] == nb_full
    assert res["requested_rows_per_epoch"] == counts.sum() < full.sum()
    by = {(r["score"], r["fraction"]): r for r in res["rows"]}
    rb = res["row_bytes"]
    for f in FRACS:
        # the oracle ranks by the counts of the two measured batches, not of the whole epoch
        assert by[("oracle", f)]["host_rows_per_epoch"] == host_rows(counts, counts, f)
        assert by[("degree", f)]["host_bytes_per_epoch"] == host_rows(counts, deg, f) * rb
    with pytest.raises(UsageError, match="max_batches"):
        tiers.host_traffic_experiment(ds, {"degree": deg}, max_batches=0, progress=False)
    with pytest.raises(UsageError, match="reserved"):
        tiers.host_traffic_experiment(ds, {"oracle": deg}, oracle=True, progress=False)


def test_summaries_match_the_rows(tiny):
    res = tiers.host_traffic_experiment(tiny, {}, FRACS, FANOUTS, BS, seed=SEED, oracle=True,
                                        count_only=False, progress=False)  # fmt: skip
    assert [r["score"] for r in res["rows"]] == ["oracle"] * len(FRACS)
    for r in res["rows"]:
        key = str(r["fraction"])
        assert res["host_bytes_by_score"]["oracle"][key] == r["host_bytes_per_epoch"]
        assert res["reduction_pct"]["oracle"][key] == pytest.approx(100 * r["traffic_reduction"])
    red = [res["reduction_pct"]["oracle"][str(f)] for f in FRACS]
    assert red[0] == 0.0 and red == sorted(red) and red[-1] > 0
    table = tiers.traffic_table(res)
    lines = table.splitlines()
    assert lines[0] == "| score | 0 % hot | 5 % hot | 10 % hot | 25 % hot |"
    assert lines[2].startswith("| oracle | ") and f"(-{red[2]:.1f} %)" in lines[2]


def test_cli_json_plot_and_plot_add(tiny, tmp_path, capsys):
    argv = ["bench", "tiers", str(tiny.path), "--fanouts", "4,3", "--batch-size", "16",
            "--seed", str(SEED), "--quiet", "--json"]  # fmt: skip
    assert main([*argv, "--scores", "degree,wrpr,sj", "--max-batches", "3"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    first = json.loads(out[-1])
    assert set(first["reduction_pct"]) == {"degree", "wrpr", "sj", "oracle"}
    assert first["oracle"] == tiers.ORACLE_SOURCE and first["batches_per_epoch"] == 3
    saved = tmp_path / "first.json"
    saved.write_text("some log line\n" + out[-1] + "\n")
    png = tmp_path / "img" / "t.png"
    assert main([*argv, "--plot", str(png), "--plot-add", str(saved)]) == 0
    second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert second["plot"] == str(png) and png.stat().st_size > 0
    assert set(second["reduction_pct"]) == {*tiers.DEFAULT_SCORES, "oracle"}
    from matplotlib.image import imread

    h, w = imread(png).shape[:2]
    assert w > 1.8 * h  # two panels side by side


def test_cli_errors_are_one_line(tiny, tmp_path, capsys):
    base = ["bench", "tiers", str(tiny.path), "--quiet"]
    bad = tmp_path / "bad.json"
    bad.write_text("not json\n")
    for extra, msg in [
        (["--plot-add", str(bad), "--plot", str(tmp_path / "x.png")], "--plot-add"),
        (["--plot-add", str(bad)], "--plot-add"),
        (["--scores", "degree,bogus"], "--scores"),
        (["--fractions", "0,2"], "--fractions"),
    ]:
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"gnnio: error: {msg}"), err
    assert not (tmp_path / "x.png").exists()


def test_plot_traffic_needs_results(tmp_path):
    with pytest.raises(UsageError, match="at least one"):
        tiers.plot_traffic([], tmp_path / "x.png")


def test_cli_text_output_starts_with_the_table(tiny, capsys):
    argv = ["bench", "tiers", str(tiny.path), "--fanouts", "4,3", "--batch-size", "16",
            "--scores", "degree", "--max-batches", "1", "--quiet"]  # fmt: skip
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| score | 0 % hot | 5 % hot | 10 % hot | 25 % hot |"
    assert lines[2].startswith("| degree | ") and lines[3].startswith("| oracle | ")
