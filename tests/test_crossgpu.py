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
    GEMM_TILES,
    GPU_COLUMNS,
    SPEC_EFFICIENCIES,
    SPEC_TERMS,
    CrossGPUModel,
    CrossGPUModelError,
    design_names,
    gemm_tile_work,
    op_table,
    recurrent_reread_bytes,
    same_compute_die,
    spec_row,
    spec_weight_floor,
    transfer_power_w,
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
    gemm_n = np.where(rng.random(n) < 0.5, np.nan, np.ceil(10 ** rng.uniform(0, 4, n)))
    batch = np.ceil(10 ** rng.uniform(0, 2, n))
    return op_table(flops, nbytes, out, list(groups), rng.random(n) < 0.5, rng.random(n) < 0.5, gemm_n=gemm_n,
                    gemm_batch=batch)


def _random_model(seed: int, tiles: bool = True) -> CrossGPUModel:
    """Random parameters within the model file's bounds (tile efficiencies in (0, 1], spec weights at
    or above their floors): what monotonicity must survive."""
    rng = np.random.default_rng(seed)
    d = len(design_names())
    model = CrossGPUModel(*(rng.normal(0, 2, d) for _ in range(6)), sm_bytes_per_clock=float(rng.uniform(1, 200)),
                          watts_per_tflops=float(rng.uniform(1, 30)),
                          l2_weight=float(rng.uniform(0, 2)),
                          wave_exponent=float(rng.uniform(0, 1.5)), c0_ms=float(rng.uniform(0, 0.01)), info={})
    if tiles:
        model.tile_efficiency = rng.uniform(0.05, 1.0, len(GEMM_TILES))
        model.spec_weights = spec_weight_floor()[:, None, :] + rng.exponential(
            0.7, (len(SPEC_EFFICIENCIES), len(KIND_GROUPS), len(SPEC_TERMS)))
    return model


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


def test_tile_padding_is_at_least_one_and_only_matmul_like_operations_are_tiled() -> None:
    ops = _random_ops(400, seed=4)
    tiles = len(GEMM_TILES)
    work = gemm_tile_work(ops.raw)
    assert np.all(work[:, :tiles] >= 1.0) and np.all(work[:, tiles:] >= 0)
    matmul = ops.raw[:, 3] == 1
    assert matmul.any() and (~matmul).any()
    assert np.all(work[~matmul, :tiles] == 1.0) and np.all(work[~matmul, tiles:] == 0.0)  # convs, others: no tiles


def test_tile_padding_counts_partial_tiles_and_tile_traffic() -> None:
    j = GEMM_TILES.index((128, 128))
    # a 100-column output wastes 28 of a 128-wide tile's columns; a 256 x 256 one fills its tiles
    narrow = op_table(np.array([2.0 * 128 * 100 * 64]), np.array([1e6]), np.array([128.0 * 100]), ["matmul"],
                      np.zeros(1), np.zeros(1), gemm_n=np.array([100.0]))
    assert gemm_tile_work(narrow.raw)[0, j] == pytest.approx(128 / 100)
    full = op_table(np.array([2.0 * 256 * 256 * 64]), np.array([1e6]), np.array([256.0 * 256]), ["matmul"],
                    np.zeros(1), np.zeros(1), gemm_n=np.array([256.0]))
    work = gemm_tile_work(full.raw)[0]
    assert work[j] == pytest.approx(1.0)
    # 4 tiles each load (128 + 128) x 64 floats, per useful FLOP
    assert work[len(GEMM_TILES) + j] == pytest.approx(4 * 256 * 64 * 4 / (2.0 * 256 * 256 * 64))


def test_model_file_refuses_spec_weights_below_their_floor() -> None:
    d = _random_model(8).to_dict()
    CrossGPUModel.from_dict(d)
    bad = np.array(d["spec_weights"])
    bad[0, 0, SPEC_TERMS.index("fp32_tflops")] = -1.5  # a higher FP32 peak would lower the rate
    with pytest.raises(CrossGPUModelError):
        CrossGPUModel.from_dict({**d, "spec_weights": bad.tolist()})
    with pytest.raises(CrossGPUModelError):
        CrossGPUModel.from_dict({**d, "tile_efficiency": [1.2] + d["tile_efficiency"][1:]})


def test_earlier_model_file_predicts_as_before_with_the_shape_columns_at_zero() -> None:
    m = _random_model(9, tiles=False)
    d = m.to_dict()
    n_shape = len([x for x in design_names() if x.split(":")[-1].startswith(("log_m", "log_n", "log_k", "log_batch"))])
    for k in ("theta_ff", "theta_tc", "theta_m", "theta_s", "theta_p", "theta_k"):
        d[k] = d[k][:-n_shape]
    old = {**d, "schema": 2, "design": design_names()[:-n_shape]}
    for k in ("tile_efficiency", "gemm_tiles", "spec_terms", "spec_weights"):
        old.pop(k)
    loaded = CrossGPUModel.from_dict(old)
    ops = _random_ops(300, seed=2)
    assert np.allclose(loaded.predict_ms(ops, "Tesla T4"), CrossGPUModel(
        *(np.asarray(old[k] + [0.0] * n_shape) for k in ("theta_ff", "theta_tc", "theta_m", "theta_s", "theta_p",
                                                          "theta_k")),
        m.sm_bytes_per_clock, m.watts_per_tflops, m.l2_weight, m.wave_exponent, m.c0_ms, {}).predict_ms(ops, "Tesla T4"))


def test_leave_one_gpu_out_scores_only_rows_above_the_kernel_time_floor() -> None:
    from gpurec.model.fitting.crossgpu_fit import SCORED_MIN_GPU_MS, score_leave_one_gpu_out

    logo = pd.DataFrame({"gpu": ["A", "A", "A", "B"], "group": ["matmul", "matmul", "other", "matmul"],
                         "source": "s", "target_ms": [1.0, 2.0, SCORED_MIN_GPU_MS / 100, 1.0],
                         "pred_ms": [1.1, 2.0, 1.0, 0.5]})
    per_op, per_gpu = score_leave_one_gpu_out(logo)
    a = next(r for r in per_gpu if r["gpu"] == "A")
    assert a["rows"] == 2 and a["rows_below_floor"] == 1 and a["mape"] == pytest.approx(0.05)
    assert {(r["gpu"], r["group"]) for r in per_op} == {("A", "matmul"), ("B", "matmul")}
    assert next(r for r in per_gpu if r["gpu"] == "B")["rows_below_floor"] == 0


def test_a_kind_group_no_other_gpu_measured_is_scored_apart() -> None:
    """The H100's recurrent layers have no row on any other GPU: the fold without the H100 has
    nothing to learn them from, so their error is reported beside the MAPE, not inside it."""
    from gpurec.model.fitting.crossgpu_fit import score_leave_one_gpu_out
    from gpurec.reports.accuracy import _scored_floor_text

    logo = pd.DataFrame({"gpu": ["A", "A", "A"], "group": ["matmul", "other", "other"], "kind": ["Linear", "LSTM", "GRU"],
                         "source": "s", "target_ms": [1.0, 1.0, 1.0], "pred_ms": [1.1, 1000.0, 3.0],
                         "group_seen": [True, False, False]})
    per_op, (a,) = score_leave_one_gpu_out(logo)
    assert (a["rows"], a["mape"]) == (1, pytest.approx(0.1))
    assert (a["rows_kind_unseen"], a["kinds_unseen"]) == (2, ["GRU", "LSTM"])
    assert a["kind_unseen_mape"] == pytest.approx((999 + 2) / 2)
    assert [r["group"] for r in per_op] == ["matmul"]
    text = _scored_floor_text({"scored_min_gpu_ms": 0.01, "per_gpu": [{**a, "gpu": "NVIDIA H100 80GB HBM3"}]})
    assert "H100 2 rows (GRU, LSTM; MAPE 50050%)" in text


