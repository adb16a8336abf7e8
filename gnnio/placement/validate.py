"""Reading a placement file (``gnnio plan --save``) with every field checked, and binding it to
the dataset it was made for (issue 16).

A placement file is an ``.npz`` without pickled objects (:func:`gnnio.placement.save_placement`).
:func:`read_fields` refuses, with one line naming the file and the field, anything a writer
never produces: a missing or unexpected array, ``group_sizes`` that do not add up to
``group_devices`` or devices that are not ``0..D-1`` exactly once, a buffer count other than the
device count, buffers that are not 1-D integer arrays (float ids), ids out of ``[0, num_nodes)``
or repeated within a buffer, a negative ``num_nodes``, a ``parts`` array of the wrong length or
with parts out of range, ``params_json`` that is not a JSON object.

:func:`check_for_dataset` refuses a placement made for another dataset: ``gnnio plan --save``
records the dataset's name and :attr:`~gnnio.graph.dataset.Dataset.fingerprint` (a hash of the
sha256 checksums of its arrays) in the placement's params, so a plan made for Cora is refused on
a reordered Cora (the same node count, other ids), and a file that records no dataset is refused
too (:func:`bind` records one for placements built in Python).
"""

from __future__ import annotations

import json
import os
import re
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UsageError

__all__ = ["PLACEMENT_FORMAT", "bind", "check_for_dataset", "read_fields"]

PLACEMENT_FORMAT = "gnnio-placement-v1"
_SCALARS = ("format", "strategy", "num_nodes", "group_sizes", "group_devices", "peer_reads",
            "params_json", "prep_s")  # fmt: skip
_FINGERPRINT = re.compile(r"^[0-9a-f]{16}$")
#: the most nodes a placement may describe (its lookup arrays are N entries per GPU)
MAX_NODES = 1 << 40


def _ints(z, key: str, path: Path, ndim: int) -> np.ndarray:
    a = z[key]
    if a.dtype.kind not in "iu" or a.ndim != ndim:
        want = "an integer" if ndim == 0 else f"a {ndim}-D integer array"
        raise UsageError(f"{path}: '{key}' must be {want}, got {a.dtype} of shape {list(a.shape)}")
    return a


