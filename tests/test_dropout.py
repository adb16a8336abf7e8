"""gnnio's CPU dropout equals ``F.dropout`` bit for bit (values, gradients, random stream) and the
training step uses it."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from gnnio.train import dropout as dropout_mod
from gnnio.train.dropout import dropout, matches_torch
from gnnio.utils.syncs import OpCounter
from tests.helpers import in_forked_child


@pytest.fixture(autouse=True)
def _every_size(monkeypatch):
    """The fast path for tensors of any size here (small ones take F.dropout by default)."""
    monkeypatch.setattr(dropout_mod, "_MIN_ELEMENTS", 0)


def test_small_tensors_take_f_dropout_by_default(monkeypatch):
    monkeypatch.setattr(dropout_mod, "_MIN_ELEMENTS", 4096)
    assert matches_torch(torch.float32)  # (its one-time check makes a pass of its own)
    passes = _count_passes(monkeypatch)
    (y0, g0, a0), (y1, g1, a1) = _both(torch.randn(63, 65), 0.5, seed=1)  # 4095 elements
    assert passes["n"] == 0 and torch.equal(y0, y1) and torch.equal(a0, a1)
    _both(torch.randn(64, 64), 0.5, seed=1)  # 4096
    assert passes["n"] == 1


def _both(x: torch.Tensor, p: float, seed: int):
    """(F.dropout's output, its gradient, the next draws) and the same for gnnio's dropout."""
    out = []
    for fn in (F.dropout, dropout):
        xi = x.detach().clone().requires_grad_(x.is_floating_point())
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            y = fn(xi, p=p, training=True)
            after = torch.default_generator.get_state()  # every byte, counters included
            after = torch.cat([after, torch.rand(5, dtype=torch.float64).view(torch.uint8)])
        grad = None
        if xi.requires_grad:
            y.backward(torch.arange(y.numel(), dtype=y.dtype).view_as(y))
            grad = xi.grad
        out.append((y.detach(), grad, after))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_equals_f_dropout_bit_for_bit_with_the_same_random_stream(dtype, p):
    x = torch.randn(257, 33, generator=torch.Generator().manual_seed(3)).to(dtype)
    (y0, g0, a0), (y1, g1, a1) = _both(x, p, seed=11)
    assert torch.equal(y0, y1) and torch.equal(g0, g1) and torch.equal(a0, a1)
    assert matches_torch(dtype)  # the fast path was taken, not F.dropout itself


def test_equals_f_dropout_when_drawn_in_several_rounds(monkeypatch):
    """Above ``_CHUNK`` elements the draws come in rounds through one reused buffer: same
    result; and on a tensor smaller than the buffer left by a larger one."""
    monkeypatch.setattr(dropout_mod, "_CHUNK", 1 << 14)
    big = torch.randn(700, 513, generator=torch.Generator().manual_seed(4))
    assert big.numel() > 20 * dropout_mod._CHUNK
    passes = _count_passes(monkeypatch)
    for i, x in enumerate((big, big[:5].clone(), big, big)):
        (y0, g0, a0), (y1, g1, a1) = _both(x, 0.35, seed=21 + i)
        assert torch.equal(y0, y1) and torch.equal(g0, g1) and torch.equal(a0, a1)
    assert passes["n"] == 4  # the fast path ran (not F.dropout against itself)


@pytest.mark.parametrize("chunk", [1, 7, 64, 311, 312, 313, 1000])
@pytest.mark.parametrize("words_before", [0, 1, 623, 624, 625])
def test_any_round_size_and_position_in_the_stream_gives_f_dropout(chunk, words_before):
    """Rounds of any size, starting anywhere in the generator's block (an odd word, the last
    word, a used-up block): F.dropout's values and the generator's state after it."""
    x = torch.randn(37, 29, generator=torch.Generator().manual_seed(chunk))
    res = []
    with torch.random.fork_rng(devices=[]):
        for fn in (
            lambda t: F.dropout(t, 0.6, True),
            lambda t: dropout_mod._mask_dropout(t, 0.6, chunk),
        ):
            torch.manual_seed(9)
            torch.rand(words_before)  # float32 draws: one word each
            res.append((fn(x), torch.default_generator.get_state()))
    assert torch.equal(res[0][0], res[1][0]) and torch.equal(res[0][1], res[1][1])


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 40),
    cols=st.integers(1, 40),
    p=st.floats(0.01, 0.99),
    seed=st.integers(0, 2**31),
)
def test_equals_f_dropout_on_any_shape_and_rate(rows, cols, p, seed):
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    (y0, g0, a0), (y1, g1, a1) = _both(x, p, seed)
    assert torch.equal(y0, y1) and torch.equal(g0, g1) and torch.equal(a0, a1)


def test_inputs_the_fast_path_does_not_take_behave_as_f_dropout():
    x = torch.randn(8, 6)
    assert dropout(x, p=0.0, training=True) is x  # F.dropout returns its input
    assert dropout(x, p=0.5, training=False) is x
    assert torch.equal(dropout(x, p=1.0, training=True), torch.zeros_like(x))
    t = x.t()  # not contiguous: empty_like keeps its strides, so F.dropout is used
    (y0, _, a0), (y1, _, a1) = _both(t, 0.5, seed=5)
    assert torch.equal(y0, y1) and torch.equal(a0, a1)
    empty = torch.empty(0, 4)
    assert dropout(empty, p=0.5, training=True).shape == (0, 4)


@pytest.mark.parametrize("mode", [torch.inference_mode, torch.no_grad])
def test_the_first_call_may_come_under_no_grad_or_inference_mode(mode):
    dropout_mod._CHECKED.clear()
    x = torch.randn(6, 5)
    outs = []
    with mode():
        for fn in (F.dropout, dropout):
            torch.manual_seed(3)
            outs.append(fn(x, p=0.5, training=True))
    assert len(dropout_mod._CHECKED) == 1 and matches_torch(torch.float32)
    assert torch.equal(*outs)


def test_a_torch_that_draws_otherwise_gets_f_dropout(monkeypatch):
    monkeypatch.setattr(dropout_mod, "matches_torch", lambda dtype: False)
    calls = Counter()
    real = F.dropout

    def spy(*a, **k):
        calls["F.dropout"] += 1
        return real(*a, **k)

    monkeypatch.setattr(dropout_mod.F, "dropout", spy)
    dropout(torch.randn(4, 4), p=0.5, training=True)
    assert calls["F.dropout"] == 1


def test_the_check_sees_a_different_draw(monkeypatch):
    """matches_torch compares with F.dropout for real: a mask drawn otherwise fails it."""
    dropout_mod._CHECKED.clear()
    monkeypatch.setattr(
        dropout_mod,
        "_mask_dropout",
        lambda x, p, chunk=0: x * (torch.rand(x.shape) < 1 - p).to(x.dtype) / (1 - p),  # float32
    )
    try:
        assert not matches_torch(torch.float32)
    finally:
        dropout_mod._CHECKED.clear()


def test_the_training_step_on_the_cpu_draws_no_bernoulli():
    """The model's dropout goes through gnnio's (no aten.bernoulli_ in a step), and a step's
    output is F.dropout's: same loss as the model with F.dropout patched back in."""
    from gnnio.sampling.base import Block
    from gnnio.train.models import build_model

    torch.manual_seed(0)
    net = build_model("sage", 12, 16, 3, num_layers=2, dropout=0.5)
    n_src, n_dst = 30, 10
    src = torch.randint(0, n_src, (60,))
    dst = torch.randint(0, n_dst, (60,)).sort().values
    b0 = Block(torch.stack([src, dst]), num_src=n_src, num_dst=n_dst)
    keep = dst < 4
    b1 = Block(torch.stack([src[keep] % n_dst, dst[keep]]), num_src=n_dst, num_dst=4)
    x = torch.randn(n_src, 12)

    class Ops(OpCounter):
        def __init__(self):
            super().__init__()
            self.names = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names[func.overloadpacket.__name__] += 1
            return super().__torch_dispatch__(func, types, args, kwargs)

    assert matches_torch(torch.float32)  # its one-time check runs F.dropout: not inside the count
    torch.manual_seed(1)
    with Ops() as ops:
        loss = net(x, [b0, b1]).square().sum()
    assert ops.names["bernoulli_"] == 0 and ops.names["rand"] == 0 and ops.names["uniform_"] == 0
    torch.manual_seed(1)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(dropout_mod, "_mask_dropout", lambda x, p, chunk=0: F.dropout(x, p, True))
        assert torch.equal(net(x, [b0, b1]).square().sum(), loss)


