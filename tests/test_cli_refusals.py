"""``gnnio train`` refuses, in one line, an option given where it has no effect (the rule of
``refuse_ignored``), and still takes it where it has one; defaults are never refused."""

from __future__ import annotations

import json

import pytest

from gnnio.cli.main import build_parser, main
from gnnio.cli.train import refuse_ignored
from gnnio.cli.train_config import config_from_args

REFUSED = [
    ("--buffer 0.2", "--buffer: needs several ranks"),
    ("--sampling-mode shared", "--sampling-mode: has no effect without --partition"),
    ("--no-reuse", "--no-reuse: needs several ranks"),
    ("--reuse", "--reuse: needs several ranks"),
    ("--dist-timeout 5", "--dist-timeout: needs several ranks"),
    ("--layer-size 100", "--layer-size: has no effect without --sampler ladies"),
    ("--locality-max-scale 4", "--locality-max-scale: has no effect without --locality-scale auto"),
    ("--locality-scale 2 --gpu-cache-fraction 0.1 --locality-compute-s 3",
     "--locality-compute-s: has no effect without --locality-scale auto"),
    ("--nproc 2 --placement p.npz --buffer 0.1", "--buffer: has no effect with --placement FILE"),
    ("--reuse-level machine", "--reuse-level: needs several ranks"),
    ("--nproc 2 --no-reuse --reuse-level gpu", "--reuse-level: has no effect with --no-reuse"),
    ("--score degree", "--score: has no effect without --gpu-cache-fraction or --cache-policy"),
    ("--cache-policy lru --score sj", "--score: has no effect without --gpu-cache-fraction"),
]  # fmt: skip


