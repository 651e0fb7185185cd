"""Cross-GPU operation time: a roofline with wave quantisation and a learned, bounded efficiency.

After NeuSight (ASPLOS'25), an operation's GPU time on GPU g is built from g's specifications:

    rate_c = rate_c0 * p(g),  rate_c0 = max(fp32(g) * u_ff, tc(g, op) * u_tc)           FLOP/s
    p(g)   = (TDP(g) / (TDP(g) + rho * rate_c0))^gamma                 power headroom, gamma in (0, 1)
    rate_m = bandwidth(g) * u_m(L2(g))                                 effective DRAM byte/s
    rate_s = SMs(g) * clock(g) * beta * u_s                            effective on-chip byte/s
    t      = (sum of (F/rate_c, B/rate_m, B/rate_s)^k)^(1/k) * Q(g)^a + c0

``tc(g, op)`` is g's tensor-core peak for the operation's math (TF32 for FP32 convolutions, which
cuDNN may run in TF32, and for ``tf32`` operations; FP16 or BF16 for GEMM-like operations in those
types, e.g. ``bf16-mixed`` convolutions and matmuls); 0 where the operation has no tensor-core path.
The catalogue carries the FP32 rate where a GPU has no such tensor cores (a V100's BF16), so a
GPU without them gets no tensor-core speed-up.

F and B are the operation's FLOPs and bytes in its mode; the efficiencies ``u`` lie in (0, 1)
(a sigmoid of a linear function of the operation's features: kind group, log FLOPs, log bytes,
log output elements, intensity, mode), so no GPU is ever credited beyond its peak.  The third
term is the SMs' own load/store throughput (``beta`` bytes per SM per clock, learned): an
operation whose data stays in L2 does not speed up with DRAM bandwidth (an H200 is an H100 with
43% more bandwidth, and most small operations run no faster on it).  ``p(g)`` is the power headroom: a card with a
low board power per peak FLOP/s (T4: 70 W for 8.1 TFLOPS) cannot hold its boost clock on large
operations; ``gamma`` (per operation, in (0, 1)) keeps the rate non-decreasing in peak and TDP. ``Q`` is wave
quantisation: GEMM-like kernels run 128x128 output tiles, one per SM at a time, and a partly
filled last wave costs a full one. ``u_m`` grows with log(L2 / working set) through a weight kept
non-negative, so a larger L2 never slows an operation down.

**Monotone by construction.** Time depends on the GPU only through fp32 and the tensor-core peaks (inside a max,
times non-negative efficiencies), bandwidth, L2 (non-decreasing ``u_m``) and the SM count (``Q``
is taken as the best quantisation over any count up to the GPU's, which never increases with
more SMs; the on-chip term falls with more SMs and a higher clock). So a GPU that is not worse in any of these never gets a longer time.

Prediction is numpy only; fitting lives in gpurec.model.fitting.crossgpu_fit (torch autograd).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpurec.catalog import GPUSpec, resolve_gpu
from gpurec.model.features import KIND_GROUPS, OpBlock, kind_group

CROSSGPU_SCHEMA = 2
CROSSGPU_FILE = "crossgpu.json"
GEMM_GROUPS = ("conv", "matmul", "attention")
GEMM_TILE = 128 * 128
MAX_SM = 256  # wave quantisation looks at SM counts up to this

# GPU columns the model reads (units in the names), in this order.
GPU_COLUMNS = ("fp32_tflops", "tf32_tflops", "fp16_tflops", "bf16_tflops", "memory_bandwidth_gbs", "l2_cache_mb", "sm_count", "max_sm_clock_mhz",
               "tdp_w")
# Per-operation columns: what crosses the GPU (raw) and what the efficiencies see (design).
OP_COLUMNS = ("flops_mode", "bytes_mode", "output_elements", "gemm", "tensor_mode")
# tensor_mode codes: which tensor-core peak an operation may use (0: none, FP32 units only).
TENSOR_MODES = ("none", "tf32", "fp16", "bf16")
_TENSOR_PEAK_COLUMN = {1: "tf32_tflops", 2: "fp16_tflops", 3: "bf16_tflops"}


class CrossGPUModelError(ValueError):
    """The cross-GPU model file is missing, of another schema, or does not fit this code."""


def spec_row(gpu: str | GPUSpec) -> np.ndarray:
    """The GPU columns of one catalogue GPU."""
    s = resolve_gpu(gpu)
    return np.array([s.fp32_tflops, s.tf32_tflops, s.fp16_tflops, s.bf16_tflops, s.memory_bandwidth_gbs, s.l2_cache_mb, s.sm_count,
                     s.max_sm_clock_mhz, s.tdp_w], dtype=np.float64)


@dataclass
class OpTable:
    """Operations as the cross-GPU model sees them: raw columns and the efficiency design matrix."""

    raw: np.ndarray  # (n, len(OP_COLUMNS))
    design: np.ndarray  # (n, n_design)

    def __len__(self) -> int:
        return int(self.raw.shape[0])

    def take(self, idx: np.ndarray) -> OpTable:
        return OpTable(self.raw[idx], self.design[idx])


# Per kind group: intercept, log FLOPs, log bytes, log output elements, log intensity, log of the
# reduction length (FLOPs per output element: K of a GEMM, C_in x k^2 of a convolution) and squares.
_PER_GROUP = ("1", "log_flops", "log_bytes", "log_out", "log_intensity", "log_reduction", "log_flops^2",
              "log_bytes^2", "log_reduction^2")


def design_names() -> list[str]:
    """Names of the efficiency design columns: per kind group, an intercept and slopes."""
    names = []
    for g in KIND_GROUPS:
        names += [f"{g}:{c}" for c in _PER_GROUP]
    return [*names, "training", "training:log_flops", "training:log_bytes", "half_precision"]


def op_table(flops_mode: np.ndarray, bytes_mode: np.ndarray, output_elements: np.ndarray, groups: Sequence[str],
             training: np.ndarray, tensor_mode: np.ndarray) -> OpTable:
    """Build the table from per-operation arrays (groups are KIND_GROUPS names; ``tensor_mode``
    indexes TENSOR_MODES: 1 (TF32) where FP32 work may run on TF32 tensor cores, 0 where not)."""
    f = np.maximum(np.asarray(flops_mode, dtype=np.float64), 0.0)
    b = np.maximum(np.asarray(bytes_mode, dtype=np.float64), 1.0)
    o = np.maximum(np.asarray(output_elements, dtype=np.float64), 1.0)
    gidx = np.array([KIND_GROUPS.index(g) for g in groups], dtype=np.int64)
    tr = np.asarray(training, dtype=np.float64)
    n = len(f)
    lf, lb, lo = np.log10(f + 1.0) / 10, np.log10(b) / 10, np.log10(o) / 10
    li = np.log10((f + 1.0) / b) / 4
    lr = np.log10(f / (2.0 * o) + 1.0) / 4
    per = np.stack([np.ones(n), lf, lb, lo, li, lr, lf**2, lb**2, lr**2], axis=1)
    w = per.shape[1]
    tm = np.asarray(tensor_mode, dtype=np.float64)
    design = np.zeros((n, len(KIND_GROUPS) * w + 4))
    for j in range(w):
        design[np.arange(n), gidx * w + j] = per[:, j]
    design[:, -4:] = np.stack([tr, tr * lf, tr * lb, (tm >= 2).astype(np.float64)], axis=1)
    gemm = np.isin(gidx, [KIND_GROUPS.index(g) for g in GEMM_GROUPS]).astype(np.float64)
    raw = np.stack([f, b, o, gemm, tm], axis=1)
    return OpTable(raw=raw, design=design)


def op_table_from_block(block: OpBlock, tf32_convs: bool = True) -> OpTable:
    """The table of extracted operations (``tf32_convs``: cuDNN may use TF32 for FP32 convolutions,
    PyTorch's default).  GEMM-like operations computing in TF32, FP16 or BF16 (their math_mode,
    gpurec.ops.features) take that tensor-core peak; other operations none."""
    from gpurec.ops.features import FEATURE_NAMES

    v = block.values
    col = FEATURE_NAMES.index
    training = block.training.astype(np.float64)
    has_bwd = training * ((v[:, col("flops_bwd")] > 0) | (v[:, col("input_requires_grad")] > 0))
    flops_mode = v[:, col("flops_total")] + training * v[:, col("flops_bwd")]
    bytes_mode = v[:, col("bytes_total")] * (1.0 + 2.0 * has_bwd)  # as gpurec.model.features
    groups = [kind_group(k) for k in block.kinds]
    math = v[:, col("math_mode")]  # 0 fp32, 1 tf32, 2 fp16, 3 bf16 (gpurec.ops.features.MATH_MODES)
    gemm = np.array([g in GEMM_GROUPS for g in groups], dtype=bool)
    conv = np.array([g == "conv" for g in groups], dtype=bool)
    tensor_mode = np.where(gemm, math, 0.0)
    if tf32_convs:
        tensor_mode = np.where(conv & (math == 0), 1.0, tensor_mode)
    return op_table(flops_mode, bytes_mode, v[:, col("output_elements")], groups, training, tensor_mode)


def tensor_peak(tensor_mode: np.ndarray, specs: np.ndarray) -> np.ndarray:
    """Per operation, the tensor-core peak (TFLOPS) of its math mode on its GPU's spec row (0: none)."""
    out = np.zeros(len(tensor_mode))
    for code, column in _TENSOR_PEAK_COLUMN.items():
        out = np.where(tensor_mode == code, specs[:, GPU_COLUMNS.index(column)], out)
    return out


