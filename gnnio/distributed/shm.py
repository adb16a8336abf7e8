"""Shards shared between the ranks of a machine, for ``shared`` sampling mode (HyDRA's memory
sharing; issue 26, item 4).

**CPU** (every run): each rank copies its shard's arrays (``nodes``, ``indptr``, ``indices``) into
torch shared-memory tensors backed by files in ``/dev/shm`` (``torch.from_file(...,
shared=True)``), the other ranks of its machine map them, and once every rank has mapped them
the owner removes the names: the mappings stay valid and nothing is left in ``/dev/shm``, even
if the run dies later. A peer's neighbour list is then read from the owner's memory, not from
pages of the partition files. The bytes read are counted by the sampler exactly as before.

**GPU** (NCCL with ``--device cuda``; written, awaiting a GPU with two processes): the owner's
shard is a CUDA tensor on its GPU, shared with torch's CUDA IPC (``torch.multiprocessing.
reductions.reduce_tensor``: a handle the other process opens with ``cudaIpcOpenMemHandle``), so a
peer reads the owner's GPU memory directly (over NVLink where there is one), as HyDRA does.
:func:`share_shards` returns the peers' arrays as CUDA tensors then; the sampler reads the rows
it needs from them (:func:`gather_lists`). Owners on other machines are never mapped: their
rows go through request/response.

All collectives run in the calling thread on the context's ``control`` group: the sampler is
built by the main thread, on every rank, in the same order.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import numpy as np
import torch

__all__ = ["SHM_DIR", "gather_lists", "share_shards"]

SHM_DIR = Path("/dev/shm")
NAMES = ("nodes", "indptr", "indices")


def _use_cuda_ipc(ctx) -> bool:
    return ctx.backend == "nccl" and ctx.device.type == "cuda"


def share_shards(ctx, arrays: dict[str, np.ndarray], peers: list[int]):
    """Share this rank's shard ``arrays`` and map those of ``peers`` (ranks of this machine).

    Returns ``(mapped, via)``: ``{peer: {name: array}}`` (NumPy arrays in shared memory on the
    CPU; CUDA tensors with CUDA IPC) and how (``"shm"``, ``"cuda_ipc"``, or ``"files"`` where
    ``/dev/shm`` is missing: the caller then maps the partition files). A collective step: every
    rank calls it, with or without peers."""
    if _use_cuda_ipc(ctx):  # pragma: no cover - needs CUDA (gpu-check, two processes)
        return _share_cuda(ctx, arrays, peers), "cuda_ipc"
    tag = [uuid.uuid4().hex if ctx.is_main else None]
    ctx.broadcast_object_list(tag)
    use = SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK)
    mine: dict[str, tuple[str, str, tuple[int, ...]]] = {}
    if use:
        for name in NAMES:
            a = np.ascontiguousarray(arrays[name])
            path = SHM_DIR / f"gnnio-{tag[0]}-r{ctx.rank}-{name}"
            t = torch.from_file(str(path), shared=True, size=max(a.size, 1),
                                dtype=torch.from_numpy(a[:0]).dtype)  # fmt: skip
            if a.size:
                t[: a.size].copy_(torch.from_numpy(a).reshape(-1))
            mine[name] = (str(path), a.dtype.str, a.shape)
    every = ctx.all_gather_object(mine if use else None)
    mapped: dict[int, dict[str, np.ndarray]] = {}
    try:
        for k in peers:
            if every[k] is None:
                continue
            views = {}
            for name, (path, dt, shape) in every[k].items():
                n = int(np.prod(shape))
                dtype = np.dtype(dt)
                t = torch.from_file(path, shared=True, size=max(n, 1),
                                    dtype=torch.from_numpy(np.empty(0, dtype)).dtype)  # fmt: skip
                views[name] = t.numpy()[:n].reshape(shape)
            mapped[k] = views
    finally:
        ctx.barrier()  # every peer has mapped my shard: the names can go
        for path, _, _ in mine.values():
            Path(path).unlink(missing_ok=True)
    return mapped, ("shm" if use else "files")


def _share_cuda(ctx, arrays, peers):  # pragma: no cover - needs CUDA
    """CUDA IPC: each rank's shard on its GPU, the handles exchanged as objects."""
    from torch.multiprocessing.reductions import reduce_tensor

    keep = {n: torch.from_numpy(np.ascontiguousarray(arrays[n])).to(ctx.device) for n in NAMES}
    handles = {n: reduce_tensor(t) for n, t in keep.items()}
    every = ctx.all_gather_object(handles)
    mapped = {}
    for k in peers:
        mapped[k] = {n: fn(*args) for n, (fn, args) in every[k].items()}
    ctx._extra.setdefault("ipc_keep", []).append(keep)  # the owner keeps its shard alive
    ctx.barrier()
    return mapped


def gather_lists(indptr: torch.Tensor, indices: torch.Tensor, local: np.ndarray):
    """The neighbour lists of rows ``local`` of a shard held as tensors on any device (a peer's
    GPU with CUDA IPC), copied into a compact CPU CSR: ``(indptr, indices)`` with row ``i`` the
    list of ``local[i]``. The sampler's kernels then run on it unchanged."""
    dev = indptr.device
    loc = torch.from_numpy(np.asarray(local, dtype=np.int64)).to(dev)
    start, end = indptr[loc].long(), indptr[loc + 1].long()
    deg = end - start
    ptr = torch.zeros(loc.numel() + 1, dtype=torch.int64, device=dev)
    torch.cumsum(deg, 0, out=ptr[1:])
    total = int(ptr[-1])
    pos = torch.arange(total, device=dev) - torch.repeat_interleave(ptr[:-1], deg)
    idx = torch.repeat_interleave(start, deg) + pos
    return ptr.cpu().numpy(), indices[idx].cpu().numpy()
