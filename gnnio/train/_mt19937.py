"""torch's CPU random stream continued in numba: ``torch.rand(n, dtype=torch.float64) < q`` bit for
bit, about ten times faster, for dropout's masks (:mod:`gnnio.train.dropout`).

torch's CPU generator (``at::CPUGeneratorImpl``) is the standard 32-bit Mersenne Twister
(``at::mt19937``: 624 words of state, ``left`` and ``next`` counters); a float64 uniform is two
consecutive words ``a, b`` as ``((a << 32 | b) & (2^53 - 1)) * 2^-53``, drawn one element after
the other in a serial loop (about 4.5 ns per element on the 2-core VM; the words themselves are
the standard MT19937 stream, as NumPy's ``MT19937`` would give them from the same state).

Here the state is read from ``Generator.get_state()``, the stream continued by the MT19937
recurrence ``x[j + 624] = x[j + 397] ^ twist(x[j], x[j + 1])`` over a small reused buffer (the
recurrence's dependence distance is 227 words, so it vectorizes), each word tempered and each
pair compared with ``q`` as integers (``u < q`` exactly when ``(a << 32 | b) & (2^53 - 1) <
ceil(q * 2^53)``), and the state written back with ``Generator.set_state()``: the generator ends
where torch's own draws would leave it. Two words are tempered at once in one 64-bit integer (the
masks keep each half's shifted bits in that half), which is what lets the pass vectorize.

The state's byte layout is torch's ``CPUGeneratorImplState`` (5,056 bytes on 64-bit builds:
``the_initial_seed`` u64, ``left`` i32, ``seeded`` i32, ``next`` u64, ``state`` 624 x u64, then the
normal-distribution caches, left untouched). :func:`read_state` returns ``None`` for any other
size or inconsistent counters, and :func:`gnnio.train.dropout.matches_torch` compares the whole
path with ``F.dropout`` (values and the generator's next draws) before it is used, so a torch that
draws or stores its state otherwise, or a big-endian machine, gets ``F.dropout``.

Deviation from torch, documented where it is used: torch holds the generator's mutex while it
draws; here the state is read, continued and written back, so a draw made by *another thread*
from the default generator during one dropout call is overwritten (it would have interleaved
with torch's, an order torch does not define either). gnnio itself draws from the default
generator only in dropout, under one lock.
"""

from __future__ import annotations

import math

import numpy as np
import torch

try:
    from numba import njit

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - numba is a dependency
    HAVE_NUMBA = False

__all__ = [
    "MTState",
    "block_words",
    "dropout_out_pass",
    "read_state",
    "threshold",
    "write_state",
]

_N, _M = 624, 397
_STATE_BYTES = 5056
_LEFT, _NEXT, _WORDS = 8, 16, 24


