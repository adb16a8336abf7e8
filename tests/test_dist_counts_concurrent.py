"""A rank's training store and evaluation store read one host memory: each books its own rows.

``DistRun.build_store`` gives the evaluation store (group ``eval_fetch``, the evaluation loaders'
gather thread) the training store's host store -- the features, a static cache, the ``pread``
reader of a memory-mapped file. The sharded store booked its host rows as the difference of the
host store's counters across its read, so a gather of the other store meanwhile was booked
twice, once by each. The host read here waits for the other thread's before it returns, so the
two reads overlap for sure."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from gnnio.distributed.train import DistRun
from gnnio.graph import load
from gnnio.placement.topology import load_topology
from gnnio.train.config import TrainConfig
from tests.fake_dist import Exchange, FakeCtx, run_ranks
from tests.helpers import write_tiny_dataset


def _overlap(obj) -> None:
    """Make ``obj.gather`` (shared by both stores) wait for the other thread's, before and after
    it reads."""
    enter, leave = threading.Barrier(2, timeout=5), threading.Barrier(2, timeout=5)
    inner = obj.gather

    def gather(*args, **kw):
        enter.wait()
        rows = inner(*args, **kw)
        leave.wait()
        return rows

    obj.gather = gather


@pytest.mark.parametrize(
    "store, policy", [("memory", "none"), ("memory", "static"), ("mmap", "none")]
)
def test_training_and_evaluation_gathers_at_once_book_their_own_host_rows(tmp_path, store, policy):
    ds = load(write_tiny_dataset(tmp_path / "g", num_nodes=120, num_edges=600, seed=3))
    cfg = TrainConfig(
        fanouts=[2], batch_size=8, score="degree", store=store, cache_policy=policy,
        cache_size=0.05 if policy != "none" else 0.0, placement_strategy="alg1", buffer=0.1,
        progress=False,
    )  # fmt: skip
    topo = load_topology("1")
    (setup,) = run_ranks(1, lambda ctx: DistRun(ctx).build_store(ds, cfg, torch.device("cpu")),
                         topo)  # fmt: skip
    train, ev = setup.store, setup.eval_store
    ev.ctx = FakeCtx(0, 1, Exchange(1), topo)  # (its own group's exchange, as on a real run)
    assert ev.host_store is train.host_store and ev._pread is train._pread
    _overlap(train._pread if train._pread is not None else train.host_store)
    host = np.flatnonzero(train.dev_num.numpy() < 0)  # rows only host memory holds
    a, b = torch.from_numpy(host[:3]), torch.from_numpy(host[10:30])
    got: dict = {}
    t = threading.Thread(target=lambda: got.setdefault("b", ev.gather(b)))
    t.start()
    ra = train.gather(a)
    t.join(10)
    feats = torch.from_numpy(np.asarray(ds.features))
    assert torch.equal(ra, feats[a]) and torch.equal(got["b"], feats[b])
    rows_a = {k: v for k, v in train.counters.rows.items() if v}
    rows_b = {k: v for k, v in ev.counters.rows.items() if v}
    assert sum(rows_a.values()) == 3, rows_a  # (was 23: the evaluation store's 20 too)
    assert sum(rows_b.values()) == 20, rows_b