def read_fields(path: str | os.PathLike) -> dict[str, Any]:
    """The fields of the :class:`~gnnio.placement.Placement` stored in ``path`` (its constructor's
    keyword arguments), every one checked (module docstring); one-line
    :class:`~gnnio.errors.UsageError` otherwise."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{path}: placement file not found")
    try:
        with open(path, "rb") as f:
            head = f.read(6)
        if not head.startswith((b"PK", b"\x93NUMPY")):  # np.load would try to unpickle it
            why = "not an .npz; 'gnnio plan --save' writes one"
            raise UsageError(f"{path}: not a gnnio placement file ({why})")
        z = np.load(path, allow_pickle=False)
        if not hasattr(z, "files"):
            raise UsageError(f"{path}: not a gnnio placement file (a .npy, not an .npz)")
        with z:
            keys = set(z.files)
            if (
                "format" not in keys
                or z["format"].dtype.kind != "U"
                or str(z["format"]) != PLACEMENT_FORMAT
            ):
                raise UsageError(f"{path}: not a gnnio placement file ({PLACEMENT_FORMAT})")
            missing = [k for k in _SCALARS if k not in keys]
            if missing:
                raise UsageError(f"{path}: missing '{missing[0]}'")
            n = int(_ints(z, "num_nodes", path, 0))
            if not 0 <= n <= MAX_NODES:
                raise UsageError(f"{path}: num_nodes must be in [0, 2^40], got {n}")
            sizes = [int(s) for s in _ints(z, "group_sizes", path, 1)]
            devs = [int(d) for d in _ints(z, "group_devices", path, 1)]
            if not sizes or min(sizes) < 1 or sum(sizes) != len(devs):
                raise UsageError(
                    f"{path}: group_sizes {sizes} do not split the {len(devs)} group_devices "
                    "into non-empty groups"
                )
            if sorted(devs) != list(range(len(devs))):
                raise UsageError(
                    f"{path}: group_devices {devs} must hold the devices 0..{len(devs) - 1} "
                    "exactly once"
                )
            bufs = [f"buffer_{i}" for i in range(len(devs))]
            extra = sorted(keys - set(_SCALARS) - set(bufs) - {"parts"})
            if extra:
                raise UsageError(
                    f"{path}: unexpected array '{extra[0]}' (the groups describe "
                    f"{len(devs)} devices)"
                )
            absent = [b for b in bufs if b not in keys]
            if absent:
                raise UsageError(f"{path}: missing '{absent[0]}' ({len(devs)} devices)")
            buffers = []
            for i, b in enumerate(bufs):
                a = _ints(z, b, path, 1).astype(np.int64)
                if a.size and (int(a.min()) < 0 or int(a.max()) >= n):
                    bad = int(a.min()) if int(a.min()) < 0 else int(a.max())
                    raise UsageError(f"{path}: buffer {i} holds node {bad}, outside [0, {n})")
                if np.unique(a).shape[0] != a.shape[0]:
                    raise UsageError(f"{path}: buffer {i} holds a node twice")
                buffers.append(a)
            parts = None
            if "parts" in keys:
                parts = _ints(z, "parts", path, 1)
                if parts.shape[0] != n or (
                    n and (int(parts.min()) < -1 or int(parts.max()) >= len(devs))
                ):
                    raise UsageError(
                        f"{path}: 'parts' must give each of the {n} nodes a part in "
                        f"[-1, {len(devs)})"
                    )
                parts = parts.astype(np.int16)
            pr = z["peer_reads"]
            if pr.dtype != np.bool_ or pr.ndim != 0:
                raise UsageError(f"{path}: 'peer_reads' must be a boolean")
            try:
                params = json.loads(str(z["params_json"]))
            except (ValueError, RecursionError):
                params = None
            if not isinstance(params, dict):
                raise UsageError(f"{path}: 'params_json' must hold a JSON object")
            fp = params.get("dataset_fingerprint")
            if fp is not None and not (isinstance(fp, str) and _FINGERPRINT.match(fp)):
                raise UsageError(f"{path}: dataset_fingerprint must be 16 hex digits, got {fp!r}")
            prep = z["prep_s"]
            if prep.dtype.kind != "f" or prep.ndim != 0 or not np.isfinite(prep):
                raise UsageError(f"{path}: 'prep_s' must be a finite number")
            groups, s0 = [], 0
            for s in sizes:
                groups.append(tuple(devs[s0 : s0 + s]))
                s0 += s
            return dict(
                strategy=str(z["strategy"]),
                num_nodes=n,
                groups=tuple(groups),
                buffers=buffers,
                peer_reads=bool(pr),
                params=params,
                prep_s=float(prep),
                parts=parts,
            )
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise UsageError(f"{path}: cannot read placement: {e}".replace("\n", " ")) from None


def bind(placement, dataset) -> None:
    """Record ``dataset`` (name and fingerprint) in ``placement.params``, as ``gnnio plan
    --save`` does: :func:`check_for_dataset` then accepts the saved file for it only."""
    placement.params.update(dataset=dataset.name, dataset_fingerprint=dataset.fingerprint)


def check_for_dataset(placement, path: Any, dataset, option: str = "--placement") -> None:
    """Refuse (one line) ``placement`` (read from ``path``) for ``dataset`` when it was made for
    another node count or another dataset, or records no dataset at all."""
    n = dataset.num_nodes
    if placement.num_nodes != n:
        raise UsageError(
            f"{option} {path}: made for a dataset of {placement.num_nodes} nodes, "
            f"{dataset.name} has {n}"
        )
    fp = placement.params.get("dataset_fingerprint")
    if fp is None:
        raise UsageError(
            f"{option} {path}: records no dataset it was made for; make it with "
            f"'gnnio plan {dataset.path} --save FILE' (or gnnio.placement.validate.bind in Python)"
        )
    if fp != dataset.fingerprint:
        raise UsageError(
            f"{option} {path}: made for dataset '{placement.params.get('dataset', '?')}' ({fp}), "
            f"not {dataset.name} ({dataset.fingerprint}): another dataset, or the same graph "
            "reordered or rewritten (other node ids); run gnnio plan on this one"
        )
