"""Uniform neighbour sampler: invariants, uniformity, determinism, torch path, reference, bench."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from gnnio.bench._timing import median, time_passes
from gnnio.graph.csr import CSRGraph
from gnnio.sampling import MiniBatch, UniformSampler, parse_fanouts
from gnnio.sampling.gpu import TorchUniformSampler, sample_hop_torch
from gnnio.sampling.reference import sample_reference
from gnnio.sampling.uniform import call_key

from .helpers import random_graph, shared_neighbourhood_graph, subset_counts, write_tiny_dataset

# ---- helpers -------------------------------------------------------------------------------------


def check_batch(mb: MiniBatch, graph: CSRGraph, seeds, fanouts) -> None:
    """Every invariant of the id spaces and of sampling without replacement."""
    indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
    seeds = np.asarray(seeds, dtype=np.int64)
    b, n_hops = len(seeds), len(fanouts)
    inp = mb.input_nodes.cpu().numpy()
    assert mb.seeds.dtype == torch.int64 and mb.input_nodes.dtype == torch.int64
    assert np.array_equal(mb.seeds.cpu().numpy(), seeds)
    assert np.array_equal(inp[:b], seeds), "input_nodes must start with the seeds"
    assert len(np.unique(inp)) == len(inp), "input_nodes must be distinct"
    assert ((inp >= 0) & (inp < graph.num_nodes)).all()
    hop_nodes = mb.meta["hop_nodes"]
    assert hop_nodes[0] == b and hop_nodes[-1] == len(inp) and len(hop_nodes) == n_hops + 1
    assert len(mb.blocks) == n_hops
    assert mb.blocks[-1].num_dst == b
    for j in range(n_hops - 1):
        assert mb.blocks[j].num_dst == mb.blocks[j + 1].num_src
    deg = np.diff(indptr)
    for h, fanout in enumerate(fanouts):
        blk = mb.blocks[n_hops - 1 - h]  # hop h + 1 is block L - 1 - h
        assert (blk.num_dst, blk.num_src) == (hop_nodes[h], hop_nodes[h + 1])
        ei = blk.edge_index.cpu()
        assert ei.dtype == torch.int64 and ei.dim() == 2 and ei.shape[0] == 2
        src, dst = ei[0].numpy(), ei[1].numpy()
        assert ((src >= 0) & (src < blk.num_src)).all() and ((dst >= 0) & (dst < blk.num_dst)).all()
        assert (np.diff(dst) >= 0).all(), "edges grouped by destination in local-id order"
        # count per destination = min(deg, fanout)
        d = deg[inp[: blk.num_dst]]
        want = d if fanout < 0 else np.minimum(d, fanout)
        assert np.array_equal(np.bincount(dst, minlength=blk.num_dst), want)
        # every sampled edge exists, no repeats
        gs, gd = inp[src], inp[dst]
        for u, v in zip(gs.tolist(), gd.tolist()):
            assert u in set(indices[indptr[v] : indptr[v + 1]].tolist()), f"edge {u}->{v} absent"
        assert len(set(zip(gs.tolist(), gd.tolist()))) == len(gs), "repeated edge"
        # new nodes of this hop = input_nodes[n_h:n_{h+1}], in first-appearance order
        nxt = hop_nodes[h]
        for s in src.tolist():
            if s >= nxt:
                assert s == nxt, "new nodes must be numbered in order of first appearance"
                nxt += 1
        assert nxt == hop_nodes[h + 1]


def picks_of(mb: MiniBatch, deg: int, fanout: int) -> np.ndarray:
    """``[B, fanout]`` neighbour ids (global 0..deg-1) picked per seed in a 1-hop batch."""
    blk = mb.blocks[-1]
    g = mb.input_nodes[blk.edge_index[0]].cpu().numpy()
    return g.reshape(-1, fanout)


def cpu_picks(rows: int, deg: int, fanout: int, seed: int = 0) -> np.ndarray:
    g = shared_neighbourhood_graph(rows, deg)
    s = UniformSampler(g, [fanout], seed=seed)
    return picks_of(s.sample(torch.arange(deg, deg + rows)), deg, fanout)


def torch_picks(rows: int, deg: int, fanout: int, seed: int = 0) -> np.ndarray:
    g = shared_neighbourhood_graph(rows, deg)
    ip, ix = g.to_torch()
    s = TorchUniformSampler(ip, ix, [fanout])
    return picks_of(s.sample(torch.arange(deg, deg + rows), key=seed), deg, fanout)


def biased_floyd_picks(rows: int, deg: int, fanout: int, seed: int = 0) -> np.ndarray:
    """A plausible bug: Floyd's algorithm drawing from [0, j) instead of [0, j]."""
    rng = np.random.default_rng(seed)
    out = np.empty((rows, fanout), dtype=np.int64)
    for r in range(rows):
        chosen: list[int] = []
        for j in range(deg - fanout, deg):
            t = int(rng.integers(0, j)) if j > 0 else 0
            chosen.append(j if t in chosen else t)
        out[r] = chosen
    return out


