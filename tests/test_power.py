"""Power bounded by physics ([idle, limit] of each GPU) and the per-kind power of operations
inside networks (gpurec.model.network)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).parent.parent


def test_catalogue_power_bounds_have_sources_and_measured_idle_matches_data() -> None:
    """Every GPU has a limit and an idle power below it; a measured idle power is the median of
    that GPU's idle readings in datasets/ (so the catalogue cannot drift from the data)."""
    import pandas as pd

    from gpurec.catalog import load_catalog

    measured = {}
    for path in sorted((ROOT / "datasets").glob("*/idle.parquet")):
        idle = pd.read_parquet(path)
        for gpu, rows in idle.groupby("gpu"):
            measured[gpu] = float(rows["idle_power_w"].median())
    assert measured, "no idle readings in datasets/"
    for spec in load_catalog():
        idle_w, limit_w = spec.power_bounds_w()
        assert 0 < idle_w < limit_w, spec.nvml_name
        assert spec.power_source, spec.nvml_name
        if spec.nvml_name in measured:
            assert spec.idle_power_w == pytest.approx(measured[spec.nvml_name], abs=0.05), spec.nvml_name
        else:
            assert spec.idle_power_w is None, f"{spec.nvml_name}: an idle power without a measurement"


def test_unmeasured_idle_is_the_measured_share_of_the_limit() -> None:
    from gpurec.catalog import idle_share_of_limit, load_catalog

    shares = [s.idle_power_w / s.power_limit_w for s in load_catalog() if s.idle_power_w is not None]
    assert idle_share_of_limit() == pytest.approx(float(np.median(shares)))
    t4 = next(s for s in load_catalog() if s.short_name == "T4")
    assert t4.power_bounds_w() == pytest.approx((idle_share_of_limit() * 70.0, 70.0))


# Networks and batches spanning tiny to huge steps (vit_b_16 b4096 inference was predicted at
# 772 W on the 700 W H100 before power was bounded).
GRID = [("vit_b_16", 4096, "inference"), ("vit_b_16", 256, "training"), ("resnet50", 1, "inference"),
        ("resnet50", 512, "training"), ("mobilenet_v3_small", 1024, "inference"), ("vgg16", 256, "training")]


@pytest.fixture(scope="module")
def shipped():
    import gpurec

    return gpurec.load_predictor(check_data=False)


@pytest.mark.parametrize("model,batch,mode", GRID)
def test_no_estimate_outside_idle_and_limit(shipped, model: str, batch: int, mode: str) -> None:
    """Over the whole catalogue: eager, host-free and per-operation power within [idle, limit]."""
    from gpurec.catalog import load_catalog

    p = shipped
    for spec in load_catalog():
        idle_w, limit_w = spec.power_bounds_w()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = p.predict(model, (batch, 3, 224, 224), mode=mode, gpu=spec.nvml_name)
        label = f"{spec.short_name} {model} b{batch} {mode}"
        tol = 1e-6 * limit_w
        gpu_power_w = est.gpu_energy_mj / est.gpu_time_ms
        for name, w in (("eager", est.power_w), ("host-free", gpu_power_w)):
            assert idle_w - tol <= w <= limit_w + tol, f"{label}: {name} {w:.1f} W outside [{idle_w:.1f}, {limit_w}]"
        op_w = est._ops.power_w
        assert (op_w >= idle_w - tol).all() and (op_w <= limit_w + tol).all(), label


def test_network_power_held_inside_bounds_whatever_the_correction() -> None:
    """A correction that would push the network above the limit (or below idle) is held at it."""
    from gpurec.model.network import Correction, aggregate

    t = np.array([1.0, 2.0, 3.0, 4.0])
    w = np.array([600.0, 650.0, 150.0, 140.0])
    offsets = np.array([0, 2, 4])
    up = Correction("none", "scale", {"*|training": {}}, {"*|training": {"scale": 1.5}}, {})
    down = Correction("none", "scale", {"*|training": {}}, {"*|training": {"scale": 0.5}}, {})
    sums = aggregate(t, w, offsets, 0.02, idle_w=120.0, limit_w=700.0)
    assert up.apply(sums, "H100", "training")[1] == pytest.approx([700.0, 1.5 * (150 * 3 + 140 * 4) / 7])
    assert down.apply(sums, "H100", "training")[1] == pytest.approx([0.5 * (600 + 1300) / 3, 120.0])
    free = aggregate(t, w, offsets, 0.02)  # without bounds nothing is clipped
    assert up.apply(free, "H100", "training")[1][0] == pytest.approx(1.5 * 1900 / 3)


