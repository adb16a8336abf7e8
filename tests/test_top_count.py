"""One rule for "the top fraction f of N nodes": gnnio.utils.counts.top_count, used by the tiered store,
the caches, the placement planner and the hotness benchmark."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnnio.preprocess.hotness import top_count


@pytest.mark.parametrize(
    "f,n,want",
    [
        (0.25, 10, 3),  # a half rounds up (Python's round would give 2)
        (0.35, 10, 4),
        (0.15, 10, 2),  # 0.15 * 10 is 1.4999... in binary floating point; the decimal is 1.5
        (0.29, 100, 29),
        (0.1, 1000, 100),
        (0.1, 11, 1),  # ceil would give 2
        (0.001, 10, 1),  # a positive fraction is at least one node
        (0.0, 10, 0),
        (0.5, 0, 0),
        (1.0, 7, 7),
        (3.0, 20, 20),
        (np.float32(0.3), 10, 3),
    ],
)
def test_top_count_by_hand(f, n, want):
    assert top_count(f, n) == want


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf")])
def test_top_count_refuses_bad_fractions(bad):
    with pytest.raises(ValueError, match="fraction"):
        top_count(bad, 10)
    with pytest.raises(ValueError, match="n must"):
        top_count(0.5, -1)


@settings(max_examples=200, deadline=None)
@given(f=st.floats(0, 1, allow_nan=False), g=st.floats(0, 1), n=st.integers(0, 10**12))
def test_top_count_is_nearest_monotone_and_clamped(f, g, n):
    k = top_count(f, n)
    assert 0 <= k <= n
    exact = Fraction(repr(f)) * n
    if f > 0 and n > 0:
        assert k >= 1
        if exact >= Fraction(1, 2):
            assert -Fraction(1, 2) < k - exact <= Fraction(1, 2)  # nearest, halves up
    else:
        assert k == 0
    lo, hi = sorted((f, g))
    assert top_count(lo, n) <= top_count(hi, n)


def test_every_fraction_to_count_conversion_uses_the_rule():
    from gnnio.bench.hotness import captured_shares
    from gnnio.features.caches.cache import capacity_rows
    from gnnio.features.tiers.tiered import hot_rows_for_fraction
    from gnnio.placement.planner import buffer_rows_from
    from gnnio.placement.topology import load_topology

    topo = load_topology("2+2")
    for f, n in [(0.25, 10), (0.15, 10), (0.1, 11), (0.001, 10), (0.5, 7)]:
        k = top_count(f, n)
        assert hot_rows_for_fraction(f, n) == k
        assert capacity_rows(f, n) == k
        assert buffer_rows_from(f, n, 4, topo) == k
        counts = np.zeros(n)
        counts[:k] = 1.0  # exactly the k top-scored nodes are read
        score = np.arange(n, 0, -1, dtype=np.float64)
        assert captured_shares(counts, score, [f])[str(f)] == 1.0
        counts[k - 1] = 0.0
        counts[min(k, n - 1)] += 1.0  # one read moves just past the top k
        assert captured_shares(counts, score, [f])[str(f)] < 1.0 or k == n
