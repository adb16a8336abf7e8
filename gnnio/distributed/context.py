"""The rank context of a distributed run: who am I, who shares my machine, which links I use.

A run is distributed when ``WORLD_SIZE`` > 1 is in the environment, as PyTorch's launchers set it
(``torchrun``, or ``gnnio train --nproc N``, which starts the same workers through
``torch.distributed.run``'s elastic launcher; see :mod:`gnnio.distributed.launch`). :func:`init` joins the
process group from ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` / ``MASTER_PORT`` (``env://``) and
learns every rank's machine with one ``all_gather`` of ``GROUP_RANK`` (torchrun's node rank).

Backends: NCCL when CUDA has a device for every local rank, else gloo; on gloo each rank is a
**simulated** device: its shard of feature rows is a CPU tensor and every byte that crosses a rank
boundary goes through a real gloo collective (loopback TCP between local processes) and is
counted per link.

Links (the ``bytes_by_link`` keys): ``local`` (the rank's own shard), ``peer`` (another rank of the
same machine), ``host`` (the machine's host memory), ``network`` (a rank on another machine).

Topology: a :class:`~gnnio.placement.topology.Topology` with one device per rank (rank ``k`` is
device ``k``). Given as ``--topology`` (``gnnio plan``'s strings), each NVLink group must lie
within one machine; by default it is inferred: one group per machine (``"P"`` on one machine,
``"P*M"`` for ``M`` machines of ``P`` ranks).

**Every collective goes through this context** (issue 26). Its methods put each tensor on the
device the backend needs (:attr:`DistContext.comm_device`: ``cuda:<local_rank>`` on NCCL, which
refuses CPU tensors and another rank's device; the CPU on gloo), allocate the outputs there, and
name the process group by the thread that owns it, so no two threads ever issue collectives on one
communicator (on NCCL two threads on one communicator can interleave differently on different
ranks, and hang). The groups, created in this order on every rank, and their only users:

=================  ===========================================================================
``default``        DDP's gradient all-reduce (the main thread; on GPUs autograd's device thread
                   while the main thread waits in ``backward``)
``control``        the main thread's barriers, reductions, object gathers, the placement's
                   broadcast and the checkpoints' agreement
``fetch``          the training loader's gather thread (:class:`~gnnio.distributed.store.
                   ShardedFeatureStore` exchanges)
``sample``         the training loader's sampling thread (:mod:`gnnio.distributed.sampling`, dsp)
``eval_fetch``     the evaluation loaders' gather thread
``eval_sample``    the evaluation loaders' sampling thread
=================  ===========================================================================

``GNNIO_COMM_CHECK=DIR`` (tests, :mod:`gnnio.distributed.commcheck`) wraps ``torch.distributed``'s
collectives in every rank and records, per call, the thread and group, and every tensor NCCL
would refuse.
"""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..errors import UsageError

if TYPE_CHECKING:
    from ..placement.topology import Topology

__all__ = ["GROUPS", "DistContext", "env_world_size", "init", "infer_topology_spec"]

#: the process groups every rank creates, in this order, after the default one (module docstring)
GROUPS = ("control", "fetch", "sample", "eval_fetch", "eval_sample")

#: collective / rendezvous timeout (seconds) when ``--dist-timeout`` is not given
DEFAULT_TIMEOUT_S = 120.0


