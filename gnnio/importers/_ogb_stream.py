"""OGB's files read as streams: members of ``.npz`` archives row block by row block, and edge
lists spilled to a temporary file for imports within a memory budget (issue 25, item 1).

An OGB edge list is a gzip CSV (or a member of an ``.npz`` archive) that can only be read front to
back, but :func:`gnnio.preprocess.chunked.build_csr` reads the edges once per bucket of rows. The
in-memory importer holds them as two int64 arrays (16 bytes per edge); here they are written, one
parsed block at a time, to a file in a temporary directory and read back through a mapping whose
pages are dropped after each chunk (:class:`~gnnio.preprocess.chunked.EdgeArrays`).
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import IO

import numpy as np

from ..errors import DatasetError
from ..preprocess.chunked import EdgeArrays, write_to
from ..utils.progress import bar
from ._common import parse_csv_block, rows_per_chunk

__all__ = ["npz_header", "npz_load", "spill_csv_edges", "spill_npz_edges", "stream_npz_rows"]


def npz_header(f: IO[bytes], where: str):
    """``(shape, fortran_order, dtype)`` of the ``.npy`` member open as ``f``; a one-line
    DatasetError for anything else."""
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            return np.lib.format.read_array_header_1_0(f)
        if version == (2, 0):
            return np.lib.format.read_array_header_2_0(f)
    except ValueError as e:
        raise DatasetError(f"{where}: not a .npy member ({e})") from None
    raise DatasetError(f"{where}: unsupported .npy version {version}")


def _out_of_range(lo: int, hi: int, n: int, where) -> None:
    if lo < 0 or hi >= n:
        raise DatasetError(f"{where}: node id {lo if lo < 0 else hi} is out of range [0, {n})")


def spill_csv_edges(blocks: Iterable[tuple[int, bytes]], path: Path, n: int, e: int | None,
                    spill: Path, progress: bool) -> tuple[EdgeArrays, int]:  # fmt: skip
    """Parse ``src,dst`` CSV ``blocks`` of ``path`` (checked as the in-memory reader checks them:
    ``e`` edges if given, ids in ``[0, n)``) into the file ``spill`` as int64 ``[E, 2]``.
    Returns the edges over it and the number of self-loops."""
    pos = loops = 0
    lo, hi = 0, -1
    with open(spill, "wb") as f, bar(total=e, desc="edges", unit="edge", enabled=progress) as pb:
        for first, block in blocks:
            arr = parse_csv_block(block, np.int64, 2, str(path), first)
            k = arr.shape[0]
            if e is not None and pos + k > e:
                raise DatasetError(f"{path}: more than {e} edges (num-edge-list says {e})")
            if k:
                lo, hi = min(lo, int(arr.min())), max(hi, int(arr.max()))
                loops += int(np.count_nonzero(arr[:, 0] == arr[:, 1]))
            write_to(f, arr, spill)
            pos += k
            pb.update(k)
    if e is not None and pos != e:
        raise DatasetError(f"{path}: {pos} edges, but num-edge-list says {e}")
    _out_of_range(lo, hi, n, path)
    mm = np.memmap(spill, dtype=np.int64, mode="r", shape=(pos, 2)) if pos else np.zeros((0, 2))
    return EdgeArrays(mm[:, 0], mm[:, 1]), loops


def spill_npz_edges(npz: Path, n: int, spill: Path) -> tuple[EdgeArrays, int]:
    """Copy the member ``edge_index`` (integers ``[2, E]``) of the archive ``npz`` to the file
    ``spill`` as it is stored, without reading it into RAM; returns the edges over it (ids checked
    in ``[0, n)``, one chunk at a time) and the number of self-loops."""
    where = f"{npz}[edge_index]"
    try:
        with zipfile.ZipFile(npz) as zf, zf.open("edge_index.npy") as f:
            shape, fortran, dtype = npz_header(f, where)
            if len(shape) != 2 or shape[0] != 2 or dtype.kind not in "iu":
                raise DatasetError(f"{npz}: edge_index is {dtype} {list(shape)}, expected "
                                   "integers [2, E]")  # fmt: skip
            want = int(np.prod(shape)) * dtype.itemsize
            with open(spill, "wb") as out:
                got = 0
                while block := f.read(min(64 << 20, want - got) or 1):
                    write_to(out, block, spill)
                    got += len(block)
                    if got >= want:
                        break
            if got != want:
                raise DatasetError(f"{where}: truncated ({got:,} of {want:,} bytes)")
    except KeyError:
        raise DatasetError(f"{npz}: has no array 'edge_index'") from None
    except (OSError, zipfile.BadZipFile) as e:
        raise DatasetError(
            f"{npz}: cannot read 'edge_index' ({' '.join(str(e).split())})"
        ) from None
    # a Fortran-ordered [2, E] (e.g. a saved transpose) is stored as the C-ordered [E, 2]
    layout = (shape[1], 2) if fortran else tuple(shape)
    ei = np.memmap(spill, dtype=dtype, mode="r", shape=layout) if want else np.zeros(layout)
    edges = EdgeArrays(ei[:, 0], ei[:, 1]) if fortran else EdgeArrays(ei[0], ei[1])
    lo, hi, loops = 0, -1, 0
    for s, d in edges:
        if s.size:
            lo, hi = min(lo, int(s.min()), int(d.min())), max(hi, int(s.max()), int(d.max()))
            loops += int(np.count_nonzero(s == d))
    _out_of_range(lo, hi, n, npz)
    return edges, loops


def npz_load(path: Path, key: str) -> np.ndarray:
    """One (small enough) member of an .npz archive, without pickles."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if key not in z.files:
                raise DatasetError(f"{path}: has no array '{key}' (has {', '.join(z.files)})")
            return z[key]
    except (ValueError, OSError, zipfile.BadZipFile) as e:
        raise DatasetError(f"{path}: cannot read '{key}' ({' '.join(str(e).split())})") from None


def stream_npz_rows(path: Path, key: str, progress: bool):
    """Open ``key`` inside ``path`` and yield its shape/dtype, then row blocks, streamed."""
    where = f"{path}[{key}]"
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise DatasetError(f"{path}: not a readable .npz archive ({e})") from None
    with zf:
        if f"{key}.npy" not in zf.namelist():
            raise DatasetError(f"{path}: has no array '{key}'")
        with zf.open(f"{key}.npy") as f:
            shape, fortran, dtype = npz_header(f, where)
            if fortran or len(shape) != 2 or dtype.kind not in "biuf":  # (strings: no cast)
                raise DatasetError(
                    f"{where}: expected a C-ordered 2-D numeric array, got {dtype} {list(shape)}"
                )
            yield shape, dtype
            n, f_dim = shape
            step = rows_per_chunk(f_dim * dtype.itemsize)
            with bar(total=n, desc="features", unit="row", enabled=progress) as pb:
                for s in range(0, n, step):
                    k = min(step, n - s)
                    want = k * f_dim * dtype.itemsize
                    buf = f.read(want)
                    if len(buf) != want:
                        raise DatasetError(f"{where}: truncated at row {s}")
                    yield np.frombuffer(buf, dtype=dtype).reshape(k, f_dim)
                    pb.update(k)
