"""Dropout on the CPU with ``F.dropout``'s exact result at 1.8 to 3 times its speed.

On the CPU ``F.dropout(x, p, training=True)`` is ``noise = empty_like(x).bernoulli_(1 - p);
noise.div_(1 - p); x * noise``, and torch's CPU ``bernoulli_(q)`` draws one float64 uniform per
element from the default generator and keeps the element where it is below ``q``, in a serial
per-element loop: about 12 ns per element, 59 % of a GraphSAGE step's CPU time on the 2^17 graph
(torch 2.13, 2-core VM). ``torch.rand(..., dtype=torch.float64)`` draws the *same* uniforms from
the same generator (so the generator ends in the same state) through a faster kernel, and drawing
them in consecutive pieces gives the same stream as one draw. From them gnnio forms ``x * noise``
with ``noise = 1 / q`` (computed by torch's own ``div_`` in ``x``'s dtype) where the draw is below
``q`` and ``0`` elsewhere, and the backward ``grad * noise``: the same tensors bit for bit as
``F.dropout`` and its ``MulBackward``, hence the same losses as before (``tests/test_dropout.py``;
``tests/test_step.py`` pins the loss histories).

For float32 and float64 the uniforms are drawn ``_CHUNK`` at a time into two reused buffers (a
fresh 96 MB tensor of draws took ~38 ms of page faults on the 2-core VM), and one numba
pass per piece forms ``noise`` and ``x * noise``, on a second thread while the next piece is drawn
(with more than one intra-op thread); the backward is ``grad * noise`` as ``F.dropout``'s (so
double backward works; forward-mode AD has a ``jvp``; under ``torch.func`` transforms
``F.dropout`` is used). One call's draws are one unbroken run of the stream (a lock: torch holds
the generator for a whole ``bernoulli_`` too). Other dtypes take the plain torch passes (a float64
tensor of draws, 4x a half-precision input's bytes).

Whether this torch draws its Bernoulli masks that way is checked once per dtype on a private seed
(:func:`matches_torch`, over several pieces, under a lock); where it does not (another torch build), and on every
other device (CUDA's ``F.dropout`` is one fused Philox kernel), :func:`dropout` is ``F.dropout``.
The draws themselves stay serial (torch's Mersenne Twister): they are what is left of dropout's
CPU time.
"""

from __future__ import annotations

import functools
import os
import threading

import torch
import torch.nn.functional as F

from ..utils.thread_pool import LazyPool

try:
    from numba import njit

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - numba is a dependency
    HAVE_NUMBA = False

__all__ = ["dropout", "matches_torch"]

#: uniforms drawn per piece: two 4 MiB buffers per thread. 12M elements on the 2-core VM: 76, 68,
#: 69, 73, 78, 88 ms at 2^16, 2^18, 2^19, 2^20, 2^21, 2^22 (the pass of the last piece is not
#: overlapped; each piece is a torch op, so not the smallest)
_CHUNK = 1 << 19
_scratch = threading.local()
#: one thread for the mask passes, beside the thread that draws
_POOL = LazyPool("dropout-mask")
_DRAW_LOCK = threading.RLock()  # one dropout's draws at a time (see _FusedDropout.forward)

if HAVE_NUMBA:

    @njit(nogil=True, cache=True)
    def _mask_mul(r, q, x, s, out, noise):  # pragma: no cover - compiled; tested via callers
        # noise = s where r < q else 0 (x's dtype), out = x * noise
        zero = x.dtype.type(0)
        for i in range(x.shape[0]):
            v = s if r[i] < q else zero
            noise[i] = v
            out[i] = x[i] * v


def _draws(n: int) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple]:
    """This thread's two reused float64 buffers of at least ``n`` elements, as tensors and as
    NumPy arrays over the same memory (so a piece costs no ``numpy()`` conversion)."""
    bufs = getattr(_scratch, "bufs", None)
    if bufs is None or bufs[0][0].numel() < n:
        t = (
            torch.empty(n, dtype=torch.float64, device="cpu"),
            torch.empty(n, dtype=torch.float64, device="cpu"),
        )
        bufs = _scratch.bufs = (t, (t[0].numpy(), t[1].numpy()))
    return bufs


def _forget_locks() -> None:
    # a forked child: the locks in whatever state another thread of the parent left them
    global _DRAW_LOCK, _CHECK_LOCK
    _DRAW_LOCK, _CHECK_LOCK = threading.RLock(), threading.Lock()


os.register_at_fork(after_in_child=_forget_locks)