@pytest.mark.parametrize("extra,words", REFUSED, ids=[r[0] for r in REFUSED])
def test_an_option_without_effect_is_refused_in_one_line(extra, words, tmp_path, capsys):
    # refused before the dataset is opened: DIR need not exist
    assert main(["train", str(tmp_path / "none"), *extra.split(), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err


TAKEN = [
    ("", 1),
    ("--sampler ladies --layer-size 100", 1),
    ("--locality-scale auto --gpu-cache-fraction 0.1 --locality-max-scale 4 "
     "--locality-compute-s 3", 1),
    ("--nproc 2 --buffer 0.2 --no-reuse --dist-timeout 5", 2),
    ("--nproc 2 --partition P --sampling-mode shared", 2),
    ("--nproc 2 --reuse-level machine", 2),
    ("--gpu-cache-fraction 0.1 --score degree", 1),
    ("--cache-policy static --score degree", 1),
    ("--nproc 2 --cache-policy static --score degree", 2),
]  # fmt: skip


@pytest.mark.parametrize("extra,ranks", TAKEN, ids=[t[0] or "defaults" for t in TAKEN])
def test_an_option_with_effect_is_taken(extra, ranks):
    args = build_parser().parse_args(["train", "d", *extra.split()])
    refuse_ignored(args, ranks)
    cfg = config_from_args(args, ranks)
    want = {"layer_size": 8192, "locality_max_scale": 8.0, "buffer": 0.1, "sampling_mode": "dsp",
            "reuse": True, "reuse_level": "gpu", "score": "wrpr"}  # fmt: skip
    given = {"--layer-size": ("layer_size", 100), "--locality-max-scale": ("locality_max_scale", 4),
             "--buffer": ("buffer", 0.2), "--sampling-mode": ("sampling_mode", "shared"),
             "--no-reuse": ("reuse", False), "--reuse-level": ("reuse_level", "machine"),
             "--score": ("score", "degree")}  # fmt: skip
    for opt, (field, value) in given.items():
        if opt in extra:
            want[field] = value
    assert {k: getattr(cfg, k) for k in want} == want


@pytest.mark.parametrize("extra,words", REFUSED[:6], ids=[r[0] for r in REFUSED[:6]])
def test_bench_step_refuses_them_too(extra, words, tmp_path, capsys):
    """``gnnio bench step`` takes train's options and refuses the same ones, before it opens the
    dataset (the time it reports is a configuration's: an ignored option would mislabel it)."""
    assert main(["bench", "step", str(tmp_path / "none"), *extra.split(), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err


PRESAMPLE_ONLY = ["--batch-size 256", "--epochs 2", "--seed 3", "--threads 1"]


@pytest.mark.parametrize("extra", PRESAMPLE_ONLY)
@pytest.mark.parametrize("score", ["degree", "wrpr", "sj"])
def test_reorder_refuses_presample_options_for_other_scores(extra, score, tmp_path, capsys):
    """``gnnio reorder``'s pre-sampling options are read by ``--by presample`` only: with another
    score they are one line, before DIR is opened or anything written."""
    out = tmp_path / "r"
    argv = ["reorder", str(tmp_path / "none"), "--by", score, "--out", str(out), *extra.split()]
    assert main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    opt = extra.split()[0]
    assert err.count("\n") == 1, err
    assert f"{opt}: has no effect without --by presample" in err, err
    assert not out.exists()


def test_reorder_takes_presample_options_with_presample(tmp_path):
    """With ``--by presample`` the options are taken: the copy follows the counts of a pre-sampling
    pass with those very batch size, epochs and seed."""
    import numpy as np

    import gnnio
    from gnnio.preprocess.hotness import compute_score
    from gnnio.preprocess.reorder import order_by_score
    from tests.helpers import write_tiny_dataset

    src = write_tiny_dataset(tmp_path / "d", num_nodes=64, num_edges=400)
    argv = ["reorder", str(src), "--by", "presample", "--fanouts", "3,2", "--out",
            str(tmp_path / "r"), "--quiet", "--batch-size", "4", "--epochs", "3", "--seed", "7",
            "--threads", "1"]  # fmt: skip
    assert main(argv) == 0
    got = np.asarray(gnnio.load(tmp_path / "r").extra["new2old"])
    score = compute_score("presample", gnnio.load(src), fanouts=[3, 2], batch_size=4, epochs=3,
                          seed=7, num_threads=1, progress=False)  # fmt: skip
    np.testing.assert_array_equal(got, order_by_score(score))
    default = compute_score(
        "presample", gnnio.load(src), fanouts=[3, 2], num_threads=1, progress=False
    )
    assert not np.array_equal(order_by_score(default), got)  # (the options mattered)


EPOCH_ONLY = ["--epochs 3", "--patience 2", "--eval full", "--eval-batch-size 64",
              "--summary S.json", "--log L.jsonl", "--checkpoint M.pt", "--checkpoint-dir C",
              "--checkpoint-dir C --checkpoint-every 2", "--resume C"]  # fmt: skip


@pytest.mark.parametrize("extra", EPOCH_ONLY)
def test_bench_step_refuses_what_only_epochs_read(extra, tmp_path, capsys):
    """``gnnio bench step`` times ``--batches`` steps and runs no epoch: train's stopping,
    evaluation and output options are one line there, before the dataset is opened (a
    ``--summary`` it took was never written)."""
    argv = [a if a.isdigit() or a.startswith("--") or a in ("full",) else str(tmp_path / a)
            for a in extra.split()]  # fmt: skip
    assert main(["bench", "step", str(tmp_path / "none"), *argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    opt = extra.split()[0]
    assert err.count("\n") == 1 and f"{opt}: has no effect in bench step" in err, err
    assert list(tmp_path.iterdir()) == []


def test_bench_step_verify_checks_every_byte(tmp_path, capsys):
    """``bench step --verify`` recomputes every sha256, as ``gnnio train --verify`` does: a byte
    flipped outside the blocks an open samples is found with it and not without."""
    from tests.helpers import flip_unsampled_byte, write_tiny_dataset

    ds = write_tiny_dataset(tmp_path / "d", num_nodes=2048, num_edges=8000, feat_dim=128)
    f = ds / "features.npy"
    flip_unsampled_byte(f)
    argv = ["bench", "step", str(ds), "--fanouts", "2,2", "--batch-size", "16", "--hidden", "8",
            "--batches", "1", "--warmup", "0", "--device", "cpu", "--quiet"]  # fmt: skip
    assert main([*argv, "--verify"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "features.npy" in err and "sha256" in err, err
    assert main(argv) == 0


@pytest.mark.parametrize("reorder", [None, "degree", "sj"])
def test_prepare_refuses_reorder_batch_size_without_presample(reorder, tmp_path, capsys):
    """``prepare --reorder-batch-size`` is read by ``--reorder presample`` only: one line
    otherwise, before anything is imported or written; with presample it is taken."""
    out = tmp_path / "o"
    argv = ["prepare", "synthetic", "--num-nodes", "256", "--avg-degree", "4", "--feat-dim", "4",
            "--num-classes", "2", "--out", str(out), "--quiet", "--reorder-batch-size", "64",
            *(["--reorder", reorder] if reorder else [])]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "--reorder-batch-size: has no effect without --reorder presample" in err, err
    assert not out.exists()
    if reorder == "sj":  # the same command with presample writes the reordered dataset
        assert main([*argv[:-1], "presample", "--reorder-fanouts", "2,2"]) == 0
        assert (out / "meta.json").is_file()


@pytest.mark.parametrize("score", ["degree", "wrpr", "sj"])
def test_fanouts_are_refused_where_the_score_reads_none(score, tmp_path, capsys):
    """``reorder --fanouts`` and ``prepare --reorder-fanouts`` are read by sj (their number),
    sj_fanout and presample only: one line for the other scores, nothing written; taken by sj,
    whose layers follow their number."""
    import numpy as np

    import gnnio
    from gnnio.preprocess.hotness import compute_score
    from gnnio.preprocess.reorder import order_by_score
    from tests.helpers import write_tiny_dataset

    src = write_tiny_dataset(tmp_path / "d", num_nodes=64, num_edges=400)
    out = tmp_path / "r"
    argv = ["reorder", str(src), "--by", score, "--fanouts", "3,2", "--out", str(out), "--quiet"]
    prep = ["prepare", "synthetic", "--num-nodes", "256", "--avg-degree", "4", "--feat-dim", "4",
            "--num-classes", "2", "--out", str(tmp_path / "p"), "--quiet", "--reorder", score,
            "--reorder-fanouts", "3,2"]  # fmt: skip
    if score != "sj":
        for cmd, opt in ((argv, "--fanouts"), (prep, "--reorder-fanouts")):
            assert main(cmd) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1, err
            assert f"{opt}: has no effect without --" in err and "sj_fanout" in err, err
        assert not out.exists() and not (tmp_path / "p").exists()
        return
    assert main(argv) == 0 and main(prep) == 0
    got = np.asarray(gnnio.load(out).extra["new2old"])
    two = compute_score("sj", gnnio.load(src), fanouts=[3, 2], progress=False)
    np.testing.assert_array_equal(got, order_by_score(two))
    three = compute_score("sj", gnnio.load(src), fanouts=[15, 10, 5], progress=False)
    assert not np.array_equal(order_by_score(three), got)  # (two layers, not the default three)


@pytest.mark.parametrize(
    "extra,line",
    [
        ("--layer-size 16", "--layer-size: has no effect without --sampler ladies"),
        ("--sampler labor --layer-size 16", "--layer-size: has no effect without --sampler ladies"),
        ("--graph-in host", "--graph-in: has no effect without --device cuda"),
        ("--graph-in gpu --sampler ladies", "--graph-in: has no effect without --device cuda"),
    ],
)
def test_bench_sampling_refuses_what_its_sampler_or_device_ignores(extra, line, tmp_path, capsys):
    """``bench sampling --layer-size`` is LADIES' and ``--graph-in`` the GPU's (the JSON said
    null for them): one line where nothing reads them; taken where something does."""
    from tests.helpers import write_tiny_dataset

    d = write_tiny_dataset(tmp_path / "d", num_nodes=200, num_edges=1200)
    base = ["bench", "sampling", str(d), "--fanouts", "3,3", "--batch-size", "16", "--batches",
            "1", "--passes", "1", "--warmup", "0", "--no-progress", "--json"]  # fmt: skip
    assert main([*base, *extra.split()]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and line in err, err
    assert main([*base, "--sampler", "ladies", "--layer-size", "16"]) == 0
    assert '"layer_size": 16' in capsys.readouterr().out


def test_bench_locality_refuses_a_layer_size_its_node_wise_sampler_ignores(tmp_path, capsys):
    """``bench locality --layer-size`` is LADIES' (README: an option that would have no effect is
    one line): with the default node-wise sampler it was taken and ignored; with ``--sampler
    ladies`` it is the layer size, 8192 when not given."""
    from tests.helpers import write_tiny_dataset

    d = write_tiny_dataset(tmp_path / "d", num_nodes=200, num_edges=1200)
    base = ["bench", "locality", str(d), "--fanouts", "3,3", "--batch-size", "16", "--batches",
            "1", "--scales", "1,2", "--no-progress", "--json"]  # fmt: skip
    assert main([*base, "--layer-size", "16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--layer-size: has no effect without --sampler ladies" in err
    assert main([*base, "--sampler", "ladies", "--layer-size", "16"]) == 0
    assert '"layer_size": 16' in capsys.readouterr().out
    assert main([*base, "--sampler", "ladies"]) == 0
    assert '"layer_size": 8192' in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra,line",
    [
        ("--method random --base metis", "--base: has no effect without --method hdr"),
        ("--method metis --hops 3", "--hops: has no effect without bfs-block"),
        ("--method hdr --hops 3", "--hops: has no effect without bfs-block"),
    ],
)
def test_partition_refuses_what_its_method_ignores(extra, line, tmp_path, capsys):
    """``--base`` is hdr's and ``--hops`` bfs-block's (as the method or hdr's base): with another
    method they were taken and ignored; one line now, and taken where the method reads them."""
    from tests.helpers import write_tiny_dataset

    d = write_tiny_dataset(tmp_path / "d", num_nodes=200, num_edges=1200)
    base = ["partition", str(d), "--parts", "2", "--fanouts", "3,3", "--batch-size", "16",
            "--quiet"]  # fmt: skip
    assert main([*base, *extra.split(), "--out", str(tmp_path / "p0")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and line in err, err
    assert not (tmp_path / "p0").exists()
    ok = ["--method hdr --base bfs-block --hops 3", "--method bfs-block --hops 1", "--method hdr"]
    for i, taken in enumerate(ok, 1):
        assert main([*base, *taken.split(), "--out", str(tmp_path / f"p{i}")]) == 0


@pytest.mark.parametrize(
    "extra,line",
    [
        ("--strategies mod,random --alpha 0.5", "--alpha: has no effect without alg1"),
        ("--strategies alg1 --replicate 0.2", "--replicate: has no effect without interleaved"),
        ("--strategies alg1 --pagraph-max-nodes 5", "--pagraph-max-nodes: has no effect without"),
    ],
)
def test_plan_refuses_what_no_strategy_given_reads(extra, line, tmp_path, capsys):
    """``--alpha`` is alg1's, ``--replicate`` interleaved's, ``--pagraph-max-nodes`` pagraph's:
    without their strategy they were taken and ignored; one line now, taken with it."""
    from tests.helpers import write_tiny_dataset

    d = write_tiny_dataset(tmp_path / "d", num_nodes=200, num_edges=1200)
    base = ["plan", str(d), "--topology", "2", "--fanouts", "3,3", "--batch-size", "16", "--json"]
    assert main([*base, *extra.split()]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and line in err, err
    taken = (
        "--strategies alg1,interleaved,pagraph --alpha 0.5 --replicate 0.2 --pagraph-max-nodes 5"
    )
    assert main([*base, *taken.split()]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "pagraph" in out["skipped"]  # (200 nodes: above the cap of 5)


def test_bench_locality_refuses_a_negative_q_size_first_naming_it(tmp_path, capsys):
    """``--q-size -1`` was refused only after the dataset was read and B's score computed, as
    ``las_sets: size must be >= 0``, not naming the option; now before any work (a missing
    dataset is not reached), in one line naming ``--q-size``."""
    base = ["bench", "locality", str(tmp_path / "missing"), "--no-progress"]
    assert main([*base, "--q-size", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--q-size must be >= 0, got -1" in err, err


@pytest.mark.parametrize("scales", ["2,1e308", "5e-324", "1.01e200"])
def test_bench_locality_refuses_a_scale_past_the_samplers_range(scales, tmp_path, capsys):
    """``--scales 1e308``: Eq. 8's sums overflowed -- locality-aware LADIES' layers came out empty
    (host bytes 0, as if B held everything), the node-wise kernel divided by zero (a traceback);
    one line naming ``--scales`` now, before any work (the dataset is missing)."""
    base = ["bench", "locality", str(tmp_path / "missing"), "--no-progress"]
    assert main([*base, "--sampler", "ladies", "--scales", scales]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--scales: each must be a number in [1e-200, 1e200]" in err


@pytest.mark.parametrize("cmd", [["plan", "{d}", "--topology", "2", "--strategies", "pagraph"],
                                 ["bench", "placement", "--dataset", "{d}"]])  # fmt: skip
def test_a_negative_pagraph_cap_is_refused_in_one_line(cmd, tmp_path, capsys):
    """``--pagraph-max-nodes -1`` skipped pagraph on every graph, silently (a graph has at
    least 0 nodes); one line naming the option now, before any work (the dataset is missing)."""
    argv = [a.format(d=tmp_path / "missing") for a in cmd]
    assert main([*argv, "--pagraph-max-nodes", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--pagraph-max-nodes: must be >= 0" in err, err