def test_casts_and_lookups_transfer_as_the_work_they_are() -> None:
    """autocast's casts are elementwise copies and embedding lookups gathers, across GPUs; the
    recurrent layers stay a group of their own."""
    from gpurec.model.crossgpu import physical_group
    from gpurec.model.features import kind_group

    assert (kind_group("autocast_cast"), physical_group("autocast_cast")) == ("other", "elementwise")
    assert physical_group("Embedding") == "data_movement" and physical_group("cumsum") == "reduce"
    assert physical_group("LSTM") == "other" and physical_group("Conv2d") == kind_group("Conv2d") == "conv"


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


def test_tensor_core_peak_follows_the_operations_math() -> None:
    from gpurec.model.crossgpu import TENSOR_MODES, tensor_peak

    model = _random_model(4, tiles=False)  # the tiled path's panel traffic would hide the compute term
    shape = np.array([c.split(":")[-1].startswith(("log_m", "log_n", "log_k", "log_batch")) for c in design_names()])
    for theta in (model.theta_ff, model.theta_tc, model.theta_m, model.theta_s, model.theta_p, model.theta_k):
        theta[shape] = 0.0  # random GEMM-shape weights would make most of these memory-bound
    n = 500
    rng = np.random.default_rng(4)
    flops, nbytes, out = 10 ** rng.uniform(10, 13, n), 10 ** rng.uniform(6, 8, n), 10 ** rng.uniform(5, 7, n)

    def times(mode: str, gpu: str) -> np.ndarray:
        code = np.full(n, float(TENSOR_MODES.index(mode)))
        return model.predict_ms(op_table(flops, nbytes, out, ["matmul"] * n, np.zeros(n), code), gpu)

    v100 = spec_row("Tesla V100-PCIE-32GB")
    assert tensor_peak(np.array([0.0, 1.0, 2.0, 3.0]), np.stack([v100] * 4)).tolist() == [0.0, 14.0, 112.0, 14.0]
    # a V100 has FP16 tensor cores and no BF16 ones; an H100 has both at one rate
    assert np.all(times("bf16", "V100") >= times("fp16", "V100"))
    assert np.median(times("bf16", "V100") / times("fp16", "V100")) > 1.5
    assert np.allclose(times("bf16", "H100"), times("fp16", "H100"))


def test_model_file_refuses_parameters_that_break_monotonicity() -> None:
    d = _random_model(0).to_dict()
    CrossGPUModel.from_dict(d)
    for key in ("l2_weight", "wave_exponent", "c0_ms", "watts_per_tflops", "sm_bytes_per_clock"):
        with pytest.raises(CrossGPUModelError):
            CrossGPUModel.from_dict({**d, key: -0.1})
    with pytest.raises(CrossGPUModelError):
        CrossGPUModel.from_dict({**d, "design": d["design"][:-1]})


def test_model_file_keeps_and_checks_the_memory_energy() -> None:
    d = _random_model(0).to_dict()
    assert CrossGPUModel.from_dict({k: v for k, v in d.items() if k != "memory_energy_pj_per_byte"}
                                   ).memory_energy_pj_per_byte is None  # files from before it load as before
    assert CrossGPUModel.from_dict({**d, "memory_energy_pj_per_byte": 30.0}).memory_energy_pj_per_byte == 30.0
    for bad in (-1.0, float("nan")):
        with pytest.raises(CrossGPUModelError):
            CrossGPUModel.from_dict({**d, "memory_energy_pj_per_byte": bad})


def test_same_compute_die_differs_only_in_memory() -> None:
    assert same_compute_die(spec_row("H100"), spec_row("H200"))
    assert not same_compute_die(spec_row("H100"), spec_row("NVIDIA H100 PCIe"))
    assert not same_compute_die(spec_row("A100-SXM4-80GB"), spec_row("H100"))


def test_carried_power_adds_dram_power_of_the_faster_gpu_and_stays_in_bounds() -> None:
    anchor_w, t_a = np.array([500.0, 500.0, 690.0]), np.array([10.0, 10.0, 10.0])
    moved = np.array([0.0, 2e10, 2e10])  # bytes: none, 2 TB/s on the anchor, the same
    t = np.array([8.0, 8.0, 8.0])
    w = transfer_power_w(anchor_w, 120.0, 125.0, 700.0, moved, t_a, t, 50.0)
    assert w[0] == pytest.approx(505.0)  # no bytes: the anchor's dynamic power over the GPU's own idle
    # 50 pJ/B x 2e10 B over 8 ms instead of 10 ms: 125 W instead of 100 W of DRAM power
    assert w[1] == pytest.approx(505.0 + 25.0)
    assert w[2] == 700.0  # never above the limit
    assert transfer_power_w(np.array([100.0]), 120.0, 125.0, 700.0, np.array([0.0]), t_a[:1], t[:1], 50.0)[0] == 125.0
    # a memory type that moves a byte for less: at the same time, less power than the anchor's
    same_t = transfer_power_w(anchor_w[1:2], 120.0, 125.0, 700.0, moved[1:2], t_a[:1], t_a[:1], 40.0, 50.0)
    assert same_t[0] == pytest.approx(505.0 - 20.0)  # 10 pJ/B less x 2e10 B over 10 ms


def test_recurrent_layers_move_their_weights_at_every_step() -> None:
    pytest.importorskip("torch")
    import torch.nn as nn

    from gpurec.model.features import OpBlock
    from gpurec.ops.extract import extract_operations

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn, self.head = nn.LSTM(64, 128, batch_first=True), nn.Linear(128, 10)

        def forward(self, x):  # noqa: ANN001, ANN201
            return self.head(self.rnn(x)[0])

    params = sum(p.numel() for p in nn.LSTM(64, 128).parameters())
    for mode, passes in (("inference", 1), ("training", 3)):
        block = OpBlock.from_operations(extract_operations(Net(), (4, 32, 64), mode=mode), mode)
        extra = recurrent_reread_bytes(block)
        lstm = [i for i, k in enumerate(block.kinds) if k == "LSTM"]
        assert len(lstm) == 1 and np.count_nonzero(extra) == 1  # the Linear moves its weights once
        assert extra[lstm[0]] == pytest.approx(params * 4 * 31 * passes)  # fp32, 31 more steps


def test_memory_energy_per_memory_type_is_used_checked_and_saved() -> None:
    d = _random_model(3).to_dict()
    d["memory_energy_pj_per_byte"] = 30.0
    model = CrossGPUModel.from_dict({**d, "memory_energy_by_type_pj_per_byte": {"HBM3e": 20.0}})
    assert model.memory_energy_pj_per_byte_for("H200") == 20.0  # HBM3e
    assert model.memory_energy_pj_per_byte_for("H100") == 30.0  # HBM3: not in the table, the shared value
    assert CrossGPUModel.from_dict(model.to_dict()).memory_energy_by_type_pj_per_byte == {"HBM3e": 20.0}
    assert CrossGPUModel.from_dict(d).memory_energy_pj_per_byte_for("H200") == 30.0  # no table: one value
    for bad in ({"HBM3e": -1.0}, {"HBM3e": float("nan")}, [20.0]):
        with pytest.raises(CrossGPUModelError):
            CrossGPUModel.from_dict({**d, "memory_energy_by_type_pj_per_byte": bad})
    with pytest.raises(CrossGPUModelError):  # a table without the shared value it falls back on
        CrossGPUModel.from_dict({**d, "memory_energy_pj_per_byte": None, "memory_energy_by_type_pj_per_byte": {"HBM3": 1.0}})