def test_a_forked_child_does_not_wait_on_the_parents_lock():
    """Another thread of the parent in dropout (its draw lock held) when the process forks: the
    child's dropout does not wait forever on that thread, which the child does not have."""
    import threading

    x = torch.randn(64, 100)  # below torch's parallel grain size: no OpenMP region in the child
    assert matches_torch(torch.float32)
    held, release = threading.Event(), threading.Event()

    def hold():
        with dropout_mod._DRAW_LOCK:
            held.set()
            release.wait(60)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(60)

    def child() -> bool:
        torch.manual_seed(5)
        y = dropout(x, p=0.5, training=True)
        torch.manual_seed(5)
        return torch.equal(y, F.dropout(x, p=0.5, training=True))

    try:
        assert in_forked_child(child, timeout=30) is True, "the child's dropout hung or differed"
    finally:
        release.set()
        t.join(60)


def _count_passes(monkeypatch) -> Counter:
    from gnnio.train import _mt19937 as mt

    calls = Counter()
    real = mt.dropout_pass

    def counted(*a):
        calls["n"] += 1
        return real(*a)

    monkeypatch.setattr(mt, "dropout_pass", counted)
    return calls


def test_autograd_beyond_one_backward_as_f_dropout():
    """Double backward, forward-mode AD, torch.func.grad and vmap: F.dropout's results."""
    import torch.autograd.forward_ad as fwad

    x = torch.randn(5, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    res = []
    for fn in (F.dropout, dropout):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1)
            xi = x.clone().requires_grad_(True)
            y = fn(xi, p=0.4, training=True)
            (g,) = torch.autograd.grad((y**2).sum(), xi, create_graph=True)
            (gg,) = torch.autograd.grad(g.sum(), xi)
            with fwad.dual_level():
                tangent = fwad.unpack_dual(
                    fn(fwad.make_dual(x, torch.ones_like(x)), p=0.4, training=True)
                ).tangent
            fgrad = torch.func.grad(lambda t, f=fn: f(t, p=0.4, training=True).sum())(x)
            vm = torch.func.vmap(
                lambda t, f=fn: f(t, p=0.4, training=True), randomness="different"
            )(x)
        res.append((y.detach(), g.detach(), gg, tangent, fgrad, vm))
    for a, b in zip(*res):
        assert torch.equal(a, b)


