"""Ranks as threads of one process: a stand-in for :class:`gnnio.distributed.context.DistContext`
whose ``all_to_all_single`` exchanges tensors through shared memory with a barrier. The sharded
store and sampler issue every collective through the context, so their bookkeeping (rows and
bytes per link, requests, checkpoints) can be checked in milliseconds, on any link layout,
without gloo; the gloo tests (test_dist.py, test_dist_sampling.py) check the real exchange."""

from __future__ import annotations

import threading

import torch

from gnnio.distributed.context import DistContext


class Exchange:
    """The shared state of ``world`` thread-ranks."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.barrier = threading.Barrier(world, timeout=30)
        self.slots: list = [None] * world

    def all_to_all(self, rank: int, send: torch.Tensor, send_splits) -> torch.Tensor:
        if send_splits is None:
            parts = list(torch.tensor_split(send, self.world))
        else:
            parts = list(torch.split(send, [int(s) for s in send_splits]))
        self.slots[rank] = [p.clone() for p in parts]
        self.barrier.wait()
        out = torch.cat([self.slots[k][rank] for k in range(self.world)])
        self.barrier.wait()  # every rank has read its parts before the next call writes
        return out

    def all_gather(self, rank: int, obj) -> list:
        self.slots[rank] = obj
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out


class FakeCtx(DistContext):
    """A :class:`DistContext` (its links, machines and properties as they are) whose collectives
    go through an :class:`Exchange` of thread-ranks instead of torch.distributed; ``calls``
    records the fetch groups of ``all_to_all_single``."""

    def __init__(self, rank: int, world_size: int, exchange: Exchange, topology,
                 machine_of: list[int] | None = None) -> None:  # fmt: skip
        super().__init__(rank=rank, world_size=world_size, local_rank=rank,
                         machine_of=list(machine_of or [0] * world_size), backend="threads",
                         device=torch.device("cpu"), simulated=True, timeout_s=30.0,
                         topology=topology)  # fmt: skip
        self.exchange = exchange
        self.calls: list = []

    def all_to_all_single(self, send, recv_splits=None, send_splits=None, group="fetch", out=None):
        self.calls.append(group)
        return self.exchange.all_to_all(self.rank, send, send_splits)

    def all_gather_object(self, obj, group="control") -> list:
        return self.exchange.all_gather(self.rank, obj)

    def broadcast_object_list(self, objs: list, src: int = 0, group="control") -> None:
        objs[:] = self.exchange.all_gather(self.rank, list(objs))[src]

    def all_reduce_sum(self, values: list[float], group="control") -> list[float]:
        every = self.exchange.all_gather(self.rank, [float(v) for v in values])
        return [sum(col) for col in zip(*every)]

    def barrier(self, group="control") -> None:
        self.exchange.all_gather(self.rank, None)


def run_ranks(world: int, fn, topology, machine_of: list[int] | None = None) -> list:
    """``fn(ctx)`` on ``world`` thread-ranks; their results by rank (the first error re-raised)."""
    ex = Exchange(world)
    results: list = [None] * world
    errors: list = []

    def body(r: int) -> None:
        try:
            ctx = FakeCtx(r, world, ex, topology, list(machine_of or []))
            results[r] = fn(ctx)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
            ex.barrier.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return results
