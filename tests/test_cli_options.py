"""Every ``gnnio train`` option (``gnnio bench step`` takes the same ones) reaches the
:class:`~gnnio.train.TrainConfig` field it configures with the value given, not the default; an
option left out keeps the documented default. (Most training tests build a TrainConfig directly,
so an option dropped between the parser and the config went unnoticed by them.)"""

from __future__ import annotations

import pytest
import torch

from gnnio.cli.main import build_parser
from gnnio.cli.train import refuse_ignored
from gnnio.cli.train_config import config_from_args
from gnnio.train import TrainConfig

#: (options, ranks, {field: value}): each value differs from TrainConfig's default
GIVEN = [
    ("--model gcn", 1, {"model": "gcn"}),
    ("--fanouts 4,3", 1, {"fanouts": (4, 3)}),
    ("--batch-size 64", 1, {"batch_size": 64}),
    ("--epochs 3", 1, {"epochs": 3}),
    ("--lr 0.05", 1, {"lr": 0.05}),
    ("--weight-decay 0.01", 1, {"weight_decay": 0.01}),
    ("--hidden 32", 1, {"hidden": 32}),
    ("--dropout 0.25", 1, {"dropout": 0.25}),
    ("--model gat --heads 2", 1, {"heads": 2}),
    ("--feature-norm row", 1, {"feature_norm": "row"}),
    ("--edge-weight-norm sum", 1, {"edge_weight_norm": "sum"}),
    ("--seed 7", 1, {"seed": 7}),
    ("--eval full", 1, {"eval": "full"}),
    ("--eval-batch-size 99", 1, {"eval_batch_size": 99}),
    ("--patience 4", 1, {"patience": 4}),
    ("--store mmap", 1, {"store": "mmap"}),
    ("--threads 3", 1, {"threads": 3}),
    ("--heap system", 1, {"heap": "system"}),
    ("--isolation auto", 1, {"isolation": "auto"}),
    ("--cuda-graph step", 1, {"cuda_graph": "step"}),
    ("--cuda-graph", 1, {"cuda_graph": "all"}),
    ("--sampler-device cpu", 1, {"sampler_device": "cpu"}),
    ("--graph-in host", 1, {"graph_in": "host"}),
    ("--quiet", 1, {"progress": False}),
    ("--gpu-cache-fraction 0.3 --gpu-budget 2KiB", 1,
     {"gpu_cache_fraction": 0.3, "gpu_budget_bytes": 2048}),
    ("--gpu-cache-fraction 0.3 --score degree", 1, {"score": "degree"}),
    ("--cache-policy static --score sj", 1, {"score": "sj"}),
    ("--placement P.npz --reader 1", 1, {"placement": "P.npz", "reader": 1}),
    ("--cache-policy lru --cache-size 0.2 --cpu-cache-size 0.3", 1,
     {"cache_policy": "lru", "cache_size": 0.2, "cpu_cache_size": 0.3}),
    ("--features-on disk --host-cache-size 0.4", 1, {"store": "disk", "host_cache_size": 0.4}),
    ("--cache-policy lookahead --lookahead 5", 1, {"lookahead": 5}),
    ("--order po --po-sequences 6", 1, {"order": "po", "po_sequences": 6}),
    ("--sampler ladies --layer-size 100", 1, {"sampler": "ladies", "layer_size": 100}),
    ("--locality-scale 2.5", 1, {"locality_scale": 2.5}),
    ("--locality-scale auto --locality-max-scale 3 --locality-compute-s 0.5", 1,
     {"locality_scale": "auto", "locality_max_scale": 3.0, "locality_compute_s": 0.5}),
    ("--prune-threshold 2,0.5", 1, {"prune_threshold": (2.0, 0.5)}),
    ("--prune-threshold", 1, {"prune_threshold": (1.0, 1.0)}),
    ("--summary S.json --log L.jsonl --checkpoint M.pt", 1,
     {"summary": "S.json", "log": "L.jsonl", "checkpoint": "M.pt"}),
    ("--checkpoint-dir C --checkpoint-every 3", 1, {"checkpoint_dir": "C", "checkpoint_every": 3}),
    ("--resume C", 1, {"resume": "C"}),
    ("--stall-timeout 30", 1, {"stall_timeout": 30.0}),
    ("--nproc 2 --topology 2 --placement-strategy mod --buffer 0.3 --no-reuse --dist-timeout 9",
     2, {"nproc": 2, "topology": "2", "placement_strategy": "mod", "buffer": 0.3,
         "reuse": False, "dist_timeout": 9.0, "store": "mmap"}),
    ("--nproc 2 --local-seeds --partition PD --sampling-mode shared", 2,
     {"local_seeds": True, "partition": "PD", "sampling_mode": "shared"}),
]  # fmt: skip


def _cfg(extra: str, ranks: int):
    args = build_parser().parse_args(["train", "d", *extra.split()])
    refuse_ignored(args, ranks)  # (each combination is one gnnio train takes)
    return config_from_args(args, ranks)


@pytest.mark.parametrize("extra,ranks,want", GIVEN, ids=[g[0] for g in GIVEN])
def test_each_option_reaches_its_config_field(extra, ranks, want):
    for field, value in want.items():  # (the table is only a test where it differs)
        assert getattr(TrainConfig, field) != value, field
    cfg = _cfg(extra, ranks)
    assert {k: getattr(cfg, k) for k in want} == want


