"""Shards shared between the ranks of a machine, for ``shared`` sampling mode (HyDRA's memory
sharing; issue 26, item 4).

**CPU** (every run): each rank copies its shard's arrays (``nodes``, ``indptr``, ``indices``) into
torch shared-memory tensors backed by files in ``/dev/shm`` (``torch.from_file(...,
shared=True)``), the other ranks of its machine map them, and once every rank has mapped them
each rank removes the names of its machine's shards: the mappings stay valid and nothing is left
in ``/dev/shm`` once any rank returns, even if the run dies later. A peer's neighbour list is then read from the owner's memory, not from
pages of the partition files. The bytes read are counted by the sampler exactly as before.

**GPU** (CUDA IPC): when the shards live on a GPU, the owner's shard is a CUDA tensor there,
shared with torch's CUDA IPC (``torch.multiprocessing.reductions.reduce_tensor``: a handle the
other process opens with ``cudaIpcOpenMemHandle``), so a peer reads the owner's GPU memory
directly (over NVLink where there is one), as HyDRA does. :func:`share_shards` returns the
peers' arrays as CUDA tensors then; the sampler reads the rows it needs from them
(:func:`gather_lists`). Owners on other machines are never mapped: their rows go through
request/response.

**Which path** (:func:`sharing_path`) depends only on where the shards live, never on the
backend: the ``shard_device`` (:func:`shard_device`) is the rank's device unless the run names one
-- ``cuda:<local_rank>`` on NCCL with ``--device cuda``, the CPU on gloo -- and ``"cuda"`` puts the
shards on a GPU whatever the backend: two ranks on gloo on one GPU (``gnnio bench dist-sampling
--shard-device cuda``, the gpu-check step ``nccl``) run their collectives on gloo with CPU
tensors and share their shards on the GPU with CUDA IPC. No collective ever carries a shard
tensor: the handles and ``/dev/shm`` names travel as pickled objects.

All collectives run in the calling thread on the context's ``control`` group: the sampler is
built by the main thread, on every rank, in the same order.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import numpy as np
import torch

__all__ = ["SHM_DIR", "gather_lists", "shard_device", "share_shards", "sharing_path"]

SHM_DIR = Path("/dev/shm")
NAMES = ("nodes", "indptr", "indices")


def shard_device(ctx, want: str | torch.device | None = None) -> torch.device:
    """Where this rank's shard lives in shared mode: ``want`` None -> the rank's device
    (``ctx.device``); ``"cpu"``; ``"cuda"`` -> the rank's GPU (``ctx.device`` on NCCL, else
    ``cuda:<local_rank mod GPUs>``: several ranks on gloo may share one GPU). A ``ValueError``
    with one line for anything else or for ``"cuda"`` without a CUDA device."""
    if want is None:
        return torch.device(ctx.device)
    try:
        dev = torch.device(want)
    except (RuntimeError, TypeError):
        raise ValueError(f"shard device: cpu or cuda, got {want!r}") from None
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type != "cuda":
        raise ValueError(f"shard device: cpu or cuda, got {want!r}")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        raise ValueError("shard device cuda: no CUDA device is present")
    if dev.index is not None:
        raise ValueError(f"shard device: give cuda without an index (the rank's GPU), got {want!r}")
    if torch.device(ctx.device).type == "cuda":
        return torch.device(ctx.device)
    return torch.device("cuda", ctx.local_rank % torch.cuda.device_count())


def sharing_path(device: torch.device, shm_ok: bool) -> str:
    """How shards on ``device`` are shared within a machine: ``"cuda_ipc"`` (CUDA tensors,
    whatever the backend), ``"shm"`` (CPU, ``/dev/shm`` writable) or ``"files"`` (the caller
    maps the partition files)."""
    if torch.device(device).type == "cuda":
        return "cuda_ipc"
    return "shm" if shm_ok else "files"


def share_shards(ctx, arrays: dict[str, np.ndarray], peers: list[int], device=None):
    """Share this rank's shard ``arrays`` and map those of ``peers`` (ranks of this machine).

    ``device``: where the shards live (:func:`shard_device`; None: the CPU). Returns ``(mapped,
    via)``: ``{peer: {name: array}}`` (NumPy arrays in shared memory on the CPU; CUDA tensors
    with CUDA IPC) and how (:func:`sharing_path`). A collective step: every rank calls it, with
    the same ``device`` type, with or without peers."""
    device = torch.device("cpu") if device is None else torch.device(device)
    use = SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK)
    via = sharing_path(device, use)
    if via == "cuda_ipc":
        return _share_cuda(ctx, arrays, peers, device), via
    tag = [uuid.uuid4().hex if ctx.is_main else None]
    ctx.broadcast_object_list(tag)
    mine: dict[str, tuple[str, str, tuple[int, ...]]] = {}
    if use:
        for name in NAMES:
            a = np.ascontiguousarray(arrays[name])
            path = SHM_DIR / f"gnnio-{tag[0]}-r{ctx.rank}-{name}"
            t = torch.from_file(str(path), shared=True, size=max(a.size, 1),
                                dtype=torch.from_numpy(np.empty(0, a.dtype)).dtype)  # fmt: skip
            if a.size:
                t.numpy()[: a.size] = a.reshape(-1)  # (a may be read-only: no tensor of it)
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
        ctx.barrier()  # every rank of this machine has mapped what it needs: the names can go
        # each rank removes its peers' names as well as its own, so that none is left on this
        # machine once share_shards returns on any of its ranks (not only once the last returns)
        names = [path for k in peers if every[k] is not None for path, _, _ in every[k].values()]
        for path in [p for p, _, _ in mine.values()] + names:
            Path(path).unlink(missing_ok=True)
    return mapped, via


def _to_device(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """``a`` as a 1-D tensor of at least one element on ``device`` (CUDA IPC cannot share an
    empty allocation; the receiver cuts it back to the real length)."""
    t = torch.from_numpy(np.require(np.reshape(a, -1), requirements=["C", "W"]))  # (a: read-only?)
    if t.numel() == 0:
        t = torch.zeros(1, dtype=t.dtype)
    return t.to(device)


def _reduce(t: torch.Tensor):  # pragma: no cover - needs CUDA (tests replace it)
    from torch.multiprocessing.reductions import reduce_tensor

    return reduce_tensor(t)


def _share_cuda(ctx, arrays, peers, device):
    """CUDA IPC: each rank's shard on ``device``, the handles exchanged as objects (on the
    ``control`` group); a peer's arrays come back as CUDA tensors of the owner's memory."""
    keep, handles = {}, {}
    for n in NAMES:
        a = np.asarray(arrays[n])
        keep[n] = _to_device(a, device)
        handles[n] = (_reduce(keep[n]), a.shape)
    every = ctx.all_gather_object(handles)
    mapped = {}
    for k in peers:
        views = {}
        for n, ((fn, args), shape) in every[k].items():
            t = fn(*args)
            views[n] = t[: int(np.prod(shape))].reshape(shape)
        mapped[k] = views
    # the owner keeps its shard alive as long as the run (a peer may read it at any time)
    ctx._extra.setdefault("ipc_keep", []).append(keep)
    ctx.barrier()
    return mapped


def gather_lists(indptr: torch.Tensor, indices: torch.Tensor, local: np.ndarray, window=None):
    """The neighbour lists of rows ``local`` of a shard held as tensors on any device (a peer's
    GPU with CUDA IPC), copied into a compact CPU CSR: ``(indptr, indices)`` with row ``i`` the
    list of ``local[i]``. The sampler's kernels then run on it unchanged.

    ``window`` ``(starts_of, theta)`` (threshold pruning, HyDRA §III-A3: only ``theta``
    contiguous neighbours are transmitted): a row longer than ``theta`` copies only its circular
    window of ``theta`` positions from ``starts_of(degrees)[i]`` (the start the pruned kernels
    draw); the compact row keeps its full length, so the kernels find the window where they look
    for it, and its other entries are -1, never read."""
    dev = indptr.device
    loc = torch.from_numpy(np.require(local, np.int64, ["C", "W"])).to(dev)  # (read-only?)
    start, end = indptr[loc].long(), indptr[loc + 1].long()
    deg = end - start
    ptr = torch.zeros(loc.numel() + 1, dtype=torch.int64, device=dev)
    torch.cumsum(deg, 0, out=ptr[1:])
    total = int(ptr[-1])
    if window is None:
        pos = torch.arange(total, device=dev) - torch.repeat_interleave(ptr[:-1], deg)
        idx = torch.repeat_interleave(start, deg) + pos
        return ptr.cpu().numpy(), indices[idx].cpu().numpy()
    starts_of, theta = window
    d, s0, p = deg.cpu().numpy(), start.cpu().numpy(), ptr.cpu().numpy()
    cut = d > theta
    st = np.where(cut, starts_of(d), 0)
    n = np.where(cut, theta, d)  # entries copied per row
    row = np.repeat(np.arange(d.shape[0], dtype=np.int64), n)
    off = st[row] + np.arange(row.shape[0], dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
    off %= np.maximum(d[row], 1)
    out = np.full(total, -1, dtype=torch.empty(0, dtype=indices.dtype).numpy().dtype)
    out[p[row] + off] = indices[torch.from_numpy(s0[row] + off).to(dev)].cpu().numpy()
    return p, out