def test_power_classes() -> None:
    from gpurec.model.features import KIND_GROUPS
    from gpurec.model.network import POWER_CLASSES, power_class

    g = np.array([KIND_GROUPS.index(k) for k in ("conv", "conv", "matmul", "attention", "norm", "pool",
                                                  "elementwise")])
    groups = np.array([1, 32, 0, 0, 0, 0, 0], dtype=float)
    got = [POWER_CLASSES[i] for i in power_class(g, groups)]
    assert got == ["conv", "grouped_conv", "matmul", "matmul", "norm", "memory", "memory"]
    # a whole LSTM/GRU layer (kind group "other") is its own class, not the memory-bound rest
    from gpurec.model.network import is_recurrent

    kinds = np.array(["LSTM", "GRU", "RNN", "Linear", "log_softmax", "Embedding"], dtype=object)
    g = np.array([KIND_GROUPS.index("other")] * 3 + [KIND_GROUPS.index(k) for k in ("matmul", "activation", "other")])
    got = [POWER_CLASSES[i] for i in power_class(g, np.zeros(6), is_recurrent(kinds))]
    assert got == ["recurrent", "recurrent", "recurrent", "matmul", "memory", "memory"]


def test_kind_power_fit_recovers_per_class_factors() -> None:
    """Networks whose true power is idle + sum_k f_k * dynamic_k / T: the 'kinds' variant finds
    dyn_k = f_k - 1 and reproduces every network's power."""
    from gpurec.model.network import POWER_CLASSES, aggregate, apply_power, fit_power

    rng = np.random.default_rng(3)
    n_nets, per = 40, 30
    t = rng.uniform(0.01, 2.0, n_nets * per)
    w = rng.uniform(150, 600, n_nets * per)
    classes = rng.integers(0, len(POWER_CLASSES), n_nets * per)
    offsets = np.arange(0, n_nets * per + 1, per)
    idle = 120.0
    sums = aggregate(t, w, offsets, 0.02, power_classes=classes, idle_w=idle, limit_w=700.0)
    assert sums.dyn_energy_mj.sum(axis=1) == pytest.approx(sums.sum_energy_mj - idle * sums.sum_time_ms)
    # the recurrent class is never fitted (its power model is fitted on whole layers): factor 1
    factors = np.array([1.15, 1.3, 0.85, 1.0, 1.1, 1.0])
    assert POWER_CLASSES[-1] == "recurrent"
    true_w = idle + (sums.dyn_energy_mj @ factors) / sums.sum_time_ms
    coef = fit_power(sums, true_w, "kinds", ridge=1e-8)
    got = np.array([coef[f"dyn_{c}"] for c in POWER_CLASSES]) + 1.0
    assert got == pytest.approx(factors, abs=1e-3)
    assert coef["dyn_recurrent"] == 0.0
    assert apply_power(sums, coef) == pytest.approx(true_w, rel=1e-4)


def test_error_kinds() -> None:
    from gpurec.model.fitting.kind_errors import error_kind

    assert error_kind("Conv2d", 1) == "conv (dense)"
    assert error_kind("Conv2d", 32) == "conv (grouped/depthwise)"
    assert error_kind("cat", 0) == "channel concat"
    assert error_kind("roll", 0) == error_kind("shifted_window_attention", 0) == "window attention"
    assert error_kind("Sigmoid", 0) == "squeeze-excite gate"
    assert error_kind("StochasticDepth", 0) == "stochastic depth"
    assert error_kind("BatchNorm2d", 0) == "batch norm"
    assert error_kind("ReLU", 0) == "other"
    assert error_kind("LSTM", 0) == error_kind("GRU", 0) == "recurrent layer"


