"""OGB node-property datasets (ogbn-arxiv, ogbn-products, ogbn-papers100M, ...) from a local copy.

gnnio reads the OGB on-disk layout itself (``shared/OGB-FORMAT.md``) and never downloads:

  ``<root>/<name with - as _>/`` (or ``--root`` pointing at that folder) holding
  - ``raw/num-node-list.csv.gz`` (N), ``raw/num-edge-list.csv.gz`` (E, optional),
  - ``raw/edge.csv.gz``: headerless ``src,dst`` rows (directed edge src -> dst),
  - ``raw/node-feat.csv.gz``: N rows of F floats,
  - ``raw/node-label.csv.gz`` (optional): one class id per row, NaN or empty = unlabeled,
  - ``split/<scheme>/{train,valid,test}.csv.gz`` (optional): one node id per line.
  The binary layout of ogbn-papers100M (``raw/data.npz`` with ``edge_index``, ``num_nodes_list``,
  ``node_feat``; ``raw/node-label.npz`` with ``node_label``) is read with ``allow_pickle=False``.
  ``split_dict.pt`` is a pickle and is never loaded. Plain ``.csv`` files are accepted in place of
  ``.csv.gz``.

Everything is streamed: the CSVs are read in blocks of lines and parsed by NumPy's C parser, and
feature rows are written straight into the output memmap, so RAM holds the edge list (16 bytes
per edge) and the CSR construction (about 50 more bytes per input edge at the peak when
symmetrized, see :func:`._common.edges_to_graph`) plus one block, never the feature matrix. Edges are
symmetrized by default (GNN practice for arxiv; products is stored one-way and mirrored by OGB
itself), always deduplicated; self-loops are kept as stored. Labels: NaN -> -1.
"""

from __future__ import annotations

import gzip
import shutil
import zlib
from contextlib import ExitStack
from pathlib import Path
from typing import IO, cast

import numpy as np

from ..errors import DatasetError, UsageError
from ..graph import output_dir
from ..graph.csr import index_dtype
from ..graph.format import DatasetWriter
from ..preprocess.chunked import MIN_BUCKET, build_csr, csr_fixed_bytes, refuse_budget
from ..utils.pages import drop_pages
from ..utils.progress import bar
from ._common import (
    add_nonfinite_argument,
    edges_to_graph,
    feature_dtype_for,
    iter_line_blocks,
    labels_to_int64,
    output_bytes,
    parse_csv_block,
    write_graph,
)
from ._ogb_stream import npz_load as _npz_load
from ._ogb_stream import spill_csv_edges, spill_npz_edges, stream_npz_rows

__all__ = ["prepare_ogb", "resolve_ogb_dir", "HELP", "DESCRIPTION"]

HELP = "OGB node-property datasets from a local OGB folder (no download)"
DESCRIPTION = (
    "Import an OGB node-property dataset (ogbn-arxiv, ogbn-products, ogbn-papers100M, ...) from its "
    "on-disk layout under --root (raw/*.csv.gz or raw/data.npz, split/<scheme>/*.csv.gz). Nothing "
    "is downloaded and split_dict.pt is never unpickled. Files are streamed; features go straight "
    "to disk."
)

#: default split scheme when a dataset folder has several
DEFAULT_SCHEMES = {
    "ogbn-arxiv": "time",
    "ogbn-papers100M": "time",
    "ogbn-products": "sales_ranking",
    "ogbn-proteins": "species",
    "ogbn-mag": "time",
}
BLOCK_BYTES = 16 << 20


def add_arguments(parser) -> None:
    import argparse

    parser.add_argument(
        "--root",
        required=True,
        help="folder holding <name>/ (e.g. ogbn_arxiv/), or the dataset folder itself",
    )
    parser.add_argument(
        "--name",
        default=None,
        help="dataset name, e.g. ogbn-arxiv (default: the only dataset folder under --root)",
    )
    parser.add_argument(
        "--split-scheme",
        default="auto",
        help="folder under split/ to read (auto: the only one, or the dataset's usual one)",
    )
    parser.add_argument(
        "--symmetrize",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="add every edge reversed (deduplicated)",
    )
    add_nonfinite_argument(parser)