def test_fit_recovers_a_known_model() -> None:
    pytest.importorskip("torch")
    from gpurec.model.fitting.crossgpu_fit import CrossTable, fit, predict_rows

    truth = _random_model(5)
    truth.theta_ff *= 0.2
    truth.theta_tc *= 0.2
    truth.theta_m *= 0.2
    truth.theta_s *= 0.2
    truth.theta_p *= 0.2
    truth.theta_k *= 0.2
    truth.spec_weights = spec_weight_floor()[:, None, :] + 0.2 * (truth.spec_weights - spec_weight_floor()[:, None, :])
    gpus = ["Tesla T4", "Tesla V100-PCIE-32GB", "NVIDIA A100-PCIE-40GB", "NVIDIA H100 80GB HBM3"]
    ops = _random_ops(2400, seed=11)
    gpu_of = np.array(gpus * 600)
    specs = np.stack([spec_row(g) for g in gpu_of])
    waves = np.array([wave_factor(ops.raw[i:i + 1, 2], ops.raw[i:i + 1, 3], specs[i, 4])[0] for i in range(len(ops))])
    target = truth.predict_ms_rows(ops, specs, waves)
    groups = [KIND_GROUPS[int(np.argmax(ops.design[i, :len(KIND_GROUPS) * 9:9]))] for i in range(len(ops))]
    frame = pd.DataFrame({"gpu": gpu_of, "group": groups, "target_ms": target, "source": "synthetic"})
    table = CrossTable(frame, ops, specs, waves, gemm_tile_work(ops.raw))
    rows = np.arange(len(frame))
    model = fit(table, rows, max_iter=200, tiles=True, spec_terms=True)
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


def test_h200_power_is_carried_from_the_h100_with_dram_energy(predictor) -> None:
    cross = predictor.crossgpu
    saved = cross.memory_energy_pj_per_byte, cross.memory_energy_by_type_pj_per_byte
    cands = [("resnet50", (128, 3, 224, 224))]
    energy = {}
    try:
        for value in (None, 0.0, 60.0):
            cross.memory_energy_pj_per_byte, cross.memory_energy_by_type_pj_per_byte = value, None
            predictor.clear_cache()
            a = predictor.predict_many(cands, mode="inference", gpu="H100")[0]
            b = predictor.predict_many(cands, mode="inference", gpu="H200")[0]
            t4 = predictor.predict_many(cands, mode="inference", gpu="T4")[0]
            energy[value] = (a.gpu_energy_mj, b.gpu_energy_mj, t4.gpu_energy_mj, a, b)
    finally:
        cross.memory_energy_pj_per_byte, cross.memory_energy_by_type_pj_per_byte = saved
        predictor.clear_cache()
    (a0, b0, t0, a, b), (_, b_zero, t_zero, _, bz), (a60, b60, t60, _, b_dram) = (energy[v] for v in (None, 0.0, 60.0))
    assert a0 == a60  # the anchor's own prediction does not depend on it
    assert t0 == t60 == t_zero  # nor does a GPU of another die
    idle_a, _ = predictor._power_bounds("H100")
    idle_b, _ = predictor._power_bounds("H200")
    # with no DRAM energy, the H200 draws the H100's power over idle on its own idle floor
    assert bz.gpu_energy_mj / bz.gpu_time_ms == pytest.approx(a.gpu_energy_mj / a.gpu_time_ms - idle_a + idle_b)
    # the same bytes in less time: more power on the H200 with DRAM energy than without
    assert b_dram.gpu_time_ms < a.gpu_time_ms
    assert b60 > b_zero
    assert b_dram.gpu_energy_mj / b_dram.gpu_time_ms <= predictor._power_bounds("H200")[1]


def test_h200_power_takes_each_memory_types_energy_over_every_byte_a_recurrent_layer_moves(predictor) -> None:
    from gpurec.model.crossgpu import op_table_from_block

    cross = predictor.crossgpu
    saved = cross.memory_energy_pj_per_byte, cross.memory_energy_by_type_pj_per_byte
    cands = [("lstm_lm_2x512", (8, 128))]
    try:
        out = {}
        for table in (None, {"HBM3": 60.0, "HBM3e": 50.0}):
            cross.memory_energy_pj_per_byte, cross.memory_energy_by_type_pj_per_byte = 60.0, table
            predictor.clear_cache()
            out[table is None] = predictor.predict_many(cands, mode="training", gpu="H200")[0]
        entry, _ = predictor._entry(*cands[0], "training")
    finally:
        cross.memory_energy_pj_per_byte, cross.memory_energy_by_type_pj_per_byte = saved
        predictor.clear_cache()
    shared, typed = out[True], out[False]
    assert typed.gpu_time_ms == shared.gpu_time_ms
    moved = op_table_from_block(entry.block).raw[:, 1].sum() + recurrent_reread_bytes(entry.block).sum()
    assert recurrent_reread_bytes(entry.block).sum() > op_table_from_block(entry.block).raw[:, 1].sum()
    # 10 pJ less per byte on the H200's HBM3e, over every byte moved (the weights' re-reads included)
    assert shared.gpu_energy_mj - typed.gpu_energy_mj == pytest.approx(10.0 * 1e-9 * moved, rel=1e-6)


# -- fitting on H200/H100 evidence and reporting the ratio ---------------------------------------

def test_h200_eager_rows_take_the_h100_gpu_share() -> None:
    from gpurec.model.fitting.crossgpu_fit import h200_gpu_time_ms

    pairs = pd.DataFrame({"time_ms": [1.0, 2.0, 3.0], "h100_gpu_time_ms": [0.9, 1.0, 2.2],
                          "h100_time_ms": [1.0, 1.0, 2.0]})
    # eager gaps carried over from the H100; a host-free time above eager (noise) never inflates
    assert h200_gpu_time_ms(pairs).tolist() == pytest.approx([0.9, 2.0, 3.0])


def test_network_pairs_are_host_free_where_both_are_and_gpu_bound_eager_otherwise(monkeypatch) -> None:
    import gpurec.dataset as dataset
    from gpurec.model.fitting.crossgpu_fit import H100, H200, _gpu_bound_pairs

    def row(gpu: str, key: str, time_ms: float, energy_mj: float, host_ms: float = 0.5,
            gpu_time_ms: float = float("nan"), gpu_energy_mj: float = float("nan"), captured: bool = False) -> dict:
        return {"gpu": gpu, "set_key": key, "mode": "training", "precision": "fp32", "time_ms": time_ms,
                "energy_mj": energy_mj, "host_ms": host_ms, "gpu_time_ms": gpu_time_ms,
                "gpu_energy_mj": gpu_energy_mj, "captured": captured}

    nets = pd.DataFrame([
        # host-free on both: the GPU times and energies, although the eager H200 step is host-bound
        row(H100, "a:b8:r224", 10.0, 100.0, 9.0, 5.0, 60.0, True), row(H200, "a:b8:r224", 10.0, 90.0, 9.0, 4.5, 57.0, True),
        # eager on the H200, GPU-bound on both: eager over eager
        row(H100, "b:b8:r224", 10.0, 100.0, 1.0, 9.5, 95.0, True), row(H200, "b:b8:r224", 9.0, 95.0),
        # eager on the H200 but host-bound there: no evidence of the GPUs' difference
        row(H100, "c:b8:r224", 10.0, 100.0, 9.0, 9.5, 95.0, True), row(H200, "c:b8:r224", 9.0, 95.0),
        # the H200 row has a GPU time but was not captured: judged as eager (GPU-bound here)
        row(H100, "d:b8:r224", 10.0, 100.0, 1.0, 9.5, 95.0, True), row(H200, "d:b8:r224", 9.0, 95.0, 1.0, 4.0, 40.0),
        # another precision never pairs
        {**row(H100, "e:b8:r224", 10.0, 100.0, 1.0, 9.5, 95.0, True), "precision": "bf16-mixed"},
        {**row(H200, "e:b8:r224", 9.0, 95.0, 1.0, 8.0, 80.0, True), "precision": "bf16-mixed"}])
    monkeypatch.setattr(dataset, "load_dataset", lambda root=None, table="operations", **kw: nets)
    m = _gpu_bound_pairs(None).set_index("set_key")
    assert sorted(m.index) == ["a:b8:r224", "b:b8:r224", "d:b8:r224"]
    assert m.loc["a:b8:r224", "basis"] == "host_free"
    assert m.loc["a:b8:r224", "h200_basis_time_ms"] / m.loc["a:b8:r224", "h100_basis_time_ms"] == pytest.approx(0.9)
    assert m.loc["a:b8:r224", "h200_basis_energy_mj"] / m.loc["a:b8:r224", "h100_basis_energy_mj"] == pytest.approx(0.95)
    assert (m.loc["b:b8:r224", "basis"], m.loc["d:b8:r224", "basis"]) == ("eager", "eager")
    assert m.loc["d:b8:r224", "h200_basis_time_ms"] / m.loc["d:b8:r224", "h100_basis_time_ms"] == pytest.approx(0.9)
    assert m.loc["b:b8:r224", "h200_basis_energy_mj"] / m.loc["b:b8:r224", "h100_basis_energy_mj"] == pytest.approx(0.95)


