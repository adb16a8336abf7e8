"""GAT's attention over a block's CSR rows, without a scatter (issue 24, item 2).

PyG's ``GATConv`` gathers an ``[E, heads, C]`` message per edge and scatter-adds it into the
destinations, and its softmax takes a scatter max and a scatter sum: on a GPU the scatter-adds
accumulate with atomics in no fixed order (results change in the last bits from run to run), and
on the CPU the message buffer made the GAT step ~7x its floor (a 2^17-node graph,
docs/benchmarks.md). Here the block's edges are its CSR rows (:func:`gnnio.train.spmm.block_csr`:
the sampler's pointer, or one stable sort), and :func:`gat_attention` computes, per head ``h``:

    logit_e = leaky_relu(a_src[j] + a_dst[i]) + log w_e           (edge e: j -> i)
    logit_i = leaky_relu(a_src[i] + a_dst[i]) + log w_loop(i)       (i's self-loop)
    alpha   = exp(logit - max) / (sum over i's edges, then its loop, + 1e-16)
    out_i   = sum_e alpha_e x_j, then + alpha_i x_i

-- the sums in each row's edge order, then the loop (where PyG appends the loops), the max
detached as PyG's ``softmax`` detaches it. Row sums and maxima are ``torch.segment_reduce`` over
``[E, heads]`` (one thread per row and head on a GPU), the weighted product a custom autograd
function over the CSR rows: numba kernels on the CPU (no message buffer), one cuSPARSE product per
head on a GPU; its backward is the transposed product for ``x`` and, for the weights, one dot
product per edge and head (on a GPU as gathered rows: ``[E, heads, C]`` there, as PyG's).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .spmm import _POOL, _SERIAL_WORK, HAVE_NUMBA, _csr_tensor

if HAVE_NUMBA:
    from numba import njit

    @njit(nogil=True, cache=True)
    def _heads_product(ptr, col, val, loop, x, out, heads, lo, hi):  # pragma: no cover
        # out[i, h*c:(h+1)*c] = sum_e val[e, h] * x[col[e], h*c:(h+1)*c], edges in order, then
        # + loop[i, h] * x[i, h*c:(h+1)*c] (loop [0, heads]: none), for the rows [lo, hi);
        # x [cols, heads * c], out [rows, heads * c]
        f = x.shape[1]
        c = f // heads
        for i in range(lo, hi):
            for k in range(f):
                out[i, k] = 0
            for e in range(ptr[i], ptr[i + 1]):
                j = col[e]
                for h in range(heads):
                    v = val[e, h]
                    for k in range(h * c, (h + 1) * c):
                        out[i, k] += v * x[j, k]
            if loop.shape[0]:
                for h in range(heads):
                    v = loop[i, h]
                    for k in range(h * c, (h + 1) * c):
                        out[i, k] += v * x[i, k]

    @njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
    def _heads_dots(ptr, col, g, x, out, dloop, heads, lo, hi):  # pragma: no cover - compiled
        # out[e, h] = <g[i, h*c:(h+1)*c], x[col[e], h*c:(h+1)*c]> for the edges e of rows [lo, hi)
        # (reassociated, so the dot products vectorize: the same sums on every run and thread
        # count, in another order than a sequential loop)
        f = x.shape[1]
        c = f // heads
        for i in range(lo, hi):
            for e in range(ptr[i], ptr[i + 1]):
                j = col[e]
                for h in range(heads):
                    s = out.dtype.type(0)
                    for k in range(h * c, (h + 1) * c):
                        s += g[i, k] * x[j, k]
                    out[e, h] = s
            for h in range(heads):  # the self-loop's: <g[i], x[i]>
                s = out.dtype.type(0)
                for k in range(h * c, (h + 1) * c):
                    s += g[i, k] * x[i, k]
                dloop[i, h] = s

    @njit(nogil=True, cache=True)
    def _order_by_source(ptr, col, tptr, tcol, order):  # pragma: no cover - compiled
        # a stable counting sort of the CSR's edges by source: tptr [cols + 1] zeros on entry;
        # order[p] the p-th edge in source order (each source's edges in row order, as
        # torch.sort(col, stable=True) orders them), tcol[p] its row
        for e in range(col.shape[0]):
            tptr[col[e] + 1] += 1
        for j in range(tptr.shape[0] - 1):
            tptr[j + 1] += tptr[j]
        pos = tptr[:-1].copy()
        for i in range(ptr.shape[0] - 1):
            for e in range(ptr[i], ptr[i + 1]):
                j = col[e]
                p = pos[j]
                order[p] = e
                tcol[p] = i
                pos[j] = p + 1


def _by_rows(kernel, ptr: np.ndarray, work: int, *args) -> None:
    """``kernel(ptr, *args, lo, hi)`` over ``torch.get_num_threads()`` row ranges of about equal
    edge counts on plain threads (as :func:`gnnio.train.spmm._spmm_threads`): each row is
    computed by one thread, so results do not depend on the thread count."""
    rows = ptr.shape[0] - 1
    k = max(1, min(torch.get_num_threads(), 16))
    if k == 1 or work < _SERIAL_WORK:
        kernel(ptr, *args, 0, rows)
        return
    cuts = np.searchsorted(ptr, np.linspace(0, ptr[-1], k + 1)).clip(0, rows)
    cuts[0], cuts[-1] = 0, rows
    pool = _POOL.get(k)
    futs = [pool.submit(kernel, ptr, *args, int(a), int(b))
            for a, b in zip(cuts[:-1], cuts[1:]) if b > a]  # fmt: skip
    for f in futs:
        f.result()


def _product(ptr, col, val, x, rows: int, impl: str, loop=None) -> torch.Tensor:
    """``out[i, h] = sum_e val[e, h] x[col[e], h]`` over row ``i``'s edges, then ``+ loop[i, h]
    x[i, h]`` where ``loop`` (``[rows, H]``) is given: ``[rows, H, C]``."""
    heads, c = x.shape[1], x.shape[2]
    if impl == "numba":
        out = torch.empty((rows, heads, c), dtype=x.dtype)
        x2 = x.reshape(x.shape[0], heads * c).contiguous()
        lp = np.empty((0, heads), x2.numpy().dtype) if loop is None else loop.contiguous().numpy()
        _by_rows(_heads_product, ptr.numpy(), rows * heads * c, col.numpy(),
                 val.contiguous().numpy(), lp, x2.numpy(), out.view(rows, heads * c).numpy(),
                 heads)  # fmt: skip
        return out
    shape = (rows, x.shape[0])
    vt, xt = val.t().contiguous(), x.transpose(0, 1).contiguous()  # heads first: one copy each
    out = torch.stack([torch.mm(_csr_tensor(ptr, col, vt[h], shape), xt[h])
                       for h in range(heads)], dim=1)  # fmt: skip
    return out if loop is None else out.add_(loop[:, :, None] * x[:rows])


class _Rows:
    """A block's CSR rows for :class:`_HeadsProduct`: ``ptr``, ``col`` (sources), ``row`` (each
    edge's destination), the shape, the kernels, and the transpose's order (built on demand)."""

    def __init__(self, ptr, col, row, shape, impl):
        self.ptr, self.col, self.row, self.shape, self.impl = ptr, col, row, shape, impl
        self._t = None

    def t(self):
        """``(tptr, tcol, order)``: the edges sorted by source, stable (each source's edges in
        row order), ``order`` their positions in this CSR."""
        if self._t is None:
            if self.impl == "numba":  # O(E) counting sort, ~10x torch's sort on the CPU
                tptr = torch.zeros(self.shape[1] + 1, dtype=self.ptr.dtype)
                tcol = torch.empty_like(self.col)
                order = torch.empty(self.col.shape[0], dtype=torch.int64)
                _order_by_source(self.ptr.numpy(), self.col.numpy(), tptr.numpy(), tcol.numpy(),
                                 order.numpy())  # fmt: skip
                self._t = (tptr, tcol, order)
            else:
                trow, order = torch.sort(self.col, stable=True)
                tptr = torch._convert_indices_from_coo_to_csr(trow, self.shape[1])
                self._t = (tptr, self.row[order], order)
        return self._t


class _HeadsProduct(torch.autograd.Function):
    """``(val [E, H], loop [rows, H], x [cols, H, C]) -> [rows, H, C]``: each row's edges, then
    its self-loop (row ``i`` of ``x``), weighted per head."""

    @staticmethod
    def forward(ctx, val, loop, x, rows):
        ctx.save_for_backward(val, loop, x)
        ctx.rows = rows
        return _product(rows.ptr, rows.col, val, x, rows.shape[0], rows.impl, loop)

    @staticmethod
    def backward(ctx, g):
        val, loop, x = ctx.saved_tensors
        r = ctx.rows
        g = g.contiguous()
        nd = g.shape[0]
        dval = dloop = dx = None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:  # a dot product per edge, head
            heads, c = x.shape[1], x.shape[2]
            if r.impl == "numba":
                dval, dloop = torch.empty_like(val), torch.empty_like(loop)
                _by_rows(_heads_dots, r.ptr.numpy(), val.numel() * c, r.col.numpy(),
                         g.view(nd, heads * c).numpy(),
                         x.reshape(x.shape[0], heads * c).contiguous().numpy(), dval.numpy(),
                         dloop.numpy(), heads)  # fmt: skip
            else:
                dval = (g[r.row] * x[r.col]).sum(-1)
                dloop = (g * x[:nd]).sum(-1)
        if ctx.needs_input_grad[2]:  # the transposed product, and the loops' rows
            tptr, tcol, order = r.t()
            dx = _product(tptr, tcol, val[order], g, r.shape[1], r.impl)
            dx.narrow(0, 0, nd).add_(loop[:, :, None] * g)  # (not dx[:nd] +=: a self-copy)
        return dval, dloop, dx, None


def _take(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``t[idx]`` (rows), with a backward that sums each row's gradients in a fixed order: on the
    CPU ``index_select`` (backward ``index_add_``, serial over the indices), where ``t[idx]``'s
    backward (``index_put_`` with ``accumulate=True``) adds with several threads in no fixed
    order, so gradients changed from run to run and with the thread count; elsewhere ``t[idx]``
    (on a GPU that backward sorts the indices: no atomics, unlike ``index_select``'s)."""
    return t.index_select(0, idx) if t.device.type == "cpu" else t[idx]