def run(args) -> Path:
    return prepare_ogb(
        args.root,
        args.out,
        name=args.name,
        split_scheme=args.split_scheme,
        symmetrize=args.symmetrize,
        overwrite=args.overwrite,
        progress=not args.quiet,
        allow_nonfinite=args.allow_nonfinite,
        memory_budget=getattr(args, "memory_budget", None),
    )


# --- locating files ----------------------------------------------------------------------------


def resolve_ogb_dir(root: str | Path, name: str | None = None) -> tuple[Path, str]:
    """The dataset folder (the one with ``raw/``) and the dataset name.

    ``root`` may be the dataset folder itself or its parent; with a parent, ``name`` picks
    ``<root>/<name with - replaced by _>``, or, without ``name``, the only subfolder with ``raw/``.
    """
    root = Path(root)
    if not root.is_dir():
        raise DatasetError(f"--root {root}: no such directory")
    if (root / "raw").is_dir():
        return root, name or root.name.replace("_", "-")
    if name:
        d = root / name.replace("-", "_")
        if not (d / "raw").is_dir():
            raise DatasetError(
                f"{d / 'raw'}: no such directory (expected the OGB layout of {name})"
            )
        return d, name
    found = sorted(c for c in root.iterdir() if (c / "raw").is_dir())
    if not found:
        raise DatasetError(f"--root {root}: holds no OGB dataset folder (no */raw/ directory)")
    if len(found) > 1:
        names = ", ".join(c.name.replace("_", "-") for c in found)
        raise UsageError(f"--root {root}: holds several datasets ({names}); pick one with --name")
    return found[0], found[0].name.replace("_", "-")


def _csv(path_gz: Path) -> Path | None:
    """The ``.csv.gz`` file, or its uncompressed ``.csv`` twin, or None."""
    if path_gz.is_file():
        return path_gz
    plain = path_gz.with_suffix("")
    return plain if plain.is_file() else None


def _need_csv(path_gz: Path) -> Path:
    p = _csv(path_gz)
    if p is None:
        raise DatasetError(f"{path_gz}: no such file")
    return p


def _open(path: Path) -> IO[bytes]:
    return cast(IO[bytes], gzip.open(path, "rb")) if path.suffix == ".gz" else open(path, "rb")


def _blocks(path: Path):
    """``(first_line, bytes)`` blocks of whole lines; gzip errors become DatasetErrors."""
    try:
        with _open(path) as f:
            yield from iter_line_blocks(f, BLOCK_BYTES)
    except (OSError, EOFError, zlib.error) as e:
        raise DatasetError(f"{path}: cannot read ({' '.join(str(e).split())})") from None


def _read_ints(path: Path) -> np.ndarray:
    """All integers of a one-column CSV (small files: counts, splits)."""
    parts = [parse_csv_block(b, np.int64, 1, str(path), first) for first, b in _blocks(path)]
    return np.concatenate([p.reshape(-1) for p in parts]) if parts else np.zeros(0, np.int64)


def _choose_scheme(d: Path, name: str, scheme: str) -> Path | None:
    split = d / "split"
    if scheme != "auto":
        if not (split / scheme).is_dir():
            raise DatasetError(f"{split / scheme}: no such directory (--split-scheme {scheme})")
        return split / scheme
    if not split.is_dir():
        return None
    subs = sorted(s for s in split.iterdir() if s.is_dir())
    if not subs:
        return None
    if len(subs) == 1:
        return subs[0]
    default = DEFAULT_SCHEMES.get(name)
    if default and (split / default).is_dir():
        return split / default
    names = ", ".join(s.name for s in subs)
    raise UsageError(
        f"{split}: holds several split schemes ({names}); pick one with --split-scheme"
    )


def _read_splits(folder: Path, n: int) -> dict[str, np.ndarray]:
    out = {}
    for part in ("train", "valid", "test"):
        p = _csv(folder / f"{part}.csv.gz")
        if p is None:
            extra = (
                " (split_dict.pt is a pickle, which gnnio never loads)"
                if (folder / "split_dict.pt").exists()
                else ""
            )
            raise DatasetError(f"{folder / (part + '.csv.gz')}: no such file{extra}")
        idx = _read_ints(p)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = int(idx.min()) if idx.min() < 0 else int(idx.max())
            raise DatasetError(f"{p}: node id {bad} is out of range [0, {n})")
        if np.unique(idx).shape[0] != idx.shape[0]:
            raise DatasetError(f"{p}: contains repeated node ids")
        out[f"{part}_idx"] = idx
    return out