def test_h200_operation_pairs_take_host_free_and_eager_h200_rows() -> None:
    from gpurec.model.fitting.crossgpu_fit import _pairs

    f = pd.DataFrame({"op_signature": ["a", "a", "b", "b", "c", "d"],
                      "mode": ["training"] * 6,
                      "source": ["h100_host_free", "h200_host_free", "h100_host_free", "h200_eager",
                                 "h200_host_free", "neusight"]})
    h200, h100 = _pairs(f)
    assert sorted(zip(h200.tolist(), h100.tolist(), strict=True)) == [(1, 0), (3, 2)]  # c has no H100 row


def test_network_pairs_pull_the_h200_ratio_towards_the_measured_one() -> None:
    pytest.importorskip("torch")
    from gpurec.model.fitting.crossgpu_fit import H100, H200, CrossTable, NetworkPairs, fit

    truth = _random_model(8, tiles=False)  # the earlier structure: what this test's pairs were built for
    for name in ("theta_ff", "theta_tc", "theta_m", "theta_s", "theta_p", "theta_k"):
        setattr(truth, name, getattr(truth, name) * 0.2)
    gpus = ["Tesla T4", "Tesla V100-PCIE-32GB", "NVIDIA A100-PCIE-40GB", H100]  # no H200 rows
    ops = _random_ops(1600, seed=12)
    gpu_of = np.array(gpus * 400)
    specs = np.stack([spec_row(g) for g in gpu_of])
    waves = np.array([wave_factor(ops.raw[i:i + 1, 2], ops.raw[i:i + 1, 3], specs[i, 4])[0] for i in range(len(ops))])
    groups = [KIND_GROUPS[int(np.argmax(ops.design[i, :len(KIND_GROUPS) * 9:9]))] for i in range(len(ops))]
    frame = pd.DataFrame({"gpu": gpu_of, "group": groups, "target_ms": truth.predict_ms_rows(ops, specs, waves),
                          "source": "synthetic"})
    table = CrossTable(frame, ops, specs, waves)
    net_ops = _random_ops(600, seed=13)
    net = np.repeat(np.arange(30), 20)
    w = wave_factor(net_ops.raw[:, 2], net_ops.raw[:, 3], 132)
    sums = {g: np.bincount(net, truth.predict_ms_rows(net_ops, np.stack([spec_row(g)] * len(net_ops)), w))
            for g in (H100, H200)}
    # the measured H200/H100 ratios follow another model (the SMs' load/store rate binds sooner),
    # which the rows of the other GPUs do not reveal
    other = CrossGPUModel.from_dict({**truth.to_dict(), "sm_bytes_per_clock": truth.sm_bytes_per_clock * 0.05})
    other_sums = {g: np.bincount(net, other.predict_ms_rows(net_ops, np.stack([spec_row(g)] * len(net_ops)), w))
                  for g in (H100, H200)}
    measured = other_sums[H200] / other_sums[H100]
    assert np.abs(np.log(measured / (sums[H200] / sums[H100]))).mean() > 0.01
    pairs = NetworkPairs(net_ops, net, w, measured, [str(i) for i in range(30)])

    def ratio_error(model: CrossGPUModel) -> float:
        pred = {g: np.bincount(net, model.predict_ms_rows(net_ops, np.stack([spec_row(g)] * len(net_ops)), w))
                for g in (H100, H200)}
        return float(np.sqrt(np.mean(np.log(pred[H200] / pred[H100] / measured) ** 2)))

    rows = np.arange(len(frame))
    without = ratio_error(fit(table, rows, max_iter=60))
    with_pairs = fit(table, rows, max_iter=60, networks=pairs)
    assert ratio_error(with_pairs) < 0.5 * without, (ratio_error(with_pairs), without)
    assert with_pairs.info["network_pairs"] == 30


def test_in_sample_score_separates_a_kind_group_offset_from_scatter() -> None:
    """A GPU whose rows are the model's times x 1.3 has a 30% error that removing each (GPU, kind
    group)'s median takes away; one whose rows scatter around the model keeps its error."""
    from gpurec.model.fitting.crossgpu_fit import SCORED_MIN_GPU_MS, CrossTable, score_in_sample
    from gpurec.reports.accuracy import _in_sample_section

    model = _random_model(8, tiles=False)
    ops = _random_ops(400, seed=21)
    gpu_of = np.array(["Tesla T4", "Tesla P4"] * 200)
    specs = np.stack([spec_row(g) for g in gpu_of])
    waves = np.ones(len(ops))
    groups = [KIND_GROUPS[int(np.argmax(ops.design[i, :len(KIND_GROUPS) * 9:9]))] for i in range(len(ops))]
    pred = model.predict_ms_rows(ops, specs, waves)
    scatter = np.where(np.arange(len(ops)) % 4 < 2, 1.25, 0.8)
    target = np.where(gpu_of == "Tesla T4", pred / 1.3, pred * scatter)
    frame = pd.DataFrame({"gpu": gpu_of, "group": groups, "target_ms": target, "source": "synthetic"})
    scored = frame["target_ms"] >= SCORED_MIN_GPU_MS
    assert scored.sum() > 100
    got = {r["gpu"]: r for r in score_in_sample(CrossTable(frame, ops, specs, waves), model)}
    assert got["Tesla T4"]["mape"] == pytest.approx(0.3) and got["Tesla T4"]["mape_offset_removed"] < 1e-9
    assert got["Tesla P4"]["mape"] > 0.15 and got["Tesla P4"]["mape_offset_removed"] > 0.1
    assert got["Tesla T4"]["rows"] == int((scored & (gpu_of == "Tesla T4")).sum())
    text = "\n".join(_in_sample_section([{"gpu": "Tesla T4", "mape": 0.35}], list(got.values())))
    assert "| T4 | 35.0% | 30.0% | 0.0% |" in text