def gat_attention(hs, a_src, a_dst, adj, w, loop_w, negative_slope, dropout_fn):
    """GAT's output before the heads are combined (module docstring): ``[num_dst, H, C]``.

    Args:
        hs: ``[num_src, H, C]`` the sources' transformed features (the destinations' are its
            first ``num_dst`` rows).
        a_src: ``[num_src, H]``, a_dst: ``[num_dst, H]`` the attention terms.
        adj: the block's :class:`~gnnio.train.spmm.BlockCSR` (its ``ptr``, ``col``, ``row``).
        w: ``[E, 1]`` or ``[E]`` edge weights in CSR order (0: no attention), ``loop_w``
            ``[num_dst]`` the self-loops' weights.
        dropout_fn: ``alpha -> alpha`` applied to all attention values, the edges' then the
            loops' (``[E + num_dst, H]``, as PyG's one edge list).
    """
    ptr, col, row = adj.ptr, adj.col, adj.row
    w = w.reshape(-1, 1)
    logit = F.leaky_relu(_take(a_src, col) + _take(a_dst, row), negative_slope) + torch.log(w)
    nd = a_dst.shape[0]
    loop = F.leaky_relu(a_src[:nd] + a_dst, negative_slope) + torch.log(loop_w)[:, None]
    with torch.no_grad():  # PyG's softmax detaches the maximum
        m = torch.maximum(torch.segment_reduce(logit, "max", offsets=ptr, unsafe=True), loop)
    ex = torch.exp(logit - m[row])
    ex_loop = torch.exp(loop - m)
    total = torch.segment_reduce(ex, "sum", offsets=ptr, unsafe=True) + ex_loop + 1e-16
    alpha, alpha_loop = ex / _take(total, row), ex_loop / total
    if dropout_fn is not None:
        both = dropout_fn(torch.cat([alpha, alpha_loop]))
        alpha, alpha_loop = both[: alpha.shape[0]], both[alpha.shape[0] :]
    rows = _Rows(ptr, col, row, adj.shape, adj.impl)
    return _HeadsProduct.apply(alpha, alpha_loop, hs, rows)