# ---- invariants ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fanouts", [[3, 2], [15, 10, 5], [-1, 2], [0, 4], [2, -1, 0]])
def test_invariants_random_graph(fanouts):
    g = random_graph(300, 2500, seed=1)
    seeds = np.random.default_rng(2).permutation(300)[:17]
    mb = UniformSampler(g, fanouts, seed=3).sample(torch.from_numpy(seeds))
    check_batch(mb, g, seeds, fanouts)
    assert mb.labels is None and mb.x is None


def test_invariants_parallel_split_large_hop():
    # >= 2048 destination rows so the rows are split over threads
    g = random_graph(6000, 60000, seed=4)
    seeds = np.random.default_rng(5).permutation(6000)[:2500]
    s = UniformSampler(g, [4, 3], seed=0, num_threads=3)
    mb = s.sample(seeds)
    check_batch(mb, g, seeds, [4, 3])
    s.close()


def test_fanout_zero_and_isolated_seeds():
    g = CSRGraph.from_edges(np.array([0, 1]), np.array([2, 2]), 5)  # nodes 3, 4: no neighbours
    mb = UniformSampler(g, [0, 5]).sample(torch.tensor([2, 3, 4]))
    check_batch(mb, g, [2, 3, 4], [0, 5])
    assert mb.blocks[-1].num_edges == 0 and mb.blocks[-1].num_src == 3
    mb = UniformSampler(g, [5]).sample(torch.tensor([4, 3]))
    assert mb.num_sampled_edges == 0 and mb.input_nodes.tolist() == [4, 3]


def test_empty_seeds():
    g = random_graph(20, 60, seed=0)
    mb = UniformSampler(g, [3, 2]).sample(torch.empty(0, dtype=torch.int64))
    assert mb.input_nodes.numel() == 0 and all(b.num_edges == 0 for b in mb.blocks)
    assert [tuple(b.edge_index.shape) for b in mb.blocks] == [(2, 0), (2, 0)]


def test_large_fanout_hashed_path():
    g = shared_neighbourhood_graph(40, 200)  # k = 50 > 32 uses the hash-set variant
    seeds = np.arange(200, 240)
    mb = UniformSampler(g, [50]).sample(seeds)
    check_batch(mb, g, seeds, [50])


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(
    n=st.integers(1, 30),
    m=st.integers(0, 120),
    gseed=st.integers(0, 2**16),
    fanouts=st.lists(st.integers(-1, 5), min_size=1, max_size=3),
    nseeds=st.integers(0, 30),
    sseed=st.integers(0, 2**16),
)
def test_hypothesis_invariants_all_paths(n, m, gseed, fanouts, nseeds, sseed):
    g = random_graph(n, m, gseed)
    seeds = np.random.default_rng(sseed).permutation(n)[: min(nseeds, n)]
    check_batch(UniformSampler(g, fanouts, seed=sseed).sample(seeds), g, seeds, fanouts)
    ip, ix = g.to_torch()
    tmb = TorchUniformSampler(ip, ix, fanouts).sample(torch.from_numpy(seeds), key=sseed)
    check_batch(tmb, g, seeds, fanouts)
    rmb = sample_reference(g.indptr, g.indices, seeds, fanouts, np.random.default_rng(sseed))
    check_batch(rmb, g, seeds, fanouts)


