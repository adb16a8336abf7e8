"""Compressed feature rows (issue 25, item 4): the encodings, the format, prepare/reorder
``--feature-dtype``, decoding on the model's device, training and the bytes each tier moves."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from gnnio.cli.main import main
from gnnio.errors import DatasetError
from gnnio.graph import DatasetWriter
from gnnio.graph import feature_dtype as fdt
from gnnio.graph.dataset import load
from gnnio.importers.synthetic import prepare_synthetic
from gnnio.preprocess.reorder import reorder_path
from gnnio.train import TrainConfig, train
from gnnio.train.decode import FeatureDecoder

from .helpers import write_tiny_dataset

HYP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_finite = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False, width=32)


def _int8_round_trip(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lo, hi = fdt.column_range(x)
    scale, zp = fdt.int8_params(lo, hi)
    q = fdt.encode(x, "int8", scale, zp)
    return q, fdt.decode(q, "int8", scale, zp), scale


# ---- the encodings ------------------------------------------------------------------------------


@HYP
@given(x=arrays(np.float32, st.tuples(st.integers(1, 30), st.integers(1, 6)), elements=_finite))
def test_int8_round_trip_is_within_one_step_per_column(x):
    q, back, scale = _int8_round_trip(x)
    assert q.dtype == np.int8
    err = np.abs(back.astype(np.float64) - x)
    # one quantization step per column (half a step inside the range, one at its clamped ends),
    # plus float32 rounding of the decode
    tol = scale.astype(np.float64) * (1 + 1e-5) + 1e-6 * np.abs(x).max(axis=0) + 2e-45
    assert (err <= tol).all(), (err.max(axis=0), scale)
    assert (back[x == 0] == 0).all()  # zero stays exactly zero (zero is in every range)


@HYP
@given(x=arrays(np.float32, st.tuples(st.integers(1, 30), st.integers(1, 6)), elements=_finite))
def test_half_precision_round_trips(x):
    h = fdt.decode(fdt.encode(x, "float16"), "float16")
    assert (np.abs(h - x) <= 2.0**-11 * np.abs(x) + 2.0**-24).all()
    b = fdt.encode(x, "bfloat16")
    assert b.dtype == np.int16
    back = fdt.decode(b, "bfloat16")
    assert (np.abs(back - x) <= 2.0**-8 * np.abs(x) + 1e-38).all()
    want = torch.from_numpy(x.copy()).to(torch.bfloat16).float().numpy()
    assert back.tobytes() == want.tobytes()  # torch's rounding (nearest even), bit for bit


def test_int8_constant_columns_do_not_divide_by_zero():
    x = np.zeros((5, 3), dtype=np.float32)
    x[:, 1] = 2.5  # constant, not zero: the range [0, 2.5]
    x[:, 2] = -7.0
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        q, back, scale = _int8_round_trip(x)
    assert scale[0] == 0 and np.isfinite(scale).all()
    assert (back[:, 0] == 0).all()
    assert np.allclose(back[:, 1], 2.5, atol=scale[1]) and np.allclose(
        back[:, 2], -7, atol=scale[2]
    )
    dec = FeatureDecoder(fdt.FeatureCodec("int8", *fdt.int8_params(*fdt.column_range(x))))
    assert torch.isfinite(dec(torch.from_numpy(q))).all()


def test_float16_refuses_values_it_cannot_hold():
    with pytest.raises(ValueError, match="float16's range"):
        fdt.encode(np.array([[1e6]], dtype=np.float32), "float16")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int8"])
def test_the_model_decoder_equals_the_numpy_decode(dtype):
    x = np.random.default_rng(0).standard_normal((50, 7)).astype(np.float32) * 3 + 1
    codec = fdt.FeatureCodec(dtype)
    if dtype == "int8":
        codec = fdt.FeatureCodec("int8", *fdt.int8_params(*fdt.column_range(x)))
    stored = fdt.encode(x, dtype, codec.scale, codec.zero_point)
    got = FeatureDecoder(codec)(torch.from_numpy(stored))
    assert got.dtype == torch.float32
    assert got.numpy().tobytes() == codec.decode(stored).tobytes()
    assert FeatureDecoder(codec).state_dict() == {}  # checkpoints do not change


# ---- the format, prepare, reorder ---------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype,stored", [("float16", "float16"), ("bfloat16", "int16"), ("int8", "int8")]
)
def test_writer_recodes_and_the_dataset_records_the_dtype(tmp_path, dtype, stored):
    src = write_tiny_dataset(tmp_path / "f32", num_nodes=40, num_edges=120, feat_dim=5)
    x = np.asarray(load(src).features)
    out = tmp_path / "r0"
    reorder_path(src, "degree", out=out, progress=False)  # the float32 reference
    with fdt.writing_as(dtype):
        reorder_path(src, "degree", out=tmp_path / "r", progress=False)
    ds, ref = load(tmp_path / "r", verify=True), load(out)
    assert ds.meta["feat_dtype"] == dtype == ds.feat_dtype
    assert str(ds.features.dtype) == stored
    assert ds.meta["arrays"]["features"]["dtype"] == stored
    assert (fdt.SCALE in ds.extra) == (dtype == "int8")
    back = ds.feature_codec.decode(np.asarray(ds.features))
    want = np.asarray(ref.features)
    assert np.abs(back - want).max() <= (ds.feature_codec.scale.max() if dtype == "int8" else 0.01)
    assert np.array_equal(np.asarray(ds.graph.indices), np.asarray(ref.graph.indices))
    # reordering a compressed dataset keeps its rows and codec as they are
    reorder_path(tmp_path / "r", "degree", out=tmp_path / "rr", progress=False)
    again = load(tmp_path / "rr")
    assert again.feat_dtype == dtype
    n2o = np.asarray(again.extra["new2old"])
    o2n_r = np.asarray(ds.extra["old2new"])
    assert np.asarray(again.features).tobytes() == np.asarray(ds.features)[o2n_r[n2o]].tobytes()
    if dtype == "int8":
        assert again.feature_codec.scale.tobytes() == ds.feature_codec.scale.tobytes()
    assert x.shape == again.features.shape


def test_reorder_from_int8_to_float16_and_back_to_float32(tmp_path):
    src = write_tiny_dataset(tmp_path / "a", num_nodes=30, num_edges=90, feat_dim=4)
    with fdt.writing_as("int8"):
        reorder_path(src, "degree", out=tmp_path / "q", progress=False)
    with fdt.writing_as("float16"):
        reorder_path(tmp_path / "q", "degree", out=tmp_path / "h", progress=False)
    h = load(tmp_path / "h")
    assert h.feat_dtype == "float16" and fdt.SCALE not in h.extra


def test_an_int8_dataset_without_its_scales_is_refused(tmp_path):
    out = tmp_path / "bad"
    with pytest.raises(DatasetError, match="x_scale"):
        with DatasetWriter(out, name="bad") as w:
            w.save_array("indptr", np.zeros(3, dtype=np.int64))
            w.save_array("indices", np.zeros(0, dtype=np.int32))
            w.save_array("features", np.zeros((2, 3), dtype=np.int8))
    assert not out.exists()


def test_int8_refuses_non_finite_features_and_leaves_nothing(tmp_path):
    out = tmp_path / "nan"
    with pytest.raises(DatasetError, match="int8 cannot encode"):
        with DatasetWriter(out, name="nan", allow_nonfinite=True, feature_dtype="int8") as w:
            w.save_array("indptr", np.zeros(3, dtype=np.int64))
            w.save_array("indices", np.zeros(0, dtype=np.int32))
            w.save_array("features", np.array([[1.0, np.nan]], dtype=np.float32).repeat(2, 0))
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad", ["int4", "float64", "FLOAT16", ""])
def test_bad_feature_dtypes_are_one_line(tmp_path, capsys, bad):
    for argv in (
        ["prepare", "synthetic", "--num-nodes", "64", "--out", str(tmp_path / "o")],
        ["reorder", str(tmp_path), "--by", "degree", "--out", str(tmp_path / "o")],
    ):
        assert main([*argv, "--feature-dtype", bad]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("gnnio: error:") and "--feature-dtype" in err
        assert len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_prepare_and_info_show_the_dtype(tmp_path, capsys):
    out = tmp_path / "s"
    argv = ["prepare", "synthetic", "--num-nodes", "300", "--feat-dim", "8", "--quiet"]
    assert main([*argv, "--out", str(out), "--feature-dtype", "bfloat16"]) == 0
    assert main(["info", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["feat_dtype"] == "bfloat16"
    assert main(["info", str(out)]) == 0
    assert "8 x bfloat16" in capsys.readouterr().out


@pytest.mark.parametrize("tdtype", [torch.float16, torch.bfloat16])
def test_from_pyg_keeps_half_precision(tmp_path, tdtype):
    from torch_geometric.data import Data

    from gnnio.importers.pyg import from_pyg, to_pyg

    x = torch.randn(6, 3).to(tdtype)
    data = Data(x=x, edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]))
    ds = load(from_pyg(data, tmp_path / "p", progress=False))
    assert ds.feat_dtype == str(tdtype).removeprefix("torch.")
    back = to_pyg(ds).x
    assert back.dtype == tdtype and torch.equal(back.view(torch.int16), x.view(torch.int16))
    with fdt.writing_as("float32"):  # --feature-dtype says otherwise
        ds32 = load(from_pyg(data, tmp_path / "q", progress=False))
    assert ds32.feat_dtype == "float32" and torch.equal(torch.from_numpy(ds32.features), x.float())


def test_prepare_npy_keeps_float16_unless_told(tmp_path):
    rng = np.random.default_rng(0)
    files = {"indptr": np.arange(9, dtype=np.int64), "indices": rng.integers(0, 8, 8),
             "features": rng.standard_normal((8, 3)).astype(np.float16),
             "labels": rng.integers(0, 2, 8), "train-idx": np.arange(4)}  # fmt: skip
    argv = ["prepare", "npy", "--quiet"]
    for key, arr in files.items():
        np.save(tmp_path / f"{key}.npy", arr)
        argv += [f"--{key}", str(tmp_path / f"{key}.npy")]
    assert main([*argv, "--out", str(tmp_path / "h")]) == 0
    h = load(tmp_path / "h")
    assert h.feat_dtype == "float16"
    assert np.asarray(h.features).tobytes() == files["features"].tobytes()
    assert main([*argv, "--out", str(tmp_path / "q"), "--feature-dtype", "int8"]) == 0
    assert load(tmp_path / "q").feat_dtype == "int8"


# ---- training and bytes -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fdt")
    out = {}
    for dt in fdt.FEATURE_DTYPES:
        with fdt.writing_as(dt):
            out[dt] = prepare_synthetic(root / dt, num_nodes=2000, avg_degree=8, feat_dim=32,
                                        num_classes=4, seed=0, progress=False)  # fmt: skip
    return out


def _cfg(**kw) -> TrainConfig:
    base = dict(fanouts=(5, 5), batch_size=256, epochs=2, hidden=16, progress=False, seed=0)
    return TrainConfig(**{**base, **kw})


@pytest.mark.parametrize(
    "kw",
    [{}, {"gpu_cache_fraction": 0.2}, {"store": "disk", "host_cache_size": 0.1},
     {"cache_policy": "lru", "cache_size": 0.1}],
    ids=["memory", "tiered", "disk+host-cache", "cache"],
)  # fmt: skip
def test_training_runs_and_moves_compressed_bytes(graphs, kw):
    runs = {dt: train(graphs[dt], _cfg(**kw)) for dt in fdt.FEATURE_DTYPES}
    base = runs["float32"]
    for dt, ratio in (("float16", 0.5), ("bfloat16", 0.5), ("int8", 0.25)):
        s = runs[dt]
        assert s["feat_dtype"] == dt
        assert all(np.isfinite(s["loss_history"])) and 0 <= s["test_acc"] <= 1
        assert s["rows_by_tier"] == base["rows_by_tier"]  # the same rows, compressed
        rows = {k: v for k, v in s["bytes_by_tier"].items() if k != "disk"}
        assert rows == {k: v * ratio for k, v in base["bytes_by_tier"].items() if k != "disk"}
        if "disk" in base["bytes_by_tier"]:  # device bytes, whole pages: fewer, not exactly
            assert s["bytes_by_tier"]["disk"] == s["disk"]["bytes_read"]
            assert s["bytes_by_tier"]["disk"] <= base["bytes_by_tier"]["disk"]
        assert abs(s["loss_history"][0] - base["loss_history"][0]) < 0.05
    assert runs["int8"]["feature_codec_bytes"] == 2 * 4 * 32  # scale + zero point, once
    assert base["feature_codec_bytes"] == 0


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_pyg_loader_hands_decoded_rows(graphs, dtype):
    from gnnio.pyg.loader import PyGLoader

    ds = load(graphs[dtype])
    want = ds.feature_codec.decode(np.asarray(ds.features))
    for batch in PyGLoader(ds, [3, 3], input_nodes="train", batch_size=128):
        x = batch.x.float().numpy()
        assert batch.x.dtype == (torch.bfloat16 if dtype == "bfloat16" else torch.float32)
        assert x.tobytes() == want[batch.n_id.numpy()].tobytes()


def test_the_decoder_reads_each_dtype_by_its_own_rule():
    """Rows in a float dtype other than the stored one are cast, not reinterpreted as the codec's
    bits (bfloat16's int16 view, int8's scale) and rows of an integer dtype the codec does not
    store are refused (mutation pass over train/decode.py, 2026-11-29)."""
    x = np.random.default_rng(1).standard_normal((6, 4)).astype(np.float32)
    int8 = fdt.FeatureCodec("int8", *fdt.int8_params(*fdt.column_range(x)))
    for codec in (fdt.FeatureCodec("bfloat16"), int8, fdt.FeatureCodec("float16")):
        dec = FeatureDecoder(codec)
        for t in (torch.float64, torch.float16, torch.bfloat16):
            rows = torch.from_numpy(x).to(t)
            assert torch.equal(dec(rows), rows.float()), (codec.feat_dtype, t)
        for t in (torch.int64, torch.int32, torch.uint8):
            with pytest.raises(TypeError, match=f"dtype {t} for a {codec.feat_dtype} dataset"):
                dec(torch.ones(2, 4, dtype=t))
    with pytest.raises(TypeError, match="for a float32 dataset"):
        FeatureDecoder()(torch.ones(2, 4, dtype=torch.int16))  # int16 bits of no bfloat16
