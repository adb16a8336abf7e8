"""Rules of the tiered store's routing set-up, cold path and row source that the broader tiered
tests do not pin down (each test guards one rule a plausible bug would break; all on the CPU with
a simulated GPU tier)."""

from __future__ import annotations

import os
import tempfile
import warnings

import numpy as np
import pytest
import torch

from gnnio.errors import UsageError
from gnnio.features.base import FeatureStore
from gnnio.features.tiers import uva
from gnnio.features.tiers.row_source import RowSource, num_rows_of
from gnnio.features.tiers.simdevice import simulated_pin
from gnnio.features.tiers.tiered import TieredFeatureStore, TieringWarning
from gnnio.features.tiers.tiered_cold import ColdPath


def _feats(n: int = 20, dim: int = 3) -> np.ndarray:
    return np.arange(n * dim, dtype=np.float32).reshape(n, dim)


class _Store(FeatureStore):
    """A CPU store over ``rows`` whose ``host_tensor()`` returns ``host`` (whatever it is)."""

    def __init__(self, rows: torch.Tensor, host=None, device: str = "cpu"):
        super().__init__()
        self.rows, self.host = rows, host
        self.num_rows, self.dim = int(rows.shape[0]), int(rows.shape[1])
        self.dtype, self.device = rows.dtype, torch.device(device)

    def gather(self, ids, out=None):
        res = self.rows[torch.as_tensor(ids, dtype=torch.int64)]
        if out is None:
            return res
        out[: res.shape[0]].copy_(res)
        return out[: res.shape[0]]

    def host_tensor(self):
        return self.host


class _Handle:
    """A pin handle that records its release."""

    def __init__(self):
        self.released = False

    def release(self):
        self.released = True


# ---- the constructor's checks ---------------------------------------------------------------------


def test_a_fractional_hot_count_is_refused():
    """``hot`` must be a whole number of rows: 2.5 is refused, not silently truncated to 2."""
    with pytest.raises(ValueError, match="hot must be a non-negative integer"):
        TieredFeatureStore(_feats(), hot=2.5)
    assert TieredFeatureStore(_feats(), hot=2.0).num_hot == 2  # a whole float is a count


@pytest.mark.parametrize("hot", [0, 3])
def test_chunk_rows_below_one_is_refused_by_name(hot):
    """``chunk_rows=0`` is refused with a message naming it, even when no hot row is loaded."""
    with pytest.raises(ValueError, match="chunk_rows must be >= 1"):
        TieredFeatureStore(_feats(), hot=hot, chunk_rows=0)


@pytest.mark.parametrize("kw", [{"hot": 5}, {"hot_ids": [7, 2, 9, 11, 0]}])
def test_describe_hot_fraction_is_of_all_rows(kw):
    """``describe()["hot_fraction"]`` is the hot rows over *all* rows (5 of 20 = 0.25)."""
    store = TieredFeatureStore(_feats(), **kw)
    assert store.describe()["hot_fraction"] == 0.25


def test_describe_hot_fraction_after_a_budget_clamp():
    """After the budget clamps 10 requested rows to 3, the hot fraction is 3 of 20 rows."""
    with pytest.warns(TieringWarning):
        store = TieredFeatureStore(_feats(20, 2), hot=10, gpu_budget_bytes=3 * 8 + 7)
    assert store.num_hot == 3 and store.describe()["hot_fraction"] == 3 / 20


# ---- the cold path: modes, pin failures, release -------------------------------------------------


def test_cpu_gather_mode_never_pins():
    """``cold_mode="cpu_gather"`` is honoured over a pinnable tensor: no pin call, CPU gather."""
    calls = []

    def pin(t):
        calls.append(t.numel())
        return simulated_pin(t)

    feats = _feats()
    store = TieredFeatureStore(feats, hot=4, cold_mode="cpu_gather", pin_fn=pin)
    assert calls == [] and store.cold_mode_used == "cpu_gather"
    assert store.cold_mode_reason == "cold_mode='cpu_gather'"
    ids = [19, 0, 7, 3, 12]
    assert torch.equal(store.gather(ids), torch.from_numpy(feats[ids]))
    assert store.counters.rows == {"gpu": 2, "host": 3}


def test_pin_fallback_warning_points_at_the_constructor_call():
    """The pin-failure TieringWarning is attributed to the line that built the store."""

    def failing(t):
        raise RuntimeError("no")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        TieredFeatureStore(_feats(), hot=2, pin_fn=failing)
    tw = [w for w in caught if issubclass(w.category, TieringWarning)]
    assert len(tw) == 1 and os.path.samefile(tw[0].filename, __file__)


