"""Topology descriptions: group shorthand, presets, TOML/JSON files, units, errors."""

from __future__ import annotations

import json

import pytest

from gnnio.errors import UsageError
from gnnio.placement.topology import (
    PRESETS,
    Topology,
    load_topology,
    parse_bandwidth,
    parse_bytes,
    parse_groups,
)


@pytest.mark.parametrize(
    "spec, groups",
    [
        ("2", ((0, 1),)),
        ("4", ((0, 1, 2, 3),)),
        ("8", (tuple(range(8)),)),
        ("2+2", ((0, 1), (2, 3))),
        ("2*4", ((0, 1), (2, 3), (4, 5), (6, 7))),
        ("1+1", ((0,), (1,))),
        ("1*3", ((0,), (1,), (2,))),
        ("4+2*2", ((0, 1, 2, 3), (4, 5), (6, 7))),
    ],
)
def test_parse_groups(spec, groups):
    assert parse_groups(spec) == groups
    t = load_topology(spec)
    assert t.groups == groups
    assert t.num_gpus == sum(len(g) for g in groups)
    # the shorthand written back parses to the same groups
    assert parse_groups(t.shorthand) == groups


@pytest.mark.parametrize("bad", ["", "2+", "x", "0", "2*0", "2 2", "-1"])
def test_bad_group_specs(bad):
    with pytest.raises(UsageError):
        parse_groups(bad)


def test_shorthand_names_like_the_paper():
    assert load_topology("2+2").shorthand == "2+2"
    assert load_topology("2*4").shorthand == "2*4"
    assert load_topology("4").shorthand == "4"


def test_peers_and_costs():
    t = load_topology("2+2", host_bw="10GB/s", peer_bw="100GB/s")
    assert t.peers(0) == (1,) and t.peers(3) == (2,)
    assert t.group_of(2) == (2, 3)
    assert t.c_host(1000) == pytest.approx(1e-7)
    assert t.c_peer(1000) == pytest.approx(1e-8)
    assert t.alpha == pytest.approx(0.1)
    assert t.peers_cheaper
    assert not load_topology("pcie-2gpu").peers(0)
    with pytest.raises(IndexError):
        t.peers(4)


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_load(name):
    t = load_topology(name)
    assert t.name == name and t.num_gpus >= 1
    assert t.host_bw > 0 and t.peer_bw > 0 and t.note
    assert name in t.describe()
    d = t.to_dict()
    assert d["num_gpus"] == t.num_gpus and d["groups"] == [list(g) for g in t.groups]


def test_units():
    assert parse_bytes("16GiB") == 16 * 2**30
    assert parse_bytes("8 GB") == 8_000_000_000
    assert parse_bytes(1.5e9) == 1_500_000_000
    assert parse_bandwidth("12 GB/s") == 12e9
    assert parse_bandwidth("100Gb/s") == pytest.approx(12.5e9)  # bits
    assert parse_bandwidth(3e9) == 3e9
    for bad in ("fast", "12 parsecs", -1, True):
        with pytest.raises(UsageError):
            parse_bandwidth(bad)
    with pytest.raises(UsageError):
        parse_bytes("-3GB")


def test_toml_file(tmp_path):
    f = tmp_path / "server.toml"
    f.write_text(
        'groups = "2+2"\n'
        "num_gpus = 4\n"
        'feature_budget_bytes = "2 GiB"\n'
        "[bandwidth]\n"
        'host_to_gpu = "16 GB/s"\n'
        "gpu_to_gpu = 50e9\n"
        'network = "100 Gb/s"\n'
    )
    t = load_topology(f)
    assert t.name == "server" and t.groups == ((0, 1), (2, 3))
    assert (t.host_bw, t.peer_bw, t.network_bw) == (16e9, 50e9, 12.5e9)
    assert t.feature_budget_bytes == 2 * 2**30
    assert t.buffer_rows(1024) == 2 * 2**20


def test_json_file_with_preset_and_explicit_groups(tmp_path):
    f = tmp_path / "m.json"
    f.write_text(json.dumps({"preset": "dgx-a100-8", "host_bw": "20GB/s", "name": "mine"}))
    t = load_topology(f)
    assert t.name == "mine" and t.num_gpus == 8 and t.host_bw == 20e9
    assert t.peer_bw == PRESETS["dgx-a100-8"]["peer_bw"]
    g = tmp_path / "g.json"
    g.write_text(json.dumps({"groups": [[0, 2], [1, 3]]}))
    assert load_topology(g).peers(0) == (2,)


@pytest.mark.parametrize(
    "content, match",
    [
        ({"groups": "2", "num_gpus": 3}, "num_gpus"),
        ({"groups": "2", "colour": "green"}, "unknown key"),
        ({"preset": "nope"}, "unknown preset"),
        ({"host_bw": 1e9}, "needs 'groups'"),
        ({"groups": [[0, 1], [1, 2]]}, "exactly once"),
        ({"groups": "2", "peer_bw": "0 GB/s"}, "peer_bw"),
    ],
)
def test_bad_files(tmp_path, content, match):
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(content))
    with pytest.raises(UsageError, match=match):
        load_topology(f)