def test_ratio_section_reports_all_and_held_out_networks_in_time_and_energy() -> None:
    from gpurec.reports.accuracy import crossgpu_section, crossgpu_tables

    def net(key: str, held: bool, t_err: float, e_err: float | None) -> dict:
        r = {"set_key": key, "mode": "inference", "held_out_arch": held, "measured_ratio": 0.9,
             "pred_ratio": 0.9 + t_err / 100, "ratio_error_pp": t_err, "h200_time_ms": 1.0, "pred_h200_ms": 1.0,
             "ape": 0.0, "direct_ape": 0.1, "measured_energy_ratio": 0.95}
        if e_err is not None:
            r.update(pred_energy_ratio=0.95 + e_err / 100, energy_ratio_error_pp=e_err)
        return r

    cross = {"h200_networks": [net("resnet50:b8:r224", False, 1.0, -2.0), net("vgg13_bn:b8:r224", True, -5.0, 6.0),
                               net("alexnet:b8:r224", False, 2.0, None)],
             "h200_networks_leave_h200_out": [{"ratio_error_pp": -10.0}]}
    t = crossgpu_tables(cross)
    everything, held = t["h200_summary"]  # no basis (reports of before session 11): no basis rows
    assert (everything["networks"], held["networks"]) == (3, 1)
    assert everything["time_pp"] == pytest.approx(8 / 3) and everything["time_met"]
    assert everything["energy_pp"] == pytest.approx(4.0) and everything["energy_networks"] == 2
    assert not everything["energy_met"]
    assert held["time_pp"] == pytest.approx(5.0) and not held["time_met"]
    text = "\n".join(crossgpu_section(cross))
    assert "| held-out architectures only | 1 | 5.0 | -5.0 | **not met** | 6.0 | **not met** |" in text
    assert "off by 10.0 pp" in text
    cross["h200_networks"][0]["basis"] = "host_free"
    cross["h200_networks"][2]["basis"] = "eager"
    everything, host_free, eager, held = crossgpu_tables(cross)["h200_summary"]
    assert (host_free["label"], host_free["networks"], host_free["time_pp"]) == ("host-free on both", 1, 1.0)
    assert (eager["networks"], eager["time_pp"]) == (2, pytest.approx(3.5))
    assert "| resnet50:b8:r224 | inference |  | host_free |" in "\n".join(crossgpu_section(cross))


def test_networks_pair_at_another_precision_and_get_the_predictors_ratios_there(monkeypatch) -> None:
    import gpurec.dataset as dataset
    from gpurec.model._sets import test_arch_names
    from gpurec.model.fitting import crossgpu_fit
    from gpurec.model.fitting.crossgpu_fit import H100, H200, h200_network_errors_at

    held = sorted(test_arch_names())[0]

    def row(gpu: str, key: str, precision: str, gpu_time_ms: float, gpu_energy_mj: float) -> dict:
        return {"gpu": gpu, "set_key": key, "mode": "training", "precision": precision, "time_ms": gpu_time_ms + 1,
                "energy_mj": gpu_energy_mj + 1, "host_ms": 0.5, "gpu_time_ms": gpu_time_ms,
                "gpu_energy_mj": gpu_energy_mj, "captured": True}

    nets = pd.DataFrame([row(H100, "resnet50:b8:r224", "bf16-mixed", 10.0, 100.0),
                         row(H200, "resnet50:b8:r224", "bf16-mixed", 9.0, 90.0),
                         row(H100, f"{held}:b8:r224", "bf16-mixed", 10.0, 100.0),
                         row(H200, f"{held}:b8:r224", "bf16-mixed", 8.0, 96.0),
                         # fp32 rows of the same network never pair at bf16-mixed
                         row(H100, "vgg11:b8:r224", "fp32", 10.0, 100.0), row(H200, "vgg11:b8:r224", "fp32", 5.0, 50.0)])
    monkeypatch.setattr(dataset, "load_dataset", lambda root=None, table="operations", **kw: nets)
    asked = []

    def ratios(predictor, model, m, parse_set, precision=None):
        asked.append(precision)
        return {"product_ratio": np.array([0.92, 0.8]), "pred_energy_ratio": np.array([0.9, np.nan])}

    monkeypatch.setattr(crossgpu_fit, "_product_ratios", ratios)
    m = h200_network_errors_at(object(), object(), "bf16-mixed").set_index("set_key")
    assert asked == ["bf16-mixed"] and sorted(m.index) == sorted(["resnet50:b8:r224", f"{held}:b8:r224"])
    assert m.loc["resnet50:b8:r224", "product_ratio_error_pp"] == pytest.approx(2.0)
    assert m.loc[f"{held}:b8:r224", "measured_energy_ratio"] == pytest.approx(0.96)
    assert bool(m.loc[f"{held}:b8:r224", "held_out_arch"]) and not bool(m.loc["resnet50:b8:r224", "held_out_arch"])


def test_precision_section_scores_each_precision_and_counts_what_it_could_not_score() -> None:
    from gpurec.reports.accuracy import crossgpu_section, crossgpu_tables

    def net(key: str, held: bool, t_err: float, e_err: float | None) -> dict:
        return {"set_key": key, "mode": "training", "precision": "bf16-mixed", "held_out_arch": held,
                "measured_ratio": 0.95, "product_ratio": 0.95 + t_err / 100, "product_ratio_error_pp": t_err,
                "measured_energy_ratio": 0.9, "pred_energy_ratio": None if e_err is None else 0.9 + e_err / 100,
                "energy_ratio_error_pp": e_err}

    cross = {"h200_networks_by_precision": {"bf16-mixed": [
        net("resnet50:b8:r224", False, 1.0, -2.0), net("resnet50:b32:r224", False, -3.0, 2.0),
        net("vgg13_bn:b8:r224", True, 5.0, 4.0), net("alexnet:b8:r224", False, 1.0, None)]}}
    pp = crossgpu_tables(cross)["by_precision"]["bf16-mixed"]
    everything, held = pp["summary"]
    assert (pp["pairs"], pp["unscored"], everything["networks"], held["networks"]) == (4, 1, 3, 1)
    assert everything["time_pp"] == pytest.approx(3.0) and everything["time_met"]
    assert everything["time_bias_pp"] == pytest.approx(1.0)
    assert everything["energy_pp"] == pytest.approx(8 / 3) and everything["energy_met"]
    assert held["time_pp"] == pytest.approx(5.0) and not held["time_met"]
    (resnet,) = [r for r in pp["per_arch"] if r["arch"] == "resnet50"]
    assert resnet["networks"] == 2 and resnet["product_ratio"] == pytest.approx(0.94)
    text = "\n".join(crossgpu_section(cross))
    assert "### H200 against H100 at bf16-mixed" in text and "1 networks the predictor could not estimate" in text
    assert "| held-out architectures only | 1 | 5.0 | +5.0 | **not met** | 4.0 | +4.0 | **not met** |" in text


def test_precision_without_held_out_networks_says_so_instead_of_not_met() -> None:
    """bf16 and fp16-mixed were measured on training architectures only: an empty held-out row has
    nothing to judge, and the text must not call the training networks the honest check."""
    from gpurec.reports.accuracy import crossgpu_section

    rows = [{"set_key": "resnet50:b8:r224", "mode": "training", "precision": "bf16", "held_out_arch": False,
             "measured_ratio": 0.95, "product_ratio": 0.96, "product_ratio_error_pp": 1.0,
             "measured_energy_ratio": 0.9, "pred_energy_ratio": 0.95, "energy_ratio_error_pp": 5.0}]
    text = "\n".join(crossgpu_section({"h200_networks_by_precision": {"bf16": rows}}))
    assert "| held-out architectures only | 0 |  |  | no networks |  |  | no networks |" in text
    assert "| all networks measured on both | 1 | 1.0 | +1.0 | met | 5.0 | +5.0 | **not met** |" in text
    assert "none of these 1 networks is of a held-out architecture" in text


def test_cross_section_describes_h200_eager_rows_only_when_the_fit_used_some() -> None:
    """Since every H200 operation has a host-free row, the fit uses no eager one: the section must
    not describe a rule for rows that are not there, and must describe it while some are."""
    from gpurec.reports.accuracy import crossgpu_section

    info = {"sources": {"h100_host_free|NVIDIA H100 80GB HBM3": 10, "h200_host_free|NVIDIA H200": 5},
            "gpu_dominated_h200": {"h100_host_free_over_eager_min": 0.9, "h200_eager_over_h100_host_ms_min": 1.25}}
    text = "\n".join(crossgpu_section({"model_info": info}))
    assert "none is used; every one of those operations has a host-free row" in text
    assert "count where the GPU dominates" not in text
    info["sources"]["h200_eager|NVIDIA H200"] = 3
    text = "\n".join(crossgpu_section({"model_info": info}))
    assert "count where the GPU dominates" in text and "none is used" not in text


