"""An in-memory store's rows are held once: the pages of the features file that the copy read
leave the process's mapping (the page cache keeps them), else the rows count twice in its RSS."""

from __future__ import annotations

import numpy as np
import pytest

import gnnio
from gnnio.features import open_store
from gnnio.utils.rss import rss_by_kind

from .helpers import write_tiny_dataset


def test_reading_features_into_memory_leaves_no_file_page_mapped(tmp_path):
    """16 MiB of features read in 1 MiB chunks: the file-backed RSS grows by under 2 MiB, and
    the store's rows are the file's."""
    if "file" not in rss_by_kind():
        pytest.skip("no per-kind RSS on this system")
    path = write_tiny_dataset(tmp_path / "d", num_nodes=4096, num_edges=8192, feat_dim=1024)
    ds = gnnio.load(path)
    base = rss_by_kind()["file"]
    from gnnio import features

    feats = features._read_into_memory(ds.features, False, chunk_bytes=1 << 20)
    grown = rss_by_kind()["file"] - base
    assert grown < (2 << 20), grown
    np.testing.assert_array_equal(feats, np.load(path / "features.npy"))
    store = open_store(ds, "memory", progress=False)  # (the store's own read: the same)
    assert store.num_rows == 4096 and rss_by_kind()["file"] - base < (2 << 20)