def test_per_kind_errors_attribute_a_known_error_to_its_kind(shipped, tmp_path: Path) -> None:
    """In-network kernel times = the predictor's own per-op times, except dense convs measured
    25% longer: the dense-conv row shows -20% bias and all the error; the others none."""
    import warnings

    import pandas as pd

    from gpurec.model.fitting.kind_errors import per_kind_errors

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = shipped.predict("resnet18", (8, 3, 224, 224), mode="inference", gpu="H100")
    block = est._ops.entry.block
    conv = np.array([k == "Conv2d" for k in block.kinds])
    kernel_ms = np.where(conv, est._ops.gpu_time_ms * 1.25, est._ops.gpu_time_ms)
    rows = pd.DataFrame({"position": np.arange(len(block)), "op_signature": block.signatures, "kernel_ms": kernel_ms,
                         "gpu": est.gpu, "set_key": "resnet18:b8:r224", "mode": "inference"})
    (tmp_path / "h100").mkdir()
    rows.to_parquet(tmp_path / "h100" / "in_network.parquet")
    rows[["gpu", "set_key", "mode"]].head(1).to_parquet(tmp_path / "h100" / "networks.parquet")
    got = {r["kind"]: r for r in per_kind_errors(shipped, tmp_path, archs=["resnet18"])}
    assert got["conv (dense)"]["bias_pct"] == pytest.approx(-20.0)
    assert got["conv (dense)"]["share_of_error"] == pytest.approx(1.0)
    assert got["batch norm"]["bias_pct"] == pytest.approx(0.0, abs=1e-9)
    assert sum(r["n_ops"] for r in got.values()) == len(block)


def test_network_error_sources_name_the_operation_that_carries_the_miss(shipped, tmp_path: Path) -> None:
    """In-network kernel times = the predictor's own per-op times, except one convolution measured
    3x longer (a slow cuDNN algorithm): it is the network's first source with all of the error,
    and the network's bias is its extra time over the measured sum."""
    import warnings

    import pandas as pd

    from gpurec.model.fitting.kind_errors import network_error_sources

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = shipped.predict("resnet18", (8, 3, 224, 224), mode="inference", gpu="H100")
    block = est._ops.entry.block
    slow = [i for i, k in enumerate(block.kinds) if k == "Conv2d"][3]
    kernel_ms = est._ops.gpu_time_ms.copy()
    kernel_ms[slow] *= 3.0
    rows = pd.DataFrame({"position": np.arange(len(block)), "op_signature": block.signatures, "kernel_ms": kernel_ms,
                         "gpu": est.gpu, "set_key": "resnet18:b8:r224", "mode": "inference"})
    rows.loc[0, "op_signature"] = "not-this-operation"  # a position that does not match is counted apart
    (tmp_path / "h100").mkdir()
    rows.to_parquet(tmp_path / "h100" / "in_network.parquet")
    rows[["gpu", "set_key", "mode"]].head(1).to_parquet(tmp_path / "h100" / "networks.parquet")
    (net,) = network_error_sources(shipped, tmp_path, archs=["resnet18"], top=2)
    assert net["misaligned"] == 1 and net["n_ops"] == len(block) - 1
    first = net["top"][0]
    assert first["position"] == slow and first["kind"] == "Conv2d" and first["error_kind"] == "conv (dense)"
    assert first["share_of_error"] == pytest.approx(1.0)
    assert first["measured_ms"] == pytest.approx(3.0 * first["predicted_ms"])
    measured = float(kernel_ms[1:].sum())
    assert net["bias_pct"] == pytest.approx((measured - 2.0 * est._ops.gpu_time_ms[slow]) / measured * 100 - 100)


def test_gpu_bound_transfer_uses_only_networks_gpu_bound_on_the_host_free_gpu() -> None:
    import pandas as pd

    from gpurec.model.fitting.kind_errors import gpu_bound_transfer

    nan = float("nan")
    rec = pd.DataFrame([
        # on the GPU with host-free rows: a is GPU-bound (0.95), b is host-bound (0.5)
        {"gpu": "A", "set_key": "a", "mode": "inference", "measured_time_ms": 1.0, "measured_gpu_time_ms": 0.95},
        {"gpu": "A", "set_key": "b", "mode": "inference", "measured_time_ms": 1.0, "measured_gpu_time_ms": 0.5},
        # the other GPU (eager only): a is predicted 10% low in energy, b wildly off (ignored)
        {"gpu": "B", "set_key": "a", "mode": "inference", "measured_time_ms": 2.0, "measured_gpu_time_ms": nan},
        {"gpu": "B", "set_key": "b", "mode": "inference", "measured_time_ms": 2.0, "measured_gpu_time_ms": nan},
    ])
    rec["measured_energy_mj"] = 100.0
    rec["pred_energy_mj"] = [nan, nan, 90.0, 10.0]
    rec["pred_time_ms"] = [nan, nan, 2.0, 2.0]
    rec["is_test"] = False
    rec["error"] = ""
    out = gpu_bound_transfer(rec)
    assert out["n_gpu_bound_sets"] == 1
    (row,) = out["rows"]
    assert row["gpu"] == "B" and row["n"] == 1
    assert row["energy_mj_bias"] == pytest.approx(-10.0) and row["power_w_bias"] == pytest.approx(-10.0)
    assert row["time_ms_mape"] == pytest.approx(0.0)


