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

**Matmul-like GEMMs** (linear, matmul, bmm, attention; schema 3) take a tile structure instead,
after NeuSight: for each candidate output tile (GEMM_TILES, 64x64 to 256x128) the FLOPs padded to
whole tiles (gemm_tile_work) run at ``rate_c`` times the tile's learnt efficiency, and the SMs
load each tile's A and B panels ((tm + tn) x K x 4 bytes) besides B; the fastest tile wins, as the
library picks its kernel.  Convolutions keep the form above (cuDNN's Winograd, FFT and
implicit-GEMM kernels tile differently).  The efficiencies ``u_ff``, ``u_m`` and ``u_s`` of GEMM-like
groups also see the GPU's specifications (the logs of SPEC_TERMS, never the GPU's identity)
through weights held at or above spec_weight_floor: -1 on the peak the efficiency scales, 0 on
the others, so the rate peak x efficiency still never falls as any specification rises.

F and B are the operation's FLOPs and bytes in its mode; the efficiencies ``u`` lie in (0, 1)
(a sigmoid of a linear function of the operation's features: kind group, log FLOPs, log bytes,
log output elements, intensity, mode), so no GPU is ever credited beyond its peak.  The third
term is the SMs' own load/store throughput (``beta`` bytes per SM per clock, learned): an
operation whose data stays in L2 does not speed up with DRAM bandwidth (an H200 is an H100 with
43% more bandwidth, and most small operations run no faster on it).  ``p(g)`` is the power headroom: a card with a
low board power per peak FLOP/s (T4: 70 W for 8.1 TFLOPS) cannot hold its boost clock on large
operations; ``gamma`` (per operation, in (0, 1)) keeps the rate non-decreasing in peak and TDP. ``Q`` is wave
quantisation as the best over any SM count up to the GPU's, which is 1 for every operation (one SM
has no partial wave; see wave_factor), so it only survives in earlier model files. ``u_m`` grows with log(L2 / working set) through a weight kept
non-negative, so a larger L2 never slows an operation down.

**Monotone by construction.** Time depends on the GPU only through fp32 and the tensor-core peaks (inside a max,
times non-negative efficiencies), bandwidth, L2 (non-decreasing ``u_m``) and the SM count (``Q``
is taken as the best quantisation over any count up to the GPU's, which never increases with
more SMs; the on-chip term falls with more SMs and a higher clock). So a GPU that is not worse in any of these never gets a longer time.

