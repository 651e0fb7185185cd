"""gpurec.model: training on a small fixture, persistence checks and the prediction API contract."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

FIXTURE = Path(__file__).parent / "fixtures" / "model"
H100 = "NVIDIA H100 80GB HBM3"
QUICK = dict(tune_trials=2, max_rounds=30, default_rounds=30, early_stopping_rounds=5, n_folds=3, tune_folds=2,
             forest_trees=20, min_rows_per_mode=20)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    from gpurec.model import train

    out = tmp_path_factory.mktemp("models")
    report = train(FIXTURE, out, log=lambda s: None, **QUICK)
    return out, report


@pytest.fixture(scope="module")
def predictor(trained: tuple[Path, dict]):
    from gpurec.model import load_predictor

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fresh model on the same data must load without warnings
        return load_predictor(trained[0], data_root=FIXTURE, check_data=True)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# -- helpers ------------------------------------------------------------------------------------


def test_family_names() -> None:
    from gpurec.model.fitting.evaluate import family, row_families

    assert family("resnet50") == "resnet"
    assert family("wide_resnet50_2") == "wide"
    assert family("vit_b_16") == "vit"
    assert family("efficientnet_b0") == "efficientnet"
    assert row_families("vgg11:b1:r224", '["vgg11:b1:r224", "resnet18:b8:r224"]') == {"vgg", "resnet"}


def test_grouped_folds_never_split_a_group() -> None:
    from gpurec.model.fitting.evaluate import grouped_folds

    groups = np.array(list("aabbbcdddeeffg"))
    folds = grouped_folds(groups, 3, seed=1)
    seen = np.concatenate([te for _, te in folds])
    assert sorted(seen.tolist()) == list(range(len(groups)))
    for tr, te in folds:
        assert not set(groups[tr]) & set(groups[te])


def test_correction_recovers_known_terms() -> None:
    from gpurec.model.network import NetworkSums, apply_time, fit_time

    rng = np.random.default_rng(0)
    s_t = rng.uniform(1, 50, 40)
    n = rng.integers(20, 300, 40).astype(float)
    sums = NetworkSums(s_t, s_t * 200, n, n / 2, s_t / 10)
    measured = 0.8 * s_t + 0.5 + 0.01 * n
    coef = fit_time(sums, measured, "scale+intercept+n_ops", ridge=1e-6)
    assert coef["scale"] == pytest.approx(0.8, rel=1e-3)
    assert coef["per_op_ms"] == pytest.approx(0.01, rel=1e-2)
    assert np.allclose(apply_time(sums, coef), measured, rtol=1e-3)


def test_time_correction_is_not_extrapolated_below_its_fitted_networks() -> None:
    """Below the smallest op sum the time correction was fitted on, its intercept shrinks with the
    sum: a network keeps the relative correction of the smallest fitted one, where an extrapolated
    intercept made a tiny network many times its op sum.  Inside the range nothing changes; the
    floor is recorded at fit time and read back, a precision key takes its step mode's, and models
    trained before read it from their report's out-of-fold network sums."""
    from gpurec.model.network import Correction, NetworkSums, fit_correction
    from gpurec.tools.correction import floors_from_report

    rng = np.random.default_rng(1)
    s_t = rng.uniform(0.5, 20.0, 30)
    n = rng.integers(10, 200, 30).astype(float)
    sums = NetworkSums(s_t, s_t * 200, n, n / 2, s_t / 10)
    corr = fit_correction(sums, np.full(30, "H100"), np.full(30, "inference"), 0.9 * s_t + 0.2, s_t * 0 + 200,
                          "scale+intercept", "none", specific=())
    assert corr.time_floor_ms == {"*|inference": pytest.approx(s_t.min())}
    tiny = NetworkSums(np.array([0.01, s_t.min(), 10.0]), np.array([2.0, 200 * s_t.min(), 2000.0]),
                       np.array([1.0, 10.0, 50.0]), np.zeros(3), np.zeros(3))
    t, _, _ = corr.apply(tiny, "H100", "inference")
    edge = t[1] / s_t.min()  # the relative correction at the smallest fitted network
    assert t[0] == pytest.approx(0.01 * edge) and t[2] == pytest.approx(0.9 * 10.0 + 0.2, rel=1e-2)
    unbounded = Correction.from_dict({**corr.as_dict(), "time_floor_ms": {}})
    assert unbounded.apply(tiny, "H100", "inference")[0][0] == pytest.approx(0.2, rel=0.1)  # the old extrapolation
    bf16 = "*|inference|bf16-mixed"
    precision = Correction.from_dict({**corr.as_dict(), "time_coef": {bf16: corr.time_coef["*|inference"]},
                                      "power_coef": {bf16: corr.power_coef["*|inference"]}, "n_rows": {bf16: 40}})
    assert precision.apply(tiny, "H100", "inference|bf16-mixed")[0] == pytest.approx(t)
    report = {"leave_one_family_out": {"xgboost": {"network_records": [
        {"mode": "inference", "sum_time_ms": 0.3}, {"mode": "inference", "sum_time_ms": 0.06},
        {"mode": "training", "sum_time_ms": 0.4}]}}}
    assert floors_from_report(report) == {"*|inference": 0.06, "*|training": 0.4}


def test_time_correction_spares_measured_operations() -> None:
    """The time correction corrects model error: a network whose every operation was looked up
    from measurements keeps its sum, a predicted one gets the full correction, and a half-measured
    one half of it.  Power is corrected in full either way (its targets are isolated rows)."""
    from gpurec.model.network import Correction, NetworkSums, aggregate

    t = np.array([1.0, 2.0, 3.0, 4.0])
    w = np.array([100.0, 200.0, 300.0, 400.0])
    offsets = np.array([0, 2, 4])
    corr = Correction("scale", "scale", {"*|inference": {"scale": 0.5}}, {"*|inference": {"scale": 0.9}}, {})
    none = aggregate(t, w, offsets, 0.02)
    ct, cw, key = corr.apply(none, "H100", "inference")
    assert key == "*|inference" and ct == pytest.approx([1.5, 3.5])
    every = aggregate(t, w, offsets, 0.02, np.array([True, True, True, True]))
    ct, cw_all, _ = corr.apply(every, "H100", "inference")
    assert ct == pytest.approx([3.0, 7.0]) and cw_all == pytest.approx(cw)
    half = aggregate(t, w, offsets, 0.02, np.array([True, False, False, False]))  # 1 of 3 ms measured
    assert half.measured_share == pytest.approx([1 / 3, 0.0])
    ct, _, _ = corr.apply(half, "H100", "inference")
    assert ct == pytest.approx([1.5 + (3.0 - 1.5) / 3, 3.5])
    assert isinstance(half.take([1]), NetworkSums) and half.take([1]).measured_share == pytest.approx([0.0])


