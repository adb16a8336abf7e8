"""One hop of Song & Jiang's locality-aware sampling as a Triton kernel (issue 24 item 5): the
GPU form of :func:`gnnio.sampling._las_kernels.sample_rows` with ``use_q`` (``scale != 1``, the
layer's set Q' not empty), used by :mod:`gnnio.sampling.locality_torch`.

Each program takes ``BLOCK`` destination rows of the bounded batch's node buffer (the first
``cnt[0]`` real; a program of padding rows only returns at once) and runs the CPU kernel's
per-row scheme on every lane, masked (the module docstring of :mod:`gnnio.sampling.locality`
has the design):

1. the row's stream ``splitmix64(hop_key ^ v * GAMMA)``; a row longer than ``theta > 0`` draws
   its circular window's start (Lemire, rejections redrawn);
2. ``a``, the Q' members inside the row or window: binary searches in the row's sorted member
   positions ``qpos[qptr[v]:qptr[v + 1]]`` (the index built once per sampler, uploaded once);
3. ``k == n`` (the whole row or window): every position in order; ``a == 0`` or ``a == n``:
   ``k`` positions by Floyd's algorithm; else Eq. 8's ``(q_in, q_out)`` with capping, the law of
   the member count ``m`` (Fisher's noncentral hypergeometric, ``omega`` by the same safeguarded
   Newton steps on ``log omega`` until ``|E[m] - a q_in| <= 1e-12 max(1, a q_in)``, at most 200),
   ``m`` drawn from its CDF with one uniform real, then Floyd among the members (``m`` of ``a``)
   and the non-members (``k - m`` of ``n - a``), the non-member ranks sorted and mapped to
   positions past the members before them;
4. the neighbours' global ids, their row and their weight (``1 / pi``, ``1 / (deg pi)``; float64
   arithmetic stored as float32) at the hop's CSR positions ``row_off[r] + j``.

The law of ``m`` is solved for every row (the CPU kernel caches it per ``(n, a)`` within a call:
only a speed-up, the solve is deterministic). The pmf, its ratios and the picks live in
``[BLOCK, FP]`` register tiles (``FP`` >= ``fanout + 1``), summed column by column in the CPU's
order. Float64 constants that float32 cannot hold (Triton types such literals float32) and the
scale come in a float64 tensor, and floating-point contraction is off (``enable_fp_fusion``), so
``a * s + b`` and ``s2 / tot - mean^2`` round as on the CPU. **Not bit-exact by construction**:
``exp`` and ``log`` (``omega`` and the starting ``log`` odds) come from the GPU's libdevice (or
NumPy in the interpreter), numba's from libm; they may differ by an ulp, which can move a CDF
value by an ulp and, in the rare row whose uniform falls right there, change ``m``. The weights
use no ``exp``/``log`` and are the CPU's bits; the tests check nodes and edges on their seeds and
weights exactly.

The hop key comes as three int32 arguments, or with ``KEY_PTR`` from an int64 ``[1]`` device
tensor, and the scale always from the ``consts`` tensor: a CUDA graph's replay
(:mod:`gnnio.sampling.gpu_graphed`) samples with the key and scale its input buffer holds then.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._triton_hop import _key, _lemire, _mix64

__all__ = ["las_const_values", "las_consts", "sample_las_triton"]

_BLOCK = 16
_M22 = (1 << 22) - 1


def las_const_values(scale: float) -> list[float]:
    """The kernel's float64 constants: ``scale``, the Newton tolerance ``1e-12``, ``1 - 1e-16``
    (the odds clamp) -- values a float32 literal would round. (A CUDA graph's replay reads them
    from its static input buffer, uploaded with each batch: :mod:`.gpu_graphed`.)"""
    return [float(scale), 1e-12, 1.0 - 1e-16]


def las_consts(scale: float, device) -> torch.Tensor:
    """:func:`las_const_values` as a float64 tensor on ``device``."""
    return torch.tensor(las_const_values(scale), dtype=torch.float64, device=device)


@triton.jit
def _lower_bound(arr, lo, hi, x, on):
    """First index in ``[lo, hi)`` with ``arr[idx] >= x`` on the ``on`` lanes (0 elsewhere)."""
    lo = tl.where(on, lo, 0)
    hi = tl.where(on, hi, 0)
    while tl.max((lo < hi).to(tl.int32), 0) > 0:
        act = lo < hi
        mid = (lo + hi) >> 1
        v = tl.load(arr + mid, mask=act, other=0).to(tl.int64)
        less = v < x
        lo = tl.where(act & less, mid + 1, lo)
        hi = tl.where(act & (less == 0), mid, hi)
    return lo


@triton.jit
def _col(tile, col, j):
    """Column ``j`` of a ``[BLOCK, FP]`` tile (exact: one value plus zeros)."""
    return tl.sum(tl.where(col[None, :] == j, tile, 0), 1)


@triton.jit
def _floyd(state, picks, N, T, OFF, on, col, FANOUT: tl.constexpr):
    """The CPU's ``_choose(N, T, picks, OFF, state)`` on the ``on`` lanes: ``T`` distinct values
    of ``[0, N)`` into columns ``OFF .. OFF + T - 1`` (all of ``0 .. N - 1`` when ``T >= N``)."""
    every = on & (T > 0) & (T >= N)
    fl = on & (T > 0) & (T < N)
    c2 = col[None, :] - OFF[:, None]
    picks = tl.where(every[:, None] & (c2 >= 0) & (c2 < N[:, None]), c2, picks)
    for i in range(0, FANOUT):
        go = fl & (i < T)
        j = N - T + i
        val, state = _lemire(state, j + 1, go)
        seen = tl.sum(((picks == val[:, None]) & (c2 >= 0) & (c2 < i)).to(tl.int32), 1) > 0
        t = tl.where(seen, j, val)
        picks = tl.where(go[:, None] & (c2 == i), t[:, None], picks)
    return state, picks


@triton.jit
def _member_r(qpos, j1, n1, qb, st, d, i, on):
    """Window offset of the ``i``-th Q' member of a (possibly wrapped) window."""
    idx = tl.where(i < n1, j1 + i, qb + i - n1)
    v = tl.load(qpos + idx, mask=on, other=0).to(tl.int64)
    return tl.where(i < n1, v - st, v + d - st)