def test_energy_noise_floor_counts_only_networks_that_ran_the_same_way(monkeypatch) -> None:
    H200 = "NVIDIA H200"
    import gpurec.reports.dataset as ds
    from gpurec.reports.accuracy import crossgpu_section, network_energy_repeatability

    class Gpu:
        name = H200

    pairs = pd.DataFrame({
        "item": ["network", "network", "network", "op"],
        "time_ms_orig": [10.0, 10.0, 10.0, 1.0], "time_ms_rep": [10.1, 10.0, 13.0, 1.0],
        "energy_mj_orig": [100.0, 100.0, 100.0, 10.0], "energy_mj_rep": [104.0, 98.0, 150.0, 20.0]})
    monkeypatch.setattr(ds, "load_all", lambda root: [Gpu()])
    monkeypatch.setattr(ds, "repeat_pairs", lambda g: pairs)
    (r,) = network_energy_repeatability(Path("unused"))
    # the third network ran 30% slower (another way) and the operation row is no network
    assert (r["gpu"], r["pairs"]) == (H200, 2) and r["mean_pct"] == pytest.approx(3.0)
    cross = {"h200_networks": [{"set_key": "resnet50:b8:r224", "mode": "inference", "held_out_arch": False,
                                "measured_ratio": 0.9, "pred_ratio": 0.9, "ratio_error_pp": 0.0, "h200_time_ms": 1.0,
                                "pred_h200_ms": 1.0, "ape": 0.0, "direct_ape": 0.1}],
             "model_info": {"memory_energy_pj_per_byte": 42.0}}
    text = "\n".join(crossgpu_section(cross, [r]))
    assert "42.0 pJ/byte" in text
    assert "differs in energy by 3.0% on average (3.0% median, 2 pairs) on the H200" in text
    # host-free figures beside: a second basis, judged on its own (GPU) times
    both = pairs.assign(gpu_time_ms_orig=[5.0, 5.0, 5.0, 1.0], gpu_time_ms_rep=[5.0, 5.5, 5.0, 1.0],
                        gpu_energy_mj_orig=[50.0, 50.0, 50.0, 5.0], gpu_energy_mj_rep=[51.0, 40.0, 49.0, 9.0])
    monkeypatch.setattr(ds, "repeat_pairs", lambda g: both)
    eager, host_free = network_energy_repeatability(Path("unused"))
    assert (eager["basis"], eager["pairs"]) == ("eager", 2)
    assert (host_free["basis"], host_free["pairs"]) == ("host-free", 2) and host_free["mean_pct"] == pytest.approx(2.0)
    assert "on the H200, host-free" in "\n".join(crossgpu_section(cross, [eager, host_free]))


def test_card_power_levels_compare_the_same_gpu_bound_networks_on_two_cards(monkeypatch) -> None:
    """Cards of one GPU model differ in power: the same network, eager, GPU-bound, its time within 2%
    of the earlier lease's (v1), is compared per card; the energy-ratio error is split by H200 card."""
    H200 = "NVIDIA H200"
    import gpurec.reports.dataset as ds
    from gpurec.reports.accuracy import card_power_differences, crossgpu_section, energy_error_by_card

    nets = pd.DataFrame({
        "gpu_uuid": ["GPU-aaaa", "GPU-aaaa", "GPU-bbbb", "GPU-bbbb", "GPU-bbbb"],
        "v1_time_ms": [10.0, 10.0, 10.0, 10.0, 10.0], "v1_energy_mj": [1000.0] * 5,
        "time_ms": [10.0, 10.1, 10.0, 10.0, 13.0], "gpu_time_ms": [9.5, 9.8, 9.9, 5.0, 12.0],
        "energy_mj": [1100.0, 1111.0, 950.0, 500.0, 1300.0]})

    class Gpu:
        name = H200

        def t(self, table: str) -> pd.DataFrame:
            return nets if table == "networks" else pd.DataFrame()

    monkeypatch.setattr(ds, "load_all", lambda root: [Gpu()])
    a, b = card_power_differences(Path("unused"))
    # card b's second network is host-bound (5.0 / 10.0) and its third ran 30% slower: left out
    assert (a["card"], a["networks"], b["card"], b["networks"]) == ("GPU-aaaa", 2, "GPU-bbbb", 1)
    assert a["mean_pct"] == pytest.approx(10.0) and b["mean_pct"] == pytest.approx(-5.0)
    rows = [{"h200_gpu_uuid": "GPU-aaaa", "energy_ratio_error_pp": 2.0}, {"h200_gpu_uuid": "GPU-aaaa",
            "energy_ratio_error_pp": -4.0}, {"h200_gpu_uuid": "GPU-bbbb", "energy_ratio_error_pp": 3.0},
            {"h200_gpu_uuid": None, "energy_ratio_error_pp": 9.0}]
    first, second = energy_error_by_card(rows)
    assert (first["pairs"], first["bias_pp"], first["mean_abs_pp"]) == (2, -1.0, 3.0)
    assert (second["card"], second["pairs"], second["bias_pp"]) == ("GPU-bbbb", 1, 3.0)
    base = {"mode": "inference", "held_out_arch": False, "measured_ratio": 0.9, "pred_ratio": 0.9,
            "ratio_error_pp": 0.0, "h200_time_ms": 1.0, "pred_h200_ms": 1.0, "ape": 0.0, "direct_ape": 0.1,
            "measured_energy_ratio": 0.95, "pred_energy_ratio": 0.95}
    cross = {"h200_networks": [{**base, **r, "set_key": f"resnet50:b{i + 1}:r224"} for i, r in enumerate(rows[:3])]}
    many = [{**a, "card": f"GPU-{i}", "networks": 5, "mean_pct": p} for i, p in enumerate((-2.0, 7.5))]
    text = "\n".join(crossgpu_section(cross, None, many))
    assert "GPU-aaaa: -1.0 pp mean, 3.0 pp mean |error| (2 networks)" in text
    assert "9.5 points between the H200's 2 cards" in text


def test_temperature_shift_recovers_the_slope_and_brings_ratios_to_equal_temperature(monkeypatch) -> None:
    """A measured H200/H100 power ratio that rises 0.5% per °C of the cards' temperature difference:
    the slope is recovered from the training architectures' pairs alone, the error is split by that
    difference, and measured ratios brought to equal temperature leave only the model's own error."""
    import gpurec.reports.dataset as ds
    from gpurec.reports.accuracy import card_temperatures, crossgpu_section, temperature_power_shift

    H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    rng = np.random.default_rng(0)
    d_t = rng.uniform(-8.0, 8.0, 40)
    temps, nets = {}, []
    for i, d in enumerate(d_t):
        key = f"resnet50:b{i + 1}:r224"
        temps[(H100, key, "training", "host_free", "fp32")] = 50.0
        temps[(H200, key, "training", "host_free", "fp32")] = 50.0 + d
        measured = 0.9 * 0.99 * np.exp(np.log(1.005) * d)  # time ratio x equal-temperature power ratio x heat
        nets.append({"set_key": key, "mode": "training", "basis": "host_free", "held_out_arch": i >= 30,
                     "measured_ratio": 0.9, "measured_energy_ratio": measured, "pred_energy_ratio": 0.9 * 0.99 + 0.01,
                     "energy_ratio_error_pp": 100 * (0.9 * 0.99 + 0.01 - measured)})
    nets.append({**nets[0], "set_key": "vgg11:b1:r224"})  # no temperature: left out
    shift = temperature_power_shift(nets, temps)
    assert (shift["pairs"], shift["fit_pairs"], shift["held_out_pairs"]) == (40, 30, 10)
    assert shift["slope_pct_per_c"] == pytest.approx(0.5, abs=1e-6)
    assert shift["equal_temperature_power_ratio"] == pytest.approx(0.99, abs=1e-6)
    assert shift["equal_temperature_pp"] == pytest.approx(1.0, abs=1e-6)
    assert shift["raw_pp"] > 1.5
    coldest, hottest = shift["bins"][0], shift["bins"][-1]
    assert coldest["bias_pp"] > 0 > hottest["bias_pp"] and sum(b["pairs"] for b in shift["bins"]) == 40
    assert temperature_power_shift(nets[:5], temps) is None  # too few pairs to fit a slope

    networks = {H100: pd.DataFrame({"set_key": ["a:b1", "a:b1"], "mode": ["training", "inference"],
                                    "precision": ["fp32", "bf16-mixed"], "gpu_temperature_c": [40.0, 41.0],
                                    "temperature_c": [45.0, 46.0]})}

    class Gpu:
        name = H100

        def t(self, table: str) -> pd.DataFrame:
            return networks[H100] if table == "networks" else pd.DataFrame()

    monkeypatch.setattr(ds, "load_all", lambda root: [Gpu()])
    assert card_temperatures(Path("unused")) == {
        (H100, "a:b1", "training", "host_free", "fp32"): 40.0, (H100, "a:b1", "training", "eager", "fp32"): 45.0,
        (H100, "a:b1", "inference", "host_free", "bf16-mixed"): 41.0,
        (H100, "a:b1", "inference", "eager", "bf16-mixed"): 46.0}
    assert temperature_power_shift([{**r, "precision": "bf16-mixed"} for r in nets], temps) is None  # fp32 rows only
    base = {"pred_ratio": 0.9, "ratio_error_pp": 0.0, "h200_time_ms": 1.0, "pred_h200_ms": 1.0, "ape": 0.0,
            "direct_ape": 0.1}
    text = "\n".join(crossgpu_section({"h200_networks": [{**base, **r} for r in nets]}, None, None, temps))
    assert "moves +0.50% per °C" in text and "equal temperature the ratio is 0.990" in text
    assert f"about {shift['raw_pp'] - 1.0:.1f} pp of the error is the measuring cards' thermal conditions" in text


