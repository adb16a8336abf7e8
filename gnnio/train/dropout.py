"""Dropout on the CPU with ``F.dropout``'s exact result, about 15 times faster.

(Measured on the 2-core development VM: a 2^21 batch's three layer inputs, 22.8M float32
elements, in 19.6 ms against ``F.dropout``'s 289, with glibc's heap kept -- ``--heap auto`` on
the CPU -- so the outputs' pages are resident; docs/benchmarks.md. Tensors below
``_MIN_ELEMENTS`` take ``F.dropout``: the generator's state costs ~30 us a call.)

On the CPU ``F.dropout(x, p, training=True)`` is ``noise = empty_like(x).bernoulli_(1 - p);
noise.div_(1 - p); x * noise``, and torch's CPU ``bernoulli_(q)`` draws one float64 uniform per
element from the default generator and keeps the element where it is below ``q``, in a serial
per-element loop: about 12 ns per element, 59 % of a GraphSAGE step's CPU time on the 2^17 graph
(torch 2.13, 2-core VM). Those uniforms are ``torch.rand(..., dtype=torch.float64)``'s, the
standard Mersenne Twister stream of the default generator; :mod:`gnnio.train._mt19937` continues
that stream from the generator's state in numba (vectorized: ~0.8 ns per element, mask and
product included) and writes the state back, so the generator ends where ``F.dropout`` leaves
it. From the draws one pass forms ``x * noise`` with ``noise = 1 / q`` (computed by torch's own
``div_`` in ``x``'s dtype) where the draw is below ``q`` and ``0`` elsewhere; the backward is
``grad * noise``: the same tensors bit for bit as ``F.dropout`` and its ``MulBackward``, hence
the same losses as before (``tests/test_dropout.py``; ``tests/test_step.py`` pins the loss
histories). Double backward works; forward-mode AD has a ``jvp``; under ``torch.func``
transforms ``F.dropout`` is used. Other dtypes than float32 and float64 take plain torch passes
(``torch.rand`` in float64, then ``lt_``), which draw the same stream.

Whether this torch draws its Bernoulli masks that way, and stores its generator's state as
:mod:`gnnio.train._mt19937` reads it, is checked once per dtype on a private seed
(:func:`matches_torch`, over several rounds, under a lock); where it does not (another torch
build), and on every other device (CUDA's ``F.dropout`` is one fused Philox kernel),
:func:`dropout` is ``F.dropout`` -- on a GPU under :data:`gnnio.utils.capture.CAPTURE_LOCK`, as
an eager draw beside another thread's CUDA graph capture fails. One call's draws are one
unbroken run of the stream (a lock, as torch holds the generator for a whole ``bernoulli_``);
unlike torch's, a draw that *another thread* makes from the default generator during a call is
overwritten when the call writes the state back (gnnio draws from it nowhere else while
training).
"""

from __future__ import annotations

import functools
import os
import threading

import numpy as np
import torch
import torch.autograd.forward_ad as fwad
import torch.nn.functional as F

from ..utils.capture import CAPTURE_LOCK
from . import _mt19937 as mt

__all__ = ["dropout", "matches_torch"]

#: elements per round of the numba pass (its word buffer: 1 MiB per thread). 12.9M float32
#: elements, reused outputs, 2-core VM: 14.9, 13.0, 12.6, 10.5, 10.3 ms at 2^11, 2^13, 2^15,
#: 2^17, 2^19
_CHUNK = 1 << 17
#: below this many elements F.dropout (the same draws): reading and writing the generator's state
#: costs ~30 us a call; 10 x 10 float32 took 35 us against F.dropout's 8, 46 x 46 37 against 33,
#: 300 x 64 50 against 241
_MIN_ELEMENTS = 4096
_scratch = threading.local()
_DRAW_LOCK = threading.RLock()  # one dropout's draws at a time (see _mask_dropout)


def _words(per: int) -> tuple[np.ndarray, np.ndarray]:
    """This thread's reused word buffer for ``per`` elements a round, as uint32 and uint64 views."""
    bufs = getattr(_scratch, "bufs", None)
    n = mt.block_words(per)
    if bufs is None or bufs[1].shape[0] < n:
        w64 = np.empty(n, dtype=np.uint64)
        bufs = _scratch.bufs = (w64.view(np.uint32), w64)
    return bufs


def _forget_locks() -> None:
    # a forked child: the locks in whatever state another thread of the parent left them
    global _DRAW_LOCK, _CHECK_LOCK
    _DRAW_LOCK, _CHECK_LOCK = threading.RLock(), threading.Lock()


os.register_at_fork(after_in_child=_forget_locks)


class _FusedDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, q, s, chunk, st):
        out, noise = torch.empty_like(x), torch.empty_like(x)
        xs, outs, ns = x.detach().view(-1).numpy(), out.view(-1).numpy(), noise.view(-1).numpy()
        w32, w64 = _words(chunk)
        st.c = mt.dropout_pass(st.block, st.c, mt.threshold(q), xs, s, outs, ns, w32, w64, chunk)
        ctx.save_for_backward(noise)
        ctx.save_for_forward(noise)
        return out

    @staticmethod
    def backward(ctx, grad):
        (noise,) = ctx.saved_tensors
        return grad * noise, None, None, None, None  # F.dropout's: MulBackward's grad * noise

    @staticmethod
    def jvp(ctx, x_t, *_):
        (noise,) = ctx.saved_tensors
        return x_t * noise  # forward-mode AD, as F.dropout's


def _needs_backward(x: torch.Tensor) -> bool:
    """Whether the output needs the mask kept: ``x`` needs a gradient, or a forward-mode AD
    level is open (``x`` may carry a tangent)."""
    return (torch.is_grad_enabled() and x.requires_grad) or getattr(fwad, "_current_level", 0) >= 0