**A learnt residual on top (schema 4).** The roofline's efficiencies are smooth functions of a few
operation features, and within one GPU the measured times scatter about them by 15-25% (a GEMM's
tile and wave fit, cuDNN's algorithm).  A boosted-tree residual (``residual``: XGBoost, saved inside
the model file) multiplies the roofline time by exp(r), with r learnt on every GPU's log residual
from the operation's own features and three that relate it to the GPU's die alone: output tiles per
SM, the last wave's fill and bytes over L2 (RESIDUAL_FEATURES).  Memory bandwidth never enters it,
so two GPUs of one compute die (the H100 and the H200) get the same r and the roofline's ratio.
It is not monotone in the specifications (the last wave's fill is not), so a model with a residual
predicts a GPU's time as the least over it and every catalogue GPU it is no better than in any
specification (``predict_ms``, the lower envelope): monotone over the catalogue by construction.

Prediction is numpy only (and xgboost for the residual); fitting lives in
gpurec.model.fitting.crossgpu_fit (torch autograd).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpurec.catalog import GPUSpec, resolve_gpu
from gpurec.model.features import KIND_GROUPS, OpBlock, kind_group
from gpurec.model.network import is_recurrent

CROSSGPU_SCHEMA = 4
_READABLE_SCHEMAS = (2, 3, 4)  # 2: the single-tile wave factor (no tile efficiencies); 3: no residual
CROSSGPU_FILE = "crossgpu.json"
# info key of the band of the public whole models' errors, each GPU held out of the fit
# (gpurec.model.fitting.crossgpu_fit.public_model_band): what a GPU without rows of its own risks
PUBLIC_BAND_KEY = "public_model_band"
GEMM_GROUPS = ("conv", "matmul", "attention")
GEMM_TILE = 128 * 128
MAX_SM = 256  # wave quantisation looks at SM counts up to this

# GPU columns the model reads (units in the names), in this order.
GPU_COLUMNS = ("fp32_tflops", "tf32_tflops", "fp16_tflops", "bf16_tflops", "memory_bandwidth_gbs", "l2_cache_mb", "sm_count", "max_sm_clock_mhz",
               "tdp_w")
# Per-operation columns: what crosses the GPU (raw) and what the efficiencies see (design).
OP_COLUMNS = ("flops_mode", "bytes_mode", "output_elements", "gemm", "tensor_mode", "gemm_n", "gemm_batch")
# tensor_mode codes: which tensor-core peak an operation may use (0: none, FP32 units only).
TENSOR_MODES = ("none", "tf32", "fp16", "bf16")
_TENSOR_PEAK_COLUMN = {1: "tf32_tflops", 2: "fp16_tflops", 3: "bf16_tflops"}


# Kinds that the main model's coarse groups (gpurec.model.features.kind_group) leave in "other" but
# that are one physical kind of work: the cross-GPU model transfers them as that work, with the
# efficiencies it learnt on every GPU, instead of an "other" group that only the H100 (and H200)
# ever measured.  A dtype cast is an elementwise copy, an embedding lookup and a relative-position
# table are gathers, a comparison or integer cast is elementwise, cumsum is a scan.  cuDNN's
# recurrent layers stay "other": a sequence of small GEMMs bound by their steps, like no other kind.
_PHYSICAL_GROUP = {"autocast_cast": "elementwise", "embedding": "data_movement",
                   "_get_relative_position_bias": "data_movement", "eq": "elementwise", "ne": "elementwise",
                   "invert": "elementwise", "int": "elementwise", "long": "elementwise", "triu": "elementwise",
                   "cumsum": "reduce"}


def physical_group(kind: str) -> str:
    """The cross-GPU model's group of an operation kind: kind_group, with the "other" kinds of
    one physical kind of work (_PHYSICAL_GROUP) moved to that work's group."""
    group = kind_group(kind)
    return _PHYSICAL_GROUP.get(kind.lower(), group) if group == "other" else group


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


# Per GEMM-like group: the GEMM's shape (output rows M, columns N, reduction K, batch), which
# decides the kernel and its tile (a linear and a bmm of equal FLOPs and bytes run differently).
_PER_GEMM = ("log_m", "log_n", "log_k", "log_batch", "log_m^2", "log_n^2")


def design_names() -> list[str]:
    """Names of the efficiency design columns: per kind group, an intercept and slopes."""
    names = []
    for g in KIND_GROUPS:
        names += [f"{g}:{c}" for c in _PER_GROUP]
    return [*names, "training", "training:log_flops", "training:log_bytes", "half_precision",
            *_gemm_shape_names()]


def _gemm_shape_names() -> list[str]:
    return [f"{g}:{c}" for g in GEMM_GROUPS for c in _PER_GEMM]


def op_table(flops_mode: np.ndarray, bytes_mode: np.ndarray, output_elements: np.ndarray, groups: Sequence[str],
             training: np.ndarray, tensor_mode: np.ndarray, gemm_n: np.ndarray | None = None,
             gemm_batch: np.ndarray | None = None) -> OpTable:
    """Build the table from per-operation arrays (groups are KIND_GROUPS names; ``tensor_mode``
    indexes TENSOR_MODES: 1 (TF32) where FP32 work may run on TF32 tensor cores, 0 where not).

    A GEMM-like operation's output is ``gemm_batch`` matrices of M x ``gemm_n`` (M = output
    elements / (batch x N)); where N is unknown, the output is taken as square matrices."""
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
    design = np.zeros((n, len(KIND_GROUPS) * w + 4 + len(_gemm_shape_names())))
    for j in range(w):
        design[np.arange(n), gidx * w + j] = per[:, j]
    base = len(KIND_GROUPS) * w
    design[:, base:base + 4] = np.stack([tr, tr * lf, tr * lb, (tm >= 2).astype(np.float64)], axis=1)
    # 1: a matmul-like GEMM (tile-and-wave), 2: a convolution (implicit GEMM: cuDNN's Winograd, FFT
    # and implicit-GEMM kernels tile differently, so it keeps the single-tile wave factor), 0: neither
    gemm = np.isin(gidx, [KIND_GROUPS.index(g) for g in GEMM_GROUPS]).astype(np.float64)
    gemm = np.where(gidx == KIND_GROUPS.index("conv"), 2.0, gemm)
    nb = np.ones(n) if gemm_batch is None else np.maximum(np.asarray(gemm_batch, dtype=np.float64), 1.0)
    nn = np.sqrt(o / nb) if gemm_n is None else np.asarray(gemm_n, dtype=np.float64)
    nn = np.minimum(np.where(np.isfinite(nn) & (nn >= 1.0), nn, np.sqrt(o / nb)), o / nb)
    lm, ln_, lk, lbt = (np.log10(np.maximum(v, 1.0)) / 4 for v in (o / (nb * nn), nn, f / (2.0 * o) + 1.0, nb))
    shape = np.stack([lm, ln_, lk, lbt, lm**2, ln_**2], axis=1)
    for gi, g in enumerate(GEMM_GROUPS):
        rows = gidx == KIND_GROUPS.index(g)
        cols = base + 4 + gi * len(_PER_GEMM)
        design[rows, cols:cols + len(_PER_GEMM)] = shape[rows]
    raw = np.stack([f, b, o, gemm, tm, nn, nb], axis=1)
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
    groups = [physical_group(k) for k in block.kinds]
    math = v[:, col("math_mode")]  # 0 fp32, 1 tf32, 2 fp16, 3 bf16 (gpurec.ops.features.MATH_MODES)
    gemm = np.array([g in GEMM_GROUPS for g in groups], dtype=bool)
    conv = np.array([g == "conv" for g in groups], dtype=bool)
    tensor_mode = np.where(gemm, math, 0.0)
    if tf32_convs:
        tensor_mode = np.where(conv & (math == 0), 1.0, tensor_mode)
    # GEMM N: a Linear's out_features, a convolution's output channels (implicit GEMM); else unknown
    n_cols = np.where(v[:, col("out_features")] > 0, v[:, col("out_features")],
                      np.where(conv, v[:, col("out_channels")], np.nan))
    return op_table(flops_mode, bytes_mode, v[:, col("output_elements")], groups, training, tensor_mode,
                    gemm_n=n_cols)


def tensor_peak(tensor_mode: np.ndarray, specs: np.ndarray) -> np.ndarray:
    """Per operation, the tensor-core peak (TFLOPS) of its math mode on its GPU's spec row (0: none)."""
    out = np.zeros(len(tensor_mode))
    for code, column in _TENSOR_PEAK_COLUMN.items():
        out = np.where(tensor_mode == code, specs[:, GPU_COLUMNS.index(column)], out)
    return out


def wave_factor(output_elements: np.ndarray, gemm: np.ndarray, sm_count: float) -> np.ndarray:
    """Wave quantisation >= 1 of GEMM-like kernels on ``sm_count`` SMs (1 elsewhere).

    The best over any SM count up to the GPU's, so that more SMs never raise it.  One SM never has a
    partial last wave, so under that rule the factor is exactly 1 for every whole tile count (the
    search's s = 1 gives ceil(t / 1) x 1 / t = 1): the monotone guarantee and a charge for partial
    waves exclude each other here (the tiled GEMM path, gemm_tile_work, charges partly filled tiles
    instead).  Kept, without the search, for the model files that carry a wave exponent."""
    return np.ones(len(np.atleast_1d(output_elements)))


# Specifications the efficiencies may depend on (their natural log over a reference card's), and
# the efficiency each scales: a GPU's FP32 efficiency, achievable DRAM bandwidth and SM load/store
# throughput differ with its generation, and the specifications are what transfers to a GPU left
# out (never its identity).
SPEC_TERMS = ("fp32_tflops", "memory_bandwidth_gbs", "l2_cache_mb", "sm_count", "max_sm_clock_mhz", "tdp_w")
_SPEC_REF = np.array([19.5, 1555.0, 40.0, 108.0, 1410.0, 250.0])  # an A100-PCIE-40GB: centres the logs
SPEC_EFFICIENCIES = ("ff", "m", "s")
# Per efficiency, the specification whose peak it scales: its weight may go down to -1 (the rate,
# peak x efficiency, still never falls as the peak rises); every other weight is >= 0.
_SPEC_OWN = {"ff": ("fp32_tflops",), "m": ("memory_bandwidth_gbs",), "s": ("sm_count", "max_sm_clock_mhz")}


def spec_weight_floor() -> np.ndarray:
    """Lowest allowed spec weight per (efficiency, spec term): -1 for the rate's own peak, else 0."""
    return np.array([[-1.0 if t in _SPEC_OWN[e] else 0.0 for t in SPEC_TERMS] for e in SPEC_EFFICIENCIES])


def spec_logs(specs: np.ndarray) -> np.ndarray:
    """(n, len(SPEC_TERMS)) natural logs of the rows' specifications over the reference card's."""
    cols = [GPU_COLUMNS.index(t) for t in SPEC_TERMS]
    return np.log(np.maximum(specs[:, cols], 1e-9) / _SPEC_REF)


def group_onehot(design: np.ndarray) -> np.ndarray:
    """(n, len(KIND_GROUPS)) kind group of each operation, read from the design's intercepts."""
    return design[:, [g * len(_PER_GROUP) for g in range(len(KIND_GROUPS))]]


# Candidate GEMM tiles (rows, columns of the output), as the FFMA and tensor-core kernels of cuBLAS
# use them; the library picks one per shape.
GEMM_TILES = ((64, 64), (128, 64), (128, 128), (256, 128))


def gemm_tile_work(raw: np.ndarray) -> np.ndarray:
    """Per operation and candidate tile, (padding, tile traffic): columns 0..T-1 are the FLOPs the
    SMs spend over the useful FLOPs (>= 1: partly filled tiles at the output's edges), columns
    T..2T-1 the bytes the tiles load (A and B panels, (tm + tn) x K x 4) per useful FLOP.

    Partial last waves are not charged: a charge that never rises with more SMs (the rule that
    keeps the model monotone) is the best over any SM count up to the GPU's, and one SM never has
    a partial wave, so it is always 1 (as wave_factor is).  Operations that are not matmul-like
    GEMMs (convolutions included) get padding 1 and no tile traffic."""
    f, o, gemm, n_cols, batch = (raw[:, OP_COLUMNS.index(c)] for c in ("flops_mode", "output_elements", "gemm", "gemm_n",
                                                                        "gemm_batch"))
    t_count = len(GEMM_TILES)
    out = np.concatenate([np.ones((len(f), t_count)), np.zeros((len(f), t_count))], axis=1)
    idx = np.flatnonzero((gemm == 1) & (f > 0))
    if len(idx) == 0:
        return out
    n_cols, batch, o_g = n_cols[idx], batch[idx], np.maximum(o[idx], 1.0)
    m_rows = o_g / (batch * n_cols)
    k_red = f[idx] / (2.0 * o_g)  # reduction length (times the mode's passes)
    for j, (tm, tn) in enumerate(GEMM_TILES):
        tiles = batch * np.ceil(m_rows / tm - 1e-9) * np.ceil(n_cols / tn - 1e-9)
        out[idx, j] = np.maximum(tiles * tm * tn / o_g, 1.0)
        out[idx, t_count + j] = tiles * (tm + tn) * 4.0 * k_red / f[idx]
    return out


# The residual's features: the operation's own (kind group, mode, math, sizes, GEMM shape) and three
# that relate it to the GPU's compute die (tiles per SM, the last wave's fill, bytes over L2); never
# the memory bandwidth, so GPUs of one die share the residual.
RESIDUAL_FEATURES = ("group", "gemm", "tensor_mode", "training", "log_flops", "log_bytes", "log_out", "log_intensity",
                     "log_m", "log_n", "log_k", "log_batch", "bytes_over_l2", "tiles_per_sm", "wave_fill")
RESIDUAL_TILE = 128  # output tile (rows x columns) of a GEMM; other operations: blocks of 512 elements
RESIDUAL_BLOCK_ELEMENTS = 512
RESIDUAL_CLIP = 3.0  # |log residual| at most this (a factor of 20): trees never extrapolate further


def residual_features(ops: OpTable, specs: np.ndarray) -> np.ndarray:
    """(n, len(RESIDUAL_FEATURES)) features of operation i on the GPU of spec row i."""
    f, b, o, gemm, tm, nn, nb = (ops.raw[:, OP_COLUMNS.index(c)] for c in OP_COLUMNS)
    l2, sms = specs[:, GPU_COLUMNS.index("l2_cache_mb")], specs[:, GPU_COLUMNS.index("sm_count")]
    group = np.argmax(group_onehot(ops.design), axis=1).astype(np.float64)
    training = ops.design[:, len(KIND_GROUPS) * len(_PER_GROUP)]
    log = lambda v: np.log10(np.maximum(v, 1e-30))  # noqa: E731
    is_gemm = gemm > 0
    m_rows = o / np.maximum(nb * nn, 1.0)
    t = RESIDUAL_TILE
    tiles = np.where(gemm == 1, nb * np.ceil(m_rows / t - 1e-9) * np.ceil(nn / t - 1e-9), np.ceil(o / RESIDUAL_BLOCK_ELEMENTS))
    tiles = np.maximum(tiles, 1.0)
    waves = np.ceil(tiles / sms - 1e-9)
    return np.column_stack([
        group, gemm, tm, training, log(f + 1.0), log(b), log(o), log((f + 1.0) / b),
        np.where(is_gemm, log(m_rows), np.nan), np.where(is_gemm, log(nn), np.nan),
        np.where(f > 0, log(f / (2.0 * o) + 1.0), np.nan), log(nb),
        log(b / (l2 * 2**20)), log(tiles / sms), tiles / (sms * waves)])


def _booster_to_text(booster: Any) -> str:
    import base64

    return base64.b64encode(bytes(booster.save_raw("ubj"))).decode("ascii")


def _booster_from_text(text: str) -> Any:
    import base64

    import xgboost as xgb

    booster = xgb.Booster()
    booster.load_model(bytearray(base64.b64decode(text)))
    booster.set_param({"nthread": 1})
    return booster


@functools.lru_cache(maxsize=1)
def _catalogue_rows() -> np.ndarray:
    """Spec rows of every catalogue GPU, for the lower envelope (CrossGPUModel.predict_ms)."""
    from gpurec.catalog import load_catalog

    return np.stack([spec_row(s) for s in load_catalog()])


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
    # Per candidate tile (GEMM_TILES), its compute efficiency in (0, 1]; None: the single-tile wave
    # factor of earlier models instead of the tile-and-wave structure.
    tile_efficiency: np.ndarray | None = None
    # (len(SPEC_EFFICIENCIES), len(KIND_GROUPS), len(SPEC_TERMS)) weights of the GPU's spec logs in
    # each kind group's efficiencies, at least spec_weight_floor(); None: no spec dependence.
    spec_weights: np.ndarray | None = None
    # The same per memory type (the catalogue's memory_type: HBM3, HBM3e, ...), where the network pairs
    # tell the types apart; a type not in it takes memory_energy_pj_per_byte.  None: one value for all.
    memory_energy_by_type_pj_per_byte: dict[str, float] | None = None
    # An xgboost Booster of the log residual over the roofline (RESIDUAL_FEATURES); None: none.
    residual: Any = None

    def memory_energy_pj_per_byte_for(self, gpu: str | GPUSpec) -> float | None:
        """DRAM energy per byte moved on ``gpu``: its memory type's where fitted, else the shared value."""
        if self.memory_energy_pj_per_byte is None:
            return None
        kind = (gpu if isinstance(gpu, GPUSpec) else resolve_gpu(gpu)).memory_type
        return (self.memory_energy_by_type_pj_per_byte or {}).get(kind, self.memory_energy_pj_per_byte)

    def predict_ms(self, ops: OpTable, gpu: str | GPUSpec | np.ndarray) -> np.ndarray:
        """GPU time (ms) of each operation on one GPU (a name, a spec, or its spec_row).  With a
        residual, the least over this GPU and every catalogue GPU it is no better than in any
        specification (the lower envelope; module docstring)."""
        spec = np.asarray(gpu if isinstance(gpu, np.ndarray) else spec_row(gpu), dtype=np.float64)
        n = len(ops)
        if self.residual is None or n == 0:
            return self.predict_ms_rows(ops, np.broadcast_to(spec, (n, len(GPU_COLUMNS))))
        cat = _catalogue_rows()
        below = cat[np.all(cat <= spec, axis=1) & ~np.all(cat == spec, axis=1)]
        rows = np.concatenate([spec[None, :], below])  # this GPU first, then those it dominates
        every = self.predict_ms_rows(ops.take(np.tile(np.arange(n), len(rows))), np.repeat(rows, n, axis=0))
        return every.reshape(len(rows), n).min(axis=0)

    def residual_log(self, ops: OpTable, specs: np.ndarray) -> np.ndarray:
        """The residual's log factor of operation i on the GPU of spec row i (0 without one)."""
        if self.residual is None or len(ops) == 0:
            return np.zeros(len(ops))
        import xgboost as xgb

        x = xgb.DMatrix(residual_features(ops, specs), feature_names=list(RESIDUAL_FEATURES))
        return np.clip(self.residual.predict(x), -RESIDUAL_CLIP, RESIDUAL_CLIP)

    def predict_ms_rows(self, ops: OpTable, specs: np.ndarray, waves: np.ndarray | None = None,
                        tiles: np.ndarray | None = None) -> np.ndarray:
        """GPU time (ms) of operation i on the GPU of spec row i (``waves``: precomputed wave_factor,
        ``tiles``: precomputed gemm_tile_work)."""
        f, b, o, gemm, tensor_mode = (ops.raw[:, j] for j in range(5))
        fp32, bw, l2, sms, clock, tdp = (specs[:, GPU_COLUMNS.index(c)] for c in (
            "fp32_tflops", "memory_bandwidth_gbs", "l2_cache_mb", "sm_count", "max_sm_clock_mhz", "tdp_w"))
        tc = tensor_peak(tensor_mode, specs)
        x = ops.design
        z = {e: 0.0 for e in SPEC_EFFICIENCIES}
        if self.spec_weights is not None and len(specs):
            onehot = group_onehot(x)
            one_gpu = bool(np.all(specs == specs[0]))  # predict_ms: every row on one GPU
            logs = spec_logs(specs[:1] if one_gpu else specs)
            for i, e in enumerate(SPEC_EFFICIENCIES):
                z[e] = onehot @ (self.spec_weights[i] @ logs[0]) if one_gpu else \
                    np.einsum("ng,gt,nt->n", onehot, self.spec_weights[i], logs)
        u_ff = _sigmoid(x @ self.theta_ff + z["ff"])
        u_tc = _sigmoid(x @ self.theta_tc)
        l2_fit = np.clip(np.log2(l2 * 2**20 / b), 0.0, 8.0)
        u_m = _sigmoid(x @ self.theta_m + self.l2_weight * l2_fit + z["m"])
        peak = np.maximum(fp32 * u_ff, tc * u_tc)
        gamma = _sigmoid(x @ self.theta_p)
        # in the rate actually used, so the rate stays non-decreasing in both peaks and in TDP
        headroom = (tdp / (tdp + self.watts_per_tflops * peak)) ** gamma
        rate_c = peak * headroom * 1e9  # FLOP per ms
        rate_m = bw * u_m * 1e6  # byte per ms
        rate_s = sms * clock * 1e3 * self.sm_bytes_per_clock * _sigmoid(x @ self.theta_s + z["s"])  # byte per ms
        k = roofline_exponent(x @ self.theta_k)
        tiled = np.flatnonzero(gemm == 1) if self.tile_efficiency is not None else np.zeros(0, dtype=np.int64)
        if len(tiled):
            i = tiled
            work = gemm_tile_work(ops.raw[i]) if tiles is None else tiles[i]
            t_count, ki = len(GEMM_TILES), k[i]
            # each candidate tile's roofline; the library runs the fastest
            tiled_ms = np.min([soft_max(ki, f[i] * work[:, j] / (rate_c[i] * self.tile_efficiency[j]), b[i] / rate_m[i],
                                        (b[i] + f[i] * work[:, t_count + j]) / rate_s[i]) for j in range(t_count)], axis=0)
        roof = soft_max(k, f / rate_c, b / rate_m, b / rate_s)
        if waves is None:
            waves = _per_sm_count(lambda r, s: wave_factor(r[:, 2], r[:, 3], s)[:, None], ops.raw, sms)[:, 0]
        roof = roof * waves ** self.wave_exponent
        if len(tiled):
            roof[tiled] = tiled_ms  # matmul-like GEMMs: the tiled roofline instead
        return (roof + self.c0_ms) * np.exp(self.residual_log(ops, specs))

    def to_dict(self) -> dict[str, Any]:
        return {"schema": CROSSGPU_SCHEMA, "design": design_names(), "gpu_columns": list(GPU_COLUMNS),
                "theta_ff": self.theta_ff.tolist(), "theta_tc": self.theta_tc.tolist(), "theta_m": self.theta_m.tolist(),
                "theta_s": self.theta_s.tolist(), "sm_bytes_per_clock": self.sm_bytes_per_clock,
                "theta_p": self.theta_p.tolist(), "watts_per_tflops": self.watts_per_tflops,
                "theta_k": self.theta_k.tolist(), "l2_weight": self.l2_weight, "wave_exponent": self.wave_exponent, "c0_ms": self.c0_ms,
                "memory_energy_pj_per_byte": self.memory_energy_pj_per_byte,
                "memory_energy_by_type_pj_per_byte": self.memory_energy_by_type_pj_per_byte, "info": self.info,
                "tile_efficiency": None if self.tile_efficiency is None else self.tile_efficiency.tolist(),
                "gemm_tiles": [list(t) for t in GEMM_TILES],
                "spec_terms": list(SPEC_TERMS),
                "spec_weights": None if self.spec_weights is None else self.spec_weights.tolist(),
                "residual_features": list(RESIDUAL_FEATURES) if self.residual is not None else None,
                "residual_ubj_base64": None if self.residual is None else _booster_to_text(self.residual)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CrossGPUModel:
        d = _with_gemm_shape_columns(d)
        if d.get("schema") not in _READABLE_SCHEMAS or d.get("design") != design_names() \
                or d.get("gpu_columns") != list(GPU_COLUMNS):
            raise CrossGPUModelError("the cross-GPU model was fitted for another feature layout; refit it with "
                                     "`gpurec train-crossgpu` (gpurec.model.fitting.crossgpu_fit.fit_and_save)")
        if min(d["l2_weight"], d["wave_exponent"], d["c0_ms"]) < 0 \
                or min(d["sm_bytes_per_clock"], d["watts_per_tflops"]) <= 0:
            raise CrossGPUModelError("cross-GPU model parameters break monotonicity (negative L2 weight, wave "
                                     "exponent or floor); refit it")
        tile_eff = d.get("tile_efficiency")
        if tile_eff is not None and (d.get("gemm_tiles") != [list(t) for t in GEMM_TILES] or len(tile_eff) != len(GEMM_TILES)
                                     or not all(0 < e <= 1 for e in tile_eff)):
            raise CrossGPUModelError("the cross-GPU model's GEMM tiles or their efficiencies do not fit this code "
                                     "(efficiencies must lie in (0, 1]); refit it with `gpurec train-crossgpu`")
        sw = d.get("spec_weights")
        if sw is not None:
            sw = np.asarray(sw, dtype=np.float64)
            if d.get("spec_terms") != list(SPEC_TERMS) or sw.shape != (len(SPEC_EFFICIENCIES), len(KIND_GROUPS), len(SPEC_TERMS)) \
                    or np.any(sw < spec_weight_floor()[:, None, :] - 1e-12):
                raise CrossGPUModelError("the cross-GPU model's specification weights do not fit this code or would let "
                                         "a better GPU be slower; refit it with `gpurec train-crossgpu`")
        energy = d.get("memory_energy_pj_per_byte")
        if energy is not None and not (np.isfinite(energy) and energy >= 0):
            raise CrossGPUModelError("the cross-GPU model's memory energy per byte is negative or not finite; refit it "
                                     "with `gpurec train-crossgpu`")
        by_type = d.get("memory_energy_by_type_pj_per_byte")
        if by_type is not None and (energy is None or not isinstance(by_type, dict) or not all(
                isinstance(v, int | float) and np.isfinite(v) and v >= 0 for v in by_type.values())):
            raise CrossGPUModelError("the cross-GPU model's memory energy per memory type is not a table of "
                                     "non-negative numbers beside a shared value; refit it with `gpurec train-crossgpu`")
        residual = d.get("residual_ubj_base64")
        if residual is not None and d.get("residual_features") != list(RESIDUAL_FEATURES):
            raise CrossGPUModelError("the cross-GPU model's residual was fitted on other features than this code "
                                     "computes; refit it with `gpurec train-crossgpu`")
        if residual is not None:
            try:
                residual = _booster_from_text(residual)
            except Exception as e:  # a damaged or truncated booster
                raise CrossGPUModelError(f"the cross-GPU model's residual booster does not load ({e}); refit it "
                                         "with `gpurec train-crossgpu`") from e
        return cls(np.asarray(d["theta_ff"], dtype=np.float64), np.asarray(d["theta_tc"], dtype=np.float64),
                   np.asarray(d["theta_m"], dtype=np.float64), np.asarray(d["theta_s"], dtype=np.float64),
                   np.asarray(d["theta_p"], dtype=np.float64), np.asarray(d["theta_k"], dtype=np.float64),
                   float(d["sm_bytes_per_clock"]), float(d["watts_per_tflops"]),
                   float(d["l2_weight"]),
                   float(d["wave_exponent"]), float(d["c0_ms"]), dict(d.get("info", {})),
                   None if energy is None else float(energy),
                   None if tile_eff is None else np.asarray(tile_eff, dtype=np.float64), sw,
                   None if by_type is None else {str(k): float(v) for k, v in by_type.items()}, residual)


def _with_gemm_shape_columns(d: dict[str, Any]) -> dict[str, Any]:
    """A schema-2 model file (fitted before the GEMM shape columns) with those columns at weight 0,
    which predicts exactly as it did."""
    names = design_names()
    if d.get("schema") != 2 or d.get("design") != names[:len(names) - len(_gemm_shape_names())]:
        return d
    pad = [0.0] * len(_gemm_shape_names())
    return {**d, "design": names, **{k: list(d[k]) + pad for k in ("theta_ff", "theta_tc", "theta_m", "theta_s",
                                                                  "theta_p", "theta_k")}}


# Spec columns that make the compute die: GPUs equal in all of them differ only in memory.
_DIE_COLUMNS = tuple(c for c in GPU_COLUMNS if c not in ("memory_bandwidth_gbs", "l2_cache_mb"))


def same_compute_die(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two spec rows share SM count, clock, every peak and board power (e.g. an H100 SXM
    and an H200): the same SMs at the same clock draw the same dynamic power for the same work."""
    return all(float(a[GPU_COLUMNS.index(c)]) == float(b[GPU_COLUMNS.index(c)]) for c in _DIE_COLUMNS)


def transfer_power_w(anchor_w: np.ndarray, anchor_idle_w: float, idle_w: float, limit_w: float, bytes_moved: np.ndarray,
                     anchor_time_ms: np.ndarray, time_ms: np.ndarray, energy_pj_per_byte: float,
                     anchor_energy_pj_per_byte: float | None = None) -> np.ndarray:
    """Average power of work carried from an anchor GPU to a GPU of the same compute die.

    The SMs' dynamic power over idle is the anchor's; DRAM draws ``energy_pj_per_byte`` per byte
    moved on this GPU (``anchor_energy_pj_per_byte`` on the anchor, the same if None: another memory
    type may move a byte for less), so the same bytes in a shorter time (more bandwidth) draw more
    power; the idle floor is the GPU's own.  Held in [idle, limit]."""
    anchor_e = energy_pj_per_byte if anchor_energy_pj_per_byte is None else anchor_energy_pj_per_byte
    memory_w = lambda e, t: e * 1e-9 * bytes_moved / np.maximum(t, 1e-12)  # noqa: E731  pJ/ms -> W
    w = idle_w + (np.asarray(anchor_w, dtype=np.float64) - anchor_idle_w) + memory_w(energy_pj_per_byte, time_ms) \
        - memory_w(anchor_e, anchor_time_ms)
    return np.minimum(np.maximum(w, idle_w), limit_w)


def recurrent_reread_bytes(block: OpBlock) -> np.ndarray:
    """Per operation, the bytes a recurrent layer moves beyond its operation bytes: cuDNN reads the
    layer's weights again at every step (seq_len - 1 more times; forward and backward, like the
    operation bytes, in training), which the operation's bytes (inputs, weights once, outputs) leave
    out.  Every parameter counts, an upper bound: cuDNN applies the input weights to the whole
    sequence at once.  0 for other operations.  Without them a recurrent network moved about seven
    times fewer bytes per unit time than the other networks of the H200/H100 pairs (medians), and
    the H200's lower energy per byte never reached it."""
    from gpurec.ops.features import FEATURE_NAMES

    v = block.values
    col = FEATURE_NAMES.index
    recurrent = is_recurrent(block.kinds)
    rereads = v[:, col("params")] * v[:, col("element_bytes")] * np.maximum(v[:, col("seq_len")] - 1.0, 0.0)
    return np.where(recurrent, rereads * (1.0 + 2.0 * block.training.astype(np.float64)), 0.0)


K_MIN = 0.5  # smallest roofline exponent: below 1 the terms add up more than linearly


def soft_max(k: np.ndarray, *terms: np.ndarray) -> np.ndarray:
    """(sum of terms^k)^(1/k), scaled by the largest term so that no power overflows (k can be large)."""
    top = np.maximum.reduce(terms)
    safe = np.where(top > 0, top, 1.0)
    return top * sum((t / safe) ** k for t in terms) ** (1.0 / k)


def roofline_exponent(z: np.ndarray) -> np.ndarray:
    """Per-operation soft-max exponent of the roofline terms, K_MIN + softplus(z): large k is a hard
    max (compute and memory overlap fully), k = 1 their sum (no overlap)."""
    return K_MIN + np.logaddexp(0.0, z)


def _per_sm_count(fn: Any, raw: np.ndarray, sms: np.ndarray) -> np.ndarray:
    """``fn(raw rows, sm count)`` evaluated once per distinct SM count among the rows."""
    parts = [(np.flatnonzero(sms == s), fn(raw[sms == s], float(s))) for s in np.unique(sms)]
    out = np.zeros((len(raw), parts[0][1].shape[1] if parts else 0))
    for idx, v in parts:
        out[idx] = v
    return out


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(z, -40, 40)))


def load_crossgpu(model_dir: Path | str) -> CrossGPUModel | None:
    """The cross-GPU model saved beside the predictors, or None when there is none."""
    path = Path(model_dir) / CROSSGPU_FILE
    if not path.exists():
        return None
    return CrossGPUModel.from_dict(json.loads(path.read_text(encoding="utf-8")))