class _FusedDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, q, s, chunk):
        out, noise = torch.empty_like(x), torch.empty_like(x)
        n = x.numel()
        xs, outs, ns = x.detach().view(-1).numpy(), out.view(-1).numpy(), noise.view(-1).numpy()
        bufs, arrays = _draws(min(n, chunk))
        beside = n > chunk and torch.get_num_threads() > 1
        job = None
        # one call's draws in one run of the stream, as F.dropout's (torch holds the generator
        # for a whole bernoulli_), whatever other threads run dropout meanwhile
        with _DRAW_LOCK:
            try:
                for k, a in enumerate(range(0, n, chunk)):
                    b = min(n, a + chunk)
                    # the draws stay on this thread, in order; buffer k % 2 was last read by the
                    # pass of piece k - 2, waited for below at piece k - 1
                    buf = bufs[k % 2]
                    torch.rand(b - a, dtype=torch.float64, device="cpu",
                               out=buf if b - a == buf.numel() else buf[: b - a])  # fmt: skip
                    r = arrays[k % 2][: b - a]
                    if job is not None:
                        job.result()
                        job = None
                    if beside:  # this piece's pass runs while the next piece is drawn
                        job = _POOL.get().submit(_mask_mul, r, q, xs[a:b], s, outs[a:b], ns[a:b])
                    else:
                        _mask_mul(r, q, xs[a:b], s, outs[a:b], ns[a:b])
            finally:
                if job is not None:  # (also on an error: no pass left writing the buffers)
                    job.result()
        ctx.save_for_backward(noise)
        ctx.save_for_forward(noise)
        return out

    @staticmethod
    def backward(ctx, grad):
        (noise,) = ctx.saved_tensors
        return grad * noise, None, None, None  # F.dropout's backward: MulBackward's grad * noise

    @staticmethod
    def jvp(ctx, x_t, *_):
        (noise,) = ctx.saved_tensors
        return x_t * noise  # forward-mode AD, as F.dropout's


#: ``1 / q`` as ``F.dropout``'s ``noise.div_(q)`` rounds it, per (dtype, q)
@functools.lru_cache(maxsize=64)
def _scale(dtype: torch.dtype, q: float):
    return torch.ones(1, dtype=dtype, device="cpu").div_(q).numpy()[0]


def _mask_dropout(x: torch.Tensor, p: float, chunk: int | None = None) -> torch.Tensor:
    q = 1.0 - p
    chunk = chunk or _CHUNK
    if HAVE_NUMBA and x.dtype in (torch.float32, torch.float64):
        return _FusedDropout.apply(x, q, _scale(x.dtype, q), chunk)
    noise = torch.rand(x.shape, dtype=torch.float64, device="cpu").lt_(q).to(x.dtype)
    return x * noise.div_(q)


_CHECKED: dict[torch.dtype, bool] = {}
_CHECK_LOCK = threading.Lock()


def matches_torch(dtype: torch.dtype) -> bool:
    """Whether :func:`_mask_dropout` equals ``F.dropout`` on CPU tensors of ``dtype`` in this torch
    build: output, gradient and the generator's state after it, at ``p = 0.15`` (where a scale
    rounded otherwise would show). Checked once per dtype, each side from the same seed under
    ``fork_rng``: the default generator's state is put back, and the draw lock is held, so another
    thread's dropout cannot draw in between (a draw of some other kind meanwhile would be undone)."""
    with _CHECK_LOCK:
        if dtype not in _CHECKED:
            with _DRAW_LOCK:
                _CHECKED[dtype] = _check(dtype)
        return _CHECKED[dtype]


def _check(dtype: torch.dtype) -> bool:
    g = torch.Generator(device="cpu").manual_seed(12345)
    x = torch.randn(3, 67, generator=g, device="cpu").to(dtype)
    grad = torch.randn(3, 67, generator=g, device="cpu").to(dtype)
    outs = []
    with torch.inference_mode(False), torch.enable_grad(), torch.random.fork_rng(devices=[]):
        for fn in (
            lambda t: F.dropout(t, p=0.15, training=True),
            lambda t: _mask_dropout(t, 0.15, 64),  # (takes the draw lock again: an RLock)
        ):
            torch.manual_seed(777)  # (pieces of 64, 64, 64 and 9 draws above)
            xi = x.clone().requires_grad_(True)
            y = fn(xi)
            y.backward(grad)
            outs.append((y.detach(), xi.grad, torch.rand(4, dtype=torch.float64, device="cpu")))
    return all(torch.equal(a, b) for a, b in zip(*outs))


def _functorch_wrapped(x: torch.Tensor) -> bool:
    """Under ``torch.func`` transforms (``grad``, ``vmap``, ...) ``F.dropout`` is used: the fused
    pass is an ``autograd.Function`` with no ``setup_context`` and reads the tensor's memory."""
    fn = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", None)
    return bool(fn(x)) if fn is not None else False


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
        and not _functorch_wrapped(x)
        and matches_torch(x.dtype)
    ):
        return _mask_dropout(x, p)
    return F.dropout(x, p=p, training=training)