def _read_label_csv(path: Path, n: int) -> np.ndarray:
    """One label per line; empty lines and 'nan' are unlabeled (-1)."""
    parts = []
    for _, block in _blocks(path):
        if b"," in block:
            raise DatasetError(
                f"{path}: several label columns (multi-label datasets are not supported)"
            )
        lines = np.array(block.split(b"\n")[:-1])  # the block ends with a newline
        lines = np.char.strip(lines)
        lines = lines.astype(f"S{max(3, lines.dtype.itemsize)}")  # room for b"nan"
        lines[lines == b""] = b"nan"
        try:
            parts.append(lines.astype(np.float64))
        except ValueError as e:
            raise DatasetError(f"{path}: {' '.join(str(e).split())}") from None
    vals = np.concatenate(parts) if parts else np.zeros(0)
    if vals.shape[0] != n:
        raise DatasetError(f"{path}: {vals.shape[0]} labels for {n} nodes")
    return labels_to_int64(vals[:, None], str(path))


# --- CSV layout --------------------------------------------------------------------------------


def _read_edges_csv(path: Path, n: int, e: int | None, progress: bool):
    if e is not None:
        src = np.empty(e, dtype=np.int64)
        dst = np.empty(e, dtype=np.int64)
    parts: list[np.ndarray] = []
    pos = 0
    with bar(total=e, desc="edges", unit="edge", enabled=progress) as pb:
        for first, block in _blocks(path):
            arr = parse_csv_block(block, np.int64, 2, str(path), first)
            k = arr.shape[0]
            if e is not None:
                if pos + k > e:
                    raise DatasetError(f"{path}: more than {e} edges (num-edge-list says {e})")
                src[pos : pos + k] = arr[:, 0]
                dst[pos : pos + k] = arr[:, 1]
            else:
                parts.append(arr)
            pos += k
            pb.update(k)
    if e is None:
        both = np.concatenate(parts) if parts else np.zeros((0, 2), np.int64)
        del parts
        src, dst = both[:, 0].copy(), both[:, 1].copy()
        del both
    elif pos != e:
        raise DatasetError(f"{path}: {pos} edges, but num-edge-list says {e}")
    _check_ids(src, dst, n, path)
    return src, dst


def _check_ids(src: np.ndarray, dst: np.ndarray, n: int, path: Path) -> None:
    if src.size:
        lo = int(min(src.min(), dst.min()))
        hi = int(max(src.max(), dst.max()))
        if lo < 0 or hi >= n:
            bad = lo if lo < 0 else hi
            raise DatasetError(f"{path}: node id {bad} is out of range [0, {n})")


def _feature_width(path: Path) -> int:
    with _open(path) as f:
        first = f.readline().strip()
    if not first:
        raise DatasetError(f"{path}: empty first line")
    return first.count(b",") + 1


def _stream_features_csv(path: Path, feats: np.ndarray, progress: bool, drop: bool) -> None:
    n, f_dim = feats.shape
    pos = 0
    with bar(total=n, desc="features", unit="row", enabled=progress) as pb:
        for first, block in _blocks(path):
            arr = parse_csv_block(block, np.float32, f_dim, str(path), first)
            k = arr.shape[0]
            if pos + k > n:
                raise DatasetError(f"{path}: more than {n} rows (num-node-list says {n})")
            feats[pos : pos + k] = arr
            if drop:  # within a memory budget: the written pages leave the process
                drop_pages(feats)
            pos += k
            pb.update(k)
    if pos != n:
        raise DatasetError(f"{path}: {pos} rows, but num-node-list says {n} nodes")


# --- binary (papers100M) layout ----------------------------------------------------------------


# --- main entry --------------------------------------------------------------------------------


