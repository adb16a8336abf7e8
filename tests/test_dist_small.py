"""Small pieces of a distributed run, checked alone: the DDP communication hook averages the
gradients over the ranks and counts their bytes (the gloo training tests check that every rank
ends with the same parameters, which a summing hook keeps too); partition-local seeds refuse a
partition too small for the batches every rank takes; the launcher's one line names the rank
that caused a failure, never one that only lost its peer."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gnnio.distributed.ddp import GradCounter, counting_allreduce
from gnnio.distributed.launch import failure_line


class _OtherRank:
    """A context whose all-reduce adds the other rank's bucket, as it would hand it over."""

    def __init__(self, other: torch.Tensor, world: int) -> None:
        self.other, self.world = other, world

    def all_reduce(self, t, group="default", async_op=False):
        assert group == "default" and async_op
        t.add_(self.other / self.world)  # the other rank divided its bucket as this one did
        fut = torch.futures.Future()
        fut.set_result([t])
        return SimpleNamespace(get_future=lambda: fut)


def test_the_hook_averages_gradients_and_counts_their_bytes():
    mine = torch.tensor([2.0, 4.0, 6.0])
    other = torch.tensor([4.0, 0.0, -2.0])
    state = GradCounter(2, _OtherRank(other, 2))
    out = counting_allreduce(state, SimpleNamespace(buffer=lambda: mine)).wait()
    assert torch.equal(out, torch.tensor([3.0, 2.0, 2.0]))  # the mean over both ranks
    assert state.bytes == 3 * 4 and state.seconds >= 0.0
    state.ctx = _OtherRank(torch.zeros(5, dtype=torch.float64), 2)
    counting_allreduce(state, SimpleNamespace(buffer=lambda: torch.zeros(5, dtype=torch.float64)))
    assert state.bytes == 3 * 4 + 5 * 8


def test_local_seeds_refuse_fewer_seeds_than_batches():
    """Every rank takes the same number of batches: a partition with fewer training nodes than
    that would give a rank an empty batch."""
    from gnnio.distributed.plan import LocalSeedsOrder
    from gnnio.errors import UsageError

    order = LocalSeedsOrder(np.arange(4), 2, 4)
    assert [len(b) for b in order.batches(0)] == [1, 1, 1, 1]
    with pytest.raises(UsageError, match="3 training nodes, fewer than the 4 batches"):
        LocalSeedsOrder(np.arange(3), 2, 4)


def _failure(pid: int, message: str, timestamp: int):
    return SimpleNamespace(
        exitcode=1, pid=pid, message={"message": message}, timestamp=timestamp,
        signal_name=lambda: "",
    )  # fmt: skip


@pytest.mark.parametrize(
    "lost",
    [
        "RuntimeError: ProcessGroupGloo: lost its peer 1 during all_to_all",
        "RuntimeError: Connection reset by remote end: broken pipe",
        "RuntimeError: [gloo] socket closed while receiving",
    ],
)
def test_a_rank_that_lost_its_peer_is_not_the_cause(lost):
    err = SimpleNamespace(
        failures={
            0: _failure(10, lost, 1),  # reported first
            1: _failure(11, "Traceback...\nValueError: bad batch", 2),
        }
    )
    assert (
        failure_line(err) == "rank 1 (pid 11) failed: ValueError: bad batch; stopped rank(s) 0 too"
    )