def test_file_errors_are_one_line(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        load_topology(tmp_path / "missing.toml")
    f = tmp_path / "broken.toml"
    f.write_text("groups = [\n")
    with pytest.raises(UsageError, match="cannot parse") as e:
        load_topology(f)
    assert "\n" not in str(e.value)
    with pytest.raises(UsageError, match="not a preset"):
        load_topology("warp-drive")


def test_topology_validates_groups():
    with pytest.raises(UsageError):
        Topology("t", groups=((0, 2),))
    with pytest.raises(UsageError):
        Topology("t", groups=())


def test_plan_without_buffer_works_with_presets_and_shorthands(tmp_path, capsys):
    """``gnnio plan DIR --topology PRESET`` failed ("--buffer: give the per-GPU buffer ..."): no
    preset sets feature_budget_bytes, which its help gave as the default. Now the default is
    gnnio train --nproc's --buffer (0.1 N); a topology file's budget still wins."""
    from gnnio.cli.main import main
    from gnnio.placement.planner import buffer_rows_from
    from gnnio.train.config_dist import DEFAULT_BUFFER
    from gnnio.utils.counts import top_count

    from .helpers import write_tiny_dataset

    assert DEFAULT_BUFFER == 0.1
    ds = write_tiny_dataset(tmp_path / "ds", num_nodes=60, num_edges=300)
    want = top_count(DEFAULT_BUFFER, 60)
    for spec in ("dgx-a100-8", "pcie-2gpu", "2"):
        args = ["plan", str(ds), "--topology", spec, "--strategies", "alg1,rule1"]
        assert main([*args, "--fanouts", "4,3", "--batch-size", "16", "--json", "--quiet"]) == 0
        assert json.loads(capsys.readouterr().out.splitlines()[-1])["buffer_rows"] == want, spec
    assert all(buffer_rows_from(None, 60, 16, load_topology(p)) == want for p in PRESETS)
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"groups": "2", "feature_budget_bytes": 16 * 30}))
    assert buffer_rows_from(None, 60, 16, load_topology(f)) == 30
    assert buffer_rows_from(0.2, 60, 16, load_topology(f)) == 12  # (a given --buffer wins)
    f.write_text(json.dumps({"groups": "2", "feature_budget_bytes": 16 * 1000}))
    assert buffer_rows_from(None, 60, 16, load_topology(f)) == 60  # (at most every row)
    assert buffer_rows_from(0.2, 60, 16, load_topology("2")) == 12


# -- rules a mutation pass over topology.py found untested (2026-11-29) --


@pytest.mark.parametrize(
    "content, match",
    [
        ({"groups": [[0, 1], []]}, "non-empty GPU group"),  # an empty group, devices all covered
        ({"groups": "2", "gpu_memory_bytes": 0}, None),  # 0 bytes is a size (accepted)
        ({"groups": "2", "gpu_memory_bytes": -1}, "gpu_memory_bytes"),
        ({"groups": "2", "bandwidth": {"host_to_gpu": "1GB/s", "pcie": 3}}, "unknown bandwidth"),
        ({"groups": "1", "num_gpus": True}, "num_gpus must be an integer"),  # True == 1
        ({"groups": "2", "num_gpus": 2.0}, "num_gpus must be an integer"),
        ({"groups": [["a", "b"]]}, "must hold integer device ids"),
        ({"groups": "2", "feature_budget_bytes": True}, "expected a byte count"),
        ({"groups": "2", "gpu_memory_bytes": "2e18"}, "not a byte count"),
    ],
)
def test_file_fields_at_their_edges(tmp_path, content, match):
    f = tmp_path / "t.json"
    f.write_text(json.dumps(content))
    if match is None:
        assert load_topology(f).gpu_memory_bytes == 0
        return
    with pytest.raises(UsageError, match=match) as e:
        load_topology(f)
    assert "\n" not in str(e.value)


def test_a_file_holding_a_list_is_one_line(tmp_path):
    f = tmp_path / "t.json"
    f.write_text("[1, 2]")
    with pytest.raises(UsageError, match="table/object at the top level"):
        load_topology(f)


def test_file_suffix_in_capitals_and_a_null_gpu_memory(tmp_path):
    f = tmp_path / "T.JSON"
    f.write_text(json.dumps({"groups": "2+2", "gpu_memory_bytes": None}))
    t = load_topology(f)
    assert t.name == "T" and t.groups == ((0, 1), (2, 3))
    assert t.gpu_memory_bytes is None  # null: not known, not the default 32 GiB


def test_bounds_are_inclusive():
    from gnnio.placement.topology import MAX_BANDWIDTH, MAX_BYTES

    assert parse_bandwidth(MAX_BANDWIDTH) == MAX_BANDWIDTH
    assert Topology("t", groups=((0,),), host_bw=MAX_BANDWIDTH).host_bw == MAX_BANDWIDTH
    assert parse_bytes(int(MAX_BYTES)) == int(MAX_BYTES)
    with pytest.raises(UsageError, match="not a byte count"):
        parse_bytes(2 * MAX_BYTES)
    assert len(parse_groups("1024")[0]) == 1024  # 1024 GPUs are allowed, 1025 are not
    with pytest.raises(UsageError, match="more than 1024"):
        parse_groups("1024+1")


def test_byte_counts_are_exact_and_bools_are_refused():
    big = 10**18 - 1  # a float would round it to 10**18
    assert parse_bytes(big) == big
    for bad in (True, False):
        with pytest.raises(UsageError, match="expected a byte count"):
            parse_bytes(bad)


def test_buffer_rows_round_down():
    t = Topology("t", groups=((0,),), feature_budget_bytes=1000)
    assert t.buffer_rows(300) == 3  # 3.33 rows: 3 fit
    assert t.buffer_rows(400) == 2  # 2.5 rows: 2 fit, not 3
    assert Topology("t", groups=((0,),)).buffer_rows(300) is None


def test_overrides_take_units_and_skip_none():
    t = load_topology("2", feature_budget_bytes="1 GiB", gpu_memory_bytes="8GB", host_bw=None)
    assert t.feature_budget_bytes == 2**30 and t.gpu_memory_bytes == 8 * 10**9
    assert t.host_bw == load_topology("2").host_bw
    assert t.with_overrides(host_bw=None, peer_bw=None) is t
    assert t.with_overrides(peer_bw=1e9, note=None).peer_bw == 1e9