def env_world_size() -> int:
    """``WORLD_SIZE`` from the environment (1 when unset)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise UsageError(f"WORLD_SIZE: not an integer: {os.environ['WORLD_SIZE']!r}") from None


def infer_topology_spec(machine_of: list[int]) -> str:
    """Default topology string: one NVLink group per machine (ranks numbered machine-major)."""
    machines = sorted(set(machine_of))
    sizes = [machine_of.count(m) for m in machines]
    if len(machines) == 1:
        return str(sizes[0])
    if len(set(sizes)) == 1:
        return f"{sizes[0]}*{len(machines)}"
    return "+".join(str(s) for s in sizes)


@dataclass
class DistContext:
    """One rank's view of the run.

    Attributes:
        rank, world_size, local_rank: from the launcher's environment.
        machine_of: machine (torchrun node rank) of every rank.
        backend: ``"nccl"`` or ``"gloo"``.
        device: this rank's compute device (``cuda:<local_rank>`` with NCCL, else the CPU).
        simulated: True on gloo: devices are simulated in CPU memory.
        timeout_s: collective timeout.
        groups: :data:`GROUPS` name -> process group (module docstring: one thread each);
            ``"default"`` is the default group (None).
        topology: the machine description (one device per rank).
    """

    rank: int
    world_size: int
    local_rank: int
    machine_of: list[int]
    backend: str
    device: torch.device
    simulated: bool
    timeout_s: float
    groups: dict = field(default_factory=dict)
    topology: Topology | None = None
    topology_spec: str = ""
    inferred_topology: bool = True
    _extra: dict = field(default_factory=dict)

    @property
    def topo(self) -> Topology:
        """:attr:`topology`, which :func:`init_distributed` sets on every rank."""
        assert self.topology is not None, "a DistContext without its topology"
        return self.topology

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def machine(self) -> int:
        return self.machine_of[self.rank]

    @property
    def num_machines(self) -> int:
        return len(set(self.machine_of))

    def link_to(self, other: int) -> str:
        """Link a row crosses from rank ``other`` to this rank."""
        if other == self.rank:
            return "local"
        return "peer" if self.machine_of[other] == self.machine else "network"

    # -- collectives: the one place that issues them (module docstring) ---------------------
    @property
    def comm_device(self) -> torch.device:
        """Where collective buffers live: the GPU for NCCL, the CPU for gloo."""
        return self.device if self.backend == "nccl" else torch.device("cpu")

    def group(self, name: str):
        """The process group called ``name`` (:data:`GROUPS`, or ``"default"``: None)."""
        if name == "default":
            return None
        try:
            return self.groups[name]
        except KeyError:
            raise ValueError(
                f"no process group {name!r} (have default, {', '.join(GROUPS)})"
            ) from None

    def to_comm(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` on :attr:`comm_device`, contiguous (the same tensor when it already is)."""
        out = t.to(self.comm_device).contiguous()
        check = self._extra.get("check")
        if check is not None:
            check.placed(out)
        return out

    def empty(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised collective buffer on :attr:`comm_device`."""
        return self.to_comm(torch.empty(shape, dtype=dtype, device=self.comm_device))

    def all_to_all_single(
        self, send: torch.Tensor, recv_splits=None, send_splits=None, group: str = "fetch",
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """``all_to_all_single`` of ``send`` (split along dim 0 by ``send_splits``; None: equal
        parts); returns the received tensor on :attr:`comm_device` (``out`` if given)."""
        import torch.distributed as dist

        send = self.to_comm(send)
        n = send.shape[0] if recv_splits is None else int(sum(recv_splits))
        if out is None:
            out = self.empty((n, *send.shape[1:]), send.dtype)
        else:
            out = self.to_comm(out)
        dist.all_to_all_single(out, send, recv_splits, send_splits, group=self.group(group))
        return out

    def all_reduce(self, t: torch.Tensor, group: str = "default", async_op: bool = False):
        """Sum ``t`` over ranks in place. ``async_op``: ``t`` must already be on
        :attr:`comm_device` (DDP's buckets are); returns the work handle."""
        import torch.distributed as dist

        c = self.to_comm(t)
        if async_op:
            if c.data_ptr() != t.data_ptr():
                raise ValueError(f"all_reduce(async_op=True): tensor on {t.device}, not "
                                 f"{self.comm_device}")  # fmt: skip
            return dist.all_reduce(c, group=self.group(group), async_op=True)
        dist.all_reduce(c, group=self.group(group))
        if c.data_ptr() != t.data_ptr():
            t.copy_(c)
        return None

    def barrier(self, group: str = "control") -> None:
        import torch.distributed as dist

        dist.barrier(group=self.group(group))

    def all_reduce_sum(self, values: list[float], group: str = "control") -> list[float]:
        """Element-wise sum over ranks (float64)."""
        t = self.to_comm(torch.tensor(values, dtype=torch.float64))
        self.all_reduce(t, group=group)
        return t.cpu().tolist()

    def all_gather_object(self, obj, group: str = "control") -> list:
        """Every rank's ``obj`` (pickled; on NCCL through ``cuda:<local_rank>``, which
        :func:`init` made the current device)."""
        import torch.distributed as dist

        out: list = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group(group))
        return out

    def broadcast_object_list(self, objs: list, src: int = 0, group: str = "control") -> None:
        """``objs`` of rank ``src`` on every rank (in place)."""
        import torch.distributed as dist

        dist.broadcast_object_list(objs, src=src, group=self.group(group))

    def describe(self) -> str:
        kind = (
            "simulated devices (gloo, CPU)"
            if self.simulated
            else f"{self.backend} on {self.device}"
        )
        return (
            f"{self.world_size} ranks on {self.num_machines} machine(s), topology "
            f"{self.topology_spec}, {kind}"
        )


def check_topology(spec: str, machine_of: list[int]) -> Any:
    """The :class:`~gnnio.placement.topology.Topology` that ``--topology spec`` names, checked
    against the run: one device per rank, no NVLink group across machines (``machine_of[r]``
    is rank r's machine). The launcher calls it before any rank starts (all ranks on machine 0),
    each rank again in :func:`init`."""
    from ..placement.topology import load_topology

    world = len(machine_of)
    try:
        topo = load_topology(spec)
    except UsageError as e:
        msg = str(e)  # load_topology's errors name --topology or the file already
        if not msg.startswith("--topology"):
            msg = f"--topology {msg}" if msg.startswith(spec) else f"--topology {spec}: {msg}"
        raise UsageError(msg) from None
    except Exception as e:  # noqa: BLE001
        raise UsageError(f"--topology {spec}: {e}") from None
    if topo.num_gpus != world:
        raise UsageError(
            f"--topology {spec}: describes {topo.num_gpus} devices but the run has {world} ranks"
        )
    for g in topo.groups:
        if len({machine_of[d] for d in g}) > 1:
            raise UsageError(
                f"--topology {spec}: NVLink group {list(g)} spans several machines "
                f"(ranks per machine: {machine_of})"
            )
    return topo


def init(
    timeout_s: float | None = None,
    device: str = "cpu",
    topology: str | None = None,
) -> DistContext:
    """Join the process group described by the environment and build the context.

    Args:
        timeout_s: rendezvous and collective timeout; None = :data:`DEFAULT_TIMEOUT_S`.
        device: ``"cpu"`` (gloo, simulated devices) or ``"cuda"`` (NCCL when CUDA has a device
            for every local rank).
        topology: NVLink groups as ``gnnio plan`` takes them, or None (inferred).
    """
    import torch.distributed as dist

    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            raise UsageError(
                f"distributed run: {var} is not set (launch with gnnio train --nproc N or torchrun)"
            )
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    node = int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0")))
    timeout = float(timeout_s if timeout_s is not None else DEFAULT_TIMEOUT_S)
    want_cuda = torch.device(device).type == "cuda"
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    use_nccl = want_cuda and torch.cuda.is_available() and torch.cuda.device_count() >= local_world
    if want_cuda and not use_nccl:
        raise UsageError(
            f"--device cuda: {local_world} rank(s) on this machine need as many CUDA devices, "
            f"found {torch.cuda.device_count() if torch.cuda.is_available() else 0}"
        )
    backend = "nccl" if use_nccl else "gloo"
    dev = torch.device("cuda", local_rank) if use_nccl else torch.device("cpu")
    if use_nccl:
        torch.cuda.set_device(dev)
    td = _dt.timedelta(seconds=timeout)
    try:
        dist.init_process_group(backend, init_method="env://", timeout=td)
    except Exception as e:  # noqa: BLE001 - a rendezvous failure becomes one line
        raise UsageError(
            f"rank {rank}: could not join the process group at "
            f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} within {timeout:g} s "
            f"(--dist-timeout): {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from None
    # one group per thread that issues collectives, created in the same order on every rank
    groups = {name: dist.new_group(backend=backend, timeout=td) for name in GROUPS}
    machines: list[Any] = [None] * world
    dist.all_gather_object(machines, node, group=groups["control"])
    machine_of = [int(m) for m in machines]
    inferred = topology is None
    spec = infer_topology_spec(machine_of) if inferred else str(topology)
    topo = check_topology(spec, machine_of)
    ctx = DistContext(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        machine_of=machine_of,
        backend=backend,
        device=dev,
        simulated=not use_nccl,
        timeout_s=timeout,
        groups=groups,
        topology=topo,
        topology_spec=spec,
        inferred_topology=inferred,
    )
    from .commcheck import install_from_env

    install_from_env(ctx)
    return ctx


def shutdown() -> None:
    """Leave the process group (no-op when none); writes a communication check's record."""
    import torch.distributed as dist

    from .commcheck import finish_active

    finish_active()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