# ---- uniformity ----------------------------------------------------------------------------------

P_MIN = 1e-4  # fixed seeds make these deterministic; a correct sampler passes with margin


def test_chisquare_marginal_and_subsets_cpu():
    # deg 10, fanout 3: 12000 independent rows (one per destination) in a single call
    picks = cpu_picks(12000, 10, 3, seed=7)
    assert (np.sort(picks, axis=1)[:, 1:] != np.sort(picks, axis=1)[:, :-1]).all()
    marg = np.bincount(picks.ravel(), minlength=10)
    assert chisquare(marg).pvalue > P_MIN
    assert chisquare(subset_counts(picks, 10)).pvalue > P_MIN  # all 120 3-subsets equally likely


def test_chisquare_across_calls_cpu():
    # the same seed node sampled in 3000 calls (counter-based keys, then epoch_seed keys)
    g = shared_neighbourhood_graph(1, 10)
    s = UniformSampler(g, [3], seed=11)
    a = np.stack([picks_of(s.sample(torch.tensor([10])), 10, 3)[0] for _ in range(1500)])
    b = np.stack(
        [picks_of(s.sample(torch.tensor([10]), epoch_seed=e), 10, 3)[0] for e in range(1500)]
    )
    marg = np.bincount(np.concatenate([a, b]).ravel(), minlength=10)
    assert chisquare(marg).pvalue > P_MIN


def test_chisquare_would_catch_a_biased_sampler():
    picks = biased_floyd_picks(12000, 10, 3, seed=7)
    p_marg = chisquare(np.bincount(picks.ravel(), minlength=10)).pvalue
    p_sub = chisquare(subset_counts(picks, 10)).pvalue
    assert min(p_marg, p_sub) < 1e-9


def test_chisquare_hashed_path():
    picks = cpu_picks(400, 200, 50, seed=3)  # 20000 picks over 200 neighbours
    assert chisquare(np.bincount(picks.ravel(), minlength=200)).pvalue > P_MIN


@pytest.mark.parametrize("deg", [10, 20])  # Floyd on short and long rows
def test_chisquare_torch_paths(deg):
    fanout = 3 if deg == 10 else 4
    picks = torch_picks(12000, deg, fanout, seed=5)
    assert (np.sort(picks, axis=1)[:, 1:] != np.sort(picks, axis=1)[:, :-1]).all()
    assert chisquare(np.bincount(picks.ravel(), minlength=deg)).pvalue > P_MIN
    if deg == 10:
        assert chisquare(subset_counts(picks, deg)).pvalue > P_MIN


def test_kernel_and_reference_agree_on_distribution():
    g = random_graph(400, 3000, seed=9)
    seeds = np.random.default_rng(1).permutation(400)[:20]
    fanouts = [3, 2]
    rng = np.random.default_rng(0)
    s = UniformSampler(g, fanouts, seed=0)
    ts = TorchUniformSampler(*g.to_torch(), fanouts)
    stats: dict[str, list] = {"cpu": [], "torch": [], "ref": []}
    incl: dict[str, np.ndarray] = {k: np.zeros(400) for k in stats}
    for t in range(300):
        for name, mb in (
            ("cpu", s.sample(seeds, epoch_seed=t)),
            ("torch", ts.sample(torch.from_numpy(seeds), key=t)),
            ("ref", sample_reference(g.indptr, g.indices, seeds, fanouts, rng)),
        ):
            stats[name].append((len(mb.input_nodes), mb.num_sampled_edges))
            hop1 = mb.input_nodes[mb.blocks[-1].edge_index[0]].numpy()
            incl[name][hop1] += 1
    means = {k: np.mean(v, axis=0) for k, v in stats.items()}
    sds = {k: np.std(v, axis=0) for k, v in stats.items()}
    for k in ("cpu", "torch"):
        # 300 draws: the means' standard error is sd / sqrt(300); allow 5 of them
        tol = 5 * np.sqrt((sds[k] ** 2 + sds["ref"] ** 2) / 300) + 1e-9
        assert (np.abs(means[k] - means["ref"]) <= tol).all(), (k, means)
        # how often each node is a hop-1 neighbour: same expectation (k/d per seed)
        assert np.abs(incl[k] - incl["ref"]).max() <= 5 * np.sqrt(incl["ref"].max() + 1) + 5


