"""The numba row copy (gnnio/utils/row_copy.py) against numpy indexing: rows addressed by their
stride, the byte count honoured, any dtype. Where it does not compile, every gather falls back to
the plain kernel with one warning, so the row tests of the stores pass either way: these call it
directly."""

from __future__ import annotations

import numpy as np
import pytest

from gnnio.features import _gather as G

pytestmark = pytest.mark.skipif(not G.HAVE_NUMBA, reason="the row copy is a numba intrinsic")


def _kernel():
    from numba import njit

    from gnnio.utils.row_copy import copy_row

    @njit
    def copy(dst, src, rows, nbytes):
        for i in range(rows.shape[0]):
            copy_row(dst, i, src, rows[i], nbytes)

    return copy


@pytest.mark.parametrize("dtype", [np.float32, np.uint16, np.int8, np.float64])
@pytest.mark.parametrize("id_dtype", [np.int64, np.int32])
def test_copy_row_is_numpy_row_indexing(dtype, id_dtype):
    copy = _kernel()
    rng = np.random.default_rng(0)
    wide = (rng.standard_normal((50, 24)) * 50).astype(dtype)
    src = wide[:, 3:16]  # rows 13 items long at a stride of 24: addressed by strides[0]
    rows = rng.integers(0, 50, 30).astype(id_dtype)
    dst = np.zeros((30, 13), dtype=dtype)
    copy(dst, src, rows, src.shape[1] * src.itemsize)
    assert np.array_equal(dst, src[rows])
    part = np.zeros((30, 13), dtype=dtype)  # a byte count short of a row: the rest untouched
    copy(part, src, rows, 5 * src.itemsize)
    assert np.array_equal(part[:, :5], src[rows, :5]) and not part[:, 5:].any()
    assert np.array_equal(src, wide[:, 3:16])  # the source is read only


def test_the_stores_prefetching_kernel_compiled():
    """A store's gather ran the prefetching kernel (the row copy compiled), not the fallback."""
    import warnings

    import torch

    from gnnio.features import InMemoryFeatureStore

    x = np.arange(400, dtype=np.float32).reshape(40, 10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ("gnnio: prefetching gather kernel unavailable")
        got = InMemoryFeatureStore(x, num_threads=2).gather(torch.tensor([3, 39, 0]))
    assert torch.equal(got, torch.from_numpy(x)[[3, 39, 0]]) and G._prefetch_ok is True