@pytest.mark.parametrize("mode", ["no_grad_input", "under_no_grad", "inference_mode", "dual"])
def test_an_input_without_a_gradient_keeps_no_mask(monkeypatch, mode):
    """The model's first layer (the features need no gradient), ``torch.no_grad``, inference
    mode: the output and the stream are F.dropout's, and no mask is made or kept (the autograd
    function is not used). A forward-mode AD level open: the function is used, its tangent
    F.dropout's. Fails when the mask-free pass drifts from F.dropout or is never taken."""
    import contextlib

    import torch.autograd.forward_ad as fwad

    assert matches_torch(torch.float32)  # (its one-time check uses the function: before the spy)
    fused = Counter()
    real = dropout_mod._FusedDropout.apply

    def spy(*a):
        fused["n"] += 1
        return real(*a)

    monkeypatch.setattr(dropout_mod._FusedDropout, "apply", spy)
    x = torch.randn(70, 90, generator=torch.Generator().manual_seed(6))  # > _MIN_ELEMENTS
    tangent = torch.randn(70, 90, generator=torch.Generator().manual_seed(7))
    ctx = {
        "no_grad_input": contextlib.nullcontext,
        "under_no_grad": torch.no_grad,
        "inference_mode": torch.inference_mode,
        "dual": fwad.dual_level,
    }[mode]
    res = []
    for fn in (F.dropout, dropout):
        xi = x.clone().requires_grad_(mode == "under_no_grad")
        with torch.random.fork_rng(devices=[]), ctx():
            torch.manual_seed(3)
            if mode == "dual":
                xi = fwad.make_dual(xi, tangent)
            y = fn(xi, p=0.35, training=True)
            t = fwad.unpack_dual(y).tangent if mode == "dual" else None
            y = fwad.unpack_dual(y).primal if mode == "dual" else y
            res.append((y.clone(), t, torch.default_generator.get_state()))
    assert torch.equal(res[0][0], res[1][0]) and torch.equal(res[0][2], res[1][2])
    if mode == "dual":
        assert torch.equal(res[0][1], res[1][1])
    assert fused["n"] == (1 if mode == "dual" else 0), fused
    assert not res[1][0].requires_grad


