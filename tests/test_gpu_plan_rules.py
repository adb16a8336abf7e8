"""The GPU user's defaults (issue 24 item 4, :mod:`gnnio.train.gpu_plan`) held to the rules the
module docstring states: each tier's threshold taken at the exact byte (fits at the budget, not
one byte past it), every layout option a user can give keeps the plan off, the planned config
is one ``gnnio train`` accepts, the hottest rows fill the GPU tier, and the modeled load time
is the docstring's formula."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from gnnio.importers.synthetic import prepare_synthetic
from gnnio.placement.topology import DEFAULT_HOST_BW
from gnnio.train import TrainConfig
from gnnio.train.gpu_plan import (
    SCRATCH_BYTES_PER_NODE,
    apply_layout_plan,
    plan_layout,
    resolve_device,
)

GiB = 2**30
FREE = 8 * GiB  # reserve max(1 GiB, free / 4) = 2 GiB: the budget is 6 GiB
BUDGET = 6 * GiB
ROW = 4096


def _graph(tmp_path_factory, feat_dim: int):
    """A 1,500-node synthetic graph (average degree 8) with ``feat_dim``-wide rows."""
    import gnnio

    out = tmp_path_factory.mktemp("data") / f"plan{feat_dim}"
    prepare_synthetic(out, num_nodes=1500, avg_degree=8, feat_dim=feat_dim, num_classes=4, seed=0,
                      split=(0.5, 0.2, 0.3), progress=False)  # fmt: skip
    return gnnio.load(out)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return _graph(tmp_path_factory, 16)


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """The graph of ``ds`` with 512-wide rows: the rows outweigh the CSR and its member index."""
    return _graph(tmp_path_factory, 512)


def _cfg(**kw) -> TrainConfig:
    base = dict(fanouts=(5, 5), batch_size=128, epochs=1, hidden=16, progress=False)
    base.update(kw)
    return TrainConfig(seed=0, **base)


def test_everything_fits_at_exactly_the_budget_and_not_one_byte_past_it():
    """Features + CSR + scratch equal to the budget all go on the GPU; one byte more does not."""
    n = 2**20 - 1
    scratch = SCRATCH_BYTES_PER_NODE * (n + 1)  # 16 MiB
    feats = 4 * GiB
    csr = BUDGET - feats - scratch
    at = plan_layout(feats, ROW, csr, n, free_bytes=FREE)
    assert at["budget_bytes"] == BUDGET
    assert (at["gpu_cache_fraction"], at["sampler_device"], at["graph_in"]) == (1.0, "cuda", "gpu")
    assert at["gpu_feature_bytes"] + at["gpu_csr_bytes"] + scratch == BUDGET
    past = plan_layout(feats, ROW, csr + 1, n, free_bytes=FREE)  # the CSR over a quarter: UVA
    assert (past["graph_in"], past["gpu_csr_bytes"]) == ("host", 0)


def test_the_csr_goes_on_the_gpu_at_exactly_a_quarter_of_the_budget():
    """CSR + scratch equal to a quarter of the budget stay on the GPU; one byte more is UVA."""
    n = 2**20 - 1
    scratch = SCRATCH_BYTES_PER_NODE * (n + 1)
    feats = 8 * GiB  # never fits
    csr = BUDGET // 4 - scratch
    at = plan_layout(feats, ROW, csr, n, free_bytes=FREE)
    assert (at["sampler_device"], at["graph_in"], at["gpu_csr_bytes"]) == ("cuda", "gpu", csr)
    assert at["hot_rows"] == (BUDGET - csr - scratch) // ROW  # the rest of the budget: rows
    past = plan_layout(feats, ROW, csr + 1, n, free_bytes=FREE)
    assert (past["sampler_device"], past["graph_in"], past["gpu_csr_bytes"]) == ("cuda", "host", 0)
    assert past["hot_rows"] == (BUDGET - scratch) // ROW


def test_uva_sampling_at_exactly_a_quarter_of_the_budget_of_scratch_then_the_cpu_sampler():
    """Scratch equal to a quarter of the budget still samples on the GPU (UVA); one node more
    (16 bytes of scratch) gives the CPU sampler and the whole budget to rows."""
    n = BUDGET // 4 // SCRATCH_BYTES_PER_NODE - 1  # scratch = 1.5 GiB exactly
    feats, csr = 64 * GiB, 4 * GiB  # neither fits
    at = plan_layout(feats, ROW, csr, n, free_bytes=FREE)
    assert (at["sampler_device"], at["graph_in"]) == ("cuda", "host")
    assert at["hot_rows"] == (BUDGET - BUDGET // 4) // ROW
    past = plan_layout(feats, ROW, csr, n + 1, free_bytes=FREE)
    assert past["sampler_device"] == "cpu" and past["hot_rows"] == BUDGET // ROW


def test_the_hot_rows_never_pass_the_budget():
    """Whatever the case, the GPU bytes planned (rows, CSR, scratch) stay within the budget."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 2**24))
        row = int(rng.choice([4, 64, 512, 4096]))
        feats, csr = n * row, int(rng.integers(0, 2**33))
        free = int(rng.integers(0, 2**35))
        p = plan_layout(feats, row, csr, n, free_bytes=free)
        scratch = SCRATCH_BYTES_PER_NODE * (n + 1) if p["sampler_device"] == "cuda" else 0
        assert 0 <= p["hot_rows"] <= n
        if p["hot_rows"]:
            assert p["gpu_feature_bytes"] + p["gpu_csr_bytes"] + scratch <= p["budget_bytes"]
        assert p["reserve_bytes"] == max(GiB, free // 4)


def test_auto_picks_cuda_with_exactly_one_gpu_per_rank(monkeypatch):
    """``--device auto`` is CUDA when the GPUs equal the local ranks (one GPU, one rank)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("auto") == "cuda"
    assert resolve_device("auto", ranks=2) == "cpu"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto", ranks=2) == "cuda"


@pytest.mark.parametrize(
    "opts",
    [
        {"gpu_cache_fraction": 0.5},
        {"placement": "placement.json"},
        {"cache_policy": "lru"},
        {"cache_policy": "static"},
        {"sampler_device": "cpu"},
        {"sampler_device": "cuda", "graph_in": "host"},
        {"store": "disk"},
    ],
)
def test_every_layout_option_keeps_the_plan_off(ds, opts):
    """Each layout option of the module docstring, given alone, leaves the config as it is."""
    cfg = _cfg(**opts)
    same, plan = apply_layout_plan(ds, cfg, torch.device("cuda"), free_bytes=80 * GiB)
    assert same is cfg and plan["planned"] is False


@pytest.mark.parametrize("free", [80 * GiB, GiB + 10**6, GiB + 1, 0])
def test_the_planned_config_is_one_train_accepts(ds, free, monkeypatch):
    """Every plan (all on the GPU, UVA, the CPU sampler) gives a config that validates."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # (--device cuda's check)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    new, plan = apply_layout_plan(ds, _cfg(device="cuda"), torch.device("cuda"), free_bytes=free)
    assert plan["planned"]
    new.validate()
    assert new.sampler_device == plan["sampler_device"]
    if plan["sampler_device"] == "cpu":
        assert new.graph_in == "auto"


def test_the_planned_hot_rows_are_the_hottest_ones(ds):
    """The tier built from the plan holds exactly ``hot_rows`` rows, those of highest score."""
    from gnnio.train.setup import build_store, hot_score

    scratch = SCRATCH_BYTES_PER_NODE * (ds.num_nodes + 1)
    cfg = _cfg(device="cuda")
    new, plan = apply_layout_plan(
        ds, cfg, torch.device("cuda"), free_bytes=GiB + 4 * scratch + 1000
    )
    assert 0 < plan["hot_rows"] < ds.num_nodes
    score = hot_score(ds, new, progress=False)
    store = build_store(ds, new, torch.device("cpu"), score).store
    hot = np.sort(np.asarray(store._hot_ids, dtype=np.int64))
    assert hot.size == plan["hot_rows"]
    want = np.lexsort((np.arange(score.size), -score))[: plan["hot_rows"]]  # ties: lower id
    np.testing.assert_array_equal(hot, np.sort(want))


def test_modeled_load_time_is_the_docstring_formula(ds):
    """Mean input rows of the first two batches x batches (rounded up) x the cold share x the
    row's bytes / the default PCIe bandwidth."""
    from gnnio.sampling import UniformSampler

    scratch = SCRATCH_BYTES_PER_NODE * (ds.num_nodes + 1)
    cfg = _cfg(device="cuda")
    _, plan = apply_layout_plan(ds, cfg, torch.device("cuda"), free_bytes=GiB + 4 * scratch + 1000)
    seeds = np.asarray(ds.train_idx, dtype=np.int64)
    b = cfg.batch_size
    assert seeds.size % b  # a last, partial batch: counted
    s = UniformSampler(ds.graph, list(cfg.fanouts), seed=cfg.seed)
    rows = [s.sample(torch.from_numpy(seeds[i * b : (i + 1) * b])).input_nodes.numel()
            for i in range(2)]  # fmt: skip
    assert rows[0] != rows[1]  # (so that one batch alone would not do)
    feats = ds.features
    row_bytes = feats.dtype.itemsize * feats.shape[1]
    cold = 1.0 - plan["gpu_cache_fraction"]
    want = (rows[0] + rows[1]) / 2 * math.ceil(seeds.size / b) * cold * row_bytes / DEFAULT_HOST_BW
    assert plan["modeled_load_s"] == pytest.approx(want, rel=1e-12)


def test_locality_ladies_is_planned_with_the_gpu_sampler(ds, monkeypatch):
    """The locality-aware LADIES has a GPU sampler (LADIES' torch path with Eq. 8): planned as
    LADIES, the CSR and its scratch on the GPU when they fit, a config train accepts."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # (--device cuda's check)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    cfg = _cfg(device="cuda", sampler="ladies", locality_scale=4.0)
    new, plan = apply_layout_plan(ds, cfg, torch.device("cuda"), free_bytes=80 * GiB)
    assert (plan["sampler_device"], plan["graph_in"]) == ("cuda", "gpu") and plan["gpu_csr_bytes"]
    new.validate()
    assert (new.sampler_device, new.graph_in) == ("cuda", "gpu")


def test_locality_scale_on_a_gpu_needs_no_layout_option(monkeypatch):
    """``--locality-scale`` without a layout option: refused on the CPU (no set B), accepted on
    a GPU (``cuda`` or ``auto`` with one present) where the plan's hot rows are B; refused again
    when a layout option turns the plan off without giving B, or with no GPU for ``auto``."""
    from gnnio.errors import UsageError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("cpu", "auto"):  # (no GPU: auto is the CPU)
        with pytest.raises(UsageError, match="needs nodes held on the GPU"):
            _cfg(device=device, locality_scale=2.0).validate()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for device in ("auto", "cuda", "cuda:0"):
        for scale in (2.0, "auto"):
            _cfg(device=device, locality_scale=scale).validate()
        _cfg(device=device, sampler="ladies", locality_scale=2.0).validate()
    layout = (dict(sampler_device="cpu"), dict(sampler_device="cuda"), dict(cache_policy="fifo"))
    for opts in layout:
        with pytest.raises(UsageError, match="needs nodes held on the GPU"):
            _cfg(device="cuda", locality_scale=2.0, **opts).validate()
    with pytest.raises(UsageError, match="needs nodes held on the GPU"):
        _cfg(device="cpu", locality_scale=2.0).validate()


@pytest.mark.parametrize("sampler", ["uniform", "ladies"])
def test_the_planned_hot_rows_are_the_locality_set(wide, monkeypatch, sampler):
    """``gnnio train --device cuda --locality-scale 2`` with no layout option: the planned config
    builds a tiered store whose hot rows -- the sampler's B -- are the plan's ``hot_rows`` (the
    hottest), the locality-aware sampler gets them, and the plan's ``locality`` says what B is:
    the planned rows, all rows (no host row to avoid) or none."""
    from gnnio.sampling import LocalityLadiesSampler, LocalitySampler
    from gnnio.train.setup import build_sampler, build_store, hot_score, member_index_bytes

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    extra = {"layer_size": 64} if sampler == "ladies" else {}
    cfg = _cfg(device="cuda", sampler=sampler, locality_scale=2.0, score="degree", **extra)
    cfg.validate()
    ds = wide
    csr = np.asarray(ds.graph.indptr).nbytes + np.asarray(ds.graph.indices).nbytes
    whole = member_index_bytes(ds, dataclasses.replace(cfg, gpu_cache_fraction=1.0))
    free = GiB + 4 * (csr + whole + SCRATCH_BYTES_PER_NODE * (ds.num_nodes + 1))
    new, plan = apply_layout_plan(ds, cfg, torch.device("cuda"), free_bytes=free)
    hot = plan["hot_rows"]
    assert 0 < hot < ds.num_nodes and plan["gpu_member_index_bytes"] > 0
    assert plan["locality"].startswith(f"B = the {hot:,} planned hot rows")
    new.validate()
    # the store on CPU tensors (no GPU here): the same hot-row choice the GPU store makes
    setup = build_store(ds, new, torch.device("cpu"), score=hot_score(ds, new, progress=False))
    want = np.sort(np.argsort(-hot_score(ds, new, progress=False), kind="stable")[:hot])
    np.testing.assert_array_equal(setup.gpu_ids, want)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (80 * GiB, 80 * GiB))
    s, _ = build_sampler(ds, dataclasses.replace(new, sampler_device="cpu"), [5, 5], setup)
    assert isinstance(s, LocalityLadiesSampler if sampler == "ladies" else LocalitySampler)
    np.testing.assert_array_equal(s.q_sets[0], want)  # (Q'_1 = B)
    _, every = apply_layout_plan(ds, cfg, torch.device("cuda"), free_bytes=80 * GiB)
    assert every["hot_rows"] == ds.num_nodes and every["locality"].startswith("every row")
    _, none = apply_layout_plan(ds, cfg, torch.device("cuda"), free_bytes=GiB + 1000)
    assert none["hot_rows"] == 0 and none["locality"].startswith("no row fits")
    _, plain = apply_layout_plan(ds, _cfg(device="cuda"), torch.device("cuda"), free_bytes=free)
    assert "locality" not in plain


def test_ladies_is_planned_with_the_gpu_sampler(ds, monkeypatch):
    """LADIES has a GPU sampler (gnnio/sampling/ladies_torch.py): planned as the uniform one,
    the CSR and its scratch on the GPU when they fit, a config train accepts."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # (--device cuda's check)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    cfg = _cfg(device="cuda", sampler="ladies")
    new, plan = apply_layout_plan(ds, cfg, torch.device("cuda"), free_bytes=80 * GiB)
    assert (plan["sampler_device"], plan["graph_in"]) == ("cuda", "gpu") and plan["gpu_csr_bytes"]
    new.validate()
    assert (new.sampler_device, new.graph_in) == ("cuda", "gpu")


@pytest.mark.parametrize("sampler", ["ladies", "labor"])
def test_modeled_load_time_counts_the_rows_of_the_training_sampler(ds, sampler):
    """The rows per batch are measured with the sampler that trains: a LADIES batch has about
    ``B + L K`` rows whatever ``--fanouts`` holds (they were a uniform batch of fanouts 1,1: far
    fewer), a LABOR-0 batch fewer than the uniform one."""
    from gnnio.sampling import LaborSampler, LadiesSampler

    cfg = _cfg(device="cuda", sampler=sampler, fanouts=(1, 1) if sampler == "ladies" else (5, 5),
               **({"layer_size": 300} if sampler == "ladies" else {}))  # fmt: skip
    _, plan = apply_layout_plan(ds, cfg, torch.device("cuda"), free_bytes=GiB + 40_000)
    assert 0 < plan["gpu_cache_fraction"] < 1  # (cold rows: the time is not 0)
    seeds = np.asarray(ds.train_idx, dtype=np.int64)
    b = cfg.batch_size
    if sampler == "ladies":
        s = LadiesSampler(ds.graph, [300, 300], seed=cfg.seed)
    else:
        s = LaborSampler(ds.graph, list(cfg.fanouts), seed=cfg.seed)
    rows = [s.sample(torch.from_numpy(seeds[i * b : (i + 1) * b])).input_nodes.numel()
            for i in range(2)]  # fmt: skip
    row_bytes = ds.features.dtype.itemsize * ds.features.shape[1]
    cold = 1.0 - plan["gpu_cache_fraction"]
    want = (rows[0] + rows[1]) / 2 * math.ceil(seeds.size / b) * cold * row_bytes / DEFAULT_HOST_BW
    assert plan["modeled_load_s"] == pytest.approx(want, rel=1e-12)


def test_the_locality_member_index_is_planned_beside_the_csr(wide, monkeypatch):
    """``--locality-scale``: the member index (setup.member_index_bytes at the planned hot
    fraction) is planned with the CSR. Where the CSR alone fits in a quarter of the budget but
    not with the index, the plan is UVA sampling (both in pinned host memory); where both fit,
    the index takes room from the hot rows."""
    from gnnio.train.setup import member_index_bytes

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    ds = wide
    csr = np.asarray(ds.graph.indptr).nbytes + np.asarray(ds.graph.indices).nbytes
    scratch = SCRATCH_BYTES_PER_NODE * (ds.num_nodes + 1)
    row = ds.features.dtype.itemsize * ds.features.shape[1]
    cfg = _cfg(device="cuda", locality_scale=2.0)
    whole = member_index_bytes(ds, dataclasses.replace(cfg, gpu_cache_fraction=1.0))
    assert whole > 1000 and row * ds.num_nodes > 4 * (csr + whole + scratch)  # (rows never fit)
    free = GiB + 4 * (csr + scratch) + 4000  # budget 4 (CSR + scratch) + 4000: a quarter, + 1000
    _, plain = apply_layout_plan(ds, _cfg(device="cuda"), torch.device("cuda"), free_bytes=free)
    assert plain["graph_in"] == "gpu" and "gpu_member_index_bytes" not in plain
    _, plan = apply_layout_plan(ds, cfg, torch.device("cuda"), free_bytes=free)
    assert (plan["graph_in"], plan["gpu_csr_bytes"], plan["gpu_member_index_bytes"]) == (
        "host", 0, 0)  # fmt: skip
    free = GiB + 4 * (csr + whole + scratch)  # the index at any hot fraction fits
    _, plain = apply_layout_plan(ds, _cfg(device="cuda"), torch.device("cuda"), free_bytes=free)
    _, plan = apply_layout_plan(ds, cfg, torch.device("cuda"), free_bytes=free)
    member, frac = plan["gpu_member_index_bytes"], plan["gpu_cache_fraction"]
    assert plan["graph_in"] == "gpu" and plan["gpu_csr_bytes"] == csr and 0 < frac < 1
    assert 0 < member <= whole
    assert plan["hot_rows"] == (plan["budget_bytes"] - csr - member - scratch) // row
    assert plan["hot_rows"] < plain["hot_rows"]


def test_the_member_index_estimate_bounds_what_the_samplers_build(ds):
    """``member_index_bytes`` (what ``--graph-in auto`` and the plan count for the member index)
    is an upper bound of the index both locality-aware samplers build, node-wise and LADIES
    (3 hops), for B the hottest nodes or random ones. It took the hot fraction of the edges, but
    B and the sets Q' are hubs: on this R-MAT graph the index was 2-3x that estimate."""
    from gnnio.features.tiers.tiered import hot_rows_for_fraction
    from gnnio.sampling import LocalityLadiesSampler, LocalitySampler
    from gnnio.train.setup import member_index_bytes
    from tests.test_ladies_locality_torch import torch_on_cpu

    n, fo = ds.num_nodes, (4, 3, 2)
    hub_first = np.argsort(-np.bincount(np.asarray(ds.graph.indices), minlength=n), kind="stable")
    for frac in (0.02, 0.1, 0.5):
        cfg = _cfg(fanouts=fo, locality_scale=2.0, gpu_cache_fraction=frac)
        bound, k, most = member_index_bytes(ds, cfg), hot_rows_for_fraction(frac, n), 0
        for hot in (hub_first[:k], np.random.default_rng(k).permutation(n)[:k]):
            las = LocalitySampler(ds.graph, fo, hot_ids=hot, scale=2.0)
            built = sum(a.nbytes for q in las._q if q is not None for a in q)
            with torch_on_cpu():
                lad = LocalityLadiesSampler(ds.graph, [8] * len(fo), hot, scale=2.0)
            on_dev = sum(x.numel() * x.element_size() for q in lad._torch._q if q for x in q)
            assert 0 < on_dev <= built <= bound, (frac, on_dev, built, bound)
            most = max(most, built)
        assert most > 0.9 * bound  # (the hubs' index: a bound that says something)


def test_several_ranks_are_never_planned(ds, monkeypatch):
    """With more than one rank the placement decides: no plan, the config as given, and
    ``plans_layout`` (which lets ``--locality-scale`` on a GPU go without a layout option) says
    so too, though one rank on the same GPU is planned."""
    from gnnio.train.gpu_plan import plans_layout

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    cfg = _cfg(device="cuda")
    same, plan = apply_layout_plan(ds, cfg, torch.device("cuda"), world_size=2, free_bytes=80 * GiB)
    assert same is cfg and plan["planned"] is False
    assert plan["reason"] == "several ranks: the placement decides"
    assert plans_layout(cfg, world_size=1) and not plans_layout(cfg, world_size=2)


def test_no_hot_row_sizes_the_member_index_at_one_row_not_all(ds):
    """Where the first plan has the CSR on the GPU but no hot row (rows wider than the budget
    left), the member index is estimated for one row of B, not for B = every row (the reading
    of a zero fraction): the whole index would push the topology off the GPU for nothing."""
    import types

    from gnnio.train.setup import member_index_bytes

    cfg = _cfg(device="cuda", locality_scale=2.0)
    n = ds.num_nodes
    csr = np.asarray(ds.graph.indptr).nbytes + np.asarray(ds.graph.indices).nbytes
    scratch = SCRATCH_BYTES_PER_NODE * (n + 1)
    one = member_index_bytes(ds, dataclasses.replace(cfg, gpu_cache_fraction=1e-12))
    whole = member_index_bytes(ds, dataclasses.replace(cfg, gpu_cache_fraction=1.0))
    assert one < whole
    budget = 4 * (csr + one + scratch)  # the CSR and a one-row index fill the quarter exactly
    feats = types.SimpleNamespace(dtype=np.dtype(np.float32), shape=(n, budget // 4 + 1), ndim=2)
    fake = types.SimpleNamespace(features=feats, graph=ds.graph, num_nodes=n,
                                 train_idx=ds.train_idx)  # fmt: skip
    _, plan = apply_layout_plan(fake, cfg, torch.device("cuda"), free_bytes=GiB + budget)
    assert (plan["graph_in"], plan["sampler_device"], plan["hot_rows"]) == ("gpu", "cuda", 0)
    assert (plan["gpu_csr_bytes"], plan["gpu_member_index_bytes"]) == (csr, one)


def test_the_member_index_counts_int64_positions_past_2_pow_31_in_neighbours():
    """A node with ``2**31`` in-neighbours or more makes the member index's positions int64 (as
    the samplers build it): 8 bytes each, not 4. (The indices are a zero-stride view: no
    memory.)"""
    import types

    from gnnio.train.setup import member_index_bytes

    e = 2**31 + 1
    graph = types.SimpleNamespace(indptr=np.array([0, e], dtype=np.int64),
                                  indices=np.broadcast_to(np.int32(0), (e,)))  # fmt: skip
    fake = types.SimpleNamespace(graph=graph)
    cfg = _cfg(locality_scale=2.0, gpu_cache_fraction=1.0)
    assert member_index_bytes(fake, cfg) == 2 * (8 * 2 + 8 * e)


def test_a_static_cache_gives_the_locality_set_its_cached_rows_only(ds):
    """With a static cache and no GPU tier, B (``gpu_ids``) is the cached rows, the
    ``capacity`` hottest ones, not every row in score order; and only SAGE's ``sum`` form takes
    ``ht_mean`` weights."""
    import types

    from gnnio.train.setup import build_store, edge_weights, hot_score

    cfg = _cfg(cache_policy="static", cache_size=0.1, score="degree")
    score = hot_score(ds, cfg, progress=False)
    setup = build_store(ds, cfg, torch.device("cpu"), score)
    cap = setup.store.capacity
    assert 0 < cap < ds.num_nodes
    want = np.lexsort((np.arange(score.size), -score))[:cap]  # ties: lower id
    np.testing.assert_array_equal(setup.gpu_ids, np.sort(want))
    ns = types.SimpleNamespace
    assert edge_weights(ns(edge_weight_norm="sum", model="sage")) == "ht_mean"
    assert edge_weights(ns(edge_weight_norm="sum", model="gin")) == "ht"
    assert edge_weights(ns(edge_weight_norm="mean", model="sage")) == "ht"


def test_the_gpu_budget_reaches_the_tiered_store(ds):
    """``gpu_budget_bytes`` bounds the GPU tier that ``build_store`` builds (the hot rows are
    clamped, with a warning), rather than being dropped on the way."""
    from gnnio.train.setup import build_store, hot_score

    cfg = _cfg(gpu_cache_fraction=0.5, score="degree", gpu_budget_bytes=20_000)
    with pytest.warns(Warning, match="hot rows clamped to"):
        setup = build_store(ds, cfg, torch.device("cpu"), hot_score(ds, cfg, progress=False))
    tiering = setup.info["tiering"]
    assert 0 < tiering["hot_rows"] < ds.num_nodes // 2 and tiering["gpu_tier_bytes"] <= 20_000


@pytest.mark.parametrize("sampler", ["uniform", "ladies"])
def test_build_sampler_refuses_a_locality_scale_when_no_row_is_on_the_gpu(sampler):
    """The library's guard under the CLI's (``TrainConfig.validate`` refuses first): with no set
    B (``setup.gpu_ids`` None: no row on the GPU) ``build_sampler`` builds no locality-aware
    sampler, it is one UsageError naming the options that put rows there."""
    from gnnio.errors import UsageError
    from gnnio.train.setup import StoreSetup, build_sampler
    from tests.helpers import random_graph

    class Ds:
        graph = random_graph(100, 600, 0)

    cfg = TrainConfig(sampler=sampler, layer_size=7, locality_scale=2.0)
    setup = StoreSetup(store=None, tiers=None, gpu_ids=None, info={}, eval_store=None)
    with pytest.raises(UsageError, match="holds no rows on the GPU .*--gpu-cache-fraction"):
        build_sampler(Ds, cfg, [4, 3], setup)
    setup.gpu_ids = np.arange(10)
    assert build_sampler(Ds, cfg, [4, 3], setup)[0].scale == 2.0
