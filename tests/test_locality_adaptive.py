"""Algorithm 2 (AdaptiveScale), the modeled loading share, and ``gnnio bench locality``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gnnio.placement.topology import DEFAULT_HOST_BW, GB, Topology
from gnnio.sampling import AdaptiveScale, modeled_loading_share, modeled_loading_time
from gnnio.sampling.adaptive import DEFAULT_GPU_BW

from .helpers import write_tiny_dataset


def run_script(shares, **kw) -> tuple[list[float], list[int], AdaptiveScale]:
    a = AdaptiveScale(**kw)
    out = [a.update(r) for r in shares]
    return out, [h["line"] for h in a.history], a


def test_algorithm2_doubles_then_fixes_at_maxs():
    # r > ut three times: 1 -> 2 -> 4 -> 8; then s >= MAXS fixes it (line 2) whatever r is
    s, lines, a = run_script([0.5, 0.5, 0.5, 0.5, 0.9, 0.01])
    assert s == [2, 4, 8, 8, 8, 8]
    assert lines == [3, 3, 3, 2, 0, 0]
    assert a.fixed and a.pre == 4


def test_algorithm2_fixes_inside_the_band_and_at_s_one():
    s, lines, a = run_script([0.3, 0.17, 0.5])  # lt <= r <= ut: line 5 fixes s = 2
    assert s == [2, 2, 2] and lines == [3, 5, 0] and a.fixed
    s, lines, a = run_script([0.05, 0.9])  # r < lt but s == 1: line 5 as well
    assert s == [1, 1] and lines == [5, 0]


def test_algorithm2_averages_with_pre_and_can_overshoot_maxs():
    # 1 -> 2 -> 4 (pre 2); r < lt: s = (4 + 2) / 2 = 3; r < lt again: (3 + 2) / 2 = 2.5;
    # r > ut: pre = 2.5, s = 5; r > ut: pre = 5, s = 10 (> MAXS, as printed); line 2 fixes it
    shares = [0.5, 0.5, 0.1, 0.1, 0.3, 0.3, 0.3]
    s, lines, a = run_script(shares)
    assert s == [2, 4, 3, 2.5, 5, 10, 10]
    assert lines == [3, 3, 4, 4, 3, 3, 2]
    # clamp=True (documented deviation) caps line 3 at MAXS
    s, _, _ = run_script(shares, clamp=True)
    assert s == [2, 4, 3, 2.5, 5, 8, 8]


def test_algorithm2_custom_thresholds_and_start():
    s, lines, _ = run_script([0.05, 0.05, 0.4], lt=0.1, ut=0.3, maxs=16, s0=4)
    assert s == [2.5, 1.75, 3.5] and lines == [4, 4, 3]  # pre starts at 1 (module docstring)
    with pytest.raises(ValueError, match="lt <= ut"):
        AdaptiveScale(lt=0.3, ut=0.2)
    with pytest.raises(ValueError, match="loading_share"):
        AdaptiveScale().update(float("nan"))


def test_modeled_loading_share():
    t = modeled_loading_time(12 * GB, gpu_bytes=900 * GB, peer_bytes=0)
    assert t == pytest.approx(1.0 + 1.0)
    assert DEFAULT_GPU_BW == 900 * GB
    share = modeled_loading_share(DEFAULT_HOST_BW * 0.5, 0, compute_s=1.5)
    assert share == pytest.approx(0.25)
    topo = Topology(name="t", groups=((0,),), host_bw=24 * GB)
    assert modeled_loading_share(24 * GB, 0, 1.0, topology=topo) == pytest.approx(0.5)
    assert modeled_loading_share(0, 0, 0) == 0.0
    with pytest.raises(ValueError, match="compute_s"):
        modeled_loading_share(1, 1, -1)
    with pytest.raises(ValueError, match="host_bw"):
        modeled_loading_share(1, 1, 1, host_bw=0)
    # fewer host bytes (a larger LAS scale) -> a smaller share -> Algorithm 2 stops doubling
    a = AdaptiveScale()
    for host in (6e9, 4e9, 2.3e9):
        a.update(modeled_loading_share(host, 1e9, compute_s=1.0))
    assert [h["line"] for h in a.history] == [3, 3, 5] and a.s == 4


def test_bench_locality_cli(tmp_path, capsys):
    from gnnio.cli.main import main

    d = write_tiny_dataset(tmp_path / "tiny", num_nodes=400, num_edges=4000, feat_dim=8)
    argv = ["bench", "locality", str(d), "--scales", "1,2,4,8", "--gpu-cache-fraction", "0.1"]
    rc = main([*argv, "--fanouts", "5,3", "--batch-size", "8", "--json", "--no-progress"])
    assert rc == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1  # --json: the JSON object only, no table before it
    out = json.loads(lines[0])
    assert set(out["host_bytes"]) == {"1", "2", "4", "8"}
    assert out["hot_rows"] == 40 and out["row_bytes"] == 32
    for k in ("gpu_bytes", "host_share", "edges_per_batch", "modeled_host_s"):
        assert set(out[k]) == {"1", "2", "4", "8"}
    h = [out["host_bytes"][k] for k in ("1", "2", "4", "8")]
    assert h[-1] < h[0]  # locality moves reads to B
    assert out["batches"] == out["batches_per_epoch"]
    rc = main([*argv, "--batches", "2", "--batch-size", "8", "--prune", "1,1", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["batches"] == 2 and out["prune"] == [1.0, 1.0] and all(out["thresholds"])
    assert main([*argv, "--batches", "1", "--batch-size", "8", "--no-progress"]) == 0
    assert capsys.readouterr().out.split()[:3] == ["s", "host", "MB"]  # the table without --json
    rc = main([*argv[:3], "--scales", "1,0"])
    assert rc == 2 and "--scales" in capsys.readouterr().err
    rc = main([*argv, "--score", "nope"])
    assert rc == 2 and "--score" in capsys.readouterr().err
    assert np.isfinite(out["setup_s"])


def test_check_scale_takes_exactly_its_range():
    """``check_scale`` takes ``[1e-200, 1e200]`` with both ends, and refuses the next values past
    them, 0 and non-finite ones (Eq. 8's sums overflow or vanish out there)."""
    from gnnio.sampling.adaptive import MAX_SCALE, check_scale

    assert check_scale(MAX_SCALE) == 1e200 and check_scale(1.0 / MAX_SCALE) == 1e-200
    assert check_scale("2") == 2.0
    for bad in (1.01e200, 0.99e-200, 0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=r"scale: must be a number in \[1e-200, 1e200\]"):
            check_scale(bad)


def test_algorithm2_thresholds_are_strict():
    """Line 3 needs ``r > ut`` and line 4 ``r < lt``: a share exactly at a threshold is inside
    the band, so line 5 fixes ``s``."""
    s, lines, a = run_script([0.2])  # r == ut
    assert s == [1] and lines == [5] and a.fixed
    s, lines, a = run_script([0.5, 0.15])  # s = 2, then r == lt
    assert s == [2, 2] and lines == [3, 5] and a.fixed


@pytest.mark.parametrize(
    "kw, words",
    [({"lt": float("nan")}, "lt must be finite"), ({"maxs": float("inf")}, "maxs must be finite"),
     ({"lt": -0.1}, "need 0 <= lt <= ut"), ({"maxs": 0}, "s0 and maxs must be > 0"),
     ({"s0": -1}, "s0 and maxs must be > 0")],
)  # fmt: skip
def test_algorithm2_refuses_parameters_it_cannot_run(kw, words):
    with pytest.raises(ValueError, match=words):
        AdaptiveScale(**kw)
    with pytest.raises(ValueError, match="loading_share"):
        AdaptiveScale().update(float("inf"))


def test_modeled_loading_time_takes_the_topologys_bandwidths_and_refuses_bad_ones():
    """``topology`` supplies both link bandwidths; a negative byte count or a bandwidth that is
    not a finite positive number is one ValueError naming it."""
    topo = Topology(name="t", groups=((0, 1),), host_bw=10 * GB, peer_bw=100 * GB)
    t = modeled_loading_time(10 * GB, peer_bytes=100 * GB, topology=topo)
    assert t == pytest.approx(2.0)
    with pytest.raises(ValueError, match="host_bytes: must be a finite number >= 0"):
        modeled_loading_time(-1.0)
    with pytest.raises(ValueError, match="peer_bytes: must be a finite number >= 0"):
        modeled_loading_time(0, peer_bytes=float("nan"))
    with pytest.raises(ValueError, match="gpu_bw: must be a finite number > 0"):
        modeled_loading_time(1, gpu_bw=float("inf"))