def test_anchored_leave_one_gpu_out_carries_the_anchors_measurement_by_the_models_ratio() -> None:
    """A fold model whose absolute times are off by a constant per GPU, but whose ratio of the two
    GPUs is right, predicts the held-out GPU exactly from an anchor's measurement; rows under the
    kernel-time floor, operations the anchor lacks and repeated measurements do not count twice."""
    from gpurec.model.fitting.crossgpu_fit import SCORED_MIN_GPU_MS, score_anchored

    truth = {"x": 1.0, "y": 2.0, "z": 4.0}
    rows = []
    for op, t in truth.items():
        rows.append({"gpu": "A", "op_key": op, "group": "matmul", "target_ms": t, "pred_ms": 3.0 * t})
        rows.append({"gpu": "B", "op_key": op, "group": "matmul", "target_ms": 0.5 * t, "pred_ms": 0.5 * 3.0 * t})
        # C's times are twice what the model's ratio says: every anchored prediction from C is 2x
        rows.append({"gpu": "C", "op_key": op, "group": "matmul", "target_ms": 1.0 * t, "pred_ms": 0.5 * 3.0 * t})
    rows.append({"gpu": "A", "op_key": "x", "group": "matmul", "target_ms": 1.0, "pred_ms": 3.0})  # a repeat
    rows.append({"gpu": "A", "op_key": "only_a", "group": "norm", "target_ms": 1.0, "pred_ms": 9.0})
    rows.append({"gpu": "A", "op_key": "tiny", "group": "norm", "target_ms": SCORED_MIN_GPU_MS / 10, "pred_ms": 1.0})
    rows.append({"gpu": "B", "op_key": "tiny", "group": "norm", "target_ms": 1.0, "pred_ms": 1.0})
    by_anchor = {r["anchor"]: r for r in score_anchored(pd.DataFrame(rows), "A")}
    assert set(by_anchor) == {"B", "C"}
    assert by_anchor["B"]["rows"] == 3 and by_anchor["B"]["mape"] == pytest.approx(0.0)
    assert by_anchor["C"]["mape"] == pytest.approx(1.0) and by_anchor["C"]["by_group"] == {"matmul": pytest.approx(1.0)}
    assert by_anchor["B"]["spec_only_mape"] == pytest.approx(2.0)  # 3x absolute, right ratio


def test_report_shows_the_anchored_table_and_says_it_does_not_count_towards_the_target() -> None:
    from gpurec.reports.accuracy import _anchored_section

    assert _anchored_section([]) == []
    rows = [{"gpu": "NVIDIA H200", "anchor": "NVIDIA H100 80GB HBM3", "same_die": True, "rows": 10, "mape": 0.066,
             "median_ape": 0.04, "spec_only_mape": 0.55, "by_group": {"matmul": 0.05}},
            {"gpu": "NVIDIA H200", "anchor": "Tesla T4", "same_die": False, "rows": 5, "mape": 0.3,
             "median_ape": 0.2, "spec_only_mape": 0.5, "by_group": {}}]
    text = "\n".join(_anchored_section(rows))
    assert "| H200 | H100 | yes | 10 | 6.6% | 4.0% | 55.0% | matmul 5% |" in text
    assert "H200 from H100 6.6%" in text and "not counted towards it" in text


def _residual_favouring_small_gpus(model: CrossGPUModel, ops) -> CrossGPUModel:
    """``model`` with a residual booster that makes an operation faster the more tiles each SM gets
    (so the fewer SMs a GPU has): the kind of non-monotone residual the lower envelope must mend."""
    import xgboost as xgb

    from gpurec.model.crossgpu import RESIDUAL_FEATURES, residual_features

    specs = np.stack([spec_row(s) for s in load_catalog()])
    x = np.concatenate([residual_features(ops, np.broadcast_to(r, (len(ops), len(GPU_COLUMNS)))) for r in specs])
    y = -1.5 * x[:, RESIDUAL_FEATURES.index("tiles_per_sm")]
    booster = xgb.train({"max_depth": 4, "eta": 0.3, "nthread": 1, "seed": 0},
                        xgb.DMatrix(x, y, feature_names=list(RESIDUAL_FEATURES)), 30)
    model.residual = booster
    return model


def test_a_residual_that_favours_weaker_gpus_is_mended_by_the_lower_envelope() -> None:
    ops = _random_ops(1500, seed=11)
    model = _residual_favouring_small_gpus(_random_model(4), ops)
    pairs = _dominating_pairs()
    raw = {g: model.predict_ms_rows(ops, np.broadcast_to(spec_row(g), (len(ops), len(GPU_COLUMNS))))
           for g in {x for p in pairs for x in p}}
    # the residual alone breaks monotonicity on some catalogue pair ...
    assert any((raw[better] > raw[worse] * (1 + 1e-9)).any() for worse, better in pairs)
    # ... and predict_ms, the envelope, never puts a dominating GPU behind
    pred = {g: model.predict_ms(ops, g) for g in raw}
    for worse, better in pairs:
        assert not (pred[better] > pred[worse] * (1 + 1e-9)).any(), f"{better} slower than {worse}"
    # a GPU that dominates no other catalogue GPU keeps its own prediction
    p4 = spec_row("Tesla P4")
    assert np.allclose(model.predict_ms(ops, p4), model.predict_ms_rows(ops, np.broadcast_to(p4, (len(ops), len(GPU_COLUMNS)))))


def test_residual_survives_the_model_file_and_a_damaged_or_foreign_one_is_refused() -> None:
    ops = _random_ops(400, seed=12)
    model = _residual_favouring_small_gpus(_random_model(5), ops)
    d = json.loads(json.dumps(model.to_dict()))
    again = CrossGPUModel.from_dict(d)
    for g in ("Tesla T4", "NVIDIA H200", "NVIDIA A100-SXM4-80GB"):
        assert np.allclose(again.predict_ms(ops, g), model.predict_ms(ops, g), rtol=1e-6)
    assert not np.allclose(again.predict_ms(ops, "Tesla T4"),
                           CrossGPUModel.from_dict({**d, "residual_ubj_base64": None}).predict_ms(ops, "Tesla T4"))
    with pytest.raises(CrossGPUModelError, match="other features"):
        CrossGPUModel.from_dict({**d, "residual_features": ["group", "log_flops"]})
    with pytest.raises(CrossGPUModelError, match="does not load"):
        CrossGPUModel.from_dict({**d, "residual_ubj_base64": d["residual_ubj_base64"][:200]})


