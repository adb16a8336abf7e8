"""A loader stage that raises ends the run with its error; a stage that stops delivering ends it
after ``stall_timeout`` with one line naming the stage (issue 16; pyg#5348: a NeighborLoader
that stalls after hours)."""

from __future__ import annotations

import threading
import time
import warnings

import numpy as np
import pytest
import torch

from gnnio.features import InMemoryFeatureStore
from gnnio.ordering import RandomOrder
from gnnio.pipeline.loader import LoaderStall, NodeLoader
from gnnio.sampling import UniformSampler
from gnnio.train import TrainConfig, train
from gnnio.train.loop import LocalRun


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from gnnio.importers.synthetic import prepare_synthetic

    out = tmp_path_factory.mktemp("stall") / "g"
    prepare_synthetic(out, num_nodes=600, avg_degree=6, feat_dim=8, num_classes=3, seed=0,
                      split=(0.5, 0.2, 0.3), progress=False)  # fmt: skip
    return out


@pytest.fixture
def release():
    """An event the stuck stage threads wait on; set at teardown so they end."""
    ev = threading.Event()
    yield ev
    ev.set()


class Faulty:
    """Wraps a sampler: at batch ``at`` (the ``k``-th call) it raises or blocks on ``release``."""

    def __init__(self, inner, at: int, kind: str, release: threading.Event | None = None):
        self.inner, self.at, self.kind, self.release = inner, at, kind, release
        self.calls = 0

    def sample(self, seeds, epoch_seed=None):
        self.calls += 1
        if self.calls == self.at + 1:
            if self.kind == "raise":
                raise MemoryError("sampler ran out of memory on purpose")
            self.release.wait(120)  # a call that does not return (bounded: the test ends)
        return self.inner.sample(seeds, epoch_seed=epoch_seed)


class SlowStore(InMemoryFeatureStore):
    def __init__(self, feats, release, at):
        super().__init__(feats)
        self.release, self.at, self.calls = release, at, 0

    def gather(self, ids, out=None):
        self.calls += 1
        if self.calls == self.at + 1:
            self.release.wait(120)
        return super().gather(ids, out=out)


def loader(data, sampler=None, store=None, stall=None):
    import gnnio

    ds = gnnio.load(data)
    smp = sampler or UniformSampler(ds.graph, [3, 3], seed=0)
    st = store or InMemoryFeatureStore(np.asarray(ds.features))
    order = RandomOrder(torch.from_numpy(np.asarray(ds.train_idx)), 16, seed=0)
    return NodeLoader(smp, st, order, labels=ds.labels, stall_timeout=stall), ds


#: the stall timeout of these tests: a batch's stages, ~1 ms, took up to 1 s on a loaded 2-core
#: machine (2,850 batches with two busy cores), and 0.5 s stalled the loader at a batch before the
#: stuck one in 1 run of 40 (got 0 batches, not 4); the stuck call waits 120 s
STALL_S = 5.0


def test_stalled_sampler_ends_the_epoch_naming_the_stage(data, release):
    import gnnio

    g = gnnio.load(data).graph
    ld, _ = loader(
        data, Faulty(UniformSampler(g, [3, 3], seed=0), 4, "hang", release), stall=STALL_S
    )
    t0 = time.monotonic()
    got = 0
    with pytest.raises(LoaderStall) as err:
        for _ in ld.epoch(0):
            got += 1
    assert time.monotonic() - t0 < 60  # the stall ends it, not the stuck call's 120 s
    assert got == 4
    msg = str(err.value)
    assert "\n" not in msg and "--stall-timeout" in msg
    assert "the sample (worker 0) stage has been in sampler.sample for batch 4" in msg
    assert ld.stats is not None and not ld.stats.complete


def test_stalled_store_names_the_gather_stage(data, release):
    import gnnio

    feats = np.asarray(gnnio.load(data).features)
    ld, _ = loader(data, store=SlowStore(feats, release, 2), stall=STALL_S)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(
            LoaderStall, match=r"the gather stage has been in store.gather for batch 2"
        ):
            for _ in ld.epoch(0):
                pass
    # the stuck thread is left behind, already reported: no "did not stop" warning on top
    assert not [w for w in caught if "did not stop" in str(w.message)]


def test_no_timeout_by_default_and_bad_values(data):
    ld, _ = loader(data)
    assert ld.stall_timeout is None and sum(1 for _ in ld.epoch(0)) == ld.order.num_batches
    with pytest.raises(ValueError, match="stall_timeout"):
        loader(data, stall=0)


class FaultyRun(LocalRun):
    def __init__(self, kind: str, release=None):
        self.kind, self.release = kind, release

    def build_sampler(self, ds, cfg, fanouts, setup):
        smp, adaptive = super().build_sampler(ds, cfg, fanouts, setup)
        # epoch 1, batch 2 (19 batches per epoch)
        return Faulty(smp, 19 + 2, self.kind, self.release), adaptive


def cfg(**kw):
    base = dict(fanouts=(3, 3), batch_size=16, epochs=3, hidden=8, progress=False)
    return TrainConfig(**{**base, **kw})


def test_a_raising_sampler_ends_training_with_its_error(data):
    t0 = time.monotonic()
    with pytest.raises(MemoryError, match="on purpose") as err:
        train(data, cfg(), run=FaultyRun("raise"))
    assert time.monotonic() - t0 < 60
    notes = getattr(err.value, "__notes__", [])
    assert any("sample (worker 0) stage: sampler.sample for batch 2 of epoch 1" in n for n in notes)


def test_a_stalled_sampler_ends_training_with_one_line(data, release, capsys, monkeypatch):
    from gnnio.cli import main as cli_main
    from gnnio.train import loop

    monkeypatch.setattr(loop, "LocalRun", lambda: FaultyRun("hang", release))
    t0 = time.monotonic()
    rc = cli_main.main(["train", str(data), "--epochs", "3", "--fanouts", "3,3", "--batch-size",
                        "16", "--hidden", "8", "--quiet", "--stall-timeout", "5"])  # fmt: skip
    assert rc == 2 and time.monotonic() - t0 < 60
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1, err
    assert err[0].startswith("gnnio: error: no batch from the loader for 5 s (--stall-timeout)")
    assert "epoch 1: the sample (worker 0) stage has been in sampler.sample for batch 2" in err[0]
