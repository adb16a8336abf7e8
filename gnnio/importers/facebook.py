"""Facebook Page-Page network (MUSAE release: Rozemberczki, Allen & Sarkar, 2021).

Files in ``--root`` (see ``datasets/facebook_page_page/SOURCE.md``):
  - ``facebook_edges.csv``: header ``id_1,id_2``, one undirected edge per row;
  - ``facebook_target.csv``: header ``id,facebook_id,page_name,page_type`` (quoted free-text names,
    so it is read with the ``csv`` module); ``page_type`` is the class;
  - ``facebook.json``: ``{"<node id>": [feature ids]}``, a sparse binary matrix.

Result: the graph symmetrized, deduplicated, self-loops dropped (2 * (171002 - 179) = 341646
directed edges); binary float32 features ``[22470, 4714]`` written row-chunk by row-chunk into the
output memmap; labels 0..C-1 in sorted class-name order (``meta["class_names"]``); a seeded
stratified train/valid/test split (default 10/10/80, see :func:`._common.stratified_split`).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from ..errors import DatasetError
from ..graph.format import DatasetWriter, sha256_file
from ..utils.progress import bar
from ._common import (
    check_dense_ids,
    edges_to_graph,
    output_bytes,
    parse_csv_block,
    parse_fractions,
    require_file,
    rows_per_chunk,
    stratified_split,
    write_graph,
)

__all__ = ["prepare_facebook", "HELP", "DESCRIPTION"]

HELP = "Facebook Page-Page network (MUSAE CSV/JSON files)"
DESCRIPTION = (
    "Import the Facebook Page-Page graph from facebook_edges.csv, facebook_target.csv and "
    "facebook.json in --root. Edges are symmetrized with self-loops dropped, features are the "
    "binary page-description matrix (float32), labels are page types in sorted name order, and the "
    "split is random, stratified by class and seeded."
)

EDGES, TARGET, FEATS = "facebook_edges.csv", "facebook_target.csv", "facebook.json"


def add_arguments(parser) -> None:
    parser.add_argument("--root", required=True, help="folder holding the three MUSAE files")
    parser.add_argument(
        "--split",
        default="0.1,0.1",
        metavar="TRAIN,VALID",
        help="train and valid fractions per class; the rest is test",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random split")


def run(args) -> Path:
    train_frac, valid_frac = parse_fractions(args.split)
    return prepare_facebook(
        args.root,
        args.out,
        split=(train_frac, valid_frac),
        seed=args.seed,
        overwrite=args.overwrite,
        progress=not args.quiet,
    )


def _read_targets(path: Path) -> tuple[np.ndarray, list[str]]:
    """Labels (int64 [N], in sorted class-name order) and the class names."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise DatasetError(f"{path}: empty file")
        header = [h.strip() for h in header]
        if "id" not in header or "page_type" not in header:
            raise DatasetError(f"{path}: header {header} lacks the columns 'id' and 'page_type'")
        i_id, i_type = header.index("id"), header.index("page_type")
        ids, types = [], []
        for lineno, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) != len(header):
                raise DatasetError(
                    f"{path}: line {lineno} has {len(row)} fields, the header has {len(header)}"
                )
            try:
                ids.append(int(row[i_id]))
            except ValueError:
                raise DatasetError(
                    f"{path}: line {lineno}: id {row[i_id]!r} is not an integer"
                ) from None
            types.append(row[i_type].strip())
    ids_arr = np.asarray(ids, dtype=np.int64)
    n = ids_arr.shape[0]
    if n == 0:
        raise DatasetError(f"{path}: no rows")
    if not np.array_equal(np.sort(ids_arr), np.arange(n)):
        raise DatasetError(f"{path}: ids must be 0..{n - 1}, each exactly once")
    names = sorted(set(types))
    code = {c: i for i, c in enumerate(names)}
    labels = np.empty(n, dtype=np.int64)
    labels[ids_arr] = [code[t] for t in types]
    return labels, names


def _read_edges(path: Path, n: int) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as f:
        header = f.readline().decode("utf-8", "replace").strip()
        if header.replace(" ", "") != "id_1,id_2":
            raise DatasetError(f"{path}: header is {header!r}, expected 'id_1,id_2'")
        e = parse_csv_block(f.read(), np.int64, 2, str(path), first_line=1)
    if e.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    lo, hi = int(e.min()), int(e.max())
    if lo < 0 or hi >= n:
        bad = lo if lo < 0 else hi
        raise DatasetError(
            f"{path}: node id {bad} is out of range [0, {n}) ({TARGET} has {n} rows)"
        )
    return e[:, 0].copy(), e[:, 1].copy()


