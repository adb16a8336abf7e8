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