def prepare_ogb(
    root: str | Path,
    out: str | Path,
    name: str | None = None,
    split_scheme: str = "auto",
    symmetrize: bool = True,
    overwrite: bool = False,
    progress: bool = True,
    allow_nonfinite: bool = False,
    memory_budget: int | None = None,
) -> Path:
    """Import an OGB node-property dataset from its local on-disk layout into ``out``.

    ``root``: the dataset folder (with ``raw/``) or its parent; ``name`` picks the folder in a
    parent (``ogbn-arxiv`` -> ``ogbn_arxiv``). ``split_scheme``: a folder under ``split/`` or
    ``"auto"``. ``symmetrize``: add each edge reversed (then deduplicate). Features are float32
    (float16 inputs stay float16; NaN or infinite values refused unless ``allow_nonfinite``),
    labels int64 with -1 for NaN, splits int64 as stored. Returns ``out``.

    ``memory_budget`` (bytes): spill the edges to a temporary file next to ``out``
    (:mod:`._edge_spill`), build the CSR in buckets (:func:`gnnio.preprocess.chunked.build_csr`)
    and drop the written feature pages, the same files bit for bit; a budget below what the
    per-node arrays and one chunk need is a one-line UsageError before anything is written.
    """
    try:
        with ExitStack() as stack:
            return _prepare_ogb(root, out, name, split_scheme, symmetrize, overwrite, progress,
                                allow_nonfinite, memory_budget, stack)  # fmt: skip
    except OSError as e:  # writing the temporary edge file (a full disk): one line
        if memory_budget is not None and (err := output_dir.write_error(Path(out), e)):
            raise err from None
        raise


