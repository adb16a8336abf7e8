"""Block aggregation as one CSR SpMM, forward and backward, built once from the sampler's output.

A block's edges ``j -> i`` come out of gnnio's samplers grouped by destination in local-id order,
so the block *is* a CSR matrix ``A`` (``[num_dst, num_src]``, row = destination) once its row
pointer is known: samplers hand it over as ``Block.ptr`` (no sort, no coalescing, no host
synchronisation); a block without one is sorted here once. :func:`block_matmul` computes
``A @ x`` with a custom autograd function whose backward is ``A^T @ grad``, the transpose built
only when ``x`` needs a gradient (never for layer 0, whose input is the features).
:func:`block_matmul_root` adds the destinations' own rows ``x[:num_dst]`` (a layer's root term)
with one backward for both, so the root's gradient costs no input-sized zero tensor and add.

Two implementations (recorded as ``kernels["spmm"]`` in a training summary):

* **numba** (CPU tensors, the default where numba imports): a ``nogil`` row loop run on
  ``torch.get_num_threads()`` Python threads over row ranges, each output row accumulated edge by
  edge in CSR order, a multiply then an add per edge (tested bit-identical to that sum) -- the
  order of ``torch.sparse.mm`` on a CSR tensor, bit-identical to it where MKL does not fuse the
  multiply-add (on an Intel CPU with FMA it does, and the last bits differ). Measured 1.2-3.4x
  faster than it on the CPU, the transpose product 1.7-5x (one thread, a 2^21-node graph's
  layer-0 block, loaded VM; ``benchmarks/step_kernels.py``); the transpose is a stable counting
  sort, ``O(E)``.
* **torch** (CUDA tensors, or ``GNNIO_SPMM=torch``): ``torch.mm`` of a CSR tensor (cuSPARSE on a
  GPU); the transpose by one stable ``sort`` of the sources and
  ``torch._convert_indices_from_coo_to_csr``, neither of which reads anything back to the host.
  On a GPU the host paces the training step (an H200, 2026-11-26: 1.2 ms of kernels in a 4.9 ms
  step), so this path is written in few torch operations: each edge's row is the block's own
  destination (``edge_index[1]``, no expansion of the pointer), ``mean``'s values are ``1 / deg``
  from the pointer's differences, the product is one ``torch.mm``.

Values: ``reduce="sum"`` ``A_ij = w_j``; ``reduce="mean"`` ``A_ij = w_j / sum_k w_k`` over the
in-edges of ``i`` (``1 / deg(i)`` without weights); rows without in-edges are 0. The per-edge
values are computed as the previous ``aggregate`` computed them (row sums in edge order, then one
division per edge), so the forward results are unchanged. Both implementations sum a row's weights
in edge order (the torch path with ``torch.segment_reduce`` over ``[E, 1]``, one thread per row on
a GPU), so the values are bit-identical between them and from run to run on a GPU, where the
``index_add_`` used before accumulated with atomics in no fixed order.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from ..utils.thread_pool import LazyPool
from ..utils.triton_kernels import kernel_ran

try:
    from numba import njit

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - numba is a dependency
    HAVE_NUMBA = False

__all__ = [
    "BlockCSR",
    "block_csr",
    "block_matmul",
    "block_matmul_root",
    "first_rows",
    "sparse_mm",
    "spmm_impl",
]

if HAVE_NUMBA:

    @njit(nogil=True, cache=True)
    def _spmm(ptr, col, val, x, out, lo, hi):  # pragma: no cover - compiled; tested via callers
        # out[i] = sum_e val[e] * x[col[e]] over e in [ptr[i], ptr[i+1]), in edge order, for the
        # rows [lo, hi) (the caller's threads take disjoint row ranges)
        f = x.shape[1]
        for i in range(lo, hi):
            for k in range(f):
                out[i, k] = 0
            for e in range(ptr[i], ptr[i + 1]):
                j = col[e]
                v = val[e]
                for k in range(f):
                    out[i, k] += v * x[j, k]

    @njit(nogil=True, cache=True)
    def _transpose(ptr, col, val, tptr, tcol, tval):  # pragma: no cover - compiled
        # stable counting sort of the edges by column: tptr [n_cols + 1] zeros on entry
        for e in range(col.shape[0]):
            tptr[col[e] + 1] += 1
        for j in range(tptr.shape[0] - 1):
            tptr[j + 1] += tptr[j]
        pos = tptr[:-1].copy()
        for i in range(ptr.shape[0] - 1):
            for e in range(ptr[i], ptr[i + 1]):
                j = col[e]
                p = pos[j]
                tcol[p] = i
                tval[p] = val[e]
                pos[j] = p + 1

    @njit(nogil=True, cache=True)
    def _row_values(ptr, w, out):  # pragma: no cover - compiled
        # out[e] = w[e] / max(sum of w over e's row, 1e-30) (w None: see _mean_ones)
        for i in range(ptr.shape[0] - 1):
            s = w.dtype.type(0)
            for e in range(ptr[i], ptr[i + 1]):
                s += w[e]
            s = max(s, w.dtype.type(1e-30))
            for e in range(ptr[i], ptr[i + 1]):
                out[e] = w[e] / s

    @njit(nogil=True, cache=True)
    def _row_values_loop(ptr, w, c, out, self_out):  # pragma: no cover - compiled
        # the mean over a row's edges and a self-loop of weight c: s = (w_0 + ... + w_k) + c in
        # edge order, out[e] = w[e] / s, self_out[i] = c / s (w None: _ones_loop)
        for i in range(ptr.shape[0] - 1):
            s = w.dtype.type(0)
            for e in range(ptr[i], ptr[i + 1]):
                s += w[e]
            s = s + w.dtype.type(c)
            for e in range(ptr[i], ptr[i + 1]):
                out[e] = w[e] / s
            self_out[i] = w.dtype.type(c) / s

    @njit(nogil=True, cache=True)
    def _ones_loop(ptr, c, out, self_out):  # pragma: no cover - compiled
        one = out.dtype.type(1)
        for i in range(ptr.shape[0] - 1):
            s = out.dtype.type(ptr[i + 1] - ptr[i]) + out.dtype.type(c)
            for e in range(ptr[i], ptr[i + 1]):
                out[e] = one / s
            self_out[i] = out.dtype.type(c) / s

    @njit(nogil=True, cache=True)
    def _mean_ones(ptr, out):  # pragma: no cover - compiled
        one = out.dtype.type(1)
        for i in range(ptr.shape[0] - 1):
            d = out.dtype.type(ptr[i + 1] - ptr[i])
            for e in range(ptr[i], ptr[i + 1]):
                out[e] = one / d


_POOL = LazyPool("spmm-pool")

#: rows x features below which one thread does the product (a handoff costs ~20 us)
_SERIAL_WORK = 1 << 18


def _spmm_threads(ptr, col, val, x, out) -> None:
    """:func:`_spmm` over ``torch.get_num_threads()`` row ranges of about equal edge counts, on
    plain Python threads (the kernel releases the GIL). Not numba's ``prange``: its OpenMP
    workers spin at barriers, and on a loaded 2-core machine one descheduled spinner made the
    step's next operations 20-60 ms slower (measured; see :mod:`gnnio.sampling._kernels`, which
    avoids ``prange`` for the same reason). Each row is summed by one thread in edge order, so
    the result does not depend on the thread count."""
    rows = ptr.shape[0] - 1
    k = max(1, min(torch.get_num_threads(), 16))
    if k == 1 or rows * x.shape[1] < _SERIAL_WORK:
        _spmm(ptr, col, val, x, out, 0, rows)
        return
    pool = _POOL.get(k)
    cuts = np.searchsorted(ptr, np.linspace(0, ptr[-1], k + 1)).clip(0, rows)
    cuts[0], cuts[-1] = 0, rows
    futs = [pool.submit(_spmm, ptr, col, val, x, out, int(a), int(b))
            for a, b in zip(cuts[:-1], cuts[1:]) if b > a]  # fmt: skip
    for f in futs:
        f.result()


def spmm_impl(device: torch.device | str) -> str:
    """The SpMM implementation used for tensors on ``device``: ``numba`` or ``torch``."""
    if torch.device(device).type != "cpu":
        return "torch"
    if os.environ.get("GNNIO_SPMM", "").lower() == "torch" or not HAVE_NUMBA:
        return "torch"
    return "numba"


class BlockCSR:
    """``A`` of a block in CSR form: ``ptr`` ``[rows + 1]``, ``col`` ``[E]``, ``val`` ``[E]``.

    ``impl`` picks the kernels (:func:`spmm_impl`). The transpose is built on first use (the
    backward pass) and kept.
    """

    def __init__(self, ptr, col, val, shape: tuple[int, int], impl: str, row):
        self.ptr, self.col, self.val = ptr, col, val
        self.row = row  # each entry's row, in entry order (a block's destinations; the torch
        # transpose's gathers read it, so the pointer is never expanded)
        self.shape = (int(shape[0]), int(shape[1]))
        self.impl = impl
        self._t: BlockCSR | None = None
        #: ``[rows]`` each row's self-loop value (``block_csr(..., self_loop=c)``), else None
        self.self_val: torch.Tensor | None = None

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``A @ x`` for ``x`` ``[shape[1], F]`` (no autograd), in ``A``'s dtype: an ``x`` in
        another (autocast's lower precision) is cast to it, as PyG's scatter aggregation runs in
        float32 under autocast."""
        x = (x if x.dtype == self.val.dtype else x.to(self.val.dtype)).contiguous()
        kernel_ran("spmm", self.impl)
        if self.impl == "numba":
            out = torch.empty((self.shape[0], x.shape[1]), dtype=x.dtype)
            _spmm_threads(self.ptr.numpy(), self.col.numpy(), self.val.numpy(), x.numpy(),
                          out.numpy())  # fmt: skip
            return out
        return sparse_mm(_csr_tensor(self.ptr, self.col, self.val, self.shape), x)

    def t(self) -> BlockCSR:
        """``A^T`` (``[shape[1], shape[0]]``), edges of equal column in row order."""
        if self._t is None:
            rows, cols = self.shape
            if self.impl == "numba":
                tptr = torch.zeros(cols + 1, dtype=torch.int64)
                tcol = torch.empty_like(self.col)
                tval = torch.empty_like(self.val)
                _transpose(self.ptr.numpy(), self.col.numpy(), self.val.numpy(), tptr.numpy(),
                           tcol.numpy(), tval.numpy())  # fmt: skip
                trow = None  # (the numba kernels need no row of each entry)
            else:  # one stable sort gives the order and the sorted columns (the new rows)
                trow, order = torch.sort(self.col, stable=True)
                tcol, tval = self.row[order], self.val[order]
                tptr = torch._convert_indices_from_coo_to_csr(trow, cols)
            self._t = BlockCSR(tptr, tcol, tval, (cols, rows), self.impl, trow)
        return self._t


