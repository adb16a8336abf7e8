"""``TrainConfig.validate`` at the edges of every numeric range: the first value outside is
refused with one line naming the option, the last value inside is accepted."""

from __future__ import annotations

import math

import pytest

from gnnio.errors import UsageError
from gnnio.train import TrainConfig

INF, NAN = math.inf, math.nan

REFUSED = [
    ({"lr": 0.0}, "--lr"),
    ({"lr": 1.0000001e9}, "--lr"),
    ({"weight_decay": -1e-12}, "--weight-decay"),
    ({"weight_decay": 1.0000001e9}, "--weight-decay"),
    ({"weight_decay": INF}, "--weight-decay"),
    ({"batch_size": 0}, "--batch-size"),
    ({"epochs": 0}, "--epochs"),
    ({"hidden": 0}, "--hidden"),
    ({"heads": 0}, "--heads"),
    ({"prefetch": 0}, "--prefetch"),
    ({"stall_timeout": 0.0}, "--stall-timeout"),
    ({"stall_timeout": INF}, "--stall-timeout"),
    ({"eval_batch_size": 0}, "--eval-batch-size"),
    ({"dropout": 1.0}, "--dropout"),
    ({"dropout": -0.01}, "--dropout"),
    ({"model": "gcn", "edge_weight_norm": "sum", "sampler": "labor"}, "--edge-weight-norm sum"),
    ({"patience": 0}, "--patience"),
    ({"seed": -1}, "--seed"),
    ({"threads": 0}, "--threads"),
    ({"gpu_cache_fraction": 1.01}, "--gpu-cache-fraction"),
    ({"gpu_cache_fraction": NAN}, "--gpu-cache-fraction"),
    ({"gpu_budget_bytes": -1}, "--gpu-budget"),
    ({"cache_policy": "lru", "cache_size": 1.01}, "--cache-size"),
    ({"cache_policy": "lookahead", "cpu_cache_size": 0.1}, "--cpu-cache-size"),
    ({"cache_policy": "lru", "cpu_cache_size": 1.01}, "--cpu-cache-size"),
    ({"lookahead": 4097}, "--lookahead"),
    ({"lookahead": -1}, "--lookahead"),
    ({"po_sequences": 0}, "--po-sequences"),
    ({"layer_size": 0}, "--layer-size"),
    ({"locality_max_scale": 0.99}, "--locality-max-scale"),
    ({"locality_max_scale": 5.01e199}, "--locality-max-scale"),  # (line 3 may double it: 1e200)
    ({"locality_scale": 1.01e200, "gpu_cache_fraction": 0.1}, "--locality-scale"),
    ({"locality_compute_s": 0.0}, "--locality-compute-s"),
    ({"prune_threshold": (0.0, 0.0)}, "--prune-threshold"),
    ({"prune_threshold": (1.0000001e9, 1.0)}, "--prune-threshold"),
    ({"prune_threshold": (1.0, -0.1)}, "--prune-threshold"),
    ({"checkpoint_every": 0, "checkpoint_dir": "ck"}, "--checkpoint-every"),
    ({"checkpoint_every": 5}, "--checkpoint-every"),
    ({"checkpoint_every": 5, "checkpoint_dir": "ck", "cache_policy": "lru"}, "--checkpoint-every"),
]

ACCEPTED = [
    {"lr": 1e9},
    {"lr": 1e-12},
    {"weight_decay": 0.0},
    {"weight_decay": 1e9},
    {"batch_size": 1, "epochs": 1, "hidden": 1, "heads": 1, "prefetch": 1},
    {"stall_timeout": 1e-3},
    {"eval_batch_size": 1},
    {"dropout": 0.0},
    {"dropout": 0.999},
    {"patience": 1},
    {"seed": 0},
    {"threads": 1},
    {"gpu_cache_fraction": 1.0},
    {"gpu_cache_fraction": 0.0},
    {"gpu_budget_bytes": 0},
    {"cache_policy": "lru", "cache_size": 1.0, "cpu_cache_size": 1.0},
    {"lookahead": 4096},
    {"lookahead": 0},
    {"po_sequences": 1},
    {"layer_size": 1},
    {"locality_max_scale": 1.0},
    {"locality_max_scale": 5e199, "locality_scale": "auto", "gpu_cache_fraction": 0.1},
    {"locality_scale": 1e200, "gpu_cache_fraction": 0.1},
    {"locality_compute_s": 1e-9},
    {"prune_threshold": (1e9, 0.0)},
    {"checkpoint_every": 1, "checkpoint_dir": "ck", "cache_policy": "static"},
]


@pytest.mark.parametrize("kw,option", REFUSED, ids=[str(k) for k, _ in REFUSED])
def test_the_first_value_outside_a_range_is_refused(kw, option, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=f"^{option}"):
        TrainConfig(**kw).validate()


@pytest.mark.parametrize("kw", ACCEPTED, ids=[str(k) for k in ACCEPTED])
def test_the_last_value_inside_a_range_is_accepted(kw, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    TrainConfig(**kw).validate()
