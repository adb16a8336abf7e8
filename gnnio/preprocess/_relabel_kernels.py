"""The numba kernels of Data Tiering's Algorithm 2 (:func:`gnnio.preprocess.reorder.relabel_csr`),
shared by the one-pass path and the bounded-memory one (:mod:`gnnio.preprocess.reorder_bounded`)."""

from __future__ import annotations

from numba import njit, prange

__all__ = ["_move_rows", "_move_run", "_new_degrees"]


@njit(cache=True, nogil=True, parallel=True)
def _new_degrees(indptr, new2old, indptr2):
    n = new2old.shape[0]
    for i in prange(n):
        o = new2old[i]
        indptr2[i + 1] = indptr[o + 1] - indptr[o]
    indptr2[0] = 0


@njit(cache=True, nogil=True, parallel=True)
def _move_rows(indptr, indices, new2old, old2new, indptr2, bounds, indices2):
    """Copy every old row to its new place, mapping each value through ``old2new``.

    ``bounds`` splits the new rows into chunks of about equal edge counts; one chunk per prange
    iteration keeps threads balanced although hot (long) rows come first after reordering.
    """
    for c in prange(bounds.shape[0] - 1):
        for i in range(bounds[c], bounds[c + 1]):
            o = new2old[i]
            s = indptr[o]
            d = indptr[o + 1] - s
            t = indptr2[i]
            for j in range(d):
                indices2[t + j] = old2new[indices[s + j]]


@njit(cache=True, nogil=True, parallel=True)
def _move_run(buf, start, indptr, rows_old, rows_new, old2new, indptr2, indices2):
    """The bounded relabel's kernel for one read run: old row ``rows_old[k]``, whose edges sit in
    ``buf`` from position ``indptr[rows_old[k]] - start``, becomes new row ``rows_new[k]``."""
    for k in prange(rows_old.shape[0]):
        o = rows_old[k]
        s = indptr[o] - start
        d = indptr[o + 1] - indptr[o]
        t = indptr2[rows_new[k]]
        for j in range(d):
            indices2[t + j] = old2new[buf[s + j]]
