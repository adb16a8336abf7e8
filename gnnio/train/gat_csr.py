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
detached as PyG's ``softmax`` detaches it. On a GPU row sums and maxima are
``torch.segment_reduce`` over ``[E, heads]`` (one thread per row and head); on the CPU the
softmax is one autograd function (:class:`_EdgeSoftmax`: two numba passes around torch's
``exp``, the same values bit for bit, and one fused backward pass plus a sum per source over
the transpose's order) in place of some twenty ``[E, heads]`` torch operations each way. The
weighted product is a custom autograd
function over the CSR rows: numba kernels on the CPU (no message buffer), one cuSPARSE product per
head on a GPU; its backward is the transposed product for ``x`` and, for the weights, one dot
product per edge and head (on a GPU as gathered rows: ``[E, heads, C]`` there, as PyG's).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .spmm import _POOL, _SERIAL_WORK, HAVE_NUMBA, _csr_tensor, sparse_mm

if HAVE_NUMBA:
    from numba import njit

    from .spmm import _transpose

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
    def _logits_rows(ptr, col, a_src, a_dst, logw, logloop, slope, alpha, alpha_loop, lo, hi):
        # pragma: no cover - compiled. GAT's attention logits of the rows [lo, hi) (module
        # docstring), less each row's max over its edges and its loop: alpha [E, H] the
        # edges', alpha_loop [rows, H] the loop's. The operations and roundings of the torch
        # path (float32 slope, as leaky_relu's); edges outer, heads inner: one read of a
        # source's row per edge
        heads = a_dst.shape[1]
        sl = alpha.dtype.type(slope)
        m = np.empty(heads, alpha.dtype)
        for i in range(lo, hi):
            for h in range(heads):
                z = a_src[i, h] + a_dst[i, h]
                z = (z if z > 0 else z * sl) + logloop[i]
                alpha_loop[i, h] = z
                m[h] = z
            for e in range(ptr[i], ptr[i + 1]):
                j = col[e]
                for h in range(heads):
                    y = a_src[j, h] + a_dst[i, h]
                    y = (y if y > 0 else y * sl) + logw[e]
                    alpha[e, h] = y
                    m[h] = max(m[h], y)
            for e in range(ptr[i], ptr[i + 1]):
                for h in range(heads):
                    alpha[e, h] -= m[h]
            for h in range(heads):
                alpha_loop[i, h] -= m[h]

    @njit(nogil=True, cache=True)
    def _normalise_rows(ptr, alpha, alpha_loop, lo, hi):  # pragma: no cover - compiled
        # alpha /= total, alpha_loop /= total for the rows [lo, hi): total the sum over a row's
        # edges in edge order, then + the loop's, then + 1e-16 (the torch path's order)
        heads = alpha_loop.shape[1]
        s = np.empty(heads, alpha.dtype)
        eps = alpha.dtype.type(1e-16)
        for i in range(lo, hi):
            for h in range(heads):
                s[h] = 0
            for e in range(ptr[i], ptr[i + 1]):
                for h in range(heads):
                    s[h] += alpha[e, h]
            for h in range(heads):
                s[h] = s[h] + alpha_loop[i, h] + eps
                alpha_loop[i, h] /= s[h]
            for e in range(ptr[i], ptr[i + 1]):
                for h in range(heads):
                    alpha[e, h] /= s[h]

    @njit(nogil=True, cache=True)
    def _softmax_rows_backward(ptr, col, a_src, a_dst, slope, alpha, alpha_loop, ga, ga_loop,
                               dz, dz_loop, da_dst, lo, hi):  # fmt: skip
        # pragma: no cover - compiled. The softmax's and the leaky ReLU's backward for the rows
        # [lo, hi): dz [E, H] each edge's logit gradient (the sources' share, summed by
        # _sum_by_source), dz_loop [rows, H] the loops', da_dst [rows, H] the destinations'
        heads = a_dst.shape[1]
        sl = alpha.dtype.type(slope)  # (leaky_relu_backward's: the slope in the input's dtype)
        dot = np.empty(heads, alpha.dtype)
        for i in range(lo, hi):
            for h in range(heads):
                dot[h] = alpha_loop[i, h] * ga_loop[i, h]
            for e in range(ptr[i], ptr[i + 1]):
                for h in range(heads):
                    dot[h] += alpha[e, h] * ga[e, h]
            for h in range(heads):
                z = a_src[i, h] + a_dst[i, h]
                g = alpha_loop[i, h] * (ga_loop[i, h] - dot[h])
                g = g if z > 0 else g * sl
                dz_loop[i, h] = g
                da_dst[i, h] = g
            for e in range(ptr[i], ptr[i + 1]):
                j = col[e]
                for h in range(heads):
                    y = a_src[j, h] + a_dst[i, h]
                    g = alpha[e, h] * (ga[e, h] - dot[h])
                    g = g if y > 0 else g * sl
                    dz[e, h] = g
                    da_dst[i, h] += g

    @njit(nogil=True, cache=True)
    def _sum_by_source(tptr, order, dz, dz_loop, da_src, lo, hi):  # pragma: no cover - compiled
        # da_src[j] = the loop's share (j < rows) + the logit gradients of j's edges, in row
        # order (tptr, order: _Rows.t()), for the sources [lo, hi)
        heads = da_src.shape[1]
        nd = dz_loop.shape[0]
        for j in range(lo, hi):
            for h in range(heads):
                acc = dz_loop[j, h] if j < nd else da_src.dtype.type(0)
                for p in range(tptr[j], tptr[j + 1]):
                    acc += dz[order[p], h]
                da_src[j, h] = acc


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
    futs = [pool.submit(kernel, ptr, *args, int(a), int(b))  # type: ignore[call-arg]  # *args
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
    out = torch.stack([sparse_mm(_csr_tensor(ptr, col, vt[h], shape), xt[h])
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
                # spmm's stable counting sort, each edge's position as its value: the order
                _transpose(self.ptr.numpy(), self.col.numpy(),
                           np.arange(self.col.shape[0], dtype=np.int64), tptr.numpy(),
                           tcol.numpy(), order.numpy())  # fmt: skip
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


class _EdgeSoftmax(torch.autograd.Function):
    """``(a_src [cols, H], a_dst [rows, H]) -> (alpha [E, H], alpha_loop [rows, H])``: GAT's
    attention over a block's CSR rows (the CPU path of :func:`gat_attention`; ``logw``,
    ``logloop`` and the rows are constants): the logits less the row's max (numba), torch's
    ``exp``, the row sums and divisions (numba) -- :func:`_softmax_torch`'s values bit for bit,
    in place of some twenty ``[E, H]`` torch operations. The backward is one numba pass per row
    (softmax and leaky ReLU) and a sum per source in the transpose's order: the same gradients
    to float rounding, and the same on every run and thread count."""

    @staticmethod
    def forward(ctx, a_src, a_dst, logw, logloop, rows, slope):
        a_src, a_dst = a_src.contiguous(), a_dst.contiguous()
        nd, heads = a_dst.shape
        alpha = torch.empty((rows.col.shape[0], heads), dtype=a_dst.dtype)
        alpha_loop = torch.empty((nd, heads), dtype=a_dst.dtype)
        ptr = rows.ptr.numpy()
        _by_rows(_logits_rows, ptr, alpha.numel() * 4, rows.col.numpy(), a_src.numpy(),
                 a_dst.numpy(), logw.contiguous().numpy(), logloop.contiguous().numpy(), slope,
                 alpha.numpy(), alpha_loop.numpy())  # fmt: skip
        torch.exp_(alpha)  # (torch's vectorised exp: the torch path's values)
        torch.exp_(alpha_loop)
        _by_rows(_normalise_rows, ptr, alpha.numel(), alpha.numpy(), alpha_loop.numpy())
        ctx.save_for_backward(a_src, a_dst, alpha, alpha_loop)
        ctx.rows, ctx.slope = rows, slope
        return alpha, alpha_loop

    @staticmethod
    @torch.autograd.function.once_differentiable  # (numba passes: no double backward)
    def backward(ctx, ga, ga_loop):
        a_src, a_dst, alpha, alpha_loop = ctx.saved_tensors
        r = ctx.rows
        ga = torch.zeros_like(alpha) if ga is None else ga.contiguous()
        ga_loop = torch.zeros_like(alpha_loop) if ga_loop is None else ga_loop.contiguous()
        dz, dz_loop, da_dst = (torch.empty_like(t) for t in (alpha, alpha_loop, a_dst))
        _by_rows(_softmax_rows_backward, r.ptr.numpy(), alpha.numel() * 4, r.col.numpy(),
                 a_src.numpy(), a_dst.numpy(), ctx.slope, alpha.numpy(), alpha_loop.numpy(),
                 ga.numpy(), ga_loop.numpy(), dz.numpy(), dz_loop.numpy(),
                 da_dst.numpy())  # fmt: skip
        da_src = None
        if ctx.needs_input_grad[0]:
            tptr, _, order = r.t()
            da_src = torch.empty_like(a_src)
            _by_rows(_sum_by_source, tptr.numpy(), alpha.numel(), order.numpy(), dz.numpy(),
                     dz_loop.numpy(), da_src.numpy())  # fmt: skip
        return da_src, da_dst, None, None, None, None


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
    rows = _Rows(ptr, col, row, adj.shape, adj.impl)
    if adj.impl == "numba" and a_src.dtype in (torch.float32, torch.float64):
        alpha, alpha_loop = _EdgeSoftmax.apply(a_src, a_dst, torch.log(w.reshape(-1)),
                                               torch.log(loop_w), rows, negative_slope)  # fmt: skip
    else:
        alpha, alpha_loop = _softmax_torch(a_src, a_dst, w, loop_w, rows, negative_slope)
    return _attend(alpha, alpha_loop, hs, rows, dropout_fn)


def _softmax_torch(a_src, a_dst, w, loop_w, rows, negative_slope):
    """The attention ``(alpha [E, H], alpha_loop [rows, H])`` in torch operations (the GPU's
    path; :class:`_EdgeSoftmax` computes the same values in numba)."""
    ptr, col, row = rows.ptr, rows.col, rows.row
    w = w.reshape(-1, 1)
    logit = F.leaky_relu(_take(a_src, col) + _take(a_dst, row), negative_slope) + torch.log(w)
    nd = a_dst.shape[0]
    loop = F.leaky_relu(a_src[:nd] + a_dst, negative_slope) + torch.log(loop_w)[:, None]
    with torch.no_grad():  # PyG's softmax detaches the maximum
        m = torch.maximum(torch.segment_reduce(logit, "max", offsets=ptr, unsafe=True), loop)
    ex = torch.exp(logit - m[row])
    ex_loop = torch.exp(loop - m)
    total = torch.segment_reduce(ex, "sum", offsets=ptr, unsafe=True) + ex_loop + 1e-16
    return ex / _take(total, row), ex_loop / total


def _attend(alpha, alpha_loop, hs, rows, dropout_fn):
    """The attention's dropout, then the weighted product over the rows (in the attention's
    dtype: under autocast ``hs`` is in the lower precision, the softmax in float32 -- the
    product stays in float32, as :meth:`~gnnio.train.spmm.BlockCSR.matmul`'s)."""
    if hs.dtype != alpha.dtype:
        hs = hs.to(alpha.dtype)
    if dropout_fn is not None:
        both = dropout_fn(torch.cat([alpha, alpha_loop]))
        alpha, alpha_loop = both[: alpha.shape[0]], both[alpha.shape[0] :]
    return _HeadsProduct.apply(alpha, alpha_loop, hs, rows)