def test_per_kind_errors_at_a_precision_reads_that_precision_s_rows_only(shipped, tmp_path: Path) -> None:
    """bf16-mixed positions (batch norms measured 25% longer) beside fp32 positions of the same
    set (convolutions 25% longer): each precision sees its own rows, predicted at that precision."""
    import warnings

    import pandas as pd

    from gpurec.model.fitting.kind_errors import error_kind, per_kind_errors

    frames = []
    for precision, slow in (("bf16-mixed", "BatchNorm2d"), ("fp32", "Conv2d")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = shipped.predict("resnet18", (8, 3, 224, 224), mode="inference", gpu="H100", precision=precision)
        block = est._ops.entry.block
        hit = np.array([k == slow for k in block.kinds])
        frames.append(pd.DataFrame({"position": np.arange(len(block)), "op_signature": block.signatures,
                                    "kernel_ms": np.where(hit, est._ops.gpu_time_ms * 1.25, est._ops.gpu_time_ms),
                                    "gpu": est.gpu, "set_key": "resnet18:b8:r224", "mode": "inference",
                                    "precision": precision}))
    (tmp_path / "h100").mkdir()
    pd.concat(frames).to_parquet(tmp_path / "h100" / "in_network.parquet")
    frames[0][["gpu", "set_key", "mode"]].head(1).to_parquet(tmp_path / "h100" / "networks.parquet")
    low = {r["kind"]: r for r in per_kind_errors(shipped, tmp_path, archs=["resnet18"], precision="bf16-mixed")}
    assert error_kind("autocast_cast", 0) == "autocast cast"
    assert low["batch norm"]["bias_pct"] == pytest.approx(-20.0)
    assert low["batch norm"]["share_of_error"] == pytest.approx(1.0)
    # the casts are there, with no GPU time of their own (their consumers' times hold them)
    assert low["autocast cast"]["n_ops"] > 0 and low["autocast cast"]["predicted_ms"] == 0.0
    assert sum(r["n_ops"] for r in low.values()) == len(frames[0])
    fp32 = {r["kind"]: r for r in per_kind_errors(shipped, tmp_path, archs=["resnet18"])}
    assert fp32["conv (dense)"]["share_of_error"] == pytest.approx(1.0) and "autocast cast" not in fp32


def _rnn_networks(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Any]:
    """40 random networks of 20 operations, the first 10 mostly whole recurrent layers: per-op
    times, powers, power classes, offsets and their sums (idle 120 W, limit 700 W)."""
    from gpurec.model.network import POWER_CLASSES, aggregate

    rng = np.random.default_rng(seed)
    n_nets, per = 40, 20
    t = rng.uniform(0.01, 2.0, n_nets * per)
    w = rng.uniform(150, 600, n_nets * per)
    rec = POWER_CLASSES.index("recurrent")
    classes = rng.integers(0, len(POWER_CLASSES) - 1, n_nets * per)
    classes[: 10 * per] = np.where(rng.random(10 * per) < 0.7, rec, classes[: 10 * per])  # 10 RNN networks
    offsets = np.arange(0, n_nets * per + 1, per)
    return t, w, classes, offsets, aggregate(t, w, offsets, 0.02, power_classes=classes, idle_w=120.0, limit_w=700.0)


def test_power_correction_leaves_recurrent_layers_power_as_predicted() -> None:
    """A 'scale' learnt on other networks must not cut a recurrent layer's dynamic power: the
    correction acts on the rest of the network; model files fitted before keep their form."""
    from gpurec.model.network import POWER_CLASSES, Correction, apply_power, fit_power

    rec = POWER_CLASSES.index("recurrent")
    *_, sums = _rnn_networks(4)
    rec_w = sums.dyn_energy_mj[:, rec] / sums.sum_time_ms
    assert (rec_w[:10] > 50).all() and (rec_w[10:] == 0).all()
    true_w = 0.7 * (sums.power_ops_w - rec_w) + rec_w
    coef = fit_power(sums, true_w, "scale", ridge=1e-8, hold_recurrent=True)
    assert coef["scale"] == pytest.approx(0.7, abs=1e-3)
    held = apply_power(sums, coef, hold_recurrent=True)
    assert held == pytest.approx(true_w, rel=1e-4)
    assert (apply_power(sums, coef)[:10] < held[:10] - 0.25 * rec_w[:10]).all()  # the old form cuts it
    c = Correction("none", "scale", {"*|inference": {}}, {"*|inference": coef}, {}, hold_recurrent=True)
    assert c.apply(sums, "H100", "inference")[1] == pytest.approx(true_w, rel=1e-4)
    assert Correction.from_dict(c.as_dict()).hold_recurrent == "dynamic"  # True: a session 12-13 file
    old = c.as_dict()
    del old["hold_recurrent"]
    assert Correction.from_dict(old).hold_recurrent == "none"
    with pytest.raises(ValueError, match="hold_recurrent"):
        Correction("none", "scale", {}, {}, {}, hold_recurrent="all")


def test_power_correction_holds_the_idle_power_under_recurrent_layers() -> None:
    """'whole': the idle power under a recurrent layer's time stays as predicted too, so a 'scale'
    below 1 learnt on CNNs cuts only the rest of an RNN network ("dynamic" cut the idle part)."""
    from gpurec.model.network import POWER_CLASSES, Correction, apply_power, fit_power

    t, w, classes, offsets, sums = _rnn_networks(5)
    idle = float(sums.idle_w[0])
    is_rec = classes == POWER_CLASSES.index("recurrent")
    rec_time = np.add.reduceat(np.where(is_rec, t, 0.0), offsets[:-1])
    assert sums.recurrent_time_ms == pytest.approx(rec_time)
    assert sums.take(np.arange(3)).recurrent_time_ms == pytest.approx(rec_time[:3])
    whole_w = np.add.reduceat(np.where(is_rec, t * w, 0.0), offsets[:-1]) / sums.sum_time_ms
    true_w = 0.5 * (sums.power_ops_w - whole_w) + whole_w
    coef = fit_power(sums, true_w, "scale", ridge=1e-8, hold_recurrent="whole")
    assert coef["scale"] == pytest.approx(0.5, abs=1e-3)
    assert apply_power(sums, coef, hold_recurrent="whole") == pytest.approx(true_w, rel=1e-4)
    dyn = apply_power(sums, coef, hold_recurrent="dynamic")
    assert (dyn[:10] < true_w[:10] - 0.4 * idle * rec_time[:10] / sums.sum_time_ms[:10]).all()
    assert dyn[10:] == pytest.approx(true_w[10:], rel=1e-9)  # no recurrent layer: the forms agree
    c = Correction("none", "scale", {"*|inference": {}}, {"*|inference": coef}, {}, hold_recurrent="whole")
    assert Correction.from_dict(c.as_dict()).apply(sums, "H100", "inference")[1] == pytest.approx(true_w, rel=1e-4)


def test_kernel_sum_over_step_tells_overlapping_recurrent_kernels_apart(tmp_path: Path) -> None:
    """The in-network kernel sum of a network with an LSTM exceeds its step time (cuDNN's streams
    overlap), and the report's per-kind bias of recurrent layers is read against it."""
    import pandas as pd

    from gpurec.model.fitting.kind_errors import kernel_sum_over_step

    gpu = "NVIDIA H100 80GB HBM3"
    inn = pd.DataFrame({"gpu": gpu, "mode": "inference", "precision": "fp32",
                        "set_key": ["lstm_lm_1x256:b8:s96"] * 2 + ["resnet18:b8:r224"] * 2 + ["gru_lm_2x256:b8:s96"] * 2,
                        "op_kind": ["Embedding", "LSTM", "Conv2d", "ReLU", "GRU", "Linear"],
                        "kernel_ms": [0.1, 2.5, 1.0, 0.9, 3.0, 0.6], "position": [0, 1, 0, 1, 0, 1]})
    nets = pd.DataFrame({"gpu": gpu, "mode": "inference", "precision": "fp32", "status": "ok",
                         "set_key": ["lstm_lm_1x256:b8:s96", "resnet18:b8:r224", "gru_lm_2x256:b8:s96"],
                         "gpu_time_ms": [2.0, 2.0, 3.0]})
    (tmp_path / "h100").mkdir()
    inn.to_parquet(tmp_path / "h100" / "in_network.parquet")
    nets.to_parquet(tmp_path / "h100" / "networks.parquet")
    out = {r["recurrent"]: r for r in kernel_sum_over_step(tmp_path)}
    assert out[True]["networks"] == 2 and out[True]["median_ratio"] == pytest.approx((1.3 + 1.2) / 2)
    assert out[False]["networks"] == 1 and out[False]["median_ratio"] == pytest.approx(0.95)