# ---- determinism ---------------------------------------------------------------------------------


def batches_equal(a: MiniBatch, b: MiniBatch) -> bool:
    return torch.equal(a.input_nodes, b.input_nodes) and all(
        torch.equal(x.edge_index, y.edge_index) for x, y in zip(a.blocks, b.blocks)
    )


def test_determinism_counter_and_epoch_seed():
    g = random_graph(500, 6000, seed=2)
    seeds = torch.arange(0, 500, 7)
    a, b = UniformSampler(g, [5, 3], seed=1), UniformSampler(g, [5, 3], seed=1)
    first_a, first_b = a.sample(seeds), b.sample(seeds)
    assert batches_equal(first_a, first_b)
    assert not batches_equal(first_a, a.sample(seeds)), "the counter must advance"
    assert not batches_equal(first_a, UniformSampler(g, [5, 3], seed=2).sample(seeds))
    # epoch_seed: independent of earlier calls
    e1 = a.sample(seeds, epoch_seed=42)
    e2 = UniformSampler(g, [5, 3], seed=1).sample(seeds, epoch_seed=42)
    assert batches_equal(e1, e2)
    assert not batches_equal(e1, a.sample(seeds, epoch_seed=43))
    a.set_seed(1)
    assert batches_equal(first_a, a.sample(seeds))


def test_results_do_not_depend_on_threads():
    g = random_graph(8000, 80000, seed=6)
    seeds = np.random.default_rng(0).permutation(8000)[:3000]
    outs = []
    for t in (1, 2, 3):
        s = UniformSampler(g, [4, 2], seed=5, num_threads=t)
        outs.append(s.sample(seeds, epoch_seed=9))
        s.close()
    assert batches_equal(outs[0], outs[1]) and batches_equal(outs[0], outs[2])


