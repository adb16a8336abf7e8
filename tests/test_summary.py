"""The run summary's numbers from hand-made epoch records (gnnio.train.summary): means, shares,
the hidden fraction, totals per tier over epochs, the stage seconds and the modeled loading
share that drives Algorithm 2."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gnnio.graph.feature_dtype import FeatureCodec
from gnnio.sampling import modeled_loading_share
from gnnio.train import TrainConfig
from gnnio.train.summary import hidden_fraction, loading_share, stage_seconds, summarize


def _rec(epoch, sample, gather, transfer, compute, wait, t, host, gpu):
    return {
        "epoch": epoch, "loss": 1.0, "epoch_time_s": t, "eval_s": 0.5, "batches": 3,
        "valid_acc": 0.5 + epoch / 10, "test_acc": 0.4,
        "breakdown_s": {"sample": sample, "gather": gather, "transfer": transfer,
                        "compute": compute, "wait": wait},
        "bytes_by_tier": {"host": host, "gpu": gpu}, "rows_by_tier": {"host": host // 4},
    }  # fmt: skip


def test_summary_means_shares_and_totals():
    hist = [
        _rec(0, 1.0, 2.0, 1.0, 3.0, 2.0, 8.0, 400, 100),
        _rec(1, 1.0, 0.0, 1.0, 1.0, 0.0, 4.0, 40, 0),
    ]
    ds = SimpleNamespace(name="d", path="p", train_idx=np.arange(120), feat_dtype="float32",
                         feature_codec=FeatureCodec())  # fmt: skip
    s = summarize(
        ds, TrainConfig(), torch.device("cpu"), torch.nn.Linear(2, 3), hist, 1, False, None
    )
    assert s["epoch_time_s"] == 6.0 and s["eval_time_s"] == 0.5
    assert s["breakdown_s"] == {"sample": 1.0, "gather": 1.0, "transfer": 1.0, "compute": 2.0,
                                "wait": 1.0}  # fmt: skip
    assert s["data_loading_share"] == pytest.approx(2.0 / 6.0)  # gather + transfer, no sampling
    assert s["wait_share"] == pytest.approx(1.0 / 6.0)
    assert s["hidden_fraction"] == pytest.approx(1.0 - 1.0 / 3.0)
    assert s["seeds_per_s"] == 20.0 and s["batches_per_epoch"] == 3
    assert s["bytes_by_tier"] == {"host": 440, "gpu": 100}
    assert s["rows_by_tier"] == {"host": 110}
    assert (s["best_valid_acc"], s["best_epoch"], s["epochs"]) == (0.6, 1, 2)
    assert s["num_parameters"] == 9 and s["loss_history"] == [1.0, 1.0]


def test_hidden_fraction_ends():
    bd = {"sample": 0.0, "gather": 0.0, "transfer": 0.0, "wait": 0.3}
    assert hidden_fraction(bd) == 1.0  # no loading work: nothing to hide
    assert hidden_fraction({**bd, "gather": 1.0, "wait": 3.0}) == 0.0  # waited longer: clipped
    assert hidden_fraction({**bd, "sample": 1.0, "transfer": 1.0, "wait": 0.5}) == 0.75


def test_stage_seconds_from_stats_dicts_and_objects():
    assert stage_seconds(None) == {"sample": 0.0, "gather": 0.0, "transfer": 0.0}
    plain = stage_seconds({"sample": 1, "gather_s": 2.0, "transfer": 3.0, "transfer_s": 9.0})
    assert plain == {"sample": 1.0, "gather": 2.0, "transfer": 3.0}
    obj = SimpleNamespace(sample_s=0.5, gather_s=0.25)
    assert stage_seconds(obj) == {"sample": 0.5, "gather": 0.25, "transfer": 0.0}


def test_modeled_loading_share_counts_every_tier():
    """On the CPU the share is modeled from the bytes per tier: host reads at the host
    bandwidth, peers' at NVLink's, and every tier on the training GPU (gpu, local, cache,
    gpu_cache) at the GPU's."""
    bt = {"host": 10**9, "gpu": 2 * 10**9, "local": 10**8, "cache": 5 * 10**9,
          "gpu_cache": 10**7, "peer": 3 * 10**9}  # fmt: skip
    bd = {"sample": 0.0, "gather": 0.0, "transfer": 0.0, "compute": 0.4, "wait": 0.0}
    rec = {"breakdown_s": bd, "bytes_by_tier": bt, "epoch_time_s": 1.0}
    share, kind = loading_share(rec, TrainConfig(), torch.device("cpu"))
    want = modeled_loading_share(10**9, 2 * 10**9 + 10**8 + 5 * 10**9 + 10**7, 0.4,
                                 peer_bytes=3 * 10**9)  # fmt: skip
    assert kind == "modeled" and share == want
    assert share != modeled_loading_share(
        10**9, 2 * 10**9 + 10**8 + 10**7, 0.4, peer_bytes=3 * 10**9
    )
    assert share != modeled_loading_share(10**9, 7.11e9, 0.4)
    fixed, _ = loading_share(rec, TrainConfig(locality_compute_s=2.0), torch.device("cpu"))
    assert fixed == modeled_loading_share(10**9, 7.11e9, 2.0, peer_bytes=3 * 10**9)