@pytest.mark.parametrize("cold_mode", ["zero_copy", "auto"])
def test_a_multi_line_pin_error_is_reported_in_one_line(cold_mode):
    """A pin function's multi-line PinError becomes a one-line error / warning (its first line)."""

    def failing(t):
        raise uva.PinError("cannot pin 240 B: refused\ndriver detail on a second line")

    if cold_mode == "zero_copy":
        with pytest.raises(uva.PinError) as ei:
            TieredFeatureStore(_feats(), hot=2, cold_mode=cold_mode, pin_fn=failing)
        msg = str(ei.value)
    else:
        with pytest.warns(TieringWarning) as rec:
            store = TieredFeatureStore(_feats(), hot=2, cold_mode=cold_mode, pin_fn=failing)
        msg = str(rec[0].message)
        assert "\n" not in store.cold_mode_reason
    assert "cannot pin 240 B: refused" in msg and "\n" not in msg and "second line" not in msg


def test_a_failed_device_view_releases_the_pin(monkeypatch):
    """When the pin worked but the zero-copy view did not, the pin is released before falling back."""

    def no_view(host, device):
        raise uva.PinError("zero-copy view failed")

    monkeypatch.setattr(uva, "device_view", no_view)
    monkeypatch.setattr(uva, "clear_last_cuda_error", lambda *a: None)
    handle = _Handle()
    cold = ColdPath(RowSource(torch.zeros(8, 2)), torch.device("cuda", 0), simulated=False)
    with pytest.warns(TieringWarning, match="zero-copy view failed"):
        cold.setup("auto", lambda t: handle, all_hot=False)
    assert handle.released and cold.mode_used == "cpu_gather" and cold.view is None


def test_release_drops_the_zero_copy_view():
    """After :meth:`ColdPath.release` no view of the unpinned rows remains to be read through."""
    handle = _Handle()
    cold = ColdPath(RowSource(torch.ones(8, 2)), torch.device("cpu"), simulated=True)
    cold.setup("zero_copy", lambda t: handle, all_hot=False)
    assert cold.view is not None
    cold.release()
    assert handle.released and cold.view is None


def test_a_closed_store_offers_no_device_rows():
    """A closed zero-copy store no longer offers its (unpinned) rows to kernels."""
    store = TieredFeatureStore(_feats(), hot=4, pin_fn=lambda t: _Handle())
    assert store.cold_mode_used == "zero_copy" and store.device_rows() is not None
    store.close()
    assert store.device_rows() is None


# ---- the row source: which host tensors may be read zero-copy -----------------------------------


@pytest.mark.parametrize(
    "bad_host",
    [
        lambda r: r.double(),  # another dtype
        lambda r: r.t().contiguous().t(),  # same values, not contiguous
        lambda r: r[:-1],  # fewer rows
    ],
    ids=["dtype", "strided", "shape"],
)
def test_a_store_host_tensor_that_does_not_match_is_not_pinned(bad_host):
    """A store's ``host_tensor()`` of another dtype/shape or not contiguous is ignored: CPU gather
    through the store, no pin attempt and no warning."""
    rows = torch.from_numpy(_feats())
    calls = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store = TieredFeatureStore(
            _Store(rows, bad_host(rows)), hot=4, pin_fn=lambda t: calls.append(t) or _Handle()
        )
    assert calls == [] and store.cold_mode_used == "cpu_gather"
    assert "does not hold its rows in one RAM tensor" in store.cold_mode_reason
    ids = [19, 2, 11]
    assert torch.equal(store.gather(ids), rows[ids])


def test_a_matching_store_host_tensor_is_read_zero_copy():
    """A store's contiguous host tensor of its own shape and dtype is pinned and read zero-copy."""
    rows = torch.from_numpy(_feats())
    store = TieredFeatureStore(_Store(rows, rows), hot=4)
    assert store.cold_mode_used == "zero_copy"


def test_a_backing_store_on_another_device_is_refused():
    """A backing store that gathers to a non-CPU device is a usage error naming the fix."""
    with pytest.raises(UsageError, match="give it a store on the CPU"):
        RowSource(_Store(torch.zeros(4, 2), device="meta"))


def test_a_column_major_memmap_is_refused():
    """A Fortran-order (column-major) memory map is refused: rows are read as contiguous bytes."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "f.dat")
        mm = np.memmap(path, dtype=np.float32, mode="w+", shape=(6, 3), order="F")
        mm[:] = _feats(6, 3)
        with pytest.raises(ValueError, match="row-major"):
            RowSource(mm)
        del mm


def test_num_rows_of_refuses_a_one_dimensional_array():
    """``num_rows_of`` counts rows of 2-D features only; a 1-D array is refused, not measured."""
    assert num_rows_of(np.zeros((7, 2), np.float32)) == 7
    with pytest.raises(ValueError, match="2-D"):
        num_rows_of(np.zeros(7, np.float32))
