"""What the partitioned sampler counts, on two thread-ranks (tests/fake_dist.py): requests and
bytes per link, by hand, in both modes and across machines. The gloo tests of
test_dist_sampling.py check the batches themselves; each test here guards a mutation of the
counting that they let through."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnio.graph import load
from gnnio.placement.topology import load_topology
from gnnio.preprocess.partition import load_partition, partition_dataset, save_partition
from gnnio.sampling import UniformSampler
from tests.fake_dist import run_ranks
from tests.helpers import write_tiny_dataset

FANOUT = 3


@pytest.fixture(scope="module")
def parted(tmp_path_factory):
    """A 60-node graph in two id ranges: part 0 owns nodes 0-29, part 1 nodes 30-59."""
    root = tmp_path_factory.mktemp("parted")
    ds = load(write_tiny_dataset(root / "g", num_nodes=60, num_edges=400, seed=3))
    part = partition_dataset(ds, 2, "range", measure=False)
    pdir = save_partition(part, ds.graph, root / "p")
    return ds, pdir


def _sample(parted, mode: str, seeds_of, machine_of=None, shm_dir=None):
    from gnnio.distributed import shm
    from gnnio.distributed.sampling import ShardedSampler

    ds, pdir = parted
    saved = shm.SHM_DIR
    if shm_dir is not None:
        shm.SHM_DIR = shm_dir  # this test's own folder (put back below)

    def body(ctx):
        part = load_partition(pdir, ds, 2)
        s = ShardedSampler(part, pdir, ctx, [FANOUT], seed=3, mode=mode)
        # every link's key up front: a mid-epoch checkpoint copies the dict while the sampling
        # thread runs, and a key added during the copy ends it ("dictionary changed size")
        assert s.bytes_by_link == {"local": 0, "peer": 0, "network": 0}
        ctx.calls.clear()
        seeds = torch.tensor(seeds_of[ctx.rank])
        mb = s.sample(seeds, epoch_seed=5)
        ref = UniformSampler(ds.graph, [FANOUT], seed=3, num_threads=1).sample(seeds, epoch_seed=5)
        same = torch.equal(mb.input_nodes, ref.input_nodes) and torch.equal(
            mb.blocks[0].edge_index, ref.blocks[0].edge_index
        )
        return {"same": same, "stats": dict(s.stats), "bytes": {k: v for k, v in s.bytes_by_link.items() if v},
                "calls": list(ctx.calls), "itemsize": s.own.itemsize}  # fmt: skip

    try:
        return run_ranks(2, body, load_topology("2"), machine_of=machine_of)
    finally:
        shm.SHM_DIR = saved


def _sampled(ds, ids) -> int:
    deg = ds.graph.in_degrees()[np.asarray(ids)]
    return int(np.minimum(deg, FANOUT).sum())


def test_own_rows_are_sampled_locally_and_counted_by_hand(parted):
    """Seeds a rank owns (node 0 and 30: the first row of each shard) need no request."""
    ds, _ = parted
    seeds = {0: [0, 5, 7, 29], 1: [30, 31, 44]}
    r0, r1 = _sample(parted, "dsp", seeds)
    for r, rank in ((r0, 0), (r1, 1)):
        assert r["same"]
        assert r["stats"]["requests"] == 0 and r["stats"]["local_rows"] == len(seeds[rank])
        want = _sampled(ds, seeds[rank]) * r["itemsize"] + 16 * len(seeds[rank])
        assert r["bytes"] == {"local": want}


def test_dsp_requests_and_peer_bytes_by_hand(parted):
    ds, _ = parted
    seeds = {0: [31, 40, 2], 1: [33]}
    r0, r1 = _sample(parted, "dsp", seeds)
    assert r0["same"] and r1["same"]
    assert r0["stats"]["requests"] == 2 and r1["stats"]["requests"] == 0
    assert r0["stats"]["local_rows"] == 1 and r1["stats"]["local_rows"] == 1  # nodes 2 and 33
    # out: one count and 8 B per row id; back: 8 B per row's count and per sampled id
    assert r0["bytes"]["peer"] == 8 * (2 * 2 + _sampled(ds, [31, 40]))
    assert "peer" not in r1["bytes"]
    assert set(r0["calls"]) == {"sample"}


def test_shared_mode_reads_peer_lists_without_collectives(parted, tmp_path):
    ds, _ = parted
    seeds = {0: [31, 40, 2], 1: [33]}
    r0, r1 = _sample(parted, "shared", seeds, shm_dir=tmp_path)
    assert r0["same"] and r1["same"]
    assert r0["stats"]["requests"] == 2 and r1["stats"]["requests"] == 0
    deg = ds.graph.in_degrees()
    assert r0["bytes"]["peer"] == int(deg[[31, 40]].sum()) * r0["itemsize"] + 16 * 2
    assert r0["calls"] == [] and r1["calls"] == []  # one machine: no request/response


def test_shared_mode_requests_rows_of_another_machine(parted, tmp_path):
    """Another machine's memory cannot be mapped: its rows go by request, on the network."""
    ds, _ = parted
    seeds = {0: [31, 40, 2], 1: [33]}
    r0, _ = _sample(parted, "shared", seeds, machine_of=[0, 1], shm_dir=tmp_path)
    assert r0["same"] and r0["stats"]["requests"] == 2
    assert r0["bytes"].get("peer", 0) == 0
    assert r0["bytes"]["network"] == 8 * (2 * 2 + _sampled(ds, [31, 40]))


