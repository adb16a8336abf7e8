"""gnnio.train.gat_csr's CPU attention pieces, checked against the operations they stand for."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnio.train.gat_csr import HAVE_NUMBA, _EdgeSoftmax, _Rows

pytestmark = pytest.mark.skipif(not HAVE_NUMBA, reason="needs numba")


def test_softmax_backward_takes_the_leaky_relus_slope_in_float32():
    """``_EdgeSoftmax``'s backward multiplies a negative logit's gradient by the slope in the
    input's dtype, as ``leaky_relu_backward`` does (0.2 as float32, not as float64 and then
    rounded: those differ in the last bit for about one product in five). One edge per row from
    a source of its own and every logit negative: the expected gradients are a few float32
    torch operations, bit for bit."""
    rng = np.random.default_rng(3)
    nd, h = 64, 4
    ns = 2 * nd
    ptr = torch.arange(nd + 1)
    col = torch.arange(nd, ns)  # row i's one edge: source nd + i
    rows = _Rows(ptr, col, torch.arange(nd), (nd, ns), "numba")
    a_src = -torch.from_numpy(rng.uniform(0.1, 2, (ns, h)).astype(np.float32))
    a_dst = -torch.from_numpy(rng.uniform(0.1, 2, (nd, h)).astype(np.float32))
    a_src.requires_grad_()
    a_dst.requires_grad_()
    logw = torch.log(torch.from_numpy(rng.uniform(0.5, 2, nd).astype(np.float32)))
    logloop = torch.log(torch.from_numpy(rng.uniform(0.5, 2, nd).astype(np.float32)))
    alpha, alpha_loop = _EdgeSoftmax.apply(a_src, a_dst, logw, logloop, rows, 0.2)
    ga = torch.from_numpy(rng.standard_normal((nd, h)).astype(np.float32))
    gl = torch.from_numpy(rng.standard_normal((nd, h)).astype(np.float32))
    d_src, d_dst = torch.autograd.grad((alpha, alpha_loop), (a_src, a_dst), (ga, gl))

    al, a = alpha_loop.detach(), alpha.detach()
    dot = al * gl + a * ga  # (the loop's term first, then the row's one edge)
    slope = torch.tensor(0.2, dtype=torch.float32)
    g_loop, g_edge = al * (gl - dot) * slope, a * (ga - dot) * slope
    assert torch.equal(d_dst, g_loop + g_edge)
    assert torch.equal(d_src[:nd], g_loop) and torch.equal(d_src[nd:], g_edge)


@pytest.mark.parametrize("threads", [2, 3])
def test_row_ranges_reach_the_rows_after_the_last_edge(monkeypatch, threads):
    """``_by_rows`` cuts the rows at even edge counts; trailing rows without edges fall after the
    last cut and must still be computed (the kernels write into ``empty`` outputs: NaN here)."""
    from gnnio.train import gat_csr

    rng = np.random.default_rng(1)
    nd, ns, e, heads, c = 30, 40, 200, 2, 3
    dst = np.sort(rng.integers(0, nd - 8, e))  # the last 8 rows have no edges
    ptr = np.searchsorted(dst, np.arange(nd + 1)).astype(np.int64)
    col = rng.integers(0, ns, e).astype(np.int64)
    val = rng.uniform(0.1, 2.0, (e, heads)).astype(np.float32)
    loop = rng.uniform(0.1, 2.0, (nd, heads)).astype(np.float32)
    x = rng.standard_normal((ns, heads * c)).astype(np.float32)
    want = np.empty((nd, heads * c), np.float32)
    gat_csr._heads_product(ptr, col, val, loop, x, want, heads, 0, nd)
    monkeypatch.setattr(gat_csr, "_SERIAL_WORK", 0)
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = np.full((nd, heads * c), np.nan, np.float32)
        gat_csr._by_rows(gat_csr._heads_product, ptr, 1, col, val, loop, x, out, heads)
    finally:
        torch.set_num_threads(prev)
    assert np.array_equal(out, want)
    np.testing.assert_array_equal(out[-8:], (loop[-8:, :, None] * x[22:30].reshape(8, heads, c))
                                  .reshape(8, heads * c))  # fmt: skip