def test_a_default_device_context_does_not_move_the_draws():
    x = torch.randn(6, 9)
    with torch.device("meta"):
        outs = []
        for fn in (F.dropout, dropout):
            torch.manual_seed(4)
            outs.append(fn(x, p=0.5, training=True))
    assert outs[1].device.type == "cpu" and torch.equal(*outs)


def test_two_threads_first_calls_keep_the_stream_and_the_fast_path():
    """The one-time check runs once, under a lock, whatever threads call dropout first; and the
    default generator ends where two F.dropout calls would leave it."""
    import threading

    for rep in range(6):
        dropout_mod._CHECKED.clear()
        xs = [torch.randn(30, 40), torch.randn(30, 40)]
        start = threading.Barrier(2)
        torch.manual_seed(rep)

        def run(x, start=start):
            start.wait()
            dropout(x, p=0.5, training=True)

        ts = [threading.Thread(target=run, args=(x,)) for x in xs]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=60)
        after = torch.rand(4, dtype=torch.float64)
        torch.manual_seed(rep)
        F.dropout(xs[0], 0.5, True), F.dropout(xs[1], 0.5, True)
        assert torch.equal(after, torch.rand(4, dtype=torch.float64))
        assert dropout_mod._CHECKED == {torch.float32: True}


def test_two_threads_each_draw_one_unbroken_run(monkeypatch):
    """Two threads in dropout at once: each call's draws are one run of the stream (as torch holds
    the generator for a whole bernoulli_), so the pair equals F.dropout's in one of the two
    orders."""
    import threading

    monkeypatch.setattr(dropout_mod, "_CHUNK", 1 << 10)
    assert matches_torch(torch.float32)
    xs = [torch.randn(300, 500), torch.randn(300, 500)]
    torch.manual_seed(0)
    ab = [F.dropout(xs[0], 0.5, True), F.dropout(xs[1], 0.5, True)]
    torch.manual_seed(0)
    ba = [F.dropout(xs[1], 0.5, True), F.dropout(xs[0], 0.5, True)][::-1]
    for _ in range(4):
        torch.manual_seed(0)
        got = [None, None]
        start = threading.Barrier(2)

        def run(i, start=start, got=got):
            start.wait()
            got[i] = dropout(xs[i], p=0.5, training=True)

        ts = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=60)
        assert all(map(torch.equal, got, ab)) or all(map(torch.equal, got, ba))


def test_the_check_leaves_the_gpus_generators_alone(monkeypatch):
    """The one-time check seeds the CPU generator only: torch.manual_seed would also reseed every
    GPU's generator, silently resetting a GPU run's random stream (found in review)."""
    seeded = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda s: seeded.append(("cuda", s)))
    dropout_mod._CHECKED.clear()
    try:
        assert matches_torch(torch.float32) and matches_torch(torch.float64)
    finally:
        dropout_mod._CHECKED.clear()
    assert seeded == []