def wave_factor(output_elements: np.ndarray, gemm: np.ndarray, sm_count: float) -> np.ndarray:
    """Wave quantisation >= 1 of GEMM-like kernels on ``sm_count`` SMs (1 elsewhere).

    The best over any SM count up to the GPU's, so that more SMs never raise it."""
    tiles = np.ceil(np.maximum(output_elements, 1.0) / GEMM_TILE)
    out = np.ones(len(tiles))
    idx = np.flatnonzero(gemm > 0)
    if len(idx) == 0:
        return out
    s = np.arange(1, int(min(max(sm_count, 1), MAX_SM)) + 1, dtype=np.float64)
    t = tiles[idx, None]
    q = np.ceil(t / s[None, :]) * s[None, :] / t
    out[idx] = q.min(axis=1)
    return out


@dataclass
class CrossGPUModel:
    """Fitted parameters (see the module docstring); ``info`` records how and on what it was fitted."""

    theta_ff: np.ndarray
    theta_tc: np.ndarray
    theta_m: np.ndarray
    theta_s: np.ndarray
    theta_p: np.ndarray
    theta_k: np.ndarray  # per-operation roofline exponent k = K_MIN + softplus(x @ theta_k)
    sm_bytes_per_clock: float  # > 0
    watts_per_tflops: float  # > 0 (rho)
    l2_weight: float  # >= 0
    wave_exponent: float  # >= 0
    c0_ms: float  # >= 0, shortest kernel
    info: dict[str, Any]
    # DRAM energy per byte moved (pJ), for power carried between GPUs of one compute die
    # (transfer_power_w); None: not fitted, each GPU keeps its own power model's power.
    memory_energy_pj_per_byte: float | None = None

    def predict_ms(self, ops: OpTable, gpu: str | GPUSpec | np.ndarray) -> np.ndarray:
        """GPU time (ms) of each operation on one GPU (a name, a spec, or its spec_row)."""
        spec = gpu if isinstance(gpu, np.ndarray) else spec_row(gpu)
        return self.predict_ms_rows(ops, np.broadcast_to(spec, (len(ops), len(GPU_COLUMNS))))

    def predict_ms_rows(self, ops: OpTable, specs: np.ndarray, waves: np.ndarray | None = None) -> np.ndarray:
        """GPU time (ms) of operation i on the GPU of spec row i (``waves``: precomputed wave_factor)."""
        f, b, o, gemm, tensor_mode = (ops.raw[:, j] for j in range(len(OP_COLUMNS)))
        fp32, bw, l2, sms, clock, tdp = (specs[:, GPU_COLUMNS.index(c)] for c in (
            "fp32_tflops", "memory_bandwidth_gbs", "l2_cache_mb", "sm_count", "max_sm_clock_mhz", "tdp_w"))
        tc = tensor_peak(tensor_mode, specs)
        x = ops.design
        u_ff = _sigmoid(x @ self.theta_ff)
        u_tc = _sigmoid(x @ self.theta_tc)
        l2_fit = np.clip(np.log2(l2 * 2**20 / b), 0.0, 8.0)
        u_m = _sigmoid(x @ self.theta_m + self.l2_weight * l2_fit)
        peak = np.maximum(fp32 * u_ff, tc * u_tc)
        gamma = _sigmoid(x @ self.theta_p)
        # in the rate actually used, so the rate stays non-decreasing in both peaks and in TDP
        headroom = (tdp / (tdp + self.watts_per_tflops * peak)) ** gamma
        rate_c = peak * headroom * 1e9  # FLOP per ms
        rate_m = bw * u_m * 1e6  # byte per ms
        rate_s = sms * clock * 1e3 * self.sm_bytes_per_clock * _sigmoid(x @ self.theta_s)  # byte per ms
        k = roofline_exponent(x @ self.theta_k)
        # the direct form: times are within 1e-9..1e4 ms and k within [0.5, ~30], far from under/overflow
        roof = ((f / rate_c) ** k + (b / rate_m) ** k + (b / rate_s) ** k) ** (1.0 / k)
        if waves is None:
            if np.all(sms == sms[0]) if len(sms) else True:
                waves = wave_factor(o, gemm, float(sms[0]) if len(sms) else 1.0)
            else:
                waves = np.array([wave_factor(o[i:i + 1], gemm[i:i + 1], float(sms[i]))[0] for i in range(len(o))])
        return roof * waves ** self.wave_exponent + self.c0_ms

    def to_dict(self) -> dict[str, Any]:
        return {"schema": CROSSGPU_SCHEMA, "design": design_names(), "gpu_columns": list(GPU_COLUMNS),
                "theta_ff": self.theta_ff.tolist(), "theta_tc": self.theta_tc.tolist(), "theta_m": self.theta_m.tolist(),
                "theta_s": self.theta_s.tolist(), "sm_bytes_per_clock": self.sm_bytes_per_clock,
                "theta_p": self.theta_p.tolist(), "watts_per_tflops": self.watts_per_tflops,
                "theta_k": self.theta_k.tolist(), "l2_weight": self.l2_weight, "wave_exponent": self.wave_exponent, "c0_ms": self.c0_ms,
                "memory_energy_pj_per_byte": self.memory_energy_pj_per_byte, "info": self.info}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CrossGPUModel:
        if d.get("schema") != CROSSGPU_SCHEMA or d.get("design") != design_names() \
                or d.get("gpu_columns") != list(GPU_COLUMNS):
            raise CrossGPUModelError("the cross-GPU model was fitted for another feature layout; refit it with "
                                     "`gpurec train-crossgpu` (gpurec.model.fitting.crossgpu_fit.fit_and_save)")
        if min(d["l2_weight"], d["wave_exponent"], d["c0_ms"]) < 0 \
                or min(d["sm_bytes_per_clock"], d["watts_per_tflops"]) <= 0:
            raise CrossGPUModelError("cross-GPU model parameters break monotonicity (negative L2 weight, wave "
                                     "exponent or floor); refit it")
        energy = d.get("memory_energy_pj_per_byte")
        if energy is not None and not (np.isfinite(energy) and energy >= 0):
            raise CrossGPUModelError("the cross-GPU model's memory energy per byte is negative or not finite; refit it "
                                     "with `gpurec train-crossgpu`")
        return cls(np.asarray(d["theta_ff"], dtype=np.float64), np.asarray(d["theta_tc"], dtype=np.float64),
                   np.asarray(d["theta_m"], dtype=np.float64), np.asarray(d["theta_s"], dtype=np.float64),
                   np.asarray(d["theta_p"], dtype=np.float64), np.asarray(d["theta_k"], dtype=np.float64),
                   float(d["sm_bytes_per_clock"]), float(d["watts_per_tflops"]),
                   float(d["l2_weight"]),
                   float(d["wave_exponent"]), float(d["c0_ms"]), dict(d.get("info", {})),
                   None if energy is None else float(energy))


