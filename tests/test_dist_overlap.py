"""HyDRA's overlap rates (§IV, Eq. 5-6; gnnio/bench/dist_overlap.py): the formulas by hand, and
the all-local / all-remote samplers that time T_l and T_r on two thread-ranks
(tests/fake_dist.py): the single-process sampler's batches, every row where it should be read.
The gloo run through the CLI is in test_dist_sampling.py (the pruned ``bench dist-sampling``)."""

from __future__ import annotations

import pytest
import torch

from gnnio.bench.dist_overlap import _AllLocal, _AllRemote, overlap_rates, same_batch
from gnnio.graph import load
from gnnio.placement.topology import load_topology
from gnnio.preprocess.partition import load_partition, partition_dataset, save_partition
from gnnio.sampling import UniformSampler
from tests.fake_dist import run_ranks
from tests.helpers import write_tiny_dataset

FANOUTS = [3, 2]


def test_the_rates_by_hand():
    # eta T_l = 0.5, (1 - eta) T_r = 1.5: in series 2; perfectly overlapped 1.5
    r = overlap_rates(0.5, 1.0, 3.0, 1.5)
    assert r["r_optimal"] == pytest.approx(0.25)  # 1 - max / sum: Eq. 6 at perfect overlap
    assert r["r_optimal_as_printed"] == pytest.approx(0.75)  # Eq. 5 as printed: 1 - min / sum
    assert r["r_experimental"] == pytest.approx(0.25) and r["note"] is None
    slow = overlap_rates(0.25, 2.0, 4.0, 4.0)  # 0.5 + 3.0 in series, observed slower
    assert slow["r_experimental"] == pytest.approx(1 - 4.0 / 3.5)
    assert slow["r_optimal"] == pytest.approx(0.5 / 3.5)
    every_row_local = overlap_rates(1.0, 2.0, 5.0, 2.0)
    assert every_row_local["r_optimal"] == 0.0 and "nothing to overlap" in every_row_local["note"]
    nothing = overlap_rates(0.5, 0.0, 0.0, 1.0)
    assert nothing["r_experimental"] is None and nothing["r_optimal"] is None and nothing["note"]
    with pytest.raises(ValueError, match="eta"):
        overlap_rates(1.5, 1.0, 1.0, 1.0)


@pytest.fixture(scope="module")
def parted(tmp_path_factory):
    root = tmp_path_factory.mktemp("parted")
    ds = load(write_tiny_dataset(root / "g", num_nodes=60, num_edges=400, seed=3))
    part = partition_dataset(ds, 2, "range", measure=False)
    return ds, save_partition(part, ds.graph, root / "p")


def _run(parted, cls, mode, tmp_path):
    from gnnio.distributed import shm

    ds, pdir = parted
    seeds_of = {0: [31, 40, 2, 7], 1: [33, 5, 50]}
    saved, shm.SHM_DIR = shm.SHM_DIR, tmp_path

    def body(ctx):
        part = load_partition(pdir, ds, 2)
        s = cls(ds.graph, part, pdir, ctx, FANOUTS, seed=3, mode=mode)
        ctx.calls.clear()
        seeds = torch.tensor(seeds_of[ctx.rank])
        mb = s.sample(seeds, epoch_seed=5)
        ref = UniformSampler(ds.graph, FANOUTS, seed=3, num_threads=1).sample(seeds, epoch_seed=5)
        rows = sum(mb.meta["hop_nodes"][:-1])  # every hop's destination rows
        return {"same": same_batch(mb, ref), "stats": dict(s.stats), "rows": rows,
                "bytes": {k: v for k, v in s.bytes_by_link.items() if v}, "calls": list(ctx.calls)}  # fmt: skip

    try:
        return run_ranks(2, body, load_topology("2"))
    finally:
        shm.SHM_DIR = saved


@pytest.mark.parametrize("mode", ["dsp", "shared"])
def test_all_local_samples_every_row_itself_without_a_collective(parted, mode, tmp_path):
    for r in _run(parted, _AllLocal, mode, tmp_path):
        assert r["same"]
        assert r["stats"]["requests"] == 0 and r["stats"]["local_rows"] == r["rows"]
        assert r["calls"] == [] and set(r["bytes"]) == {"local"}


@pytest.mark.parametrize("mode", ["dsp", "shared"])
def test_all_remote_reads_every_row_through_the_modes_remote_path(parted, mode, tmp_path):
    for r in _run(parted, _AllRemote, mode, tmp_path):
        assert r["same"]
        assert r["stats"]["local_rows"] == 0 and r["stats"]["requests"] == r["rows"]
        assert r["bytes"].get("local", 0) == 0 and r["bytes"]["peer"] > 0
        # dsp asks the next rank (collectives); shared reads its copy (none)
        assert (r["calls"] != []) == (mode == "dsp")


def test_same_batch_sees_a_changed_edge_and_weight(parted):
    ds, _ = parted
    s = UniformSampler(ds.graph, FANOUTS, seed=3, num_threads=1)
    a = s.sample(torch.tensor([1, 2, 3]), epoch_seed=1)
    b = s.sample(torch.tensor([1, 2, 3]), epoch_seed=1)
    assert same_batch(a, b)
    b.blocks[0].edge_index[0, 0] += 1
    assert not same_batch(a, b)
    c = s.sample(torch.tensor([1, 2, 3]), epoch_seed=1)
    c.blocks[-1].edge_weight = torch.ones(c.blocks[-1].edge_index.shape[1])
    assert not same_batch(a, c)
    d = s.sample(torch.tensor([1, 2, 3]), epoch_seed=1)
    d.blocks[0].num_src += 1  # a block's size, with the same edges
    assert not same_batch(a, d)