def test_concurrent_calls_match_sequential():
    g = random_graph(3000, 30000, seed=8)
    s = UniformSampler(g, [5, 5], seed=0, num_threads=2)
    seed_sets = [np.random.default_rng(i).permutation(3000)[:2500] for i in range(6)]
    want = [s.sample(x, epoch_seed=i) for i, x in enumerate(seed_sets)]
    got: dict[int, MiniBatch] = {}

    def work(i):
        got[i] = s.sample(seed_sets[i], epoch_seed=i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(batches_equal(want[i], got[i]) for i in range(6))
    s.close()


def test_call_key_domains_differ():
    assert call_key(0, counter=5) != call_key(0, epoch_seed=5)
    assert call_key(0, epoch_seed=5) != call_key(1, epoch_seed=5)


# ---- errors and inputs ---------------------------------------------------------------------------


def test_bad_inputs_raise_one_line_errors():
    g = random_graph(10, 30, seed=0)
    s = UniformSampler(g, [2])
    with pytest.raises(ValueError, match="appears more than once"):
        s.sample(torch.tensor([1, 2, 1]))
    s.sample(torch.tensor([1, 2]))  # the scratch map was restored after the error
    with pytest.raises(ValueError, match="out of range"):
        s.sample(torch.tensor([10]))
    with pytest.raises(ValueError, match="out of range"):
        s.sample(torch.tensor([-1]))
    with pytest.raises(ValueError, match="1-D"):
        s.sample(torch.zeros(2, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="integer"):
        s.sample(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="fanouts"):
        UniformSampler(g, [])
    with pytest.raises(ValueError, match="fanouts"):
        UniformSampler(g, [3, -2])
    with pytest.raises(ValueError, match="num_threads"):
        UniformSampler(g, [3], num_threads=0)
    ts = TorchUniformSampler(*g.to_torch(), [2])
    with pytest.raises(ValueError, match="appears more than once"):
        ts.sample(torch.tensor([3, 3]), key=0)
    ts.sample(torch.tensor([3]), key=0)


def test_parse_fanouts():
    assert parse_fanouts("15,10,5") == [15, 10, 5]
    assert parse_fanouts("-1, 3") == [-1, 3]
    with pytest.raises(ValueError, match="fanouts"):
        parse_fanouts("15,a")
    with pytest.raises(ValueError, match="fanouts"):
        parse_fanouts("")


def test_memmapped_dataset_and_numpy_seeds(tmp_path):
    import gnnio

    ds = gnnio.load(write_tiny_dataset(tmp_path / "tiny", num_nodes=40, num_edges=200))
    seeds = ds.train_idx[:5]  # a read-only-ish memmap slice
    mb = UniformSampler(ds.graph, [3, 3]).sample(seeds)
    check_batch(mb, ds.graph, np.asarray(seeds), [3, 3])


def test_torch_hop_on_its_own():
    g = random_graph(50, 400, seed=3)
    ip, ix = g.to_torch()
    dst_nodes = torch.arange(50)
    src, dst, _redo = sample_hop_torch(ip, ix, dst_nodes, 2, hop_key=0)
    deg = np.diff(g.indptr)
    assert np.array_equal(np.bincount(dst.numpy(), minlength=50), np.minimum(deg, 2))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_sampler_invariants_and_uniformity():
    g = random_graph(2000, 20000, seed=1)
    seeds = np.random.default_rng(0).permutation(2000)[:300]
    s = UniformSampler(g, [5, 3], seed=0, device="cuda")
    assert s.device.type == "cuda"
    mb = s.sample(torch.from_numpy(seeds).cuda())
    assert mb.input_nodes.is_cuda and mb.blocks[0].edge_index.is_cuda
    check_batch(mb, g, seeds, [5, 3])
    assert batches_equal(
        s.sample(seeds, epoch_seed=1).to("cpu"), s.sample(seeds, epoch_seed=1).to("cpu")
    )
    gs = shared_neighbourhood_graph(12000, 10)
    sg = UniformSampler(gs, [3], device="cuda")
    picks = picks_of(sg.sample(torch.arange(10, 12010)).to("cpu"), 10, 3)
    assert chisquare(subset_counts(picks, 10)).pvalue > P_MIN


# ---- timing helpers and the bench ----------------------------------------------------------------


def test_time_passes_and_median():
    calls = []
    times = time_passes(lambda: calls.append(1), warmup=2, passes=3)
    assert len(times) == 3 and len(calls) == 5 and all(t >= 0 for t in times)
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([1.0, 2.0]) == 1.5
    with pytest.raises(ValueError):
        time_passes(lambda: None, passes=0)
    with pytest.raises(ValueError):
        median([])


def test_bench_sampling_cli(tmp_path, capsys):
    from gnnio.cli.main import main

    d = write_tiny_dataset(tmp_path / "tiny", num_nodes=60, num_edges=400)
    argv = ["bench", "sampling", str(d), "--fanouts", "3,2", "--batch-size", "4"]
    rc = main(
        [*argv, "--batches", "3", "--passes", "2", "--threads", "1", "--json", "--no-progress"]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("ms_per_batch", "seeds_per_s", "edges_per_s", "edges_per_batch", "threads"):
        assert key in out
    assert out["fanouts"] == [3, 2] and out["batches"] == 3 and len(out["pass_s"]) == 2
    assert out["edges_per_batch"] > 0
    rc = main([*argv, "--batches", "0"])
    assert rc == 2 and "--batches must be >= 1" in capsys.readouterr().err
    rc = main(["bench", "sampling", str(d), "--fanouts", "3,x"])
    assert rc == 2 and "fanouts" in capsys.readouterr().err