@pytest.mark.parametrize("case", range(3))
def test_the_check_sees_a_draw_that_differs_only_in_one_case(monkeypatch, case):
    """Each of the check's cases runs: a mask that differs only at the case's rate fails it."""
    p_bad = dropout_mod._CHECK_CASES[case][0]
    real = dropout_mod._mask_dropout

    def off_at_one_rate(x, p, chunk=None):
        y = real(x, p, chunk)
        return y + 1 if p == p_bad else y

    monkeypatch.setattr(dropout_mod, "_mask_dropout", off_at_one_rate)
    dropout_mod._CHECKED.clear()
    try:
        assert not matches_torch(torch.float32)
    finally:
        dropout_mod._CHECKED.clear()


def test_a_draw_off_the_cpu_waits_for_a_capture_on_another_thread():
    """On a GPU an eager dropout beside another thread's CUDA graph capture fails (torch's
    default generator is the capture's; gnnio.utils.capture): off the CPU :func:`dropout` draws
    under the capture lock -- it waits while another thread holds it, and runs while this one
    does (the step's capture calls it). The meta device stands in for CUDA."""
    import threading

    from gnnio.utils.capture import CAPTURE_LOCK

    x = torch.ones(64, 64, device="meta")
    held, release, done = threading.Event(), threading.Event(), threading.Event()

    def capture_elsewhere():
        with CAPTURE_LOCK:
            held.set()
            release.wait(10)

    t = threading.Thread(target=capture_elsewhere)
    t.start()
    assert held.wait(10)
    out = []
    d = threading.Thread(target=lambda: (out.append(dropout(x, 0.5, True)), done.set()))
    d.start()
    assert not done.wait(0.3), "the draw ran while another thread held the capture lock"
    release.set()
    t.join(10)
    assert done.wait(10) and out[0].shape == x.shape
    d.join(10)
    with CAPTURE_LOCK:  # reentrant: the thread capturing draws inside its capture
        assert dropout(x, 0.5, True).device.type == "meta"
    assert not CAPTURE_LOCK.locked()
    assert dropout(x, 0.5, False) is x or dropout(x, 0.5, False).shape == x.shape


def _untemper(y: int) -> int:
    """The MT19937 word whose tempered output is ``y``."""
    y ^= y >> 18
    y ^= (y << 15) & 0xEFC60000
    r = y
    for _ in range(5):
        r = y ^ ((r << 7) & 0x9D2C5680)
    y, r = r & 0xFFFFFFFF, r & 0xFFFFFFFF
    for _ in range(3):
        r = y ^ (r >> 11)
    return r


@pytest.mark.parametrize("p", [0.35, 0.9])
@pytest.mark.parametrize("needs_grad", [True, False])
def test_a_draw_on_the_threshold_is_dropped_and_one_below_kept(needs_grad, p):
    """torch keeps an element where its uniform ``u`` is below ``q``: with the generator set so
    that the first draws are the 53-bit integers ``k - 1`` and ``k`` (``k`` the threshold, ``u``
    just below and at ``q``) the first element is kept and the second dropped, as F.dropout does
    (either pass: with and without the mask). Random draws land there once in 2^53."""
    from gnnio.train import _mt19937 as mt

    k = int(mt.threshold(1.0 - p))
    x = torch.ones(64, 64)
    outs = []
    for fn in (F.dropout, dropout):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            torch.rand(1, dtype=torch.float64)  # (into a block: the next words are plain reads)
            st = mt.read_state(torch.default_generator)
            for i, m in enumerate((k - 1, k)):  # a draw's words: m's high 21 bits, then its low 32
                st.block[st.c + 2 * i] = _untemper((m >> 32) & 0x1FFFFF)
                st.block[st.c + 2 * i + 1] = _untemper(m & 0xFFFFFFFF)
            mt.write_state(torch.default_generator, st)
            outs.append(fn(x.clone().requires_grad_(needs_grad), p=p, training=True).detach())
    assert outs[0].view(-1)[:2].tolist() == pytest.approx([1 / (1 - p), 0.0])  # (crafted first)
    assert torch.equal(outs[0], outs[1])