def test_measured_operations_carry_the_gap_between_kernels() -> None:
    """A looked-up operation's time is its kernels' in-network time: each that launches kernels
    adds the correction mode's gap (a precision without one takes its step mode's), a measured
    kernel-free one (0 ms) none, predicted ones none (the time correction holds theirs), and a
    model file without gaps adds nothing."""
    from gpurec.model.network import Correction, aggregate

    t = np.array([1.0, 0.0, 2.0, 3.0, 4.0])
    w = np.full(5, 100.0)
    s = aggregate(t, w, np.array([0, 3, 5]), 0.02, np.array([True, True, True, False, True]))
    assert s.measured_ops == pytest.approx([2.0, 1.0])
    identity = {"scale": 1.0}
    corr = Correction("scale", "scale", {"*|inference": identity, "*|inference|bf16-mixed": identity},
                      {"*|inference": identity, "*|inference|bf16-mixed": identity},
                      {"*|inference|bf16-mixed": 99}, measured_gap_ms={"*|inference": 0.01})
    ct, _, _ = corr.apply(s, "H100", "inference")
    assert ct == pytest.approx([3.02, 7.01])
    assert corr.apply(s, "H100", "inference|bf16-mixed")[0] == pytest.approx([3.02, 7.01])  # the step mode's gap
    corr.measured_gap_ms["*|inference|bf16-mixed"] = 0.1
    assert corr.apply(s, "H100", "inference|bf16-mixed")[0] == pytest.approx([3.2, 7.1])
    again = Correction.from_dict(corr.as_dict())
    assert again.measured_gap_ms == corr.measured_gap_ms
    old = Correction.from_dict({k: v for k, v in corr.as_dict().items() if k != "measured_gap_ms"})
    assert old.apply(s, "H100", "inference")[0] == pytest.approx([3.0, 7.0])


def test_the_gap_between_kernels_is_measured_on_training_networks_without_recurrent_layers() -> None:
    """fit_measured_gap: per correction mode, the median of (host-free time - in-network kernel
    sum) / operations that launched kernels, over training architectures without whole recurrent
    layers; test architectures, recurrent networks and failed rows never count, and a mode with
    too few networks is reported as left out."""
    import pandas as pd

    from gpurec.model._sets import test_arch_names
    from gpurec.model.fitting.graph_gap import fit_measured_gap

    nets, inn = [], []

    def network(arch: str, b: int, mode: str, gap_us: float, precision: str = "fp32", status: str = "ok",
                ops: int = 4) -> None:
        nid = f"network:{arch}:b{b}:r224:{mode}"
        kernel_ms = [0.1 * (k + 1) for k in range(ops)] + [0.0]  # one kernel-free operation
        nets.append({"id": nid, "gpu": H100, "run_id": "r1", "set_key": f"{arch}:b{b}:r224", "mode": mode,
                     "precision": precision, "status": status,
                     "gpu_time_ms": sum(kernel_ms) + ops * gap_us / 1000})
        inn.extend({"network_id": nid, "gpu": H100, "run_id": "r1", "precision": precision, "kernel_ms": k,
                    "kernels": 0 if k == 0 else 2} for k in kernel_ms)

    for b in range(1, 4):
        network("resnet18", b, "inference", 0.4 + 0.05 * b)  # gaps 0.45, 0.5, 0.55 us
        network(test_arch_names()[0], b, "inference", 50.0)  # unseen: never fitted on
        network("lstm_lm_2x512", b, "inference", -80.0)  # cuDNN overlaps kernels
        network("resnet18", b, "training", 2.0, precision="bf16-mixed")
    network("resnet34", 1, "inference", 500.0, status="failed")
    gaps, report = fit_measured_gap(pd.DataFrame(nets), pd.DataFrame(inn), min_networks=3)
    assert gaps["*|inference"] == pytest.approx(0.5e-3)
    assert report["*|inference"]["n"] == 3
    assert gaps["*|training|bf16-mixed"] == pytest.approx(2.0e-3)
    few, report = fit_measured_gap(pd.DataFrame(nets), pd.DataFrame(inn), min_networks=4)
    assert few == {} and "fewer than 4" in report["*|inference"]["left_out"]


