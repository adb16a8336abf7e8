"""The global random states a resumed run restores (:mod:`gnnio.train.checkpoint`): torch's CPU
generator (and the CUDA ones when CUDA is initialised), NumPy's and Python's, in types
``torch.load(weights_only=True)`` reads back."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

__all__ = ["capture_rng", "restore_rng"]


def capture_rng() -> dict[str, Any]:
    """Torch's (CPU, and CUDA when initialised), NumPy's and Python's global generator states, in
    types ``torch.load(weights_only=True)`` reads back."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    out: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "name": str(name),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def restore_rng(state: dict[str, Any]) -> None:
    """Undo :func:`capture_rng`."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(
        (n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
         n["cached_gaussian"])
    )  # fmt: skip
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
