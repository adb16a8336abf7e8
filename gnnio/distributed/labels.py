"""A rank's labels: only those of the seeds it can train or evaluate on, read with ``pread``
(issue 26).

One process reads ``labels[seeds]`` through the memory-mapped ``labels.npy`` of all ``N`` nodes
(8 bytes per node). In a rank, every page those reads touch stays mapped and counts in its RSS
(with fault-around, seeds at random soon map the whole file: up to 32 MiB at 2^22 nodes, in
every rank), and a copy would be an anonymous array of ``N``. A rank needs far fewer: the labels
of the training seeds (every one of them, since the global shuffle deals any seed to any rank in
some epoch; with ``--local-seeds`` those of its own partition only) and of the validation and
test seeds (the evaluation order deals them alike). :func:`read_seed_labels` reads exactly these
with one ``pread`` each (:func:`gnnio.distributed.hostrows.pread_into`: nothing of the file is
mapped) into a :class:`SeedLabels`, 16 bytes per seed held (its id and its label), which the
loaders (on the CPU or the rank's GPU) and BGL's seed order look up as they would index the
whole array.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from .hostrows import pread_into

__all__ = ["SeedLabels", "read_seed_labels"]


class SeedLabels:
    """The labels of some nodes, looked up by global id: ``labels[seeds]`` as on the ``[N]``
    array, for seeds it holds (a seed it does not hold is an error, never a made-up label).

    Args:
        ids: sorted distinct global ids (int64 tensor).
        values: their labels (int64 tensor, -1 = unlabeled), aligned with ``ids``.
    """

    def __init__(self, ids: torch.Tensor, values: torch.Tensor) -> None:
        self.ids, self.values = ids, values

    @property
    def device(self) -> torch.device:
        return self.ids.device

    @property
    def nbytes(self) -> int:
        return int(self.ids.nbytes + self.values.nbytes)

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def to(self, device, non_blocking: bool = False) -> SeedLabels:
        """The same labels on ``device``."""
        if torch.device(device) == self.device:
            return self
        return SeedLabels(
            self.ids.to(device, non_blocking=non_blocking),
            self.values.to(device, non_blocking=non_blocking),
        )

    def __getitem__(self, seeds) -> torch.Tensor:
        """Labels of ``seeds`` (global ids, any shape, on this object's device), by binary
        search. On the CPU a seed it does not hold raises ``KeyError``; on a GPU the check is
        an asynchronous device assertion (no host sync)."""
        seeds = torch.as_tensor(seeds, device=self.device)
        if not self.ids.numel():
            if seeds.numel():
                raise KeyError("labels: none held, asked for some")
            return self.values[:0].reshape(seeds.shape)
        pos = torch.searchsorted(self.ids, seeds).clamp_(max=self.ids.shape[0] - 1)
        hit = self.ids[pos] == seeds
        if self.device.type == "cpu":
            if not bool(hit.all()):
                bad = int(seeds[~hit].reshape(-1)[0])
                raise KeyError(f"labels: node {bad} is not one of the {len(self)} seeds held")
        else:
            torch._assert_async(hit.all(), "labels: a node that is not one of the seeds held")
        return self.values[pos]

    def numpy_of(self, seeds) -> np.ndarray:
        """``self[seeds]`` as a NumPy array (CPU)."""
        return self.to("cpu")[torch.as_tensor(np.asarray(seeds, dtype=np.int64))].numpy()


def read_seed_labels(labels: np.ndarray, *splits) -> SeedLabels:
    """The labels of every node in ``splits`` (arrays of global ids, e.g. the train, valid and
    test splits) from ``labels`` (the dataset's ``[N]`` int64 array): by ``pread`` from its file
    when it is a memory mapping of one (nothing of it mapped, module docstring), else by
    indexing it."""
    parts = [np.asarray(s, dtype=np.int64).reshape(-1) for s in splits if s is not None]
    ids = np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
    out = np.empty(ids.shape[0], dtype=np.int64)
    path = getattr(labels, "filename", None)
    if isinstance(labels, np.memmap) and path is not None:
        if labels.dtype != np.int64 or labels.ndim != 1 or not labels.flags.c_contiguous:
            raise ValueError(f"{path}: labels must be a C-contiguous 1-D int64 array")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            rows = out.view(np.uint8).reshape(-1, 8)
            at = np.arange(ids.shape[0], dtype=np.int64)
            pread_into(fd, str(path), ids, rows, at, int(labels.offset))
        finally:
            os.close(fd)
    else:
        out[:] = np.asarray(labels, dtype=np.int64)[ids]
    return SeedLabels(torch.from_numpy(ids), torch.from_numpy(out))