def test_correction_is_keyed_by_precision() -> None:
    """A bf16-mixed network takes its precision's own correction where one was fitted, the step
    mode's (fitted on fp32 networks) where not; fp32 coefficients are fitted on fp32 networks
    only, so adding bf16-mixed networks to the data leaves them as they were."""
    from gpurec.model.network import Correction, aggregate, correction_mode, fit_correction

    assert correction_mode("training", "fp32") == "training" and correction_mode("training", None) == "training"
    assert correction_mode("training", "bf16-mixed") == "training|bf16-mixed"
    from gpurec.model.network import MIN_PRECISION_NETWORKS

    rng = np.random.default_rng(3)
    n = 2 * MIN_PRECISION_NETWORKS
    t = rng.uniform(1, 5, 4 * n)
    offsets = np.arange(0, 4 * n + 1, 4)
    sums = aggregate(t, np.full(len(t), 300.0), offsets, 0.02)
    measured_w = np.full(n, 300.0)
    modes = np.array(["training"] * (n // 2) + ["training|bf16-mixed"] * (n - n // 2))
    fp32 = modes == "training"
    fp32_only = fit_correction(sums.take(fp32), np.full(n // 2, "H100"), modes[fp32], sums.sum_time_ms[fp32] * 1.1,
                               measured_w[fp32], "scale", "none", specific=())
    measured = np.where(modes == "training", 1.1, 1.6) * sums.sum_time_ms
    both = fit_correction(sums, np.full(n, "H100"), modes, measured, measured_w, "scale", "none", specific=())
    assert both.time_coef["*|training"]["scale"] == pytest.approx(1.1, rel=0.02)
    assert both.time_coef["*|training|bf16-mixed"]["scale"] == pytest.approx(1.6, rel=0.02)
    assert fp32_only.time_coef["*|training"]["scale"] == pytest.approx(both.time_coef["*|training"]["scale"])
    one = sums.take([0])
    assert both.apply(one, "H100", "training|bf16-mixed")[2] == "*|training|bf16-mixed"
    assert Correction.identity().apply(one, "H100", "training|bf16-mixed")[2] == "identity"
    assert both.apply(one, "H100", "training|fp16-mixed")[2] == "*|training|bf16-mixed"  # its sibling's
    few = np.array(["training"] * (n - 5) + ["training|bf16"] * 5)
    sparse = fit_correction(sums, np.full(n, "H100"), few, measured, measured_w, "scale", "none", specific=())
    assert "*|training|bf16" not in sparse.time_coef  # 5 networks are too few for a correction of its own
    assert sparse.apply(one, "H100", "training|bf16")[2] == "*|training"
    # a correction fitted before the minimum (an earlier model file) is passed over the same way
    old = Correction("scale", "none", {"*|training": {"scale": 1.0}, "*|training|bf16": {"scale": 2.0}},
                     {"*|training": {}, "*|training|bf16": {}}, {"*|training": 50, "*|training|bf16": 12})
    assert old.apply(one, "H100", "training|bf16")[2] == "*|training"
    t_each, _, keys = both.apply_each(sums.take([0, 1]), "H100", ["training", "training|bf16-mixed"])
    assert keys == ["*|training", "*|training|bf16-mixed"]
    assert t_each[1] / sums.sum_time_ms[1] == pytest.approx(both.time_coef["*|training|bf16-mixed"]["scale"])


def test_package_imports_lazily() -> None:
    code = ("import sys, gpurec, gpurec.model; "
            "bad = [m for m in ('xgboost', 'sklearn', 'optuna', 'torch') if m in sys.modules]; "
            "assert not bad, bad; from gpurec.model import train; assert callable(train)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent,
                   env={"PYTHONPATH": str(Path(__file__).parent.parent), "PATH": "/usr/bin:/bin"})


# -- training and persistence -------------------------------------------------------------------


def test_training_report_and_files(trained: tuple[Path, dict]) -> None:
    out, report = trained
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["gpus_measured"]) == {H100, "NVIDIA A100-SXM4-80GB"}
    # boosters in XGBoost's format, never pickles
    files = sorted(p.name for p in out.iterdir())
    assert all(f.endswith((".ubj", ".json", ".parquet")) for f in files), files
    assert {"time", "power"} <= set(manifest["boosters"])
    assert manifest["routes"]["power"]["training"] == "training"  # enough rows: its own booster
    assert manifest["routes"]["power"]["inference"] == "all"  # too few: pooled with mode as a feature
    # time: one booster per mode and kind group (gpurec.model.config.TIME_KIND_GROUPS)
    assert manifest["routes"]["time"]["training"] == {"conv_bn": "training_conv_bn", "rest": "training_rest"}
    assert manifest["routes"]["time"]["inference"] == {"conv_bn": "all", "rest": "all"}
    for key in ("feature_names", "kind_categories", "training_data", "versions", "cv", "network_correction"):
        assert manifest[key]
    assert len(manifest["training_data"]["sha256"]) == 64
    assert {"xgboost", "sklearn", "torch", "gpurec"} <= set(manifest["versions"])
    # all three validations, with baselines beside XGBoost
    for kind in ("xgboost", "random_forest", "roofline_linear"):
        # scored on the rows that launch a kernel; the kernel-free ones (flatten) are counted apart
        free = report["grouped_kfold"][kind]["kernel_free_rows"]["n"]
        assert report["grouped_kfold"][kind]["overall"]["n"] + free == report["rows"]["operations"]
        assert "per_op" in report["leave_one_family_out"][kind]
    assert report["leave_one_gpu_out"]["available"] is True
    assert "network_corrected" in report["leave_one_family_out"]["xgboost"]
    assert set(report["network_correction"]["mape_by_variant"]["time"]) >= {"none", "scale", "full"}
    assert report["test_set"]["available"] and report["test_set"]["archs"] == ["mnasnet0_5"]
    # the test architecture never reaches training
    assert report["dropped_rows"]["test-architecture set (never trained on)"] == 0


def test_one_gpu_reports_leave_one_gpu_out_unavailable(tmp_path: Path) -> None:
    from gpurec.model import train

    data = tmp_path / "data"
    data.mkdir()
    shutil.copytree(FIXTURE / "h100", data / "h100")
    report = train(data, tmp_path / "m", log=lambda s: None, baselines=False,
                   **{**QUICK, "tune_trials": 0, "cache_dir": str(tmp_path / "cache")})
    assert report["leave_one_gpu_out"]["available"] is False
    assert "one GPU measured" in report["leave_one_gpu_out"]["reason"]


def test_roundtrip_matches_training_path(trained: tuple[Path, dict], predictor) -> None:
    """The saved and reloaded model reproduces the test-set estimate computed during training."""
    _, report = trained
    rec = next(r for r in report["test_set"]["records"] if r["gpu"] == H100)
    est = predictor.predict("mnasnet0_5", (8, 3, 224, 224), mode=rec["mode"], gpu=H100)
    assert est.gpu_time_ms == pytest.approx(rec["pred_time_ms"], rel=1e-4)
    assert est.gpu_power_w == pytest.approx(rec["pred_power_w"], rel=1e-4)
    assert est.op_sum_time_ms == pytest.approx(rec["sum_time_ms"], rel=1e-4)


def test_tampered_schema_or_features_refused(trained: tuple[Path, dict], tmp_path: Path) -> None:
    from gpurec.model import IncompatibleModel, load_predictor
    from gpurec.model.persist import write_manifest

    for change in ("schema", "feature", "booster"):
        d = _copy(trained[0], tmp_path / change)
        m = json.loads((d / "manifest.json").read_text())
        if change == "schema":
            m["schema_version"] = 999
        elif change == "feature":
            m["feature_names"] = [*m["feature_names"][:-1], "no_such_feature"]
        else:
            name = m["boosters"]["time"]["training"]["conv_bn"]
            (d / name).write_bytes((d / name).read_bytes()[:-10] + b"0123456789")
        if change != "booster":
            write_manifest(d, m)  # re-sealed, so the check under test is the one that refuses
        with pytest.raises(IncompatibleModel, match={"schema": "schema_version", "feature": "feature mismatch",
                                                     "booster": "differs"}[change]):
            load_predictor(d, check_data=False)
    d = _copy(trained[0], tmp_path / "op_feature")
    m = json.loads((d / "manifest.json").read_text())
    m["feature_config"]["op_features"] = [*m["feature_config"]["op_features"], "gone_feature"]
    write_manifest(d, m)
    with pytest.raises(IncompatibleModel, match="cannot compute"):
        load_predictor(d, check_data=False)


def test_version_and_data_differences_warn(trained: tuple[Path, dict], tmp_path: Path) -> None:
    from gpurec.model import ModelWarning, load_predictor
    from gpurec.model.persist import write_manifest

    d = _copy(trained[0], tmp_path / "versions")
    m = json.loads((d / "manifest.json").read_text())
    m["versions"]["xgboost"] = "0.0.1"
    m["training_data"]["sha256"] = "0" * 64
    write_manifest(d, m)
    with pytest.warns(ModelWarning) as rec:
        p = load_predictor(d, data_root=FIXTURE, check_data=True)
    text = " ".join(str(w.message) for w in rec)
    assert "xgboost" in text and "data" in text
    assert p.predict("alexnet", (1, 3, 224, 224), gpu="H100").time_ms > 0


def test_missing_model_dir_says_how_to_train(tmp_path: Path) -> None:
    from gpurec.model import load_predictor

    with pytest.raises(FileNotFoundError, match="gpurec train"):
        load_predictor(tmp_path / "nowhere")


# -- the API contract ---------------------------------------------------------------------------


def test_predict_contract(predictor) -> None:
    est = predictor.predict("squeezenet1_0", input_shape=(1, 3, 224, 224), mode="inference", gpu="H100")
    assert est.measured_gpu is True and est.gpu == H100
    assert est.time_ms > 0 and est.power_w > 0
    assert est.energy_mj == pytest.approx(est.time_ms * est.power_w)
    assert est.low.time_ms <= est.time_ms <= est.high.time_ms
    assert est.low.energy_mj <= est.energy_mj <= est.high.energy_mj
    assert est.time_low_ms == est.low.time_ms and est.energy_high_mj == est.high.energy_mj
    per_op = est.per_op
    assert len(per_op) == est.n_ops > 10
    for col in ("name", "kind", "time_ms", "power_w", "energy_mj", "time_share", "energy_share", "flops_share",
                "covered", "uncovered_reason"):
        assert col in per_op
    assert per_op["time_share"].sum() == pytest.approx(1.0)
    assert per_op["time_ms"].sum() == pytest.approx(est.op_sum_time_ms)
    assert 0.0 <= est.coverage <= 1.0
    assert str(est).startswith("squeezenet1_0")


def test_gpus_and_extrapolation(predictor) -> None:
    gpus = {g.nvml_name: g for g in predictor.gpus}
    assert gpus[H100].measured and gpus["NVIDIA A100-SXM4-80GB"].measured
    assert not gpus["NVIDIA L4"].measured
    assert len(gpus) >= 10
    a = predictor.predict("alexnet", (1, 3, 224, 224), mode="training", gpu="L4")
    b = predictor.predict("alexnet", (1, 3, 224, 224), mode="training", gpu="nvidia h100 80gb hbm3")
    assert a.measured_gpu is False and b.measured_gpu is True
    # measured GPUs carry the band of their own networks; extrapolated estimates that band compounded
    # with the cross-GPU validation's (leave one GPU out), so never a narrower one
    unc = predictor.manifest["uncertainty"]
    measured_hi, cross_hi = unc["measured_gpu"]["time_ratio"][1], unc["unmeasured_gpu"]["time_ratio"][1]
    assert b.gpu_time_high_ms / b.gpu_time_ms == pytest.approx(measured_hi)
    assert a.gpu_time_high_ms / a.gpu_time_ms == pytest.approx(math.exp(math.hypot(math.log(measured_hi),
                                                                                   math.log(cross_hi))))
    assert unc["unmeasured_gpu"]["time_ratio"] != unc["measured_gpu"]["time_ratio"]


def test_unknown_gpu_lists_choices(predictor) -> None:
    from gpurec.catalog import UnknownGPU

    with pytest.raises(UnknownGPU, match="Valid choices") as info:
        predictor.predict("alexnet", (1, 3, 224, 224), gpu="Voodoo5")
    assert isinstance(info.value, ValueError)
    with pytest.raises(ValueError, match="mode"):
        predictor.predict("alexnet", (1, 3, 224, 224), mode="serving")


def test_nn_module_and_uncovered_kind(predictor) -> None:
    """A module with an operation kind absent from training: predicted, flagged, never dropped."""
    from torch import nn

    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.Tanh(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    assert "Tanh" not in predictor.builder.kinds
    est = predictor.predict(net, (1, 3, 32, 32), mode="inference", gpu="H100")
    assert est.model == "Sequential"
    unc = est.uncovered
    assert "Tanh" in set(unc["kind"])
    row = unc[unc["kind"] == "Tanh"].iloc[0]
    assert "not in training data" in row["uncovered_reason"]
    assert 0 < row["flops_share"] < 1
    flagged = est.per_op[~est.per_op["covered"]]
    assert set(flagged["kind"]) == set(unc["kind"])
    assert len(est.per_op) == est.n_ops  # uncovered operations still counted
    assert est.coverage < 1.0
    # a second, structurally identical instance hits the operation cache
    n = len(predictor._cache)
    again = predictor.predict(type(net)(*[type(m)(**_kw(m)) for m in net]), (1, 3, 32, 32), gpu="H100")
    assert len(predictor._cache) == n and again.time_ms == pytest.approx(est.time_ms)


def _kw(m):  # rebuild a layer of the Sequential above with the same settings
    from torch import nn

    if isinstance(m, nn.Conv2d):
        return {"in_channels": m.in_channels, "out_channels": m.out_channels, "kernel_size": m.kernel_size,
                "padding": m.padding}
    if isinstance(m, nn.Linear):
        return {"in_features": m.in_features, "out_features": m.out_features}
    if isinstance(m, nn.AdaptiveAvgPool2d):
        return {"output_size": m.output_size}
    return {}


def test_predict_many_matches_single(predictor) -> None:
    cands = [("alexnet", (1, 3, 224, 224)), ("squeezenet1_0", (2, 3, 224, 224)), "alexnet"]
    many = predictor.predict_many(cands, mode="training", gpu="A100-80GB")
    assert len(many) == 3
    single = predictor.predict("squeezenet1_0", (2, 3, 224, 224), mode="training", gpu="A100-80GB")
    assert many[1].time_ms == pytest.approx(single.time_ms, rel=1e-6)
    assert many[1].energy_mj == pytest.approx(single.energy_mj, rel=1e-6)
    assert many[0].time_ms == pytest.approx(many[2].time_ms)  # default shape is (1, 3, 224, 224)


def test_train_and_predict_share_features(predictor) -> None:
    """A measured row's feature row equals the one prediction builds for the same operation."""
    import pandas as pd

    from gpurec.model.features import OpBlock, SetExtractor, hardware_matrix, operations_of_rows
    from gpurec.ops import extract_operations

    df = pd.read_parquet(FIXTURE / "h100" / "operations.parquet").iloc[:5]
    rows = operations_of_rows(df, SetExtractor())
    a = predictor.builder.build(rows.block, hardware_matrix(df["gpu"].tolist())).X
    r = df.iloc[0]
    from gpurec.sets import ModelInputSet

    s = ModelInputSet.parse(r["set_key"])
    op = next(o for o in extract_operations(s.arch, s.input_shape, mode=r["mode"]) if o.signature == r["op_signature"])
    b = predictor.builder.build(OpBlock.from_operations([op], r["mode"]), hardware_matrix([H100])).X
    assert np.array_equal(a[0], b[0])


def test_measured_operations_replace_predictions(trained: tuple[Path, dict]) -> None:
    """On a measured GPU, an operation measured (in any model) takes its measured values."""
    import pandas as pd

    from gpurec.model import load_predictor

    ops = pd.read_parquet(FIXTURE / "h100" / "operations.parquet")
    row = ops[(ops["set_key"] == "googlenet:b1:r224") & (ops["mode"] == "training")].iloc[0]
    with_lookup = load_predictor(trained[0], check_data=False)
    models_only = load_predictor(trained[0], check_data=False, use_measured=False)
    a = with_lookup.predict("googlenet", (1, 3, 224, 224), mode="training", gpu="H100")
    b = models_only.predict("googlenet", (1, 3, 224, 224), mode="training", gpu="H100")
    hit = a.per_op[a.per_op["signature"] == row["op_signature"]]
    assert len(hit) >= 1 and (hit["source"] == "measured").all()
    assert hit["time_ms"].iloc[0] == pytest.approx(row["time_ms"])
    assert hit["power_w"].iloc[0] == pytest.approx(row["power_w"])
    assert a.measured_share > 0 and b.measured_share == 0
    assert (b.per_op["source"] == "model").all()
    # measurements are per GPU: an unmeasured GPU gets predictions only
    c = with_lookup.predict("googlenet", (1, 3, 224, 224), mode="training", gpu="L4")
    assert c.measured_share == 0


def test_optional_extra_columns(tmp_path: Path) -> None:
    """Measured extra columns (e.g. ncu utilisations) are used when configured and present; unknown at predict."""
    import pandas as pd

    from gpurec.model import load_predictor, train
    from gpurec.model.features import FeatureConfig
    from gpurec.model.fitting.training import TrainConfig

    data = tmp_path / "data" / "h100"
    data.mkdir(parents=True)
    ops = pd.read_parquet(FIXTURE / "h100" / "operations.parquet")
    ops["smsp_inst_util"] = np.linspace(0.1, 0.9, len(ops))
    ops.to_parquet(data / "operations.parquet", index=False)
    shutil.copy(FIXTURE / "h100" / "networks.parquet", data / "networks.parquet")
    cfg = TrainConfig(feature=FeatureConfig(extra_columns=("smsp_*_util", "tc_*_util")))
    train(data.parent, tmp_path / "m", config=cfg, log=lambda s: None, baselines=False,
          **{**QUICK, "tune_trials": 0})
    m = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert m["extra_columns"] == ["smsp_inst_util"]  # tc_*_util absent: skipped, not an error
    assert m["feature_names"][-1] == "extra:smsp_inst_util"
    est = load_predictor(tmp_path / "m", check_data=False).predict("alexnet", (1, 3, 224, 224), gpu="H100")
    assert np.isfinite(est.time_ms)


def test_gpu_with_network_rows_only(tmp_path: Path) -> None:
    """A GPU measured only as whole networks: cross-GPU validation and a GPU-specific network correction."""
    from gpurec.model import load_predictor, train

    data = tmp_path / "data"
    shutil.copytree(FIXTURE / "h100", data / "h100")
    (data / "a100").mkdir()
    shutil.copy(FIXTURE / "a100_synthetic" / "networks.parquet", data / "a100" / "networks.parquet")
    report = train(data, tmp_path / "m", log=lambda s: None, baselines=False, min_networks_gpu=3,
                   **{**QUICK, "tune_trials": 0})
    logo = report["leave_one_gpu_out"]
    a100 = "NVIDIA A100-SXM4-80GB"
    assert logo["available"] and "network_train_archs_corrected" in logo["gpus"][a100]["xgboost"]
    p = load_predictor(tmp_path / "m", check_data=False)
    entry = next(g for g in p.gpus if g.nvml_name == a100)
    assert entry.networks_measured and not entry.measured
    est = p.predict("googlenet", (1, 3, 224, 224), mode="training", gpu=a100)
    assert est.correction == f"{a100}|training" and not est.measured_gpu
    # the H100 has operation rows: the pooled correction, never one of its own (per_gpu_correction)
    keys = set(json.loads((tmp_path / "m" / "manifest.json").read_text())["network_correction"]["time_coef"])
    assert not any(k.startswith(H100) for k in keys) and any(k.startswith("*|") for k in keys)
    assert p.predict("googlenet", (1, 3, 224, 224), mode="training", gpu=H100).correction == "*|training"


def test_predicting_and_recommending_never_load_gpu_side_code(trained: tuple[Path, dict]) -> None:
    """A user without a GPU loads a predictor and ranks GPUs without collection, NVML or
    calibration code (a fresh interpreter, so other tests' imports cannot hide a leak)."""
    code = (
        "import sys, gpurec\n"
        f"p = gpurec.load_predictor({str(trained[0])!r}, data_root={str(FIXTURE)!r}, check_data=True)\n"
        "p.predict('resnet18', input_shape=(2, 3, 64, 64), mode='training', gpu='H100')\n"
        "gpurec.recommend('resnet18', (2, 3, 64, 64), objective='edp', predictor=p)\n"
        "gpurec.recommend('alexnet', (1, 3, 224, 224), predictor=p)\n"
        "print(sorted(m for m in sys.modules if m.startswith('gpurec')))\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[:2] in "
        "(['gpurec', 'collect'], ['gpurec', 'device'], ['gpurec', 'calibrate']))\n"
        "sys.exit(f'GPU-side modules loaded: {bad}' if bad else 0)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).parent.parent)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "'gpurec.model.predictor'" in r.stdout and "'gpurec.recommend'" in r.stdout  # the check saw them load


def test_host_band_is_kept_per_bound() -> None:
    """GPU-bound steps hardly move with the host: their eager band must not take the
    host-bound steps' spread."""
    import numpy as np

    from gpurec.model.config import TrainConfig
    from gpurec.model.fitting.training import _host_band

    rng = np.random.default_rng(0)
    gpu = 1.0 + rng.normal(0, 0.01, 40)
    host = np.exp(rng.normal(0, 0.4, 40))
    band = _host_band((np.concatenate([gpu, host]), np.array(["gpu"] * 40 + ["host"] * 40, dtype=object)),
                      TrainConfig())
    g, h = band["by_bound"]["gpu"]["ratio"], band["by_bound"]["host"]["ratio"]
    assert g[1] - g[0] < 0.1 < h[1] - h[0]
    assert h[0] <= band["ratio"][0] <= band["ratio"][1] <= h[1] and band["n"] == 80
    few = _host_band((np.ones(3), np.array(["gpu"] * 3, dtype=object)), TrainConfig())
    assert few["ratio"] == [1.0, 1.0] and "by_bound" not in few


def test_reused_tuning_takes_each_gpu_target_with_its_parameters(tmp_path: Path) -> None:
    """`gpurec train --reuse-tuning REPORT`: the earlier run's tuned parameters and rounds per GPU
    target; a target without them (not tuned) is tuned again."""
    import json

    from gpurec.model.fitting.training import _reused_tuning

    rep = {"tuning": {"time": {"best_params": {"max_depth": 8}, "rounds": 600, "trials": 20},
                      "power": {"trials": 0}, "host": {"best_params": {"max_depth": 3}, "rounds": 5}}}
    (tmp_path / "report.json").write_text(json.dumps(rep))
    got = _reused_tuning(str(tmp_path / "report.json"))
    assert set(got) == {"time"} and got["time"]["best_params"] == {"max_depth": 8} and got["time"]["rounds"] == 600


# The training half of gpurec.model: loading a predictor and predicting must load none of it.
TRAINING_MODULES = ("gpurec.model.fitting",)


def test_load_and_predict_load_no_training_module_and_no_optuna(trained: tuple[Path, dict]) -> None:
    """The default load does not hash the dataset, and neither it nor a prediction imports the
    training half or optuna (a fresh interpreter, so other tests' imports cannot hide a leak)."""
    code = (
        "import sys, gpurec\n"
        f"p = gpurec.load_predictor({str(trained[0])!r}, data_root={str(FIXTURE)!r})\n"
        "p.predict('resnet18', input_shape=(2, 3, 64, 64), mode='training', gpu='H100')\n"
        "p.predict_many([('alexnet', (1, 3, 224, 224))], gpu='H100')\n"
        f"bad = sorted(m for m in sys.modules if m.startswith({TRAINING_MODULES!r}) or m.split('.')[0] == 'optuna')\n"
        "print(sorted(m for m in sys.modules if m.startswith('gpurec.model')))\n"
        "sys.exit(f'training modules loaded: {bad}' if bad else 0)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).parent.parent)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "'gpurec.model.predictor'" in r.stdout  # the check saw the prediction half load


def test_models_check_compares_the_models_with_the_data(trained: tuple[Path, dict], tmp_path: Path) -> None:
    from typer.testing import CliRunner

    import cli
    from gpurec.model.fitting.data import check_models
    from gpurec.model.persist import REFRESH_KEY, write_manifest

    res = check_models(trained[0], FIXTURE)
    assert res["match"] and res["data_sha256"] == res["model_data_sha256"]
    out = CliRunner().invoke(cli.app, ["models", "check", "--models", str(trained[0]), "--data", str(FIXTURE)])
    assert out.exit_code == 0 and "the same data" in out.output
    d = _copy(trained[0], tmp_path / "other")
    m = json.loads((d / "manifest.json").read_text())
    m["training_data"]["sha256"] = "0" * 64
    write_manifest(d, m)
    assert not check_models(d, FIXTURE)["match"]
    out = CliRunner().invoke(cli.app, ["models", "check", "--models", str(d), "--data", str(FIXTURE), "--format", "json"])
    assert out.exit_code == 1 and json.loads(out.output)["match"] is False
    assert "lookup_refreshed" not in json.loads(out.output)
    # a lookup rebuilt from the data on disk (gpurec tools refresh-lookup) says so; from other data, how to rebuild it
    for sha, says in ((res["data_sha256"], "from the data on disk"), ("1" * 64, "refresh-lookup")):
        m = json.loads((d / "manifest.json").read_text())
        write_manifest(d, {**m, REFRESH_KEY: {"refreshed": "2026-12-06T00:00:00+00:00", "data_sha256": sha}})
        assert check_models(d, FIXTURE)["lookup_matches_data"] is (sha == res["data_sha256"])
        out = CliRunner().invoke(cli.app, ["models", "check", "--models", str(d), "--data", str(FIXTURE)])
        assert out.exit_code == 1 and says in out.output


def test_regressors_follow_the_sklearn_estimator_contract() -> None:
    from sklearn.base import clone

    from gpurec.model.regressors import ForestModel, RooflineLinearModel, Routed, XGBModel

    rng = np.random.default_rng(0)
    X, margin = rng.random((60, 3)), np.zeros(60)
    y = X @ np.array([1.0, -0.5, 0.2])
    xgb = XGBModel({"max_depth": 3}, num_rounds=5, seed=1, nthread=1).fit(X, y, margin)
    c = clone(xgb)
    assert c is not xgb and c.get_params() == xgb.get_params() and c.booster_ is None  # unfitted copy
    assert c.params is not xgb.params  # parameters copied, not shared
    assert c.set_params(num_rounds=7, seed=3) is c and (c.num_rounds, c.seed) == (7, 3)
    assert c.fit(X, y, margin).predict(X[:2], margin[:2]).shape == (2,)
    with pytest.raises(ValueError, match="no parameter 'depth'"):
        c.set_params(depth=3)
    forest = clone(ForestModel(n_estimators=5, seed=2, n_jobs=1))
    assert forest.get_params() == {"n_estimators": 5, "seed": 2, "n_jobs": 1}
    assert clone(RooflineLinearModel()).get_params() == {}
    routed = clone(Routed(lambda: XGBModel(num_rounds=3), min_rows=10))
    assert routed.min_rows == 10 and routed.models_ == {}


def test_correction_variant_is_chosen_per_serving_mode() -> None:
    """fp32 networks that a scale alone corrects keep that variant even when bf16-mixed networks
    need an intercept as well; fp16-mixed networks, too few for their own, are scored with (and
    served by) bf16-mixed's correction."""
    from gpurec.model.network import MIN_PRECISION_NETWORKS, aggregate, correction_cv, fit_correction

    rng = np.random.default_rng(5)
    n_fp32, n_bf16, n_fp16 = 40, MIN_PRECISION_NETWORKS + 10, 6  # >= the minimum in every fold too
    n = n_fp32 + n_bf16 + n_fp16
    t = rng.uniform(1, 5, 4 * n)
    sums = aggregate(t, np.full(len(t), 300.0), np.arange(0, 4 * n + 1, 4), 0.02)
    modes = np.array(["training"] * n_fp32 + ["training|bf16-mixed"] * n_bf16 + ["training|fp16-mixed"] * n_fp16)
    measured = np.where(modes == "training", 1.2 * sums.sum_time_ms, 1.5 * sums.sum_time_ms + 2.0)
    measured *= 1 + 0.002 * rng.standard_normal(n)
    gpus, power = np.full(n, "H100"), np.full(n, 300.0)
    cv = correction_cv(sums, gpus, modes, np.arange(n) % 7, measured, power, specific=())
    assert cv["chosen"]["time"] == {"training": "scale", "training|bf16-mixed": "scale+intercept"}
    assert cv["by_mode"]["training|bf16-mixed"]["n"] == n_bf16 + n_fp16
    assert np.mean(np.abs(cv["oof_time_ms"] / measured - 1)) < 0.01
    c = fit_correction(sums, gpus, modes, measured, power, cv["chosen"]["time"], cv["chosen"]["power"], specific=())
    assert c.time_coef["*|training"]["intercept_ms"] == 0.0
    assert c.time_coef["*|training|bf16-mixed"]["intercept_ms"] == pytest.approx(2.0, abs=0.5)  # ridge-shrunk
    assert c.apply(sums.take([n - 1]), "H100", "training|fp16-mixed")[2] == "*|training|bf16-mixed"


def test_networks_without_recurrent_layers_get_a_time_correction_of_their_own() -> None:
    """Recurrent networks whose sums miss by a large fixed amount (the held-out recurrent families)
    no longer lay that amount on every other network: the networks without recurrent layers choose
    and fit their own time variant on themselves alone, their out-of-fold times are that variant's,
    and the fitted correction applies it to them only; sums that do not know their recurrent layers,
    and model files without the coefficients, keep the one correction for all."""
    from gpurec.model.network import POWER_CLASSES, Correction, aggregate, correction_cv, fit_correction

    rng = np.random.default_rng(7)
    n_rnn, n_cnn = 60, 20
    n = n_rnn + n_cnn
    t = rng.uniform(0.05, 2.0, 4 * n)
    classes = np.zeros(4 * n, dtype=np.int64)
    classes[: 4 * n_rnn: 4] = POWER_CLASSES.index("recurrent")  # one recurrent layer in each recurrent network
    sums = aggregate(t, np.full(len(t), 300.0), np.arange(0, 4 * n + 1, 4), 0.02, None, classes, 70.0, 700.0)
    rnn = np.arange(n) < n_rnn
    assert sums.without_recurrent.tolist() == (~rnn).tolist()
    measured = np.where(rnn, 1.1 * sums.sum_time_ms + 1.5, 0.95 * sums.sum_time_ms)
    measured *= 1 + 0.002 * rng.standard_normal(n)
    gpus, modes, power = np.full(n, "H100"), np.full(n, "inference"), np.full(n, 300.0)
    cv = correction_cv(sums, gpus, modes, np.arange(n) % 6, measured, power, specific=())
    assert cv["chosen"]["nonrecurrent_time"] == {"inference": "scale"}
    assert np.mean(np.abs(cv["oof_time_ms"][~rnn] / measured[~rnn] - 1)) < 0.01
    c = fit_correction(sums, gpus, modes, measured, power, "scale+intercept", "none", specific=(),
                       nonrecurrent_time_variant=cv["chosen"]["nonrecurrent_time"])
    assert c.nonrecurrent_time_coef["*|inference"]["intercept_ms"] == 0.0
    t_net = c.apply(sums, "H100", "inference")[0]
    assert np.mean(np.abs(t_net[~rnn] / measured[~rnn] - 1)) < 0.01
    back = Correction.from_dict(c.as_dict())
    assert np.allclose(back.apply(sums, "H100", "inference")[0], t_net)
    one = Correction.from_dict({k: v for k, v in c.as_dict().items() if not k.startswith("nonrecurrent")})
    unknown = aggregate(t, np.full(len(t), 300.0), np.arange(0, 4 * n + 1, 4), 0.02)  # no power classes
    assert np.allclose(one.apply(sums, "H100", "inference")[0], c.apply(unknown, "H100", "inference")[0])
    mixed = one.apply(sums, "H100", "inference")[0]  # one correction fitted on every network
    assert np.mean(np.abs(mixed[~rnn] / measured[~rnn] - 1)) > 0.05


def test_per_operation_scores_leave_kernel_free_rows_out() -> None:
    """A view's measured time is the timer's floor and the predictor gives it no GPU time: the
    per-operation scores keep to rows that launch a kernel and count the others apart."""
    from types import SimpleNamespace

    import pandas as pd

    from gpurec.model.fitting.validation import kernel_free_summary, launching_rows

    ops = pd.DataFrame({"_t_gpu": [0.5, 0.00002, 0.2, 0.00004]})
    p = SimpleNamespace(ops=ops, kernel_free=np.array([False, True, False, True]))
    assert launching_rows(p).tolist() == [True, False, True, False]
    assert kernel_free_summary(p) == {"n": 2, "median_measured_ms": pytest.approx(0.00003)}
    assert kernel_free_summary(p, np.array([0, 2])) == {"n": 0, "median_measured_ms": None}
    assert kernel_free_summary(p, np.array([2, 3]))["n"] == 1
    unknown = SimpleNamespace(ops=ops, kernel_free=None)  # data prepared before the flag: every row scored
    assert launching_rows(unknown).all()


def test_the_anchored_gpus_take_the_same_correction_for_networks_without_recurrent_layers() -> None:
    """A GPU without measurements takes the anchor's network correction as a factor, so the
    anchor's sums must know which networks have recurrent layers: a correction of their own for
    the others moves the H100 and an extrapolated A100 by the same factor."""
    from torch import nn

    import gpurec

    p = gpurec.load_predictor()
    net = nn.Sequential(nn.Conv2d(3, 24, 3, padding=1), nn.ReLU(), nn.Conv2d(24, 40, 3, stride=2), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(40, 7))
    base = p.correction.time_coef["*|inference"]
    saved = p.correction.nonrecurrent_time_coef, p.correction.nonrecurrent_time_floor_ms
    floor = {"*|inference": p.correction.floor_of("*|inference")}
    try:
        p.correction.nonrecurrent_time_coef, p.correction.nonrecurrent_time_floor_ms = {"*|inference": base}, floor
        before = [p.predict(net, (16, 3, 48, 48), gpu=g).gpu_time_ms for g in ("H100", "A100-PCIe-40GB")]
        p.correction.nonrecurrent_time_coef = {"*|inference": {**base, "scale": 2 * base["scale"],
                                                               "intercept_ms": 2 * base["intercept_ms"]}}
        after = [p.predict(net, (16, 3, 48, 48), gpu=g).gpu_time_ms for g in ("H100", "A100-PCIe-40GB")]
    finally:
        p.correction.nonrecurrent_time_coef, p.correction.nonrecurrent_time_floor_ms = saved
    assert after[0] / before[0] == pytest.approx(2.0, rel=0.02)  # no operation of it was measured
    assert after[1] / before[1] == pytest.approx(after[0] / before[0], rel=1e-6)


def test_models_trained_before_get_the_nonrecurrent_correction_from_their_own_report() -> None:
    """gpurec tools correction-nonrecurrent chooses and fits the correction of the networks
    without recurrent layers on the report's leave-one-family-out records, as training does:
    recurrent networks (gpurec.seqmodels' recurrent sets) are left out of it."""
    from gpurec.tools.correction import nonrecurrent_from_report

    rng = np.random.default_rng(3)
    fams = ["resnet", "vgg", "mobilenet", "densenet", "lstm", "gru"]
    arch = {"resnet": "resnet50", "vgg": "vgg16", "mobilenet": "mobilenet_v2", "densenet": "densenet121",
            "lstm": "lstm_lm_2x512", "gru": "gru_lm_2x256"}
    records = []
    for i in range(60):
        fam, s = fams[i % 6], float(rng.uniform(0.2, 5.0))
        n = int(rng.integers(20, 200))
        measured = 1.2 * s + 1.0 if fam in ("lstm", "gru") else 0.9 * s + 0.001 * n
        records.append({"mode": "inference", "family": fam, "set_key": f"{arch[fam]}:b8:r224", "sum_time_ms": s,
                        "sum_power_w": 300.0, "n_ops": n, "n_small": 0, "small_time_ms": 0.0,
                        "measured_time_ms": measured * (1 + 0.001 * rng.standard_normal()),
                        "measured_power_w": 300.0})
    fit = nonrecurrent_from_report({"leave_one_family_out": {"xgboost": {"network_records": records}},
                                    "config": {"correction_ridge": 0.1}})
    assert fit["variant"] == {"inference": "scale+intercept+n_ops"}
    coef = fit["coef"]["*|inference"]
    assert coef["scale"] == pytest.approx(0.9, abs=0.03) and coef["per_op_ms"] == pytest.approx(0.001, abs=3e-4)
    assert fit["mape_by_mode"]["inference"]["n"] == 40  # the 20 recurrent networks are left out
    with pytest.raises(ValueError, match="no leave-one-family-out network records"):
        nonrecurrent_from_report({})