def test_one_compute_die_shares_the_residual() -> None:
    """The residual never reads the memory bandwidth, so the H200/H100 ratio stays the roofline's."""
    from gpurec.model.crossgpu import residual_features

    ops = _random_ops(500, seed=13)
    h100, h200 = (np.broadcast_to(spec_row(g), (len(ops), len(GPU_COLUMNS))) for g in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"))
    a, b = residual_features(ops, h100), residual_features(ops, h200)
    assert np.array_equal(np.nan_to_num(a, nan=-9), np.nan_to_num(b, nan=-9))
    model = _residual_favouring_small_gpus(_random_model(6), ops)
    assert np.allclose(model.residual_log(ops, h100), model.residual_log(ops, h200))


def test_card_averaged_energy_error_uses_the_mean_over_the_committed_and_every_new_card(tmp_path) -> None:
    """A pair whose H200 network was measured again on two more cards: its measured energy ratio is
    taken at the mean of the three cards' energies (the committed card counting 1), per family;
    an eager pair, a repeat row and a network without a pair do not enter."""
    import gzip
    import json

    from gpurec.reports.accuracy import _card_averaged_text, card_averaged_energy_errors
    from gpurec.reports.dataset import GpuData

    def net(id_: str, set_key: str, energy: float, uuid: str, gpu: str = "NVIDIA H200") -> dict:
        return {"id": id_, "item": "network", "mode": "inference", "set_key": set_key, "status": "ok",
                "gpu": gpu, "gpu_time_ms": 2.0, "gpu_energy_mj": energy, "gpu_power_w": energy / 2.0,
                "gpu_uuid": uuid}

    cnn, seq = ("network:resnet18:b32:r224:inference", "resnet18:b32:r224"), \
        ("network:gpt_d512:b32:s512:inference", "gpt_d512:b32:s512")
    committed = pd.DataFrame([net(*cnn, 100.0, "GPU-aaaaaaaa-1"), net(*seq, 200.0, "GPU-bbbbbbbb-1")])
    (tmp_path / "cards").mkdir()
    for name, factor in (("rows-x-0of1.jsonl.gz", 1.03), ("rows-y-0of1.jsonl.gz", 0.97 * 0.97)):
        rows = [net(*cnn, 100.0 * factor, f"GPU-{name[5]}" * 2), net(*seq, 200.0 * 0.94, f"GPU-{name[5]}" * 2),
                {**net(*seq, 9000.0, "GPU-zz"), "repeat": True}, net("network:vgg11:b8:r224:inference", "vgg11:b8:r224",
                                                                   5.0, "GPU-zz")]
        with gzip.open(tmp_path / "cards" / name, "wt") as fh:
            fh.write("".join(json.dumps(r) + "\n" for r in rows))
    gpus = [GpuData(tag="h200", path=tmp_path, tables={"networks": committed})]
    pair = {"mode": "inference", "basis": "host_free", "measured_energy_ratio": 0.9, "pred_energy_ratio": 0.95,
            "energy_ratio_error_pp": 5.0}
    nets = [{**pair, "set_key": cnn[1]}, {**pair, "set_key": seq[1]},
            {**pair, "set_key": seq[1], "basis": "eager", "energy_ratio_error_pp": 50.0}]
    avg = card_averaged_energy_errors(nets, gpus=gpus)
    assert (avg["pairs"], avg["runs"], avg["cards"], avg["cards_per_pair"]) == (2, 2, 2, 3.0)
    cnn_mean = (1 + 1.03 + 0.97 * 0.97) / 3
    assert avg["by_family"]["CNN"]["averaged_bias_pp"] == pytest.approx(100 * (0.95 - 0.9 * cnn_mean))
    assert avg["by_family"]["sequence"]["averaged_bias_pp"] == pytest.approx(100 * (0.95 - 0.9 * (1 + 2 * 0.94) / 3))
    assert avg["measured_pp"] == pytest.approx(5.0) and avg["by_family"]["CNN"]["measured_bias_pp"] == 5.0
    text = "\n".join(_card_averaged_text(avg))
    assert "2 runs on 2 cards" in text and "sequence +5.0 -> +8.6 pp mean" in text
    assert "measured each network once" in text and avg["by_family"]["CNN"]["both_bias_pp"] == pytest.approx(
        avg["by_family"]["CNN"]["averaged_bias_pp"])
    assert card_averaged_energy_errors(nets, gpus=gpus, other="NVIDIA H100 80GB HBM3") is None
    # the H100 measured the CNN network again on one more card, 10% above its committed row: both sides averaged
    h100 = tmp_path / "h100"
    (h100 / "cards").mkdir(parents=True)
    h100_net = "NVIDIA H100 80GB HBM3"
    with gzip.open(h100 / "cards" / "rows-z-0of1.jsonl.gz", "wt") as fh:
        fh.write(json.dumps(net(*cnn, 110.0, "GPU-cccccccc-1", h100_net)) + "\n")
    gpus.append(GpuData(tag="h100", path=h100, tables={"networks": pd.DataFrame([net(*cnn, 100.0, "GPU-dddd", h100_net)])}))
    avg = card_averaged_energy_errors(nets, gpus=gpus)
    assert (avg["anchor_runs"], avg["anchor_cards"], avg["anchor_cards_per_pair"]) == (1, 1, 1.5)
    assert avg["by_family"]["CNN"]["both_bias_pp"] == pytest.approx(100 * (0.95 - 0.9 * cnn_mean / 1.05))
    assert avg["by_family"]["sequence"]["both_bias_pp"] == pytest.approx(avg["by_family"]["sequence"]["averaged_bias_pp"])
    assert "1 run(s) on 1 card(s)" in "\n".join(_card_averaged_text(avg))


def test_the_public_models_band_is_their_held_out_error_and_lands_in_the_saved_model(tmp_path: Path) -> None:
    from gpurec.model.crossgpu import CROSSGPU_FILE, PUBLIC_BAND_KEY
    from gpurec.model.fitting.crossgpu_fit import CROSSGPU_REPORT_FILE, public_model_band, store_public_band

    ratios = np.linspace(0.6, 1.5, 20)  # measured / predicted
    rows = [{"gpu": "Tesla T4" if i % 2 else "Tesla P4", "measured_ms": r * 10.0, "pred_ms": 10.0}
            for i, r in enumerate(ratios)] + [{"gpu": "Tesla T4", "measured_ms": 1.0, "pred_ms": float("nan")}]
    band = public_model_band(rows)
    assert band is not None and band["models"] == 20 and band["gpus"] == ["Tesla P4", "Tesla T4"]
    assert band["time_ratio"] == pytest.approx([np.quantile(ratios, 0.05), np.quantile(ratios, 0.95)])
    assert public_model_band(rows[:4]) is None  # too few to place a 5th-95th percentile
    assert public_model_band([{"gpu": "x", "measured_ms": 2.0, "pred_ms": 1.0}] * 5)["time_ratio"][0] == 1.0
    (tmp_path / CROSSGPU_FILE).write_text(json.dumps({"schema": 4, "info": {"rows": 3}}))
    (tmp_path / CROSSGPU_REPORT_FILE).write_text(json.dumps({"public_models": rows}))
    assert store_public_band(tmp_path) == band
    saved = json.loads((tmp_path / CROSSGPU_FILE).read_text())
    assert saved["info"][PUBLIC_BAND_KEY] == band and saved["info"]["rows"] == 3 and saved["schema"] == 4
    with pytest.raises(FileNotFoundError, match="train-crossgpu"):
        store_public_band(tmp_path / "missing")