@triton.jit
def _nch_pmf(ratio, omega, span, col, FANOUT: tl.constexpr, FP: tl.constexpr,
             BLOCK: tl.constexpr):  # fmt: skip
    """The CPU's ``_nch_pmf``: weights ``C(a,m) C(b,k-m) omega^m`` (rescaled past 1e200) and
    ``(pmf, total, mean - lo, var)``, summed in the CPU's order."""
    f = tl.full([BLOCK], 1.0, tl.float64)
    p = tl.where(col[None, :] == 0, 1.0, tl.zeros([BLOCK, FP], tl.float64))
    for j in range(0, FANOUT):
        go = j < span
        fn = f * _col(ratio, col, j) * omega
        big = go & (fn > 1e200)
        p = tl.where(big[:, None] & (col[None, :] <= j), p * 1e-200, p)
        fn = tl.where(big, fn * 1e-200, fn)
        f = tl.where(go, fn, f)
        p = tl.where(go[:, None] & (col[None, :] == j + 1), f[:, None], p)
    tot = tl.zeros([BLOCK], tl.float64)
    s1 = tl.zeros([BLOCK], tl.float64)
    s2 = tl.zeros([BLOCK], tl.float64)
    for j in range(0, FANOUT + 1):
        go = j <= span
        x = _col(p, col, j)
        tot = tl.where(go, tot + x, tot)
        s1 = tl.where(go, s1 + x * j, s1)
        s2 = tl.where(go, s2 + x * j * j, s2)
    mean = s1 / tot
    var = s2 / tot - mean * mean
    return p, tot, mean, tl.maximum(var, 0.0)