def _prepare_ogb(root, out, name, split_scheme, symmetrize, overwrite, progress, allow_nonfinite,
                 memory_budget, stack: ExitStack) -> Path:  # fmt: skip
    """:func:`prepare_ogb`; ``stack`` removes the temporary edge file on the way out."""
    bounded = memory_budget is not None

    def spill_file(n: int, e: int | None) -> Path:
        """Refuse a budget too small for ``n`` nodes and ``e`` edges (unknown: a full chunk),
        then make the temporary directory of the edge file."""
        keys = None if e is None else e * (2 if symmetrize else 1)
        need = 16 * n + 8 * BLOCK_BYTES + csr_fixed_bytes(n, keys) + MIN_BUCKET
        refuse_budget(int(memory_budget), need, f"import {n:,} nodes",
                      "the per-node arrays, a block of the CSV, a chunk of edges and 1 MiB of "
                      "sort keys")  # fmt: skip
        if e is not None:
            output_dir.check_disk(Path(out), 16 * e)  # the spill file
        spill_dir = output_dir.make_temp_dir(Path(out), "prepare")
        stack.callback(shutil.rmtree, spill_dir, ignore_errors=True)
        return spill_dir / "edges.bin"

    d, name = resolve_ogb_dir(root, name)
    raw = d / "raw"
    scheme_dir = _choose_scheme(d, name, split_scheme)
    binary = (raw / "data.npz").is_file()

    # topology, labels and splits first: every input error is found before anything is written
    if binary:
        npz = raw / "data.npz"
        nl = np.asarray(_npz_load(npz, "num_nodes_list")).reshape(-1)
        if nl.shape[0] != 1:
            raise DatasetError(f"{npz}: num_nodes_list holds {nl.shape[0]} graphs, expected 1")
        n = int(nl[0])
        if bounded:
            edges, num_self_loops = spill_npz_edges(npz, n, spill_file(n, None))
        else:
            ei = _npz_load(npz, "edge_index")
            if ei.ndim != 2 or ei.shape[0] != 2 or ei.dtype.kind not in "iu":
                raise DatasetError(
                    f"{npz}: edge_index is {ei.dtype} {list(ei.shape)}, expected integers [2, E]"
                )
            src, dst = ei[0], ei[1]
            _check_ids(src, dst, n, npz)
    else:
        nfile = _need_csv(raw / "num-node-list.csv.gz")
        nl = _read_ints(nfile)
        if nl.shape[0] != 1:
            raise DatasetError(f"{nfile}: holds {nl.shape[0]} graph sizes, expected 1")
        n = int(nl[0])
        efile = _csv(raw / "num-edge-list.csv.gz")
        e = None
        if efile is not None:
            el = _read_ints(efile)
            if el.shape[0] != 1:
                raise DatasetError(f"{efile}: holds {el.shape[0]} edge counts, expected 1")
            e = int(el[0])
        feat_file = _need_csv(raw / "node-feat.csv.gz")  # gnnio needs node features
        f_dim = _feature_width(feat_file)
        efile = _need_csv(raw / "edge.csv.gz")
        if bounded:
            spill = spill_file(n, e)
            edges, num_self_loops = spill_csv_edges(_blocks(efile), efile, n, e, spill, progress)
        else:
            src, dst = _read_edges_csv(efile, n, e, progress)
    if bounded:
        num_input_edges = edges.num_edges
        keys = num_input_edges * (2 if symmetrize else 1)
        indptr = np.zeros(0, np.int64)  # sizes below: the CSR is built inside the writer
        indices = np.zeros(0, index_dtype(n))
        graph_bytes = 8 * (n + 1) + 2 * keys * index_dtype(n).itemsize
    else:
        num_input_edges = int(src.shape[0])
        num_self_loops = int(np.count_nonzero(src == dst))
        indptr, indices = edges_to_graph(src, dst, n, symmetrize=symmetrize)
        graph_bytes = 0
        del src, dst
        if binary:
            del ei

    labels = None
    if binary and (raw / "node-label.npz").is_file():
        lab_file = raw / "node-label.npz"
        lab = _npz_load(lab_file, "node_label")
        labels = labels_to_int64(lab, str(lab_file))
        if labels.shape[0] != n:
            raise DatasetError(f"{lab_file}: {labels.shape[0]} labels for {n} nodes")
    elif not binary and _csv(raw / "node-label.csv.gz") is not None:
        labels = _read_label_csv(_need_csv(raw / "node-label.csv.gz"), n)
    splits = _read_splits(scheme_dir, n) if scheme_dir is not None else {}

    source = {
        "importer": "ogb",
        "name": name,
        "root": str(d.resolve()),
        "layout": "binary npz" if binary else "csv",
        "split_scheme": scheme_dir.name if scheme_dir is not None else None,
        "symmetrized": bool(symmetrize),
        "input_edges": num_input_edges,
        "self_loops_kept": num_self_loops,
    }
    # the binary layout's feature shape is read inside the writer (its first array checks room)
    size = output_bytes(indptr, indices, labels, *splits.values(),
                        rows=0 if binary else n, row_bytes=0 if binary else 4 * f_dim)  # fmt: skip
    with DatasetWriter(out, name=name, overwrite=overwrite, allow_nonfinite=allow_nonfinite,
                       size_hint=size + graph_bytes) as w:  # fmt: skip
        if bounded:
            held = 8 * n + sum(int(a.nbytes) for a in (labels, *splits.values()) if a is not None)
            build_csr(w, edges, n, int(memory_budget) - held - 8 * BLOCK_BYTES,
                      symmetrize=symmetrize, progress=progress)  # fmt: skip
            del edges
        else:
            write_graph(w, indptr, indices)
        del indptr, indices
        if binary:
            rows = stream_npz_rows(raw / "data.npz", "node_feat", progress)
            shape, dtype = next(rows)
            if shape[0] != n:
                raise DatasetError(f"{raw / 'data.npz'}[node_feat]: {shape[0]} rows for {n} nodes")
            feats = w.create_array("features", tuple(shape), feature_dtype_for(dtype))
            pos = 0
            for block in rows:
                feats[pos : pos + block.shape[0]] = block
                pos += block.shape[0]
                if bounded:
                    drop_pages(feats)
        else:
            feats = w.create_array("features", (n, f_dim), np.float32)
            _stream_features_csv(feat_file, feats, progress, drop=bounded)
        del feats
        if labels is not None:
            w.save_array("labels", labels)
            num_classes = int(labels.max()) + 1 if labels.size and labels.max() >= 0 else 0
            w.meta["num_classes"] = num_classes
        for key, idx in splits.items():
            w.save_array(key, idx)
        w.meta["source"] = source
    return Path(out)
