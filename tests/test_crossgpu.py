"""Cross-GPU operation time model: monotone in the specifications by construction, fit recovers a
known model, and the predictor never puts an H200 behind an H100."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpurec.catalog import load_catalog
from gpurec.model.crossgpu import (
    CROSSGPU_FILE,
    GPU_COLUMNS,
    CrossGPUModel,
    CrossGPUModelError,
    design_names,
    op_table,
    spec_row,
    wave_factor,
)
from gpurec.model.features import KIND_GROUPS

ROOT = Path(__file__).resolve().parents[1]


def _random_ops(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    groups = rng.choice(KIND_GROUPS, n)
    flops = np.where(rng.random(n) < 0.2, 0.0, 10 ** rng.uniform(3, 13, n))
    nbytes = 10 ** rng.uniform(2, 10, n)
    out = 10 ** rng.uniform(0, 8, n)
    return op_table(flops, nbytes, out, list(groups), rng.random(n) < 0.5, rng.random(n) < 0.5)


def _random_model(seed: int) -> CrossGPUModel:
    rng = np.random.default_rng(seed)
    d = len(design_names())
    return CrossGPUModel(*(rng.normal(0, 2, d) for _ in range(5)), sm_bytes_per_clock=float(rng.uniform(1, 200)),
                         watts_per_tflops=float(rng.uniform(1, 30)),
                         l2_weight=float(rng.uniform(0, 2)), k=float(rng.uniform(0.6, 6)),
                         wave_exponent=float(rng.uniform(0, 1.5)), c0_ms=float(rng.uniform(0, 0.01)), info={})


def _shipped() -> CrossGPUModel | None:
    path = ROOT / "models" / CROSSGPU_FILE
    return CrossGPUModel.from_dict(json.loads(path.read_text())) if path.exists() else None


def _dominating_pairs() -> list[tuple[str, str]]:
    """(worse, better): ``better`` is at least ``worse`` in every specification the model reads."""
    specs = {s.nvml_name: spec_row(s) for s in load_catalog()}
    return [(a, b) for a, b in itertools.permutations(specs, 2) if np.all(specs[b] >= specs[a])]


def test_wave_factor_never_rises_with_more_sms() -> None:
    tiles_out = np.array([1, 7, 100, 132, 133, 1000, 5000, 65536], dtype=float) * 128 * 128
    gemm = np.ones(len(tiles_out))
    prev = wave_factor(tiles_out, gemm, 1)
    assert np.all(prev >= 1.0)
    for sm in range(2, 200):
        cur = wave_factor(tiles_out, gemm, sm)
        assert np.all(cur <= prev + 1e-12), sm
        prev = cur
    assert np.all(wave_factor(tiles_out, np.zeros(len(tiles_out)), 7) == 1.0)  # not GEMM-like: no waves


def test_catalogue_has_dominating_pairs() -> None:
    pairs = _dominating_pairs()
    assert ("NVIDIA H100 80GB HBM3", "NVIDIA H200") in pairs
    assert ("Tesla P100-PCIE-16GB", "Tesla V100-PCIE-32GB") in pairs
    assert ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB") not in pairs
    assert len(pairs) >= 20


@pytest.mark.parametrize("seed", [0, 1, 2, "shipped"])
def test_a_gpu_no_worse_in_any_spec_is_never_slower(seed: int | str) -> None:
    model = _shipped() if seed == "shipped" else _random_model(int(seed))
    if model is None:
        pytest.skip("no shipped cross-GPU model")
    ops = _random_ops(3000, seed=7)
    pred = {g: model.predict_ms(ops, g) for g in {x for p in _dominating_pairs() for x in p}}
    for worse, better in _dominating_pairs():
        bad = pred[better] > pred[worse] * (1 + 1e-9)
        assert not bad.any(), f"{better} predicted slower than {worse} on {int(bad.sum())} operations"


def test_more_of_each_spec_alone_is_never_slower() -> None:
    model = _random_model(3)
    ops = _random_ops(2000, seed=3)
    base = spec_row("NVIDIA A100-SXM4-40GB")
    t0 = model.predict_ms(ops, base)
    for j, name in enumerate(GPU_COLUMNS):
        for scale in (1.01, 1.5, 3.0):
            better = base.copy()
            better[j] *= scale
            assert np.all(model.predict_ms(ops, better) <= t0 * (1 + 1e-9)), name


def test_model_file_refuses_parameters_that_break_monotonicity() -> None:
    d = _random_model(0).to_dict()
    CrossGPUModel.from_dict(d)
    for key in ("l2_weight", "wave_exponent", "c0_ms", "watts_per_tflops", "sm_bytes_per_clock"):
        with pytest.raises(CrossGPUModelError):
            CrossGPUModel.from_dict({**d, key: -0.1})
    with pytest.raises(CrossGPUModelError):
        CrossGPUModel.from_dict({**d, "design": d["design"][:-1]})


def test_fit_recovers_a_known_model() -> None:
    pytest.importorskip("torch")
    from gpurec.model.fitting.crossgpu_fit import CrossTable, fit, predict_rows

    truth = _random_model(5)
    truth.theta_ff *= 0.2
    truth.theta_tc *= 0.2
    truth.theta_m *= 0.2
    truth.theta_s *= 0.2
    truth.theta_p *= 0.2
    gpus = ["Tesla T4", "Tesla V100-PCIE-32GB", "NVIDIA A100-PCIE-40GB", "NVIDIA H100 80GB HBM3"]
    ops = _random_ops(2400, seed=11)
    gpu_of = np.array(gpus * 600)
    specs = np.stack([spec_row(g) for g in gpu_of])
    waves = np.array([wave_factor(ops.raw[i:i + 1, 2], ops.raw[i:i + 1, 3], specs[i, 4])[0] for i in range(len(ops))])
    target = truth.predict_ms_rows(ops, specs, waves)
    groups = [KIND_GROUPS[int(np.argmax(ops.design[i, :len(KIND_GROUPS) * 9:9]))] for i in range(len(ops))]
    frame = pd.DataFrame({"gpu": gpu_of, "group": groups, "target_ms": target, "source": "synthetic"})
    table = CrossTable(frame, ops, specs, waves)
    rows = np.arange(len(frame))
    model = fit(table, rows, max_iter=200)
    err = np.abs(np.log(predict_rows(model, table) / target))
    # a zero-parameter start is off by orders of magnitude; the fit must get close to the truth
    assert np.median(err) < 0.1, np.median(err)


# -- the predictor: the H200 is never behind the H100 -------------------------------------------

NETWORKS = ["vit_b_16", "swin_t", "efficientnet_b0", "resnet50", "mobilenet_v3_small", "convnext_tiny"]


@pytest.fixture(scope="module")
def predictor():
    pytest.importorskip("xgboost")
    if _shipped() is None:
        pytest.skip("no shipped cross-GPU model")
    from gpurec.model import load_predictor

    return load_predictor(check_data=False)


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_h200_never_predicted_more_than_2pct_slower_than_h100(predictor, mode: str) -> None:
    worst = []
    for name in NETWORKS:
        for batch in (1, 8, 64, 256):
            cands = [(name, (batch, 3, 224, 224))]
            a = predictor.predict_many(cands, mode=mode, gpu="H100")[0]
            b = predictor.predict_many(cands, mode=mode, gpu="H200")[0]
            for field in ("time_ms", "gpu_time_ms"):
                worst.append((getattr(b, field) / getattr(a, field), name, batch, field))
    ratio, name, batch, field = max(worst)
    assert ratio <= 1.02, f"{name} b{batch} {mode}: H200 {field} is {ratio:.2f}x the H100's"


def test_gpu_without_host_free_rows_takes_anchor_times_ratio(predictor) -> None:
    assert predictor.cross_anchors == ["NVIDIA H100 80GB HBM3"]
    assert predictor.cross_anchor("H100") is None
    est = predictor.predict("resnet50", (32, 3, 224, 224), "inference", gpu="T4")
    assert "cross-GPU ratio to NVIDIA H100 80GB HBM3" in est.correction
    h100 = predictor.predict("resnet50", (32, 3, 224, 224), "inference", gpu="H100")
    assert "cross-GPU" not in h100.correction
    assert est.gpu_time_ms > 3 * h100.gpu_time_ms  # a T4 is far behind an H100 on a ResNet-50