@triton.jit(do_not_specialize=["n", "cap", "k0", "k1", "k2", "theta"])
def _las(indptr, indices, dst, row_off, out_src, out_row, out_w, n, cnt, cap, k0, k1, k2, kp,
         qptr, qpos, consts, theta, FANOUT: tl.constexpr, FP: tl.constexpr, BLOCK: tl.constexpr,
         WMODE: tl.constexpr, KEY_PTR: tl.constexpr = False):  # fmt: skip
    pid = tl.program_id(0).to(tl.int64)
    real = tl.load(cnt)
    if pid * BLOCK >= real:
        return  # a program of padding rows only
    r = pid * BLOCK + tl.arange(0, BLOCK)
    rm = (r < n) & (r < real)
    col = tl.arange(0, FP)
    s = tl.load(consts)
    ntol = tl.load(consts + 1)
    one_m = tl.load(consts + 2)
    g = tl.load(dst + r, mask=rm, other=0)
    start = tl.load(indptr + g, mask=rm, other=0)
    d = tl.load(indptr + g + 1, mask=rm, other=0) - start
    off = tl.load(row_off + r, mask=rm, other=0)
    key = _key(k0, k1, k2, kp, KEY_PTR)  # (in device memory: a CUDA graph's replay)
    state = _mix64(key ^ (g.to(tl.uint64) * 0x9E3779B97F4A7C15))
    # 1. the pruning window (theta > 0): its start drawn first, as on the CPU
    cut = rm & (d > theta) & (theta > 0)
    st, state = _lemire(state, d, cut)
    st = tl.where(cut, st, 0)
    nn = tl.where(cut, theta, d)
    k = tl.minimum(nn, FANOUT)
    df = d.to(tl.float64)
    nf = nn.to(tl.float64)
    kf = k.to(tl.float64)
    inv_pi1 = df / nf
    if WMODE == 1:
        wscale = inv_pi1 / df
    else:
        wscale = inv_pi1
    # 2. the Q' members inside the row or window
    qb = tl.load(qptr + g, mask=rm, other=0)
    qe = tl.load(qptr + g + 1, mask=rm, other=0)
    has = rm & (qe > qb) & (k < nn)
    part = has & (nn != d)
    j1 = _lower_bound(qpos, qb, qe, st, part)
    n1 = _lower_bound(qpos, j1, qe, tl.minimum(d, st + nn), part) - j1
    j1 = tl.where(part, j1, qb)
    n1 = tl.where(part, n1, qe - qb)
    wrap = part & (st + nn > d)
    a = n1 + tl.where(wrap, _lower_bound(qpos, qb, qe, st + nn - d, wrap) - qb, 0)
    a = tl.where(has, a, 0)
    las = rm & (k < nn) & (a > 0) & (a < nn)
    plain = rm & (k < nn) & (las == 0)
    b = nn - a
    # 3. Eq. 8 with capping (cap_probs)
    af = a.to(tl.float64)
    bf = b.to(tl.float64)
    c = kf / (af * s + bf)
    cs = c * s
    q_in = tl.where(s >= 1.0, tl.where(cs <= 1.0, cs, 1.0), tl.where(c <= 1.0, cs, (kf - bf) / af))
    q_out = tl.where(s >= 1.0, tl.where(cs <= 1.0, c, (kf - af) / bf), tl.where(c <= 1.0, c, 1.0))
    # the law of m (solve_nch): point masses, else Newton on log omega
    lo = tl.maximum(k - b, 0)
    hi = tl.minimum(a, k)
    mu = af * q_in
    tol = ntol * tl.maximum(mu, 1.0)
    pt_hi = (hi <= lo) | (mu >= hi.to(tl.float64) - tol)
    pt_lo = (pt_hi == 0) & (mu <= lo.to(tl.float64) + tol)
    solve = las & (pt_hi == 0) & (pt_lo == 0)
    mlo = tl.where(pt_hi, hi, lo)
    span = tl.where(solve, hi - lo, 0)
    qi = tl.minimum(tl.maximum(q_in, 1e-300), one_m)
    qo = tl.minimum(tl.maximum(q_out, 1e-300), one_m)
    t = tl.where(solve, tl.log(qi / (1.0 - qi)) - tl.log(qo / (1.0 - qo)), 0.0)
    m2 = lo[:, None] + col[None, :]
    num = ((a[:, None] - m2) * (k[:, None] - m2)).to(tl.float64)
    den = (m2.to(tl.float64) + 1.0) * ((b[:, None] - k[:, None] + m2).to(tl.float64) + 1.0)
    ratio = tl.where(solve[:, None] & (col[None, :] < span[:, None]), num / den, 0.0)
    t_lo = tl.zeros([BLOCK], tl.float64)
    t_hi = tl.zeros([BLOCK], tl.float64)
    has_lo = r < 0  # (all false)
    has_hi = r < 0
    pmf = tl.zeros([BLOCK, FP], tl.float64)
    tot = tl.full([BLOCK], 1.0, tl.float64)
    active = solve
    it = 0
    while (it < 200) & (tl.max(active.to(tl.int32), 0) > 0):  # 200: _NCH_MAX_ITER
        omega = tl.exp(tl.minimum(t, 700.0))
        p, tt, mean, var = _nch_pmf(ratio, omega, span, col, FANOUT, FP, BLOCK)
        diff = (lo.to(tl.float64) + mean) - mu
        pmf = tl.where(active[:, None], p, pmf)
        tot = tl.where(active, tt, tot)
        upd = active & (tl.abs(diff) > tol)
        neg = diff < 0.0
        t_lo = tl.where(upd & neg, t, t_lo)
        has_lo = has_lo | (upd & neg)
        t_hi = tl.where(upd & (neg == 0), t, t_hi)
        has_hi = has_hi | (upd & (neg == 0))
        step = tl.where(var > 0.0, -diff / var, tl.where(neg, 8.0, -8.0))
        step = tl.minimum(tl.maximum(step, -8.0), 8.0)
        tn = t + step
        inside = ((has_lo == 0) | (t_lo < tn)) & ((has_hi == 0) | (tn < t_hi))
        alt = tl.where(
            has_lo & has_hi, 0.5 * (t_lo + t_hi), tl.where(has_lo, t_lo + 8.0, t_hi - 8.0)
        )
        t = tl.where(upd, tl.where(inside, tn, alt), t)
        active = upd
        it += 1
    # m from the CDF: one uniform real, the first CDF value above it
    nxt = state + 0x9E3779B97F4A7C15
    state = tl.where(solve, nxt, state)
    u = (_mix64(nxt) >> 11).to(tl.int64).to(tl.float64) * (1.0 / 9007199254740992.0)
    m = tl.where(solve, hi, mlo)
    found = r < 0
    acc = tl.zeros([BLOCK], tl.float64)
    for j in range(0, FANOUT):
        go = solve & (j < span)
        acc = acc + _col(pmf, col, j)
        hit = go & (found == 0) & (acc / tot > u)
        m = tl.where(hit, lo + j, m)
        found = found | hit
    m = tl.where(las, m, 0)
    # Floyd: plain rows k of n; LAS rows m of the a members, then k - m of the b non-members
    picks = tl.full([BLOCK, FP], -1, tl.int64)
    zero = tl.zeros([BLOCK], tl.int64)
    state, picks = _floyd(state, picks, tl.where(las, a, nn), tl.where(las, m, k), zero,
                          plain | las, col, FANOUT)  # fmt: skip
    state, picks = _floyd(state, picks, b, k - m, m, las, col, FANOUT)
    # the non-member ranks in ascending order (distinct: ranks among their own columns)
    nm = las[:, None] & (col[None, :] >= m[:, None]) & (col[None, :] < k[:, None])
    srt = picks
    for i in range(0, FANOUT):
        xi = _col(picks, col, i)
        own = las & (i >= m) & (i < k)
        rank = tl.sum((nm & (picks < xi[:, None])).to(tl.int32), 1).to(tl.int64)
        srt = tl.where(own[:, None] & (col[None, :] == (m + rank)[:, None]), xi[:, None], srt)
    # the t-th non-member sits at t + (members c with member_r(c) - c <= t)
    lo2 = tl.zeros([BLOCK, FP], tl.int64)
    hi2 = tl.where(nm, a[:, None] + 0 * col[None, :], 0)
    j1b, n1b, qbb = j1[:, None], n1[:, None], qb[:, None]
    stb, db = st[:, None], d[:, None]
    while tl.max(tl.max((lo2 < hi2).to(tl.int32), 1), 0) > 0:
        act = lo2 < hi2
        mid = (lo2 + hi2) >> 1
        le = _member_r(qpos, j1b, n1b, qbb, stb, db, mid, act) - mid <= srt
        lo2 = tl.where(act & le, mid + 1, lo2)
        hi2 = tl.where(act & (le == 0), mid, hi2)
    # 4. positions, neighbours, rows, weights
    is_mem = las[:, None] & (col[None, :] < m[:, None])
    midx = tl.where(picks < n1b, j1b + picks, qbb + picks - n1b)
    mpos = tl.load(qpos + midx, mask=is_mem, other=0).to(tl.int64)
    rel = tl.where(plain[:, None], picks, col[None, :])
    rel = tl.where(nm, srt + lo2, rel)
    pos = stb + rel
    pos = tl.where(pos >= db, pos - db, pos)
    pos = tl.where(is_mem, mpos, pos)
    dest = off[:, None] + col[None, :]
    valid = rm[:, None] & (col[None, :] < k[:, None]) & (dest < cap)
    nb = tl.load(indices + start[:, None] + pos, mask=valid, other=0)
    tl.store(out_src + dest, nb.to(tl.int64), mask=valid)
    tl.store(out_row + dest, r[:, None] + 0 * col[None, :], mask=valid)
    if WMODE != 2:
        wq = wscale * nf / kf
        w = tl.where(plain, wq, wscale)[:, None] + tl.zeros([BLOCK, FP], tl.float64)
        w = tl.where(is_mem, (wscale / q_in)[:, None], w)
        w = tl.where(nm, (wscale / q_out)[:, None], w)
        tl.store(out_w + dest, w.to(tl.float32), mask=valid)