def block_words(per: int) -> int:
    """Length in 64-bit words of the buffer :func:`_dropout_pass` needs for ``per`` elements a
    round: an odd-offset word, the current block, and whole blocks covering ``2 * per`` words."""
    return (1 + _N + _N * -(-2 * per // _N) + 1) // 2 + 1


class MTState:
    """The default generator's Mersenne Twister as :func:`read_state` found it: ``block`` the 624
    words of its current block, ``c`` the index of the next word to read in it (624: used up, the
    next draw regenerates), ``raw`` the state bytes (written back with the new block and ``c``)."""

    __slots__ = ("block", "c", "raw")

    def __init__(self, raw: np.ndarray, block: np.ndarray, c: int):
        self.raw, self.block, self.c = raw, block, c


def read_state(gen: torch.Generator) -> MTState | None:
    """The CPU generator's MT19937 state, or ``None`` where its layout is not the one described in
    the module docstring."""
    raw = gen.get_state().numpy()
    if raw.shape != (_STATE_BYTES,):
        return None
    raw = raw.copy()
    left = int(raw[_LEFT : _LEFT + 4].view(np.int32)[0])
    nxt = int(raw[_NEXT : _NEXT + 8].view(np.uint64)[0])
    words = raw[_WORDS : _WORDS + 8 * _N].view(np.uint64)
    if not 1 <= left <= _N or (left > 1 and left + nxt != _N + 1) or int(words.max()) >> 32:
        return None
    # torch: a read decrements left and regenerates at 0, then reads state[next++]; so left == 1
    # means the block is used up (after seeding too, where next is 0)
    return MTState(raw, words.astype(np.uint32), _N if left == 1 else nxt)


def write_state(gen: torch.Generator, st: MTState) -> None:
    """Put ``st`` (after a pass) back into ``gen``, with torch's counters for it."""
    raw = st.raw
    raw[_LEFT : _LEFT + 4].view(np.int32)[0] = _N + 1 - st.c
    raw[_NEXT : _NEXT + 8].view(np.uint64)[0] = st.c
    raw[_WORDS : _WORDS + 8 * _N].view(np.uint64)[:] = st.block
    gen.set_state(torch.from_numpy(raw))


def threshold(q: float) -> np.uint64:
    """``k`` with ``u < q`` exactly when the 53-bit integer ``m`` of a uniform ``u = m * 2^-53`` is
    below ``k`` (``q * 2^53`` is exact in float64; ``m < x`` for real ``x`` iff ``m < ceil(x)``)."""
    return np.uint64(math.ceil(q * 2.0**53))


if HAVE_NUMBA:
    _U32 = np.uint32
    _U64 = np.uint64
    _T1 = np.uint64(0x001FFFFF001FFFFF)  # tempering masks, per 32-bit half
    _T2 = np.uint64(0x9D2C56809D2C5680)
    _T3 = np.uint64(0xEFC60000EFC60000)
    _T4 = np.uint64(0x00003FFF00003FFF)

    @njit(nogil=True, cache=True)
    def _twist(w, words):  # pragma: no cover - compiled; tested via callers
        # the MT19937 recurrence: w[624 : 624 + words] from the 624 words before them (loops
        # from 0 over views: with a variable start, numba's negative-index handling keeps LLVM
        # from vectorizing, 2 ns a word instead of 0.15)
        for j in range(words):
            u = w[j]
            v = w[j + 1]
            y = (u & _U32(0x80000000)) | (v & _U32(0x7FFFFFFF))
            w[j + _N] = w[j + _M] ^ (y >> _U32(1)) ^ ((_U32(0) - (v & _U32(1))) & _U32(0x9908B0DF))

    @njit(nogil=True, cache=True, inline="always")
    def _m53(y):  # pragma: no cover - compiled
        # two words in one (the first in the low half), each tempered as MT19937 tempers a word;
        # then torch's 53-bit integer: the first word's low 21 bits above the second word
        y ^= (y >> _U64(11)) & _T1
        y ^= (y << _U64(7)) & _T2
        y ^= (y << _U64(15)) & _T3
        y ^= (y >> _U64(18)) & _T4
        return ((y & _U64(0x1FFFFF)) << _U64(32)) | (y >> _U64(32))

    @njit(nogil=True, cache=True)
    def _mask_pass(w64, k, x, s, out, noise):  # pragma: no cover - compiled
        # element i: the word pair w64[i] (first word in the low half) tempered, its 53-bit
        # integer compared with k; noise = s or 0 (x's dtype), out = x * noise
        zero = x.dtype.type(0)
        for i in range(x.shape[0]):
            v = s if _m53(w64[i]) < k else zero
            noise[i] = v
            out[i] = x[i] * v

    @njit(nogil=True, cache=True)
    def _mask_only(w64, k, x, s, out):  # pragma: no cover - compiled
        # _mask_pass's out alone: for an input without a gradient (no noise kept for a backward).
        # A kernel of its own: _mask_pass with both loops behind a branch on an empty noise ran
        # 12 % slower on both paths (a 2^21 batch's layer inputs, 2-core VM)
        zero = x.dtype.type(0)
        for i in range(x.shape[0]):
            out[i] = x[i] * (s if _m53(w64[i]) < k else zero)

    @njit(nogil=True, cache=True)
    def _uniforms(w64, out):  # pragma: no cover - compiled
        for i in range(out.shape[0]):
            out[i] = _m53(w64[i]) * (1.0 / 9007199254740992.0)

    @njit(nogil=True, cache=True)
    def _round(block, c, m, w32):  # pragma: no cover - compiled
        # the next 2m words of the stream in w32, after the current block's; returns the index of
        # the round's first word pair in the uint64 view, the new blocks made and the offset
        need = 2 * m - (_N - c)  # words beyond the current block
        nb = max(0, -(-need // _N))
        pad = c & 1  # the round's first word at an even index: pairs are 64-bit words
        w32[pad : pad + _N] = block
        _twist(w32[pad:], _N * nb)
        return (pad + c) // 2, nb, pad

    @njit(nogil=True, cache=True)
    def _next(block, c, m, nb, pad, w32):  # pragma: no cover - compiled
        # after a round of m draws: the block holding its last word, and the new c
        if nb:
            block[:] = w32[pad + _N * nb : pad + _N * nb + _N]
        return c + 2 * m - _N * nb

    @njit(nogil=True, cache=True)
    def dropout_pass(block, c, k, x, s, out, noise, w32, w64, per):  # pragma: no cover
        """``noise[i] = s if draw_i < q else 0`` and ``out = x * noise`` for the next ``len(x)``
        float64 draws of the stream whose current block is ``block`` (updated in place) and next
        word ``c``; ``per`` elements a round through ``w32`` / ``w64`` (one buffer, two views,
        :func:`block_words` long). Returns the new ``c``."""
        n = x.shape[0]
        for lo in range(0, n, per):
            hi = min(n, lo + per)
            a, nb, pad = _round(block, c, hi - lo, w32)
            _mask_pass(w64[a : a + hi - lo], k, x[lo:hi], s, out[lo:hi], noise[lo:hi])
            c = _next(block, c, hi - lo, nb, pad, w32)
        return c

    @njit(nogil=True, cache=True)
    def dropout_out_pass(block, c, k, x, s, out, w32, w64, per):  # pragma: no cover - compiled
        """:func:`dropout_pass` without its ``noise`` (an input that needs no gradient): the same
        ``out`` and stream. Returns the new ``c``."""
        n = x.shape[0]
        for lo in range(0, n, per):
            hi = min(n, lo + per)
            a, nb, pad = _round(block, c, hi - lo, w32)
            _mask_only(w64[a : a + hi - lo], k, x[lo:hi], s, out[lo:hi])
            c = _next(block, c, hi - lo, nb, pad, w32)
        return c

    @njit(nogil=True, cache=True)
    def uniform_pass(block, c, out, w32, w64, per):  # pragma: no cover - compiled
        """The next ``len(out)`` float64 uniforms of the stream, as ``torch.rand`` draws them (for
        tests and benchmarks). Returns the new ``c``."""
        n = out.shape[0]
        for lo in range(0, n, per):
            hi = min(n, lo + per)
            a, nb, pad = _round(block, c, hi - lo, w32)
            _uniforms(w64[a : a + hi - lo], out[lo:hi])
            c = _next(block, c, hi - lo, nb, pad, w32)
        return c
