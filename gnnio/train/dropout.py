"""Dropout on the CPU with ``F.dropout``'s exact result at about twice its speed.

On the CPU ``F.dropout(x, p, training=True)`` is ``noise = empty_like(x).bernoulli_(1 - p);
noise.div_(1 - p); x * noise``, and torch's CPU ``bernoulli_(q)`` draws one float64 uniform per
element from the default generator and keeps the element where it is below ``q``, in a serial
per-element loop: about 12 ns per element, 59 % of a GraphSAGE step's CPU time on the 2^17 graph
(torch 2.13, 2-core VM). ``torch.rand(..., dtype=torch.float64)`` draws the *same* uniforms from
the same generator (so the generator ends in the same state) through a faster kernel, and drawing
them in consecutive pieces gives the same stream as one draw. From them gnnio forms ``x * noise``
with ``noise = 1 / q`` (rounded to ``x``'s dtype, as ``div_`` rounds it) where the draw is below
``q`` and ``0`` elsewhere, and the backward ``grad * noise``: the same tensors bit for bit as
``F.dropout`` and its ``MulBackward``, hence the same losses as before (``tests/test_dropout.py``;
``tests/test_step.py`` pins the loss histories).

For float32 and float64 the uniforms are drawn ``_CHUNK`` at a time into one reused buffer (a
fresh 100 MB tensor of draws per layer cost ~40 ms of page faults on the 2-core VM) and one numba
pass per piece does the mask, the scale and the product, keeping a 1-byte mask for the backward;
other dtypes take the plain torch passes.

Whether this torch draws its Bernoulli masks that way is checked once per dtype on a private seed
(:func:`matches_torch`, over several pieces); where it does not (another torch build), and on every
other device (CUDA's ``F.dropout`` is one fused Philox kernel), :func:`dropout` is ``F.dropout``.
The draws themselves stay serial (torch's Mersenne Twister): they are what is left of dropout's
CPU time.
"""

from __future__ import annotations

import functools
import threading

import numpy as np
import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

try:
    from numba import njit

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - numba is a dependency
    HAVE_NUMBA = False

__all__ = ["dropout", "matches_torch"]

#: uniforms drawn per piece: 32 MiB of float64, one buffer per thread, reused (pieces of 2^16 to
#: 2^24 draws measured the same, ~80 ms for 12M elements; larger pieces, fewer torch ops)
_CHUNK = 1 << 22
_scratch = threading.local()

if HAVE_NUMBA:

    @njit(nogil=True, cache=True)
    def _mask_mul(r, q, x, s, out, keep):  # pragma: no cover - compiled; tested via callers
        # out = x * noise, noise = s where r < q else 0 (x's dtype); keep = r < q
        zero = x.dtype.type(0)
        for i in range(x.shape[0]):
            k = r[i] < q
            keep[i] = k
            out[i] = x[i] * (s if k else zero)

    @njit(nogil=True, cache=True)
    def _keep_mul(g, keep, s, out):  # pragma: no cover - compiled; tested via callers
        # out = g * noise (dropout's backward)
        zero = g.dtype.type(0)
        for i in range(g.shape[0]):
            out[i] = g[i] * (s if keep[i] else zero)


def _draws(n: int) -> torch.Tensor:
    """This thread's reused float64 buffer of at least ``n`` elements."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.numel() < n:
        buf = _scratch.buf = torch.empty(n, dtype=torch.float64)
    return buf


class _FusedDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, q, s, chunk):
        out = torch.empty_like(x)
        keep = torch.empty(x.shape, dtype=torch.bool)
        n = x.numel()
        xs, outs, keeps = x.detach().view(-1).numpy(), out.view(-1).numpy(), keep.view(-1).numpy()
        buf = _draws(min(n, chunk))
        for a in range(0, n, chunk):
            b = min(n, a + chunk)
            r = torch.rand(b - a, dtype=torch.float64, out=buf[: b - a]).numpy()
            _mask_mul(r, q, xs[a:b], s, outs[a:b], keeps[a:b])
        ctx.save_for_backward(keep)
        ctx.s = s
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        _keep_mul(grad.view(-1).numpy(), keep.view(-1).numpy(), ctx.s, out.view(-1).numpy())
        return out, None, None, None


def _mask_dropout(x: torch.Tensor, p: float, chunk: int | None = None) -> torch.Tensor:
    q = 1.0 - p
    chunk = chunk or _CHUNK
    if HAVE_NUMBA and x.dtype in (torch.float32, torch.float64):
        np_dtype = np.float32 if x.dtype == torch.float32 else np.float64
        s = np_dtype(1) / np_dtype(q)  # div_'s noise: 1 and q both in x's dtype
        return _FusedDropout.apply(x, q, s, chunk)
    return x * torch.rand(x.shape, dtype=torch.float64).lt_(q).to(x.dtype).div_(q)


@functools.cache
def matches_torch(dtype: torch.dtype) -> bool:
    """Whether :func:`_mask_dropout` equals ``F.dropout`` on CPU tensors of ``dtype`` in this torch
    build: output, gradient and the generator's state after it. Checked once per dtype, each side
    from the same seed under ``fork_rng`` (the default generator's state is put back)."""
    g = torch.Generator().manual_seed(12345)
    x = torch.randn(3, 67, generator=g).to(dtype)
    grad = torch.randn(3, 67, generator=g).to(dtype)
    outs = []
    with torch.inference_mode(False), torch.enable_grad(), torch.random.fork_rng(devices=[]):
        for fn in (
            lambda t: F.dropout(t, p=0.3, training=True),
            lambda t: _mask_dropout(t, 0.3, 64),
        ):
            torch.manual_seed(777)  # (pieces of 64, 64, 64 and 9 draws above)
            xi = x.clone().requires_grad_(True)
            y = fn(xi)
            y.backward(grad)
            outs.append((y.detach(), xi.grad, torch.rand(4, dtype=torch.float64)))
    return all(torch.equal(a, b) for a, b in zip(*outs))


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``F.dropout(x, p, training)`` (same signature, same result, same random stream); on a
    contiguous CPU tensor with ``0 < p < 1`` the mask is drawn by ``torch.rand`` (module
    docstring)."""
    if (
        training
        and 0.0 < p < 1.0
        and x.device.type == "cpu"
        and x.is_contiguous()
        and x.numel() > 0
        and matches_torch(x.dtype)
    ):
        return _mask_dropout(x, p)
    return F.dropout(x, p=p, training=training)