def sample_las_triton(indptr, indices, nodes, rows: int, count, row_off, hop_key, fanout: int,
                      theta: int, qptr, qpos, consts, wmode: int, out) -> None:  # fmt: skip
    """One hop (module docstring) of the bounded batch: rows ``nodes[:rows]`` (real up to
    ``count``, int64 ``[1]`` on the device), written at ``row_off`` (the hop's cumulative ``k``)
    into ``out = (src, row, w)`` (``w`` unused for ``wmode`` 2, ``"none"``); nothing at or past
    ``len(src)``. ``fanout >= 1``; ``consts``: :func:`las_consts` of the scale (float64 ``[3]``
    on the device). ``hop_key``: an int, or an int64 ``[1]`` device tensor of its bits
    (:func:`gnnio.sampling.gpu_hop._s64`), read there by the kernel (``KEY_PTR``): a captured
    launch samples with the key -- and the scale -- its buffers hold when it is replayed."""
    src, row, w = out
    cap = int(src.shape[0])
    if cap == 0 or rows == 0:
        return
    key_ptr = isinstance(hop_key, torch.Tensor)
    key = 0 if key_ptr else hop_key & ((1 << 64) - 1)
    kp = hop_key if key_ptr else count  # (unread without KEY_PTR)
    fp = max(2, 1 << fanout.bit_length())  # >= fanout + 1: the law of m has <= k + 1 values
    grid = (triton.cdiv(rows, _BLOCK),)
    _las[grid](indptr, indices, nodes, row_off, src, row, w, rows, count, cap, key & _M22,
               (key >> 22) & _M22, key >> 44, kp, qptr, qpos, consts, int(theta), FANOUT=fanout,
               FP=fp, BLOCK=_BLOCK, WMODE=wmode, KEY_PTR=key_ptr,
               enable_fp_fusion=False)  # fmt: skip
