"""Placement files and partition directories one value past what is valid are refused with one
line when loaded (the hostile-input tests use values far out of range; a check off by one lets
node ``N``, part ``M`` or a decreasing row pointer through, which the numba kernels would then
read out of bounds)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from gnnio.errors import UsageError
from gnnio.graph import load
from gnnio.placement import Placement, load_placement, save_placement
from gnnio.preprocess.partition import load_partition, partition_dataset, save_partition
from tests.helpers import write_tiny_dataset


def test_a_placement_buffer_holding_node_n_is_refused(tmp_path):
    path = save_placement(Placement("hand", 4, ((0, 1),), [np.array([4]), np.array([0])]),
                          tmp_path / "p.npz")  # fmt: skip
    with pytest.raises(UsageError, match=r"buffer 0 holds node 4, outside \[0, 4\)"):
        load_placement(path)


def test_placement_devices_must_be_numbered_from_zero(tmp_path):
    pl = Placement("hand", 4, ((0, 2),), [np.array([1]), np.array([0])])
    with pytest.raises(UsageError, match=r"group_devices \[0, 2\] must hold the devices 0..1"):
        load_placement(save_placement(pl, tmp_path / "p.npz"))


@pytest.fixture
def pdir(tmp_path):
    ds = load(write_tiny_dataset(tmp_path / "g", num_nodes=40, num_edges=200, seed=1))
    part = partition_dataset(ds, 2, "range", measure=False)
    return save_partition(part, ds.graph, tmp_path / "p")


def _rewrite_parts(pdir, parts: np.ndarray) -> None:
    """Replace parts.npy and its checksum in meta.json (an edit that the checksum hides)."""
    np.save(pdir / "parts.npy", parts)
    meta = json.loads((pdir / "meta.json").read_text())
    meta["sha256"]["parts"] = hashlib.sha256(np.ascontiguousarray(parts).view(np.uint8)).hexdigest()
    (pdir / "meta.json").write_text(json.dumps(meta))


def test_a_partition_for_fewer_ranks_than_it_has_parts_is_refused(pdir):
    with pytest.raises(UsageError, match="has 2 parts, the run has 1 ranks"):
        load_partition(pdir, num_parts=1)


def test_a_node_in_part_m_is_refused(pdir):
    parts = np.load(pdir / "parts.npy")
    parts[-1] = 2
    _rewrite_parts(pdir, parts)
    with pytest.raises(UsageError, match=r"parts outside \[0, 2\)"):
        load_partition(pdir)


def test_a_shard_with_neighbour_n_is_refused(pdir):
    idx = np.load(pdir / "part0" / "indices.npy")
    idx[0] = 40
    np.save(pdir / "part0" / "indices.npy", idx)
    with pytest.raises(UsageError, match=r"node ids outside \[0, 40\)"):
        load_partition(pdir)


def test_a_shard_with_a_decreasing_row_pointer_is_refused(pdir):
    ip = np.load(pdir / "part1" / "indptr.npy")
    assert ip[2] > ip[1]
    ip[1] = ip[2] + 1  # rows 0 and 1 overlap, the total unchanged
    np.save(pdir / "part1" / "indptr.npy", ip)
    with pytest.raises(UsageError, match="not a CSR row pointer"):
        load_partition(pdir)


def test_a_replicated_node_n_is_refused(pdir):
    np.save(pdir / "replicated.npy", np.array([40], dtype=np.int64))
    meta = json.loads((pdir / "meta.json").read_text())
    rep = np.load(pdir / "replicated.npy")
    meta["sha256"]["replicated"] = hashlib.sha256(rep.view(np.uint8)).hexdigest()
    (pdir / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UsageError, match=r"replicated.npy has ids outside \[0, 40\)"):
        load_partition(pdir)


def test_a_shard_row_pointer_starting_past_zero_is_refused(pdir):
    """Row pointer shifted by one with one extra leading index: it still ends at the length of
    indices and never decreases, only its first entry (1, not 0) is wrong."""
    ip = np.load(pdir / "part0" / "indptr.npy")
    idx = np.load(pdir / "part0" / "indices.npy")
    np.save(pdir / "part0" / "indptr.npy", ip + 1)
    np.save(pdir / "part0" / "indices.npy", np.r_[idx[:1], idx])
    with pytest.raises(UsageError, match="not a CSR row pointer"):
        load_partition(pdir)