def sparse_mm(adj: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``torch.mm(adj, x)`` of a CSR tensor and a dense ``x``, in their dtype also under
    ``torch.autocast`` (where ``mm`` would cast both to the lower precision: the CPU's MKL has
    no bfloat16 CSR product, and on a GPU the backward's product would meet a float16
    gradient with the float32 CSR; PyG's scatter aggregations stay in float32 alike).
    ``torch.sparse.mm`` is the same product behind a zeros + addmm."""
    if torch.is_autocast_enabled(x.device.type):
        with torch.autocast(x.device.type, enabled=False):
            return torch.mm(adj, x)
    return torch.mm(adj, x)


_CSR_WARNED = False


def _csr_tensor(ptr, col, val, shape):
    """A CSR tensor of gnnio's own (valid) arrays: no invariant checks. torch says once per
    process that CSR support is in beta: not for our users, caught on the first call only (a
    ``catch_warnings`` block per layer and pass costs host time on a GPU, where the host paces
    the step)."""
    global _CSR_WARNED
    if _CSR_WARNED:
        return torch.sparse_csr_tensor(ptr, col, val, shape, check_invariants=False)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        out = torch.sparse_csr_tensor(ptr, col, val, shape, check_invariants=False)
    _CSR_WARNED = True
    return out


class _BlockMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, adj):
        ctx.adj = adj
        return adj.matmul(x)

    @staticmethod
    def backward(ctx, grad):
        if not ctx.needs_input_grad[0]:
            return None, None
        return ctx.adj.t().matmul(grad), None


class _BlockMatmulRoot(torch.autograd.Function):
    """``(adj @ x, x[:rows])`` (``x`` with ``adj.shape[1]`` rows) with one backward for both."""

    @staticmethod
    def forward(ctx, x, adj):
        ctx.adj = adj
        ctx.set_materialize_grads(False)
        return adj.matmul(x), x[: adj.shape[0]]

    @staticmethod
    def backward(ctx, grad, grad_root):
        adj = ctx.adj
        if grad is None and grad_root is None:
            return None, None
        if grad is None:  # (no model leaves the aggregation out of its loss)
            gx = grad_root.new_zeros((adj.shape[1], grad_root.shape[1]))
        else:
            gx = adj.t().matmul(grad)
        if grad_root is not None:
            gx.narrow(0, 0, adj.shape[0]).add_(grad_root)  # (``gx[:d] +=`` copies it onto itself)
        return gx, None


def block_matmul_root(x: torch.Tensor, adj: BlockCSR) -> tuple[torch.Tensor, torch.Tensor]:
    """``(adj @ x[:S], x[:D])`` for ``adj`` ``[D, S]``: a block's aggregation and its
    destinations' own rows (the first ``D`` sources), which a layer's root term reads.

    The same values and gradients as :func:`block_matmul` beside ``x[:D]`` (the sign of an exact
    zero aside), with one backward: the root rows' gradient is added in place into the first
    ``D`` rows of ``adj^T @ grad``. Autograd's own backward of the slice allocates a zero
    gradient as large as ``x`` and then adds it to the product's, two passes over all ``S`` rows
    (``S`` is 5-7 times ``D`` in a sampled block): measured ~10 ms of a 135 ms GraphSAGE step
    on the 2^21 graph (2-core VM), and more for GCN, whose layer 0 reads its root from a
    transformed input that needs a gradient. Without a gradient for ``x`` both are plain.

    With a gradient, ``x[:D]`` is a view made inside an autograd function: modifying it in
    place, or modifying ``x`` in place while it is in use, raises (a plain slice allowed the
    former); the layers only read both."""
    xs = first_rows(x, adj.shape[1])
    if not (torch.is_grad_enabled() and xs.requires_grad):
        return _BlockMatmul.apply(xs, adj), xs[: adj.shape[0]]
    return _BlockMatmulRoot.apply(xs, adj)


def block_csr(block, reduce: str, dtype: torch.dtype, device: torch.device,
              self_loop: float = 0.0) -> BlockCSR:  # fmt: skip
    """The block's aggregation matrix (see module docstring), on ``device``, values in ``dtype``.

    Uses ``block.ptr`` when the sampler gave one (edges grouped by destination, in order);
    otherwise sorts the edges by destination once (stable, so each row keeps its edge order).

    ``self_loop=c > 0`` (``reduce="mean"`` only): each row's mean also counts a self-loop of
    weight ``c`` after its edges (GCN's ``D~^-1 (A + I)``): ``A_ij = w_j / (sum_k w_k + c)``, and
    the result's ``self_val[i] = c / (sum_k w_k + c)`` (the loop stays out of the matrix, whose
    columns are sources: the caller adds ``self_val * x_i``).
    """
    if reduce not in ("mean", "sum"):
        raise ValueError(f"aggregate: reduce must be 'mean' or 'sum', got {reduce!r}")
    if self_loop < 0 or (self_loop and reduce != "mean"):
        raise ValueError(f"block_csr: self_loop must be >= 0, with reduce='mean' when > 0; got "
                         f"{self_loop!r} with reduce={reduce!r}")  # fmt: skip
    nd, ns = block.num_dst, block.num_src
    impl = spmm_impl(device)
    src = block.edge_index[0].to(device=device, dtype=torch.int64)
    dst = block.edge_index[1].to(device=device, dtype=torch.int64)
    w = block.edge_weight
    w = None if w is None else w.to(device=device, dtype=dtype)
    ptr = getattr(block, "ptr", None)
    if ptr is None:
        if device.type != "cpu" or (dst.numel() > 1 and not bool((dst[1:] >= dst[:-1]).all())):
            dst, order = torch.sort(dst, stable=True)  # on a GPU always: a check would sync
            src = src[order]
            w = None if w is None else w[order]
        if device.type == "cpu" and dst.numel():  # sorted: two reads (NumPy's: no torch op);
            lo, hi = int(dst.numpy()[0]), int(dst.numpy()[-1])  # the conversion below writes
            if lo < 0 or hi >= nd:  # past its output at such an id, a heap corruption
                bad = lo if lo < 0 else hi
                raise ValueError(
                    f"block.edge_index[1]: destination {bad} is out of range [0, {nd})"
                )
        ptr = torch._convert_indices_from_coo_to_csr(dst, nd)
    else:  # edges ptr[i]:ptr[i+1] go into i: dst is ptr's expansion, in edge order
        ptr = ptr.to(device=device, dtype=torch.int64)
    e = int(src.shape[0])
    if device.type == "cpu":  # (no sync) the numba kernels trust every index, and so does
        _check_block(ptr, src, w, nd, ns)  # the torch path's segment_reduce(unsafe=True)
    if self_loop:
        return _with_self_loop(ptr, src, dst, w, float(self_loop), (nd, ns), impl, dtype)
    if impl == "numba":
        val = torch.empty(e, dtype=dtype)
        if w is None and reduce == "sum":
            val.fill_(1)
        elif w is None:
            _mean_ones(ptr.numpy(), val.numpy())
        elif reduce == "sum":
            val = w.contiguous()
        else:
            _row_values(ptr.numpy(), w.contiguous().numpy(), val.numpy())
    elif w is None and reduce == "mean":  # 1 / deg(i): the in-degrees are ptr's differences
        val = (ptr[1:] - ptr[:-1]).to(dtype).reciprocal_()[dst]
    else:
        val = torch.ones(e, dtype=dtype, device=device) if w is None else w
        if reduce == "mean":  # each row's sum in edge order (as _row_values): a [E, 1] column's
            # segments take torch's sequential per-row kernel, not index_add_'s atomics (whose
            # order on a GPU changes from run to run) nor CUB's tree of a 1-D input
            sums = torch.segment_reduce(val[:, None], "sum", offsets=ptr, unsafe=True)[:, 0]
            val = val / sums.clamp_min(1e-30)[dst]
    return BlockCSR(ptr, src, val, (nd, ns), impl, row=dst)


def _check_block(ptr, src, w, nd: int, ns: int) -> None:
    """ValueError naming the block's field whose ids or sizes disagree (the numba kernels read
    and, in the transpose, write at those ids unchecked): one min/max pass over the sources, one
    pass over the pointer; on NumPy views of the CPU tensors (no torch op, so no counted sync)."""
    if nd > ns:  # (a block's destinations are its first sources: GAT reads nd rows of them)
        raise ValueError(f"block: num_dst = {nd} exceeds num_src = {ns}")
    p, s, e = ptr.numpy(), src.numpy(), int(src.shape[0])
    if p.shape != (nd + 1,) or p[0] != 0 or p[-1] != e:
        got = f"{p.shape} from {int(p[0])} to {int(p[-1])}" if p.size else "none"
        raise ValueError(f"block.ptr: need num_dst + 1 = {nd + 1} entries from 0 to the {e} "
                         f"edges, got {got}")  # fmt: skip
    if nd and bool((p[1:] < p[:-1]).any()):
        raise ValueError("block.ptr: decreases")
    if e and (s.min() < 0 or s.max() >= ns):
        bad = int(s.min()) if s.min() < 0 else int(s.max())
        raise ValueError(f"block.edge_index[0]: source {bad} is out of range [0, {ns})")
    if w is not None and tuple(w.shape) != (e,):
        raise ValueError(f"block.edge_weight: need shape ({e},), got {tuple(w.shape)}")


def _with_self_loop(ptr, src, dst, w, c, shape, impl, dtype) -> BlockCSR:
    """:func:`block_csr`'s ``self_loop`` case: the row sums as ``_row_values`` takes them (edge
    order), then ``+ c``; the same values on both paths, bit for bit."""
    nd, e = shape[0], int(src.shape[0])
    if impl == "numba":
        val = torch.empty(e, dtype=dtype)
        self_val = torch.empty(nd, dtype=dtype)
        if w is None:
            _ones_loop(ptr.numpy(), c, val.numpy(), self_val.numpy())
        else:
            _row_values_loop(ptr.numpy(), w.contiguous().numpy(), c, val.numpy(), self_val.numpy())
    else:
        if w is None:  # the in-degrees are ptr's differences (exact in float)
            sums = (ptr[1:] - ptr[:-1]).to(dtype) + c
            val = sums.reciprocal()[dst]
        else:  # in edge order, one thread per row (as in block_csr)
            sums = torch.segment_reduce(w[:, None], "sum", offsets=ptr, unsafe=True)[:, 0] + c
            val = w / sums[dst]
        self_val = torch.full_like(sums, c) / sums
    adj = BlockCSR(ptr, src, val, shape, impl, row=dst)
    adj.self_val = self_val
    return adj


def first_rows(x: torch.Tensor, n: int) -> torch.Tensor:
    """``x[:n]``, or ``x`` itself when it has ``n`` rows: a full-length slice would still cost a
    backward that allocates and copies all of ``x``.

    Raises ``ValueError`` where ``x`` has fewer than ``n`` rows (a block whose sources are not
    the previous layer's rows): ``x[:n]`` would be shorter, and the numba kernels, which do not
    check their indices, would read memory past its end."""
    if x.shape[0] < n:
        raise ValueError(f"x has {x.shape[0]} rows, fewer than the block's {n} sources")
    return x if x.shape[0] == n else x[:n]


def block_matmul(x: torch.Tensor, adj: BlockCSR) -> torch.Tensor:
    """``adj @ x[:adj.shape[1]]``, differentiable in ``x`` (backward ``adj^T @ grad``)."""
    return _BlockMatmul.apply(first_rows(x, adj.shape[1]), adj)
