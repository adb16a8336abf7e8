"""gnnio's continuation of torch's CPU random stream (gnnio/train/_mt19937.py) draws what
``torch.rand(n, dtype=torch.float64)`` draws and leaves the generator as torch leaves it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gnnio.train import _mt19937 as mt


def _rand64(n: int, per: int) -> torch.Tensor:
    gen = torch.default_generator
    state = mt.read_state(gen)
    assert state is not None
    w64 = np.zeros(mt.block_words(per), dtype=np.uint64)
    out = np.empty(n)
    state.c = mt.uniform_pass(state.block, state.c, out, w64.view(np.uint32), w64, per)
    mt.write_state(gen, state)
    return torch.from_numpy(out)


def _after(fn, seed: int, words_before: int, n: int):
    """fn's n draws after ``words_before`` float32 draws (one word each), the generator's whole
    state after them, and its next draws."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        torch.rand(words_before)
        got = fn(n)
        return got, torch.default_generator.get_state(), torch.rand(3), torch.randn(2)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**63 - 1),
    words_before=st.sampled_from([0, 1, 2, 311, 312, 623, 624, 625, 1247, 1248, 1249]),
    n=st.integers(1, 3000),
    per=st.sampled_from([1, 2, 3, 311, 312, 313, 1000, 4096]),
)
def test_uniforms_equal_torch_rand_float64_and_leave_the_same_state(seed, words_before, n, per):
    want = _after(lambda k: torch.rand(k, dtype=torch.float64), seed, words_before, n)
    got = _after(lambda k: _rand64(k, per), seed, words_before, n)
    for a, b in zip(want, got):
        assert torch.equal(a, b)


def test_a_long_run_over_many_blocks_and_rounds():
    n = 300_007  # 965 blocks of words, rounds of 4096 draws
    for seed in (0, 2**40 + 3):
        want = _after(lambda k: torch.rand(k, dtype=torch.float64), seed, 3, n)
        got = _after(lambda k: _rand64(k, 4096), seed, 3, n)
        for a, b in zip(want, got):
            assert torch.equal(a, b)


@settings(max_examples=200, deadline=None)
@given(q=st.floats(0.0, 1.0), d=st.integers(-3, 3))
def test_the_integer_threshold_is_the_float_comparison(q, d):
    k = int(mt.threshold(q))
    for m in {max(0, min(2**53 - 1, k + d)), max(0, min(2**53 - 1, int(q * 2.0**53) + d))}:
        assert (m < k) == (m * 2.0**-53 < q)


def test_threshold_at_exact_multiples():
    assert int(mt.threshold(0.5)) == 2**52  # m = 2^52 is u = 0.5, not below q
    assert int(mt.threshold(1.0)) == 2**53
    assert int(mt.threshold(0.0)) == 0
    q = math.nextafter(0.5, 1.0)
    assert int(mt.threshold(q)) == 2**52 + 1


def test_a_state_of_another_layout_is_not_read():
    class Other:
        def __init__(self, t):
            self.t = t

        def get_state(self):
            return self.t

    good = torch.default_generator.get_state()
    assert mt.read_state(Other(good)) is not None
    assert mt.read_state(Other(torch.cat([good, good[:8]]))) is None  # another size
    bad = good.clone()
    bad[8:12] = torch.tensor([0, 0, 0, 0], dtype=torch.uint8)  # left = 0
    assert mt.read_state(Other(bad)) is None
    bad = good.clone()
    bad[24 + 4] = 1  # a state word above 32 bits
    assert mt.read_state(Other(bad)) is None


@pytest.mark.parametrize("p", [0.1, 0.5, 0.85])
def test_the_mask_pass_is_rand_below_q(p):
    """dropout_pass's noise is ``(torch.rand(float64) < q) * s`` and its output x * noise."""
    q = 1.0 - p
    x = np.random.default_rng(0).standard_normal(5001).astype(np.float32)
    s = np.float32(1.0) / np.float32(q)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        torch.rand(1)
        keep = (torch.rand(x.shape[0], dtype=torch.float64) < q).numpy()
        torch.manual_seed(3)
        torch.rand(1)
        state = mt.read_state(torch.default_generator)
        w64 = np.zeros(mt.block_words(700), dtype=np.uint64)
        out, noise = np.empty_like(x), np.empty_like(x)
        mt.dropout_pass(
            state.block, state.c, mt.threshold(q), x, s, out, noise, w64.view(np.uint32), w64, 700
        )
    assert np.array_equal(noise, np.where(keep, s, np.float32(0)))
    assert np.array_equal(out, x * noise)