class _Spy(torch.Tensor):
    """A shard's ``indices`` as a peer's GPU tensor would be: counts the entries copied out."""

    copied: list = []

    def __getitem__(self, idx):
        out = torch.Tensor.__getitem__(self.as_subclass(torch.Tensor), idx)
        _Spy.copied.append(int(out.numel()))
        return out


def test_pruned_shared_reads_of_a_peer_gpu_copy_only_the_window(parted):
    """HyDRA §III-A3: a pruned row transmits ``theta`` neighbours, not its list. Through CUDA IPC
    (shard tensors; here on the CPU) the reader used to copy every whole list while counting
    only the windows; the rows' samples must stay those of the whole list's kernel."""
    from gnnio.distributed.sampling import _Shard
    from gnnio.sampling.threaded import _hop_key

    ds, pdir = parted
    mapped = _Shard(pdir, 1, ds.num_nodes)  # the kernels on the whole mapped list
    arrays = {n: torch.from_numpy(np.array(getattr(mapped, n))) for n in ("nodes", "indptr")}
    arrays["indices"] = torch.from_numpy(np.array(mapped.indices)).as_subclass(_Spy)
    peer = _Shard(pdir, 1, ds.num_nodes, arrays=arrays)
    assert peer.tensors
    rows = np.arange(30, 60, dtype=np.int64)
    deg = ds.graph.in_degrees()[rows]
    theta = 4
    assert (deg > theta).any() and (deg <= theta).any()
    for h in range(3):
        _Spy.copied.clear()
        c, f = peer.sample(rows, FANOUT, _hop_key(11, h), theta)
        c_ref, f_ref = mapped.sample(rows, FANOUT, _hop_key(11, h), theta)
        np.testing.assert_array_equal(c, c_ref)
        np.testing.assert_array_equal(f, f_ref)
        assert sum(_Spy.copied) == int(np.minimum(deg, theta).sum())


def test_dsp_rows_of_two_owners_in_mixed_order_are_the_single_process_batch(tmp_path):
    """Three ranks: a rank's remote rows belong to two owners, listed interleaved. Each request
    goes to its row's owner (with two ranks every remote row has the same owner, so an unsorted
    request list still went right) and the replies land at their rows."""
    from gnnio.distributed.sampling import ShardedSampler

    ds = load(write_tiny_dataset(tmp_path / "g", num_nodes=60, num_edges=400, seed=3))
    part = partition_dataset(ds, 3, "range", measure=False)  # 0-19 | 20-39 | 40-59
    pdir = save_partition(part, ds.graph, tmp_path / "p")
    seeds_of = {0: [45, 21, 50, 33, 2], 1: [5, 41, 12, 58], 2: [25, 1, 30, 8]}

    def body(ctx):
        s = ShardedSampler(load_partition(pdir, ds, 3), pdir, ctx, [FANOUT, 2], seed=3)
        seeds = torch.tensor(seeds_of[ctx.rank])
        mb = s.sample(seeds, epoch_seed=4)
        ref = UniformSampler(ds.graph, [FANOUT, 2], seed=3, num_threads=1)
        want = ref.sample(seeds, epoch_seed=4)
        return torch.equal(mb.input_nodes, want.input_nodes) and all(
            torch.equal(a.edge_index, b.edge_index) for a, b in zip(mb.blocks, want.blocks)
        )

    assert run_ranks(3, body, load_topology("3")) == [True, True, True]