def _read_feature_lists(path: Path, n: int) -> tuple[list[np.ndarray], int]:
    """Per-node feature-id arrays (index = node id) and the feature dimension (max id + 1),
    bounded by the number of distinct feature ids (:func:`._common.check_dense_ids`)."""
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path}: not valid JSON ({e})") from None
    except RecursionError:
        raise DatasetError(f"{path}: JSON nested too deep for feature lists") from None
    if not isinstance(obj, dict):
        raise DatasetError(f"{path}: expected a JSON object mapping node ids to feature-id lists")
    lists: list[np.ndarray] = [np.zeros(0, np.int64)] * n
    max_id = -1
    for key, vals in obj.items():
        try:
            v = int(key)
            ids = np.asarray(vals, dtype=np.int64).reshape(-1)
        except (TypeError, ValueError):
            raise DatasetError(
                f"{path}: entry {key!r} is not a node id with a list of ints"
            ) from None
        if not 0 <= v < n:
            raise DatasetError(f"{path}: node id {v} is out of range [0, {n})")
        if ids.size:
            if ids.min() < 0:
                raise DatasetError(f"{path}: node {v} has negative feature id {int(ids.min())}")
            max_id = max(max_id, int(ids.max()))
        lists[v] = ids
    if max_id >= 0:
        distinct = np.unique(np.concatenate([a for a in lists if a.size])).shape[0]
        check_dense_ids(max_id, distinct, str(path), "feature id", "feature columns")
    return lists, max_id + 1


def prepare_facebook(
    root: str | Path,
    out: str | Path,
    split: tuple[float, float] = (0.1, 0.1),
    seed: int = 0,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Import the Facebook Page-Page files in ``root`` into a gnnio dataset at ``out``.

    ``split`` = (train, valid) fractions per class, test gets the rest; ``seed`` fixes the split.
    The ``[N, F]`` float32 feature matrix is filled in row chunks of about 64 MiB directly in the
    output memmap (never a second full copy in RAM). Returns ``out``.
    """
    root = Path(root)
    if not root.is_dir():
        raise DatasetError(f"--root {root}: no such directory")
    f_edges, f_target, f_feats = (require_file(root / f) for f in (EDGES, TARGET, FEATS))
    train_frac, valid_frac = parse_fractions(",".join(str(s) for s in split), what="split")

    with bar(total=3, desc="read facebook", unit="file", enabled=progress) as pb:
        labels, class_names = _read_targets(f_target)
        n = labels.shape[0]
        pb.update(1)
        src, dst = _read_edges(f_edges, n)
        pb.update(1)
        lists, f_dim = _read_feature_lists(f_feats, n)
        pb.update(1)
    num_input_edges, num_self_loops = int(src.shape[0]), int(np.count_nonzero(src == dst))
    indptr, indices = edges_to_graph(src, dst, n, symmetrize=True, drop_self_loops=True)
    del src, dst
    train, valid, test = stratified_split(labels, train_frac, valid_frac, seed)

    source = {
        "importer": "facebook",
        "root": str(root.resolve()),
        "split": {"train": train_frac, "valid": valid_frac, "seed": int(seed), "stratified": True},
        "input_edges": num_input_edges,
        "self_loops_dropped": num_self_loops,
        "files_sha256": {f.name: sha256_file(f) for f in (f_edges, f_target, f_feats)},
    }
    size = output_bytes(indptr, indices, labels, train, valid, test, rows=n, row_bytes=4 * f_dim)
    with DatasetWriter(out, name="facebook_page_page", overwrite=overwrite, size_hint=size) as w:
        write_graph(w, indptr, indices)
        feats = w.create_array("features", (n, f_dim), np.float32)
        step = rows_per_chunk(f_dim * 4)
        with bar(total=n, desc="features", unit="row", enabled=progress) as pb:
            for s in range(0, n, step):
                e = min(n, s + step)
                block = np.zeros((e - s, f_dim), dtype=np.float32)
                rows = np.repeat(np.arange(e - s), [lists[v].shape[0] for v in range(s, e)])
                cols = np.concatenate(lists[s:e]) if e > s else np.zeros(0, np.int64)
                block[rows, cols] = 1.0
                feats[s:e] = block
                pb.update(e - s)
        del feats, block
        w.save_array("labels", labels)
        w.save_array("train_idx", train)
        w.save_array("valid_idx", valid)
        w.save_array("test_idx", test)
        w.meta["num_classes"] = len(class_names)
        w.meta["class_names"] = class_names
        w.meta["source"] = source
    return Path(out)