def test_options_left_out_keep_the_documented_defaults():
    """No option given: every field is TrainConfig's default (``device`` resolved from auto,
    ``progress`` on), so a parser default that drifted from the config's shows here."""
    cfg = _cfg("", 1)
    skip = {"device", "attn_dropout", "prefetch"}  # (resolved / not a train option)
    fields = [f for f in TrainConfig.__dataclass_fields__ if f not in skip]
    got = {f: getattr(cfg, f) for f in fields}
    assert got == {f: getattr(TrainConfig, f) for f in fields}


def test_a_fraction_of_0_is_given_not_left_out():
    """``--cpu-cache-size 0`` and ``--host-cache-size 0`` are values (no second level, no
    host cache), not 'unset': taken as 0.0, never replaced by a default."""
    cfg = _cfg("--cache-policy lru --cpu-cache-size 0 --cache-size 0", 1)
    assert (cfg.cpu_cache_size, cfg.cache_size) == (0.0, 0.0)
    assert _cfg("--features-on disk --host-cache-size 0", 1).host_cache_size == 0.0


REFUSED = [
    ("--cpu-cache-size 0.2", "--cpu-cache-size: has no effect without --cache-policy"),
    ("--cache-policy lru --lookahead 4", "--lookahead: has no effect without --cache-policy lookahead"),
    ("--host-cache-size 0.1", "--host-cache-size: has no effect without --features-on disk"),
    ("--features-on memory --host-cache-size 0.1", "--host-cache-size: has no effect without"),
    ("--cache-policy lru --features-on disk --cache-size 0.2", "--cache-size: has no effect without"),
    ("--gpu-budget 1GiB", "--gpu-budget: has no effect without --gpu-cache-fraction"),
    ("--heads 2", "--heads: has no effect without --model gat"),
    ("--order random --po-sequences 2", "--po-sequences: has no effect without --order po"),
    ("--reader 1", "--reader: has no effect without --placement FILE"),
    ("--nproc 2 --reader 1", "--reader: single-process only"),
    ("--features-on disk --store memory", "--store: not with --features-on disk"),
]  # fmt: skip


@pytest.mark.parametrize("extra,words", REFUSED, ids=[r[0] for r in REFUSED])
def test_an_option_that_would_do_nothing_is_one_line(extra, words, tmp_path, capsys):
    from gnnio.cli.main import main

    # refused before the dataset is opened: DIR need not exist
    assert main(["train", str(tmp_path / "none"), *extra.split(), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err


SEVERAL_RANKS = ["--partition PD", "--topology 2", "--placement-strategy mod", "--local-seeds"]


@pytest.mark.parametrize("extra", SEVERAL_RANKS)
def test_bench_step_refuses_the_options_of_several_ranks(extra, tmp_path, capsys):
    """``gnnio bench step`` is one process: the options only ranks read are one line, as in
    ``gnnio train`` without ``--nproc``, before the dataset is opened (they were taken and
    ignored: the time reported was a single process's under another configuration's name)."""
    from gnnio.cli.main import main

    assert main(["bench", "step", str(tmp_path / "none"), *extra.split(), "--quiet"]) == 2
    err = capsys.readouterr().err
    opt = extra.split()[0]
    assert err.count("\n") == 1 and f"{opt}: needs several ranks" in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("command", [["train"], ["bench", "step"]])
def test_device_cuda_without_cuda_fails_before_the_dataset(command, tmp_path, capsys):
    """``--device cuda`` where there is none fails fast: the device's line, not the missing
    DIR's (nor, without DIR, after the built-in dataset was generated)."""
    from gnnio.cli.main import main

    assert main([*command, str(tmp_path / "none"), "--device", "cuda", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "CUDA is not available" in err, err


def test_nproc_without_dir_launches_the_built_in_dataset_with_its_epochs(tmp_path, monkeypatch):
    """``gnnio train --nproc 2`` without DIR: the ranks get the built-in dataset's path (generated
    once, in the launcher) and its own default epochs, as one process would train it; and the
    launcher's timeout is ``--dist-timeout``."""
    import gnnio
    import gnnio.distributed.launch
    from gnnio.cli.train_dist import launch_ranks
    from tests.helpers import write_tiny_dataset

    ds = gnnio.load(write_tiny_dataset(tmp_path / "d"))
    seen = {}
    monkeypatch.setattr(gnnio.distributed.launch, "launch",
                        lambda n, entry, argv, timeout_s: seen.update(n=n, argv=argv, t=timeout_s))  # fmt: skip
    args = build_parser().parse_args(["train", "--nproc", "2", "--dist-timeout", "7", "--quiet"])
    args.argv, args.rank_entry = ["train", "--nproc", "2", "--dist-timeout", "7", "--quiet"], None
    cfg = config_from_args(args, 2)
    cfg.epochs = 10  # (as run() sets the built-in dataset's default)
    assert launch_ranks(args, cfg, ds) == 0
    assert seen == {"n": 2, "argv": [*args.argv, str(ds.path), "--epochs", "10"], "t": 7.0}


@pytest.mark.parametrize("command", ["train", "plan"])
def test_score_help_names_every_score_taken(command):
    """``--score``'s help lists every score the option takes (it had left out ``out_degree``,
    and ``gnnio plan``'s ``in_degree`` too)."""
    import re

    from gnnio.preprocess.hotness import SCORES

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    parser = sub.choices[command]
    text = next(a.help for a in parser._actions if "--score" in a.option_strings)
    named = set(re.findall(r"\b[a-z]+(?:_[a-z]+)*\b", text))
    assert set(SCORES) <= named, set(SCORES) - named
