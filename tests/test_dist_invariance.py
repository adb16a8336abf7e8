"""Two ranks learn the same whatever the placement of the rows across them (gloo, CPU processes).

Placement strategies, the buffer, HyDRA's cross-batch reuse (both levels), the store and a cache only move rows
between the ranks' links; partitioned topology (a part per rank, dsp or shared sampling over
HyDRA's high-degree replication) only moves neighbour-list reads. Every one of them must give the
run with the whole topology on every rank the same ``loss_history`` and accuracy bit for bit: a
peer read of the wrong row, a stale reused row or a neighbour list from the wrong shard changes
the losses. (The samplers' own identity across parts is in ``test_dist_sampling.py``.)"""

from __future__ import annotations

import json

import pytest

from gnnio.cli.main import main
from tests.helpers import write_tiny_dataset
from tests.test_dist import run_cli

BASE = ["--nproc", "2", "--epochs", "2", "--batch-size", "16", "--fanouts", "4,3",
        "--hidden", "8", "--quiet"]  # fmt: skip

VARIANTS = {
    "random, no reuse, mmap, fifo cache": ["--placement-strategy", "random", "--no-reuse",
                                           "--store", "mmap", "--cache-policy", "fifo",
                                           "--cache-size", "0.1"],
    "partition, dsp, metis, buffer 0.3": ["--partition", "{part}", "--sampling-mode", "dsp",
                                          "--placement-strategy", "metis", "--buffer", "0.3"],
    "partition, shared": ["--partition", "{part}", "--sampling-mode", "shared"],
    "mod, machine reuse, lru cache": ["--placement-strategy", "mod", "--reuse-level", "machine",
                                      "--cache-policy", "lru", "--cache-size", "0.05"],
}  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("inv")
    d = write_tiny_dataset(root / "tiny", num_nodes=300, num_edges=2400, feat_dim=8)
    part = root / "part"
    assert main(["partition", str(d), "--parts", "2", "--method", "hdr", "--replicate", "0.05",
                 "--out", str(part), "--quiet"]) == 0  # fmt: skip
    return d, part


def _train(d, tmp_path, name, extra) -> dict:
    out = tmp_path / f"{name}.json"
    r = run_cli(["train", str(d), *BASE, *extra, "--summary", str(out)])
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def baseline(data, tmp_path_factory):
    return _train(data[0], tmp_path_factory.mktemp("base"), "alg1", [])


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_where_rows_live_across_ranks_does_not_change_what_is_learnt(data, baseline, tmp_path,
                                                                       name):  # fmt: skip
    d, part = data
    extra = [a.replace("{part}", str(part)) for a in VARIANTS[name]]
    s = _train(d, tmp_path, "v", extra)
    assert s["world_size"] == 2 and s["params_identical"] is True
    assert s["loss_history"] == baseline["loss_history"]
    acc = ("test_acc", "best_valid_acc")
    assert [s[k] for k in acc] == [baseline[k] for k in acc]
    # the variant moved rows or neighbour lists by other links: it is not the baseline run again
    if "--partition" in extra:
        assert s["partitioned_sampling"]["bytes_by_link"]["peer"] > 0
    else:
        assert s["feature_bytes_by_link"] != baseline["feature_bytes_by_link"]
