"""HyDRA's intra-machine level of cross-batch reuse (§III-B2, ②): a group's batches as one.

HyDRA "treats the current batch as a composite of all batches from GPUs within a single machine,
synchronizing batch IDs via all-gather". In gnnio the ranks that can hand rows to each other are
an NVLink group of the topology (one group per machine by default), and the rows a rank fetches
over a slow link are the ones it reads from host memory (a row on another machine is read from
that machine's host memory: NVLink groups never span machines). So, per gather, each rank of a
group tells the others which rows it needs from host memory (:func:`plan` takes those lists), and
every row of the group's composite batch crosses PCIe at most once:

* a rank that read the row for its previous batch copies it from that batch's buffer (the
  intra-GPU level, ①, as with ``reuse="gpu"``);
* else, when a rank of the group holds it from its previous batch, that rank hands it over NVLink
  (``peer`` bytes, not ``host``);
* else one of the ranks that need it reads it from host memory and hands it to the others; with
  ``by_residue`` (a cache in front of each rank's host reads, :mod:`gnnio.distributed.hostcache`)
  member ``id mod g`` reads it, needed by it or not, so each cache holds one residue.

Every rank of the group computes the same plan from the same lists (the previous batch's lists
are kept from the last gather), so who reads and who sends is agreed without more messages. The
holder or reader is chosen among the candidates by the row id (``id mod count``), which spreads
the reads over the group. HyDRA's inter-machine level (③: machines exchanging features by
all-to-all) has no counterpart here: every machine reads its own host memory.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from numba import njit

from ..features.batch_ops import move_rows

__all__ = ["GroupPlan", "GroupReuse", "level_info", "machine_level", "plan", "residue_of"]


@dataclass
class GroupPlan:
    """One rank's part of a group's plan (ids sorted ascending in every array).

    Attributes:
        reads: rows this rank reads from host memory.
        reads_mine: for each row of ``reads``, whether this rank needs it itself (always, unless
            the plan reads by residue).
        send: per group member, the rows this rank hands it (empty for itself).
        send_from_prev: per member, for each row of ``send``: True when it comes from this
            rank's previous batch, False when from this gather's host reads.
        recv: per group member, the rows this rank receives from it (empty for itself).
        host_rows_group: rows the whole group reads from host memory in this gather.
        recv_from_prev: rows of ``recv`` that their sender held from its previous batch.
    """

    reads: np.ndarray
    reads_mine: np.ndarray
    send: list[np.ndarray]
    send_from_prev: list[np.ndarray]
    recv: list[np.ndarray]
    host_rows_group: int
    recv_from_prev: int


@njit(cache=True, nogil=True)
def _plan_kernel(me, heads, ends, flat, g, by_residue, reads, mine, send, send_prev, recv, counts):
    """One merge pass over the 2g sorted lists in ``flat`` (the needs, then the prevs; list
    ``i`` is ``flat[heads[i]:ends[i]]``, ``heads`` is advanced). Writes this member's ``reads``
    (``mine``: whether it needs the row itself), and per member the rows of ``send`` /
    ``send_prev`` / ``recv``; ``counts``: reads, host_rows_group, recv_from_prev, then the send
    counts (g) and the recv counts (g). Per row, ``need`` / ``held`` / ``rem`` flag the members
    (arrays, not bit masks: a group of any size)."""
    big = np.iinfo(np.int64).max
    need = np.zeros(g, dtype=np.bool_)
    held = np.zeros(g, dtype=np.bool_)
    rem = np.zeros(g, dtype=np.bool_)
    while True:
        x = big
        for i in range(2 * g):
            if heads[i] < ends[i] and flat[heads[i]] < x:
                x = flat[heads[i]]
        if x == big:
            break
        need[:] = False
        held[:] = False
        for i in range(2 * g):
            if heads[i] < ends[i] and flat[heads[i]] == x:
                heads[i] += 1
                if i < g:
                    need[i] = True
                else:
                    held[i - g] = True
        n_rem = 0
        n_held = 0
        for k in range(g):
            rem[k] = need[k] and not held[k]  # needers without the row from their own batch
            n_rem += rem[k]
            n_held += held[k]
        if n_rem == 0:
            continue
        fresh = n_held == 0  # no member holds it: it is read from host memory
        if fresh and by_residue:
            sup = x % g  # the member whose cache holds the row's residue
        else:
            j = x % (n_rem if fresh else n_held)  # the j-th of the needers, or of the holders
            sup = -1
            for k in range(g):
                if rem[k] if fresh else held[k]:
                    if j == 0:
                        sup = k
                        break
                    j -= 1
        if fresh:
            counts[1] += 1
        for m in range(g):
            if not rem[m] or m == sup:
                continue
            if sup == me:
                c = counts[3 + m]
                send[m, c] = x
                send_prev[m, c] = not fresh
                counts[3 + m] = c + 1
            if m == me:
                c = counts[3 + g + sup]
                recv[sup, c] = x
                counts[3 + g + sup] = c + 1
                if not fresh:
                    counts[2] += 1
        if sup == me and fresh:
            reads[counts[0]] = x
            mine[counts[0]] = rem[me]
            counts[0] += 1


def plan(
    me: int, needs: list[np.ndarray], prevs: list[np.ndarray], by_residue: bool = False
) -> GroupPlan:
    """Who reads and who hands what, for member ``me`` of a group (module docstring).

    Args:
        me: this rank's position in the group.
        needs: per member, the sorted unique rows it reads from host memory for this batch
            (before any reuse).
        prevs: per member, the same list of its previous batch (the rows its previous batch's
            buffer holds from host memory; empty before the first batch).
        by_residue: a row no member holds is read by member ``id mod g`` (whose host cache
            holds that residue), needed by it or not; else by one of the members that need it.
    """
    g = len(needs)
    if len(prevs) != g or not 0 <= me < g:
        raise ValueError(f"group plan: {g} needs, {len(prevs)} previous lists, member {me}")
    lists = [np.ascontiguousarray(a, dtype=np.int64) for a in (*needs, *prevs)]
    sizes = np.array([a.size for a in lists], dtype=np.int64)
    ends = np.cumsum(sizes)
    heads = ends - sizes
    flat = np.concatenate(lists)
    mine = int(sizes[me])
    width = max(int(sizes[:g].max()), 1)
    reads = np.empty(int(sizes[:g].sum()) if by_residue else mine, dtype=np.int64)
    reads_mine = np.empty(reads.size, dtype=np.bool_)
    send = np.empty((g, width), dtype=np.int64)
    send_prev = np.empty((g, width), dtype=np.bool_)
    recv = np.empty((g, max(mine, 1)), dtype=np.int64)
    counts = np.zeros(3 + 2 * g, dtype=np.int64)
    _plan_kernel(
        me, heads, ends, flat, g, by_residue, reads, reads_mine, send, send_prev, recv, counts
    )
    sc, rc = counts[3 : 3 + g], counts[3 + g :]
    return GroupPlan(
        reads=reads[: counts[0]],
        reads_mine=reads_mine[: counts[0]],
        send=[send[m, : sc[m]] for m in range(g)],
        send_from_prev=[send_prev[m, : sc[m]] for m in range(g)],
        recv=[recv[m, : rc[m]] for m in range(g)],
        host_rows_group=int(counts[1]),
        recv_from_prev=int(counts[2]),
    )


def machine_level(topo, reuse) -> bool:
    """Whether a store with ``reuse`` uses this level on ``topo``: the same answer on every rank
    (the level's collectives are everyone's; a rank alone in its group takes part with nothing
    to hand over), False where peer links are not faster than host reads."""
    return reuse == "machine" and bool(topo.peers_cheaper) and max(map(len, topo.groups)) > 1


def level_info(topo, asked: str) -> dict:
    """The summary's ``data_setup.reuse``: the level that runs, and why where it is not the one
    asked for (``--reuse-level machine`` acts as ``gpu`` where it cannot hand rows over)."""
    if asked != "machine" or machine_level(topo, asked):
        return {"level": asked}
    why = (
        "peer links are not faster than host reads (the topology's bandwidths)"
        if not topo.peers_cheaper
        else "no NVLink group has two ranks"
    )
    return {"level": "gpu", "asked": "machine", "why": why}


def residue_of(topo, rank: int) -> tuple[int, int]:
    """``(g, i)``: the size of ``rank``'s NVLink group and its position among the group's ranks
    in ascending order (a topology file may list them in any order): the plan's member ``i``,
    whose cache holds the rows ``id mod g == i``."""
    members = sorted(topo.group_of(rank))
    return len(members), members.index(rank)


class GroupReuse:
    """The intra-machine level for one rank of a :class:`~gnnio.distributed.store.
    ShardedFeatureStore`: the needs exchange, the plan, and the hand-over of rows.

    ``members``: the rank's NVLink group (itself included; kept ascending, as the plan's member
    positions and :func:`residue_of` count them). ``prevs``: every
    member's host rows of the previous batch, from the last exchange (empty at the start).
    """

    def __init__(self, ctx, members: tuple[int, ...], group: str, by_residue: bool = False) -> None:
        self.ctx = ctx
        self.by_residue = bool(by_residue)
        # ascending whatever the topology's order: the exchanges' buffers are in rank order
        self.members = tuple(sorted(int(m) for m in members))
        self.me = self.members.index(ctx.rank)
        self.group = group
        self.prevs: list[np.ndarray] = [np.zeros(0, dtype=np.int64) for _ in self.members]
        self.forwarded_rows = 0  # rows this rank received from a member
        self.forwarded_from_prev = 0  # of those, rows a member held from its previous batch

    def exchange(self, needs: np.ndarray) -> tuple[GroupPlan, list[np.ndarray], int]:
        """Send this rank's host-row ``needs`` (sorted unique) to the group, receive theirs
        (two ``all_to_all_single`` over the whole group of the store: ranks outside the NVLink
        group send and receive nothing); returns the plan, every member's needs (the next
        gather's ``prevs``) and the request bytes sent."""
        ctx, w = self.ctx, self.ctx.world_size
        sc = [0] * w
        for m in self.members:
            if m != ctx.rank:
                sc[m] = int(needs.size)
        counts = ctx.all_to_all_single(torch.tensor(sc, dtype=torch.int64), group=self.group)
        rc = counts.cpu().tolist()
        send = torch.from_numpy(np.tile(needs.astype(np.int64, copy=False), len(self.members) - 1))
        got = ctx.all_to_all_single(send, rc, sc, group=self.group).cpu().numpy()
        bounds = np.r_[0, np.cumsum(rc)]
        all_needs = [
            needs if m == ctx.rank else got[bounds[m] : bounds[m + 1]] for m in self.members
        ]
        gp = plan(self.me, all_needs, self.prevs, self.by_residue)
        return gp, all_needs, 8 * (w + sum(sc))

    def splits(self, per_member: list[np.ndarray]) -> list[int]:
        """World-sized split sizes of per-member lists (0 for ranks outside the group)."""
        out = [0] * self.ctx.world_size
        for i, m in enumerate(self.members):
            out[m] = int(per_member[i].size)
        return out

    def hand_over(self, store, gp: GroupPlan, uniq, rows_u, place, extra=None) -> None:
        """The hand-over of ``store``'s gather (one ``all_to_all_single``, sizes known from the
        plan): rows this rank read for the group or holds from its previous batch go to the
        members that need them; the rows it gets land in ``rows_u`` at ``place`` of their
        position in ``uniq`` (counted on the link they cross: ``peer``). ``extra``: ``(ids,
        rows)`` read for the others only (the plan reads by residue)."""
        rb, dev, t0 = store.row_bytes, store.device, time.perf_counter()
        total = sum(int(a.size) for a in gp.send)
        buf, off = store._scratch("forward", total), 0
        u_np = uniq.numpy()
        for ids, from_prev in zip(gp.send, gp.send_from_prev):
            if not ids.size:
                continue
            at = torch.arange(off, off + ids.size)
            fp = torch.from_numpy(from_prev)
            if bool(fp.any()):
                assert store._prev_ids is not None and store._prev_rows is not None
                p = torch.searchsorted(store._prev_ids, torch.from_numpy(ids[from_prev]))
                move_rows(store._prev_rows, p.to(dev), buf, at[fp].to(dev))
            if not bool(fp.all()):  # read this gather: in the batch's rows, or read for others
                new, at_new = ids[~from_prev], at[~fp]
                q = np.searchsorted(u_np, new).clip(max=max(u_np.size - 1, 0))
                inb = u_np[q] == new if u_np.size else np.zeros(new.size, dtype=bool)
                ib = torch.from_numpy(inb)
                move_rows(rows_u, place(torch.from_numpy(q[inb])).to(dev), buf, at_new[ib].to(dev))
                if not inb.all():
                    assert extra is not None  # (the plan reads by residue)
                    e = torch.from_numpy(np.searchsorted(extra[0].numpy(), new[~inb]))
                    move_rows(extra[1], e.to(dev), buf, at_new[~ib].to(dev))
            off += int(ids.size)
        sc, rc = self.splits(gp.send), self.splits(gp.recv)
        got_b = self.ctx.all_to_all_single(
            buf.view(torch.uint8).reshape(-1, rb), rc, sc, group=self.group
        )
        recv = np.concatenate(gp.recv)
        if recv.size:
            got = got_b.to(dev).view(store.dtype).reshape(-1, store.dim)
            q = torch.from_numpy(np.searchsorted(u_np, recv))
            move_rows(got, torch.arange(got.shape[0], device=dev), rows_u, place(q).to(dev))
        for m, ids in zip(self.members, gp.recv):
            if ids.size:
                store.counters.add(self.ctx.link_to(m), int(ids.size), rb)
        self.forwarded_rows += int(recv.size)
        self.forwarded_from_prev += gp.recv_from_prev
        store.collective_s += time.perf_counter() - t0
