"""The options of ``gnnio bench sampling|loader|step``, ``gnnio plan`` and ``gnnio info`` reach
what they configure, and their range checks sit at the documented edges (found by a mutation pass
over the CLI's option handling: each test here fails when an option is dropped on its way)."""

from __future__ import annotations

import json

import pytest
import torch

from gnnio.cli.main import build_parser, main
from tests.helpers import flip_unsampled_byte, write_tiny_dataset


class Stop(Exception):
    """Raised by a spy once it has seen what it was called with."""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("opts") / "d", num_nodes=40, num_edges=160)


def _bench_json(argv, capsys) -> dict:
    assert main([*argv, "--quiet", "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


SAMPLING = ["bench", "sampling", "--batches", "2", "--batch-size", "4", "--passes", "1",
            "--warmup", "0", "--threads", "1", "--fanouts", "3,2"]  # fmt: skip


def test_bench_sampling_seed_and_defaults_reach_the_sampler(tiny, capsys, monkeypatch):
    """``--seed`` changes the sampled batches (their checksum); ``--sampler ladies`` without
    ``--layer-size`` samples 8192 per layer, as the help says; ``--locality-scale`` without
    ``--gpu-cache-fraction`` takes B as the top 0.1 of the nodes."""
    from gnnio.features.tiers.tiered import hot_rows_for_fraction

    argv = [*SAMPLING[:2], str(tiny), *SAMPLING[2:]]
    a = _bench_json(argv, capsys)
    b = _bench_json([*argv, "--seed", "1"], capsys)
    assert a["checksum"] != b["checksum"]
    # the seed of both the seed order and the sampler; --threads: torch's pool too
    import torch

    import gnnio.bench.sampling as bsm

    seen, before = {}, torch.get_num_threads()
    want = 1 if before != 1 else 2

    def spy(name, real):
        def f(*a, **k):
            seen[name] = a
            return real(*a, **k)

        return f

    for name in ("fixed_batches", "make_sampler"):
        monkeypatch.setattr(bsm, name, spy(name, getattr(bsm, name)))
    try:
        _bench_json([*argv, "--seed", "3", "--threads", str(want)], capsys)
        threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert (seen["fixed_batches"][3], seen["make_sampler"][4], threads) == (3, 3, want)
    assert _bench_json([*argv, "--sampler", "ladies"], capsys)["layer_size"] == 8192
    las = _bench_json([*argv, "--locality-scale", "2"], capsys)
    assert las["hot_rows"] == hot_rows_for_fraction(0.1, 40)
    p = _bench_json([*argv, "--prune-threshold", "2,0"], capsys)["prune_thresholds"]
    assert p is not None and p != _bench_json([*argv, "--prune-threshold"], capsys)[
        "prune_thresholds"]  # fmt: skip


SAMPLING_EDGES = [
    ("--locality-scale 2 --gpu-cache-fraction 0", "--gpu-cache-fraction: must be in (0, 1]"),
    ("--locality-scale inf", "--locality-scale: must be a number in [1e-200, 1e200]"),
    ("--locality-scale 0", "--locality-scale: must be a number in [1e-200, 1e200]"),
    # (Eq. 8's sums overflowed: LADIES' layers came out empty, the node-wise kernel a traceback)
    ("--sampler ladies --locality-scale 1e308", "--locality-scale: must be a number in [1e-200"),
    ("--locality-scale 1.01e200", "--locality-scale: must be a number in [1e-200, 1e200]"),
    ("--locality-scale 5e-324", "--locality-scale: must be a number in [1e-200, 1e200]"),
    ("--prune-threshold 0,0", "--prune-threshold: needs ALPHA,BETA"),
    ("--prune-threshold 1.1e9,1", "--prune-threshold: needs ALPHA,BETA"),
    ("--sampler labor --prune-threshold", "--prune-threshold: works with --sampler uniform"),
    ("--sampler ladies --layer-size 0", "--layer-size must be >= 1"),
    ("--batches 0", "--batches must be >= 1"),
    ("--gpu-cache-fraction 0.2", "--gpu-cache-fraction: only with --locality-scale"),
]


@pytest.mark.parametrize("extra,words", SAMPLING_EDGES, ids=[e[0] for e in SAMPLING_EDGES])
def test_bench_sampling_refuses_the_first_value_outside(extra, words, tiny, capsys):
    assert main(["bench", "sampling", str(tiny), *extra.split(), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err


def test_bench_sampling_takes_the_last_value_inside(tiny, capsys):
    argv = [*SAMPLING[:2], str(tiny), *SAMPLING[2:]]
    out = _bench_json([*argv, "--locality-scale", "2", "--gpu-cache-fraction", "1"], capsys)
    assert out["hot_rows"] == 40
    want = "cuda" if torch.cuda.is_available() else "cpu"  # (LADIES has a GPU path too)
    assert _bench_json([*argv, "--sampler", "ladies", "--device", "auto"], capsys)["device"] == want


def test_bench_loader_passes_its_options_to_the_loader(tiny, capsys, monkeypatch):
    """``--prefetch``, ``--workers``, ``--store``, ``--seed`` reach the loader, the store, the order
    and the sampler; ``--batches`` beyond an epoch runs the epoch's batches, and says so."""
    import gnnio.bench.loader as bl
    import gnnio.features
    import gnnio.pipeline.loader
    import gnnio.sampling

    seen = {}

    def spy(name, real):
        def f(*a, **k):
            seen[name] = (a, k)
            return real(*a, **k)

        return f

    monkeypatch.setattr(gnnio.pipeline.loader, "NodeLoader", spy("loader", gnnio.pipeline.loader.NodeLoader))  # fmt: skip
    monkeypatch.setattr(gnnio.features, "open_store", spy("store", gnnio.features.open_store))
    monkeypatch.setattr(gnnio.sampling, "UniformSampler", spy("sampler", gnnio.sampling.UniformSampler))  # fmt: skip
    monkeypatch.setattr(bl, "make_order", spy("order", bl.make_order))
    argv = ["bench", "loader", str(tiny), "--batch-size", "4", "--batches", "50", "--passes", "1",
            "--warmup", "0", "--threads", "1", "--fanouts", "2", "--prefetch", "3", "--workers",
            "2", "--store", "mmap", "--seed", "5"]  # fmt: skip
    out = _bench_json(argv, capsys)
    assert {k: seen["loader"][1][k] for k in ("prefetch", "num_workers")} == {
        "prefetch": 3, "num_workers": 2}  # fmt: skip
    assert seen["store"][1]["kind"] == "mmap" and out["store"] == "mmap"
    assert seen["sampler"][1]["seed"] == 5 and seen["order"][0][2] == 5
    assert out["batches"] == 3  # ceil(10 training nodes / 4): one epoch's, not 50
    argv[argv.index("50")] = "2"
    assert _bench_json(argv, capsys)["batches"] == 2  # the first 2 of the 3


@pytest.mark.parametrize("extra", ["--prefetch 0", "--workers 0"])
def test_bench_loader_refuses_zero_prefetch_or_workers(extra, tiny, capsys):
    assert main(["bench", "loader", str(tiny), *extra.split(), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--prefetch and --workers must be >= 1" in err, err


def test_bench_step_passes_batches_warmup_and_threads(tiny, monkeypatch):
    """``--batches`` and ``--warmup`` reach the timed passes, ``--threads`` torch's pool."""
    import torch

    import gnnio.bench.step as bs

    def spy(parts, device, warmup, k, progress):
        raise Stop(warmup, k, torch.get_num_threads())

    monkeypatch.setattr(bs, "pipelined", spy)
    monkeypatch.setattr(bs, "device_rates", lambda device: {})
    before = torch.get_num_threads()
    want = 1 if before != 1 else 2  # (a value it does not have)
    args = build_parser().parse_args(["bench", "step", str(tiny), "--device", "cpu", "--fanouts",
                                      "2", "--batches", "4", "--warmup", "2", "--threads", str(want),
                                      "--quiet"])  # fmt: skip
    try:
        with pytest.raises(Stop) as e:
            bs.run(args)
    finally:
        torch.set_num_threads(before)
    assert e.value.args == (2, 4, want)


def test_bench_step_refuses_several_processes(tmp_path, capsys):
    assert main(["bench", "step", str(tmp_path / "none"), "--nproc", "2", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bench step: one process" in err, err


STEP = ["--device", "cpu", "--fanouts", "3", "--batch-size", "8", "--hidden", "4", "--batches", "1",
        "--warmup", "0"]  # fmt: skip


def _step(tiny, extra, capsys) -> dict:
    return _bench_json(["bench", "step", str(tiny), *STEP, *extra], capsys)


def test_bench_step_isolation_auto_is_applied_and_recorded(tiny, capsys, monkeypatch):
    """``--isolation auto`` profiles the stages and times the loop under the threads it gives
    them (the result's ``isolation``: the allocation, as in gnnio train's summary); ``off``, the
    default: null, every stage at its default threads."""
    import torch

    import gnnio.bench.step as bs

    seen, real = [], bs.pipelined

    def spy(parts, device, warmup, k, progress):
        seen.append((getattr(parts.sampler, "num_threads", None), torch.get_num_threads()))
        return real(parts, device, warmup, k, progress)

    monkeypatch.setattr(bs, "pipelined", spy)
    threads = torch.get_num_threads()
    r = _step(tiny, ["--isolation", "auto"], capsys)
    iso = r["isolation"]
    assert iso is not None and set(iso["threads"]) == {"sample", "gather", "compute"}, iso
    assert all(isinstance(v, int) and v >= 1 for v in iso["threads"].values()), iso
    if seen[0][0] is not None:  # timed under the allocation, not beside it
        assert seen[0] == (iso["threads"]["sample"], iso["threads"]["compute"])
    assert torch.get_num_threads() == threads  # put back after the run
    for extra in ([], ["--isolation", "off"]):
        assert _step(tiny, extra, capsys)["isolation"] is None


def test_bench_step_heap_option_is_applied_and_recorded(tiny, capsys, monkeypatch):
    """``--heap system`` leaves glibc's malloc as it is where ``auto`` would keep freed memory
    (the CPU, features in memory), ``--heap keep`` keeps it where ``auto`` would not (features
    on disk); the result's ``heap`` says which held while the step was timed."""
    from gnnio.utils import heap

    calls = []
    monkeypatch.setattr(heap, "keep_heap", lambda: calls.append("keep") or "kept")
    for extra, want in ((["--heap", "system"], "system"),
                        (["--heap", "keep", "--features-on", "disk"], "kept")):  # fmt: skip
        calls.clear()
        assert _step(tiny, extra, capsys)["heap"] == want, extra
        assert calls == (["keep"] if want == "kept" else []), extra


INVALID = [
    ("--model gcn --edge-weight-norm sum", "--edge-weight-norm sum: applies to --model sage, not gcn"),
    ("--lr 0", "--lr: must be in (0, 1e9], got 0.0"),
    ("--weight-decay -1", "--weight-decay: must be in [0, 1e9], got -1.0"),
    ("--stall-timeout 0", "--stall-timeout: must be > 0 seconds, got 0.0"),
]  # fmt: skip


@pytest.mark.parametrize("extra,words", INVALID, ids=[i[0] for i in INVALID])
def test_bench_step_refuses_what_train_refuses_in_one_line(extra, words, tiny, capsys):
    """``gnnio bench step`` checks its configuration as ``gnnio train`` does
    (``TrainConfig.validate``): one line, nothing timed. Without the check the first two were
    timed under a configuration train refuses, the last two ended in a traceback."""
    argv = ["bench", "step", str(tiny), *STEP, *extra.split(), "--quiet", "--json"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and words in err, err


def test_bench_step_verify_without_dir_checks_every_byte_of_the_built_in_dataset(
    tmp_path, monkeypatch, capsys
):
    """``bench step --verify`` without DIR recomputes every sha256 of the built-in dataset (the
    help: 'recompute every array's sha256'), as it does for a DIR given: a byte flipped outside
    the blocks an open samples is found with it and not without."""
    from gnnio.train import defaults

    monkeypatch.setenv("GNNIO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(defaults, "DEFAULT_DATASET", {"num_nodes": 2048, "avg_degree": 4,
                        "feat_dim": 128, "num_classes": 3, "seed": 0})  # fmt: skip
    f = defaults.default_dataset(progress=False).path / "features.npy"
    flip_unsampled_byte(f)
    argv = ["bench", "step", "--fanouts", "2,2", "--batch-size", "16", "--hidden", "8",
            "--batches", "1", "--warmup", "0", "--device", "cpu", "--quiet"]  # fmt: skip
    assert main([*argv, "--verify"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "features.npy" in err and "sha256" in err, err
    assert main(argv) == 0  # (the sampled check does not see the byte: only --verify does)


def test_bench_step_warmup_default_is_three_and_recorded(tiny, capsys, monkeypatch):
    """Without ``--warmup`` each pass starts after 3 untimed batches (the documented default,
    the one docs/benchmarks.md's runs name), and the result says how many (``warmup``)."""
    import gnnio.bench.step as bs

    seen = []

    def spy(name):
        real = getattr(bs, name)

        def f(parts, device, warmup, k, progress):
            seen.append((name, warmup))
            return real(parts, device, warmup, k, progress)

        return f

    for name in ("pipelined", "sequential"):
        monkeypatch.setattr(bs, name, spy(name))
    argv = ["bench", "step", str(tiny), *STEP[:-2]]  # (STEP without its --warmup 0)
    assert _bench_json(argv, capsys)["warmup"] == 3
    assert seen == [("pipelined", 3), ("sequential", 3)]
    assert _bench_json([*argv, "--warmup", "1"], capsys)["warmup"] == 1


def test_plan_passes_its_options_to_the_planner(tiny, monkeypatch, tmp_path):
    """Every ``gnnio plan`` option reaches :func:`make_plan`: the strategies, fanouts, batch
    size, score, alpha, replicate, seed, trace epochs, local seeds, the pagraph limit, the
    buffer and both bandwidth overrides, and no progress bars under ``--json``."""
    import gnnio.cli.plan as cp
    import gnnio.preprocess.chunked as ch

    def spy(ds, topo, bsize, **kw):
        raise Stop(topo, bsize, kw)

    budgets = []
    real_budget = ch.resolve_budget
    monkeypatch.setattr(ch, "resolve_budget", lambda *a: budgets.append(a) or real_budget(*a))
    monkeypatch.setattr(cp, "make_plan", spy)
    argv = ["plan", str(tiny), "--topology", "2", "--buffer", "0.25", "--fanouts", "3,2",
            "--batch-size", "8", "--strategies", "alg1,interleaved,pagraph,random", "--score", "degree", "--alpha",
            "0.5", "--replicate", "0.2", "--host-bw", "7GB/s", "--peer-bw", "9GB/s",
            "--local-seeds", "--pagraph-max-nodes", "5", "--trace-epochs", "2", "--seed", "3",
            "--json"]  # fmt: skip
    with pytest.raises(Stop) as e:
        cp.run(build_parser().parse_args(argv))
    topo, bsize, kw = e.value.args
    assert bsize == 10  # 0.25 of 40 nodes
    assert (topo.host_bw, topo.peer_bw) == (7e9, 9e9)
    assert kw["strategies"] == ["alg1", "interleaved", "pagraph", "random"] and list(
        kw["fanouts"]
    ) == [3, 2]
    want = {"batch_size": 8, "score": "degree", "alpha": 0.5, "replicate": 0.2, "seed": 3,
            "trace_epochs": 2, "local_seeds": True, "pagraph_max_nodes": 5, "progress": False}  # fmt: skip
    assert {k: kw[k] for k in want} == want
    assert budgets == [(None, True)]  # no metis: half the available RAM by default
    with pytest.raises(Stop):
        cp.run(build_parser().parse_args([*argv[:10], "--strategies", "metis", "--json"]))
    assert budgets[-1] == (None, False)  # metis runs in memory: in RAM


def test_info_verify_says_so_and_json_is_one_document(tiny, capsys):
    assert main(["info", str(tiny), "--verify"]) == 0
    assert "verified    checksums OK, no NaN/Inf in features" in capsys.readouterr().out
    assert main(["info", str(tiny)]) == 0
    assert "verified" not in capsys.readouterr().out
    assert main(["info", str(tiny), "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and json.loads(out)["num_nodes"] == 40


PLAN_REFUSED = [
    ("--local-seeds --strategies alg1,mod", "--local-seeds: has no effect without a partitioning"),
    ("--score nosuch", "--score: unknown score 'nosuch' (choose from degree, out_degree"),
    ("--trace-epochs 0", "--trace-epochs: must be >= 1"),
    ("--batch-size 0", "--batch-size: must be >= 1"),
]


@pytest.mark.parametrize("extra,words", PLAN_REFUSED, ids=[p[0] for p in PLAN_REFUSED])
def test_plan_refuses_in_one_line_before_opening_the_dataset(extra, words, tmp_path, capsys):
    """``--local-seeds`` reads a partitioning's parts: with none among ``--strategies`` it was
    taken and ignored; an unknown ``--score`` was refused only after the dataset was read, in a
    line that did not name the option."""
    argv = ["plan", str(tmp_path / "none"), "--topology", "2", *extra.split()]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err


def test_plan_save_binds_the_placement_to_its_dataset(tiny, tmp_path, capsys):
    """``--save FILE`` writes the best placement bound to the dataset it was planned on (name and
    fingerprint: ``gnnio train --placement`` refuses it for another), and ``--json`` says where."""
    import gnnio
    from gnnio.placement import load_placement

    f = tmp_path / "p.npz"
    argv = ["plan", str(tiny), "--topology", "2", "--strategies", "mod", "--fanouts", "2",
            "--batch-size", "8", "--save", str(f), "--json", "--quiet"]  # fmt: skip
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["saved"] == str(f)
    ds = gnnio.load(tiny)
    params = load_placement(f).params
    assert (params["dataset"], params["dataset_fingerprint"]) == (ds.name, ds.fingerprint)


def test_a_bench_is_left_out_only_when_its_own_module_is_missing(monkeypatch):
    """A benchmark module not in this build is left out of ``gnnio bench``; one whose import
    fails on a missing dependency fails the command (it does not vanish from the list)."""
    import importlib

    real = importlib.import_module

    def missing(what):
        def imp(name, *a):
            if name == "gnnio.bench.gather":
                raise ModuleNotFoundError(f"No module named '{what}'", name=what)
            return real(name, *a)

        return imp

    monkeypatch.setattr(importlib, "import_module", missing("gnnio.bench.gather"))
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    kinds = next(a for a in sub.choices["bench"]._actions if a.dest == "bench").choices
    assert "gather" not in kinds and "sampling" in kinds
    monkeypatch.setattr(importlib, "import_module", missing("some_dependency"))
    with pytest.raises(ModuleNotFoundError, match="some_dependency"):
        build_parser()


@pytest.mark.parametrize("n,want", [(50, 3), (3, 3), (2, 2)])
def test_first_batches_counts_what_it_yields(n, want):
    """``bench loader``'s order (the first ``--batches`` of each epoch) says as many batches as it
    yields (``len`` of the loader over it): never more than the epoch has."""
    import torch

    from gnnio.bench.loader import FirstBatches
    from gnnio.ordering import RandomOrder

    order = RandomOrder(torch.arange(10), 4, seed=0)
    first = FirstBatches(order, n)
    got = list(first.batches(0))
    assert first.num_batches == len(got) == want
    assert all(torch.equal(a, b) for a, b in zip(got, order.batches(0)))


@pytest.mark.parametrize("cmd", [["bench", "placement", "--dataset"], ["plan"]])
def test_placement_on_a_dataset_without_a_train_split_is_one_line(cmd, tmp_path, capsys):
    """``bench placement --dataset D --score degree`` (a score that reads no training nodes) on a
    dataset without a train split: one line, as ``plan`` says it (it was a TypeError traceback
    from the access trace; found by the type check)."""
    import numpy as np

    from gnnio.graph import DatasetWriter
    from gnnio.graph.csr import edges_to_csr

    indptr, indices = edges_to_csr(np.array([0, 1, 2]), np.array([1, 2, 0]), 3)
    with DatasetWriter(tmp_path / "nosplit", name="x") as w:
        w.save_array("indptr", indptr)
        w.save_array("indices", indices)
        w.save_array("features", np.zeros((3, 2), np.float32))
    extra = ["--topology", "2"] if cmd == ["plan"] else ["--no-progress"]
    assert main([*cmd, str(tmp_path / "nosplit"), "--score", "degree", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.endswith(
        "has no training nodes; placement needs them to model reads"
    )


def _unlabeled(out, train_only: bool = False):
    """A dataset of 30 nodes with no labels and no splits (``train_only``: labels and a train
    split, no valid or test split)."""
    import numpy as np

    from gnnio.graph import DatasetWriter, edges_to_csr

    rng = np.random.default_rng(0)
    indptr, indices = edges_to_csr(rng.integers(0, 30, 90), rng.integers(0, 30, 90), 30)
    with DatasetWriter(out, name="nolabels") as w:
        w.save_array("indptr", indptr)
        w.save_array("indices", indices)
        w.save_array("features", rng.standard_normal((30, 4)).astype(np.float32))
        if train_only:
            w.save_array("labels", np.arange(30, dtype=np.int64) % 3)
            w.save_array("train_idx", np.arange(12, dtype=np.int64))
    return out


def test_bench_step_on_a_dataset_with_only_a_train_split(tmp_path, capsys):
    """``bench step`` times training batches only: on a dataset with labels and a train split but
    no valid or test split (which format.md says can be benchmarked) it ended in a TypeError
    traceback from an evaluation loader over the missing split."""
    d = str(_unlabeled(tmp_path / "d", train_only=True))
    r = _bench_json(["bench", "step", d, "--fanouts", "2,2", "--batch-size", "4", "--device",
                     "cpu", "--batches", "2", "--warmup", "0"], capsys)  # fmt: skip
    assert r["ms_per_batch"] > 0


@pytest.mark.parametrize("bench", ["step", "hotness"])
def test_a_dataset_without_labels_is_one_line_naming_what_needs_them(bench, tmp_path, capsys):
    """A dataset without labels benchmarks (format.md), except where the bench trains or
    pre-samples the labeled nodes: ``bench step`` on one ended in a TypeError traceback (exit 1)
    from the loop's label tensor; ``bench hotness`` refused it as 'benchmarked but not trained'."""
    _unlabeled(tmp_path / "d")
    argv = ["bench", bench, str(tmp_path / "d"), "--fanouts", "2,2", "--batch-size", "4",
            "--quiet", "--json"]  # fmt: skip
    assert main([*argv, "--device", "cpu", "--batches", "1"] if bench == "step" else argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "no labels" in err, err
    assert f"bench {bench}" in err and "benchmarked but not trained" not in err, err


def test_bench_cache_on_a_dataset_without_labels(tmp_path, capsys):
    """``bench cache`` on a dataset without labels ended in an IndexError traceback (the random
    order's shuffling error indexed the missing labels): it runs with ``shuffling_error`` null,
    and the PO order, whose bound needs the labels, is one line naming --orders random."""
    d = str(_unlabeled(tmp_path / "d"))
    argv = ["bench", "cache", d, "--fanouts", "2,2", "--batch-size", "4", "--batches", "3",
            "--warmup", "0", "--sizes", "0.1", "--policies", "fifo", "--eta-batch-sizes", "4"]  # fmt: skip
    r = _bench_json([*argv, "--orders", "random"], capsys)
    assert r["orders"]["random"]["shuffling_error"] is None and r["hit_ratio"]["fifo+random"]
    assert main([*argv, "--quiet", "--json"]) == 2  # (the default orders: random,po)
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "--orders random" in err, err