def _out_only(x: torch.Tensor, q: float, chunk: int, st) -> torch.Tensor:
    """The fused pass's output alone, for an input without a gradient (the model's first layer
    reads the features): no mask tensor written and kept, 4 of the pass's 20 bytes per element."""
    out = torch.empty_like(x)
    w32, w64 = _words(chunk)
    st.c = mt.dropout_out_pass(st.block, st.c, mt.threshold(q), x.detach().view(-1).numpy(),
                               _scale(x.dtype, q), out.view(-1).numpy(), w32, w64, chunk)  # fmt: skip
    return out


#: ``1 / q`` as ``F.dropout``'s ``noise.div_(q)`` rounds it, per (dtype, q)
@functools.lru_cache(maxsize=64)
def _scale(dtype: torch.dtype, q: float):
    return torch.ones(1, dtype=dtype, device="cpu").div_(q).numpy()[0]


def _mask_dropout(x: torch.Tensor, p: float, chunk: int | None = None) -> torch.Tensor:
    q = 1.0 - p
    if mt.HAVE_NUMBA and x.dtype in (torch.float32, torch.float64):
        gen = torch.default_generator
        # the state read, continued and written back under one lock: this call's draws are one
        # run of the stream whatever other threads run dropout meanwhile
        with _DRAW_LOCK:
            st = mt.read_state(gen)
            if st is None:  # a layout this module does not know: torch's own draws
                return F.dropout(x, p=p, training=True)
            try:
                if _needs_backward(x):
                    return _FusedDropout.apply(x, q, _scale(x.dtype, q), chunk or _CHUNK, st)
                return _out_only(x, q, chunk or _CHUNK, st)
            finally:
                mt.write_state(gen, st)  # (on an error too: the draws made so far are spent)
    noise = torch.rand(x.shape, dtype=torch.float64, device="cpu").lt_(q).to(x.dtype)
    return x * noise.div_(q)


_CHECKED: dict[torch.dtype, bool] = {}
_CHECK_LOCK = threading.Lock()


def matches_torch(dtype: torch.dtype) -> bool:
    """Whether :func:`_mask_dropout` equals ``F.dropout`` on CPU tensors of ``dtype`` in this torch
    build: output, gradient and the generator's whole state after it, for each of
    ``_CHECK_CASES`` (p = 0.15, where a scale rounded otherwise would show, and p near 0 and 1,
    from three positions in the generator's block). Checked once per dtype, each side from the same seed under
    ``fork_rng``: the default generator's state is put back, and the draw lock is held, so another
    thread's dropout cannot draw in between (a draw of some other kind meanwhile would be undone)."""
    with _CHECK_LOCK:
        if dtype not in _CHECKED:
            with _DRAW_LOCK:
                _CHECKED[dtype] = _check(dtype)
        return _CHECKED[dtype]


#: the self-check's cases: (p, float32 words drawn first). p = 0.15: a scale rounded otherwise
#: shows; p near 0 and 1: the threshold's ends; 5 words: an odd word in mid-block; 623: the block's
#: last word, then 1,401 draws in rounds of 64 over 4 new blocks
_CHECK_CASES = ((0.15, 5), (1e-9, 623), (1.0 - 1e-9, 0))


def _check(dtype: torch.dtype) -> bool:
    g = torch.Generator(device="cpu").manual_seed(12345)
    x = torch.randn(3, 467, generator=g, device="cpu").to(dtype)
    grad = torch.randn(3, 467, generator=g, device="cpu").to(dtype)
    gen = torch.default_generator  # (torch.manual_seed would reseed the GPUs' generators too)
    try:
        with torch.inference_mode(False), torch.enable_grad(), torch.random.fork_rng(devices=[]):
            for p, words in _CHECK_CASES:
                outs = []
                for fn in (
                    lambda t, p=p: F.dropout(t, p=p, training=True),
                    lambda t, p=p: _mask_dropout(t, p, 64),  # (takes the draw lock again: RLock)
                ):
                    gen.manual_seed(777)
                    torch.rand(words, device="cpu")
                    xi = x.clone().requires_grad_(True)
                    y = fn(xi)
                    y.backward(grad)
                    outs.append((y.detach(), xi.grad, gen.get_state()))
                if not all(torch.equal(a, b) for a, b in zip(*outs)):
                    return False
    except Exception:  # noqa: BLE001 - e.g. numba cannot compile here: torch's own dropout
        return False
    return True


def _functorch_wrapped(x: torch.Tensor) -> bool:
    """Under ``torch.func`` transforms (``grad``, ``vmap``, ...) ``F.dropout`` is used: the fused
    pass is an ``autograd.Function`` with no ``setup_context`` and reads the tensor's memory."""
    fn = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", None)
    return bool(fn(x)) if fn is not None else False


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``F.dropout(x, p, training)`` (same signature, same result, same random stream); on a
    contiguous CPU tensor with ``0 < p < 1`` the draws are continued in numba (module
    docstring), and where ``x`` needs no gradient no mask is written or kept."""
    if (
        training
        and 0.0 < p < 1.0
        and x.device.type == "cpu"
        and x.is_contiguous()
        and x.numel() >= max(1, _MIN_ELEMENTS)
        and not _functorch_wrapped(x)
        and matches_torch(x.dtype)
    ):
        return _mask_dropout(x, p)
    if training and 0.0 < p < 1.0 and x.device.type != "cpu":
        with CAPTURE_LOCK:  # never beside another thread's capture (gnnio.utils.capture)
            return F.dropout(x, p=p, training=True)
    return F.dropout(x, p=p, training=training)