# Spec columns that make the compute die: GPUs equal in all of them differ only in memory.
_DIE_COLUMNS = tuple(c for c in GPU_COLUMNS if c not in ("memory_bandwidth_gbs", "l2_cache_mb"))


def same_compute_die(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two spec rows share SM count, clock, every peak and board power (e.g. an H100 SXM
    and an H200): the same SMs at the same clock draw the same dynamic power for the same work."""
    return all(float(a[GPU_COLUMNS.index(c)]) == float(b[GPU_COLUMNS.index(c)]) for c in _DIE_COLUMNS)


def transfer_power_w(anchor_w: np.ndarray, anchor_idle_w: float, idle_w: float, limit_w: float, bytes_moved: np.ndarray,
                     anchor_time_ms: np.ndarray, time_ms: np.ndarray, energy_pj_per_byte: float) -> np.ndarray:
    """Average power of work carried from an anchor GPU to a GPU of the same compute die.

    The SMs' dynamic power over idle is the anchor's; DRAM draws ``energy_pj_per_byte`` per byte
    moved, so the same bytes in a shorter time (more bandwidth) draw more power; the idle floor is
    the GPU's own.  Held in [idle, limit]."""
    memory_w = lambda t: energy_pj_per_byte * 1e-9 * bytes_moved / np.maximum(t, 1e-12)  # noqa: E731  pJ/ms -> W
    w = idle_w + (np.asarray(anchor_w, dtype=np.float64) - anchor_idle_w) + memory_w(time_ms) - memory_w(anchor_time_ms)
    return np.minimum(np.maximum(w, idle_w), limit_w)


K_MIN = 0.5  # smallest roofline exponent: below 1 the terms add up more than linearly


def roofline_exponent(z: np.ndarray) -> np.ndarray:
    """Per-operation soft-max exponent of the roofline terms, K_MIN + softplus(z): large k is a hard
    max (compute and memory overlap fully), k = 1 their sum (no overlap)."""
    return K_MIN + np.logaddexp(0.0, z)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(z, -40, 40)))


def load_crossgpu(model_dir: Path | str) -> CrossGPUModel | None:
    """The cross-GPU model saved beside the predictors, or None when there is none."""
    path = Path(model_dir) / CROSSGPU_FILE
    if not path.exists():
        return None
    return CrossGPUModel.from_dict(json.loads(path.read_text(encoding="utf-8")))
