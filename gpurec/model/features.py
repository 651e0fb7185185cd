"""Feature table shared by training and prediction.

One code path turns (operations, GPU) into the model's input matrix, whether the operations
come from measured rows (recovered by re-extracting the row's ``set_key`` in its ``mode``
and looking its signature up) or from a user's model. Keeping both on the same function is
what makes train-time and predict-time features agree by construction.

A feature row is: the operation's analytic features (gpurec.ops FEATURE_NAMES), derived
features that cross the operation with the GPU (roofline: ideal compute and memory time;
wave quantisation: estimated thread blocks against the SMs, after NeuSight; working set and
parameters against L2), the GPU's catalogue features, a one-hot of the operation kind over a
category list frozen at training time (plus ``__other__``), a one-hot of a coarse kind group
(so unseen kinds still land near their relatives), and optional measured extra columns (ncu
counters). Per target, GPU features without a physical direction are hidden, the roofline-derived
ones are monotone (TIME_MONOTONE) and the GPU's own peaks and bandwidth are free
(TIME_UNCONSTRAINED_SPECS): only the anchor GPU's time comes from the booster, and the cross-GPU
model, monotone by construction, orders the GPUs.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gpurec.catalog import HARDWARE_FEATURES, GPUSpec, resolve_gpu
from gpurec.ops.cache import SetOperations
from gpurec.ops.features import FEATURE_NAMES, MATH_MODES, operation_feature_row
from gpurec.ops.precision import precision_or_default

if TYPE_CHECKING:
    import pandas as pd

    from gpurec.ops.operation import Operation

FEATURE_SCHEMA_VERSION = 3
OTHER_KIND = "__other__"

# Coarse kind groups: fixed order, part of the feature schema.
KIND_GROUPS: tuple[str, ...] = (
    "conv", "matmul", "attention", "norm", "activation", "pool", "elementwise", "reduce", "data_movement", "other",
)
_ACTIVATIONS = frozenset({
    "relu", "relu6", "relu_", "gelu", "silu", "sigmoid", "hardsigmoid", "hardswish", "tanh", "mish", "softmax",
    "log_softmax", "_softmax", "elu", "leakyrelu", "leaky_relu", "softplus", "hardtanh", "prelu", "selu", "celu",
    "glu", "logsigmoid", "softsign", "tanhshrink", "threshold",
})
_ELEMENTWISE = frozenset({
    "add", "iadd", "mul", "imul", "sub", "isub", "div", "truediv", "dropout", "stochasticdepth", "stochastic_depth",
    "pow", "neg", "sqrt", "rsqrt", "exp", "log", "clamp", "clip", "where", "masked_fill", "abs", "erf", "sin", "cos",
    "alphadropout", "dropout1d", "dropout2d", "dropout3d", "add_", "mul_", "floordiv", "mod",
})
_REDUCE = frozenset({"mean", "sum", "max", "min", "amax", "amin", "argmax", "argmin", "std", "var", "prod", "logsumexp"})
_MATMUL = frozenset({"linear", "matmul", "bmm", "mm", "addmm", "baddbmm", "einsum", "bilinear", "lazylinear"})
_DATA_MOVEMENT = frozenset({
    "view", "reshape", "permute", "transpose", "flatten", "cat", "concat", "stack", "contiguous", "getitem",
    "expand", "expand_as", "chunk", "split", "roll", "pad", "unsqueeze", "squeeze", "narrow", "repeat", "flip",
    "index_select", "gather", "zeros", "ones", "arange", "zeros_like", "ones_like", "unflatten", "unbind",
    "channel_shuffle", "_patch_merging_pad", "pixel_shuffle", "interpolate", "upsample", "t", "clone", "to",
    "type_as", "float", "new_zeros", "new_ones", "masked_select", "flatten_", "movedim", "swapaxes", "tile",
})


def kind_group(kind: str) -> str:
    """Coarse group of an operation kind (module class or function name)."""
    k = kind.lower()
    if "attention" in k:
        return "attention"
    if "conv" in k:
        return "conv"
    if k in _MATMUL or k.endswith("linear"):
        return "matmul"
    if "norm" in k:
        return "norm"
    if k in _ACTIVATIONS:
        return "activation"
    if "pool" in k:
        return "pool"
    if k in _ELEMENTWISE or "dropout" in k:
        return "elementwise"
    if k in _REDUCE:
        return "reduce"
    if k in _DATA_MOVEMENT or "pad" in k or "shuffle" in k:
        return "data_movement"
    return "other"


# Features derived from operation x GPU (units in the names); order is part of the schema.
DERIVED_FEATURES: tuple[str, ...] = (
    "mode_training", "has_backward", "flops_mode", "bytes_mode", "peak_tflops_used",
    "t_compute_ms", "t_memory_ms", "t_roofline_ms", "compute_bound", "param_bytes_over_l2",
    "waves", "wave_efficiency", "t_compute_wave_ms", "working_set_over_l2", "channels_per_group",
)
# channels_per_group (a grouped convolution's input channels per group, 1 for depthwise, 0 for
# everything else): cuDNN's algorithm for a grouped convolution, and with it a 2-9x change in
# time at one size, follows the group width and the batch (the few-group sweeps of
# gpurec.synthsets); a tree finds the width in one split where in_channels / groups took several.

# Wave quantisation (after NeuSight, ASPLOS'25): a kernel runs its thread blocks in waves of
# (SMs x resident blocks per SM); a last, partly filled wave costs as much as a full one. We
# cannot see the real tiling on a CPU, so blocks are estimated from the output size: GEMM-like
# kernels (conv, matmul, attention) compute 128 x 128 output tiles with one block per SM,
# everything else 1024 elements per block (256 threads x 4) with 8 blocks per SM.
GEMM_TILE_ELEMENTS = 128 * 128
GEMM_BLOCKS_PER_SM = 1
OTHER_BLOCK_ELEMENTS = 1024
OTHER_BLOCKS_PER_SM = 8

# Per target, GPU-dependent features whose effect has no physical direction are hidden from
# the booster (NaN); the roofline-derived ones are monotone (+1 = a larger value never makes the
# operation faster, -1 = never slower), which regularises the fit over operation sizes; the GPU's
# own specifications are shown unconstrained (TIME_UNCONSTRAINED_SPECS says why). The host
# dispatch model sees no GPU feature at all (dispatch is the host's work; how fast the host is,
# is the host profile's business).
TIME_MONOTONE: dict[str, int] = {
    "peak_tflops_used": -1, "t_compute_ms": 1, "t_memory_ms": 1, "t_roofline_ms": 1, "param_bytes_over_l2": 1,
    "wave_efficiency": -1, "t_compute_wave_ms": 1, "working_set_over_l2": 1,
}
# The GPU's own peaks, bandwidth and L2 reach the time booster unconstrained.  The booster learns
# the residual over the log-roofline margin, and the margin already gives a GPU with more bandwidth
# its full roofline advantage; where the measured advantage is smaller (medians over the fp32
# operations both measured: an H200 takes 0.94x an H100's time on batch norms and 0.96x on
# convolutions, where its 1.43x bandwidth gives memory-bound work 0.70x), the residual has to
# *rise* with bandwidth, which a -1 constraint forbids.  Constrained (the models shipped before
# session 23), the trees could not tell the two GPUs apart and split the difference: in sample,
# the H100's fp32 convolutions and batch norms 6-10% too slow and the H200's as much too fast.
# Only an anchor GPU's time comes from the booster (every other GPU's is the anchor's times the cross-GPU model's ratio,
# monotone in these specifications by construction), so no ordering of GPUs rests on it.
TIME_UNCONSTRAINED_SPECS: frozenset[str] = frozenset({
    "hw_fp32_tflops", "hw_tf32_tflops", "hw_fp16_tflops", "hw_bf16_tflops", "hw_memory_bandwidth_gbs",
    "hw_l2_cache_mb",
})
_GPU_DEPENDENT_DERIVED = ("peak_tflops_used", "t_compute_ms", "t_memory_ms", "t_roofline_ms", "compute_bound",
                          "param_bytes_over_l2", "waves", "wave_efficiency", "t_compute_wave_ms",
                          "working_set_over_l2")


def gpu_dependent(name: str) -> bool:
    """Whether a feature changes with the GPU (catalogue features and what is derived from them)."""
    return name.startswith("hw_") or name in _GPU_DEPENDENT_DERIVED


def target_mask(target: str, feature_names: Sequence[str]) -> np.ndarray:
    """Columns hidden (set to NaN) for ``target`` ('time', 'power' or 'host')."""
    if target == "time":
        return np.array([gpu_dependent(f) and f not in TIME_MONOTONE and f not in TIME_UNCONSTRAINED_SPECS
                         for f in feature_names], dtype=bool)
    if target == "host":
        return np.array([gpu_dependent(f) for f in feature_names], dtype=bool)
    return np.zeros(len(feature_names), dtype=bool)


def monotone_constraints(target: str, feature_names: Sequence[str]) -> tuple[int, ...] | None:
    """XGBoost monotone constraints for ``target`` (None: unconstrained)."""
    if target != "time":
        return None
    return tuple(TIME_MONOTONE.get(f, 0) for f in feature_names)


def masked(X: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``X`` with the masked columns set to NaN (a copy; ``X`` itself when nothing is masked)."""
    if not mask.any():
        return X
    out = X.copy()
    out[:, mask] = np.nan
    return out


@dataclass(frozen=True)
class FeatureConfig:
    """What goes into a feature row; saved in the manifest so prediction rebuilds the same row.

    ``time_margin='roofline'`` makes the time booster start from log(roofline time + launch floor),
    so trees learn a log-efficiency that carries over to GPUs with other peaks (with one measured
    GPU, hardware features are constant and trees alone could not extrapolate at all).
    ``power_margin='tdp'`` likewise starts power from the board's TDP. ``extra_columns`` are
    measured per-operation columns (glob patterns, e.g. ``smsp_*_util``) used only if present; at
    prediction time they are unknown (NaN) for operations never measured, so keep them off unless
    that is what you want.
    """

    op_features: tuple[str, ...] = FEATURE_NAMES
    hardware_features: tuple[str, ...] = HARDWARE_FEATURES
    extra_columns: tuple[str, ...] = ()
    time_margin: str = "roofline"  # or "none"
    power_margin: str = "tdp"  # or "none"
    launch_floor_ms: float = 0.005
    range_tolerance: float = 2.0  # an op is out of range beyond max x tol or below min / tol
    range_features: tuple[str, ...] = ("flops_total", "bytes_total")
    # Kinds the training rows held at bf16 and never at fp16 (fp16_as_bf16_kinds): their fp16
    # operations are read as their bf16 twins on GPUs whose fp16 and bf16 peaks are equal.
    fp16_as_bf16_kinds: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FeatureConfig:
        known = {f for f in cls.__dataclass_fields__}
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in known}
        return cls(**kw)


# fp16 and bf16 are the same tensor-core path at the same peak on GPUs that have both (Ampere
# and later): in the committed networks measured at both, an fp16-mixed operation's in-network
# kernel time is its bf16-mixed twin's within 1-2% (median ratio 0.99-1.00 for Linear,
# LayerNorm, attention, add, mul, GELU on the H100 and H200).  The kinds that differ (BatchNorm
# ~0.65x, convolutions ~10% apart) are those the training rows hold at fp16.  A booster that never
# saw a kind at fp16 has no evidence for how fp16 changes it, and trees split on the math mode
# for other kinds can move it anywhere (an fp16 GPT head was predicted 40% below its bf16 twin).
# The rows' math mode decides, not their precision label: under bf16 autocast cuDNN's LSTM and
# GRU run in fp16 (gpurec.ops), so their bf16-mixed rows are fp16 rows.
HALF_TWINS: tuple[tuple[str, str], ...] = (("fp16-mixed", "bf16-mixed"), ("fp16", "bf16"))
_FP16_MODE, _BF16_MODE = float(MATH_MODES.index("fp16")), float(MATH_MODES.index("bf16"))


def fp16_as_bf16_kinds(kinds: Sequence[str], math_modes: Sequence[float]) -> tuple[str, ...]:
    """The kinds of rows (``kinds`` and their ``math_mode`` feature per row) held at bf16 and
    never at fp16: FeatureConfig.fp16_as_bf16_kinds."""
    at_fp16 = {k for k, m in zip(kinds, math_modes, strict=True) if float(m) == _FP16_MODE}
    at_bf16 = {k for k, m in zip(kinds, math_modes, strict=True) if float(m) == _BF16_MODE}
    return tuple(sorted(at_bf16 - at_fp16))


@dataclass
class OpBlock:
    """Operations (possibly of several networks) as arrays; values are over FEATURE_NAMES."""

    values: np.ndarray  # (n, len(FEATURE_NAMES)) float64
    kinds: np.ndarray  # (n,) object
    training: np.ndarray  # (n,) bool
    signatures: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    # (n,) bool: the operation launches no kernel (Operation.kernel_free); None where not known
    # (blocks cached before it existed), and then no operation is treated as free.
    kernel_free: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.values.shape[0])

    @staticmethod
    def from_operations(ops: Sequence[Operation], mode: str | None = None) -> OpBlock:
        # a row computed when the operation was recorded (extract_operations(shared_records=True)) is reused
        values = np.array([op.__dict__.get("_feature_row") or operation_feature_row(op) for op in ops],
                          dtype=np.float64).reshape(len(ops), len(FEATURE_NAMES))
        modes = [mode or op.mode for op in ops]
        return OpBlock(values=values, kinds=np.array([op.kind for op in ops], dtype=object),
                       training=np.array([m == "training" for m in modes], dtype=bool),
                       signatures=[op.signature for op in ops], names=[op.name for op in ops],
                       kernel_free=np.array([op.kernel_free for op in ops], dtype=bool))

    @staticmethod
    def concat(blocks: Sequence[OpBlock]) -> OpBlock:
        if not blocks:
            return OpBlock(np.zeros((0, len(FEATURE_NAMES))), np.zeros(0, dtype=object), np.zeros(0, dtype=bool))
        return OpBlock(values=np.concatenate([b.values for b in blocks]),
                       kinds=np.concatenate([b.kinds for b in blocks]),
                       training=np.concatenate([b.training for b in blocks]),
                       signatures=[s for b in blocks for s in b.signatures],
                       names=[s for b in blocks for s in b.names],
                       kernel_free=None if any(b.kernel_free is None for b in blocks)
                       else np.concatenate([b.kernel_free for b in blocks]))

    def take(self, idx: np.ndarray) -> OpBlock:
        idx = np.asarray(idx, dtype=np.int64)
        return OpBlock(self.values[idx], self.kinds[idx], self.training[idx],
                       [self.signatures[i] for i in idx] if self.signatures else [],
                       [self.names[i] for i in idx] if self.names else [],
                       None if self.kernel_free is None else self.kernel_free[idx])

    def column(self, name: str) -> np.ndarray:
        return self.values[:, FEATURE_NAMES.index(name)]


@dataclass
class Features:
    """Model input for a block of operations on GPUs."""

    X: np.ndarray  # (n, n_features) float32
    margin_time: np.ndarray  # (n,) log-ms offset the time booster starts from
    margin_power: np.ndarray  # (n,) log-W offset the power booster starts from
    kind_index: np.ndarray  # (n,) int, -1 = kind unseen in training


_HW_INDEX = {k: i for i, k in enumerate(HARDWARE_FEATURES)}
_MATH_MODE = FEATURE_NAMES.index("math_mode")


def hardware_row(gpu: str | GPUSpec) -> np.ndarray:
    """Catalogue features of one GPU over HARDWARE_FEATURES (raises UnknownGPU)."""
    f = resolve_gpu(gpu).features()
    return np.array([f[k] for k in HARDWARE_FEATURES], dtype=np.float64)


def hardware_matrix(gpus: Sequence[str]) -> np.ndarray:
    """One hardware row per entry (names repeat a lot, so resolve each once)."""
    cache: dict[str, np.ndarray] = {}
    out = np.empty((len(gpus), len(HARDWARE_FEATURES)), dtype=np.float64)
    for i, g in enumerate(gpus):
        row = cache.get(g)
        if row is None:
            row = cache[g] = hardware_row(g)
        out[i] = row
    return out


class FeatureBuilder:
    """Builds feature rows for a frozen kind category list and FeatureConfig."""

    def __init__(self, kinds: Sequence[str], config: FeatureConfig | None = None,
                 extra_columns: Sequence[str] = ()) -> None:
        self.config = config or FeatureConfig()
        missing = [f for f in self.config.op_features if f not in FEATURE_NAMES]
        if missing:
            raise KeyError(f"operation features {missing} are not computed by gpurec.ops any more")
        missing = [f for f in self.config.hardware_features if f not in HARDWARE_FEATURES]
        if missing:
            raise KeyError(f"hardware features {missing} are not in the GPU catalogue any more")
        self.kinds = list(kinds)
        self.extra_columns = list(extra_columns)
        self._kind_pos = {k: i for i, k in enumerate(self.kinds)}
        self._op_cols = np.array([FEATURE_NAMES.index(f) for f in self.config.op_features], dtype=np.int64)
        self._hw_cols = np.array([_HW_INDEX[f] for f in self.config.hardware_features], dtype=np.int64)
        self._group_pos = {g: i for i, g in enumerate(KIND_GROUPS)}
        self._group_cache: dict[str, int] = {}
        self._gemm_groups = np.array([self._group_pos[g] for g in ("conv", "matmul", "attention")])
        self.feature_names: list[str] = [
            *self.config.op_features, *DERIVED_FEATURES, *(f"hw_{h}" for h in self.config.hardware_features),
            *(f"kind={k}" for k in self.kinds), f"kind={OTHER_KIND}", *(f"group={g}" for g in KIND_GROUPS),
            *(f"extra:{c}" for c in self.extra_columns),
        ]
        self._bf16_twins = np.array(sorted(self.config.fp16_as_bf16_kinds), dtype=object) \
            if self.config.fp16_as_bf16_kinds else None

    def _as_bf16_twins(self, v: np.ndarray, kinds: np.ndarray, hw_b: np.ndarray) -> np.ndarray:
        """``v`` with fp16 rows of the config's fp16_as_bf16_kinds given bf16's math mode, on rows
        whose GPU has equal fp16 and bf16 peaks (elsewhere the two modes' peaks differ and the
        roofline features must tell them apart); a copy only when a row changes."""
        mode = v[:, _MATH_MODE]
        sel = (mode == _FP16_MODE) & (hw_b[:, _HW_INDEX["fp16_tflops"]] == hw_b[:, _HW_INDEX["bf16_tflops"]])
        if not sel.any():
            return v
        sel &= np.isin(kinds, self._bf16_twins)
        if not sel.any():
            return v
        v = v.copy()
        v[sel, _MATH_MODE] = _BF16_MODE
        return v

    @property
    def n_features(self) -> int:
        return len(self.feature_names)

    def kind_index(self, kinds: np.ndarray) -> np.ndarray:
        pos = self._kind_pos
        return np.fromiter((pos.get(k, -1) for k in kinds), dtype=np.int64, count=len(kinds))

    def group_index(self, kinds: np.ndarray) -> np.ndarray:
        cache = self._group_cache
        out = np.empty(len(kinds), dtype=np.int64)
        for i, k in enumerate(kinds):
            g = cache.get(k)
            if g is None:
                g = cache[k] = self._group_pos[kind_group(k)]
            out[i] = g
        return out

    def build(self, block: OpBlock, hw: np.ndarray, extra: np.ndarray | None = None) -> Features:
        """Feature rows for ``block`` on hardware ``hw`` ((n, H) per row, or (1, H) broadcast)."""
        n = len(block)
        v = block.values
        hw = np.asarray(hw, dtype=np.float64)
        if hw.ndim == 1:
            hw = hw[None, :]
        hw_b = np.broadcast_to(hw, (n, hw.shape[1]))
        cfg = self.config
        if self._bf16_twins is not None:
            v = self._as_bf16_twins(v, block.kinds, hw_b)
        kind_idx = self.kind_index(block.kinds)
        group_idx = self.group_index(block.kinds)
        training = block.training.astype(np.float64)
        col = FEATURE_NAMES.index
        flops_total, flops_bwd = v[:, col("flops_total")], v[:, col("flops_bwd")]
        bytes_total, grad_in = v[:, col("bytes_total")], v[:, col("input_requires_grad")]
        has_bwd = training * ((flops_bwd > 0) | (grad_in > 0))
        flops_mode = flops_total + training * flops_bwd
        bytes_mode = bytes_total * (1.0 + 2.0 * has_bwd)  # backward reads and writes about twice as much
        fp32 = hw_b[:, _HW_INDEX["fp32_tflops"]]
        tf32 = hw_b[:, _HW_INDEX["tf32_tflops"]]
        # cuDNN may use TF32 for convolutions (torch default); matmuls stay FP32 unless enabled.
        peak = np.where(group_idx == self._group_pos["conv"], np.maximum(tf32, fp32), fp32)
        # Tensor-core products at the operation's precision run at the GPU's peak for that math
        # mode (the catalogue carries the FP32 rate where a GPU has no such tensor cores);
        # fp32 operations keep the peak above.
        gemm = np.isin(group_idx, self._gemm_groups)
        mode_col = v[:, col("math_mode")]
        for code, name in ((1.0, "tf32_tflops"), (2.0, "fp16_tflops"), (3.0, "bf16_tflops")):
            peak = np.where(gemm & (mode_col == code), np.maximum(hw_b[:, _HW_INDEX[name]], fp32), peak)
        bw = hw_b[:, _HW_INDEX["memory_bandwidth_gbs"]]
        t_compute = flops_mode / np.maximum(peak, 1e-9) / 1e9
        t_memory = bytes_mode / np.maximum(bw, 1e-9) / 1e6
        t_roof = np.maximum(t_compute, t_memory)
        l2_bytes = hw_b[:, _HW_INDEX["l2_cache_mb"]] * 2**20
        param_ratio = v[:, col("params")] * v[:, col("element_bytes")] / np.maximum(l2_bytes, 1.0)
        out_el = v[:, col("output_elements")]
        blocks = np.ceil(out_el / np.where(gemm, GEMM_TILE_ELEMENTS, OTHER_BLOCK_ELEMENTS))
        slots = np.maximum(hw_b[:, _HW_INDEX["sm_count"]], 1.0) * np.where(gemm, GEMM_BLOCKS_PER_SM,
                                                                            OTHER_BLOCKS_PER_SM)
        waves = blocks / slots
        wave_eff = np.where(blocks > 0, waves / np.maximum(np.ceil(waves), 1.0), 1.0)
        t_compute_wave = t_compute / np.maximum(wave_eff, 1e-3)
        working_set = bytes_mode / np.maximum(l2_bytes, 1.0)
        groups = v[:, col("groups")]
        per_group = np.where(groups > 1, v[:, col("in_channels")] / np.maximum(groups, 1.0), 0.0)
        derived = np.stack([training, has_bwd, flops_mode, bytes_mode, peak, t_compute, t_memory, t_roof,
                            (t_compute > t_memory).astype(np.float64), param_ratio,
                            waves, wave_eff, t_compute_wave, working_set, per_group], axis=1)
        n_kinds = len(self.kinds) + 1
        onehot = np.zeros((n, n_kinds + len(KIND_GROUPS)), dtype=np.float64)
        rows = np.arange(n)
        onehot[rows, np.where(kind_idx >= 0, kind_idx, n_kinds - 1)] = 1.0
        onehot[rows, n_kinds + group_idx] = 1.0
        parts = [v[:, self._op_cols], derived, hw_b[:, self._hw_cols], onehot]
        if self.extra_columns:
            if extra is None:
                extra = np.full((n, len(self.extra_columns)), np.nan)
            parts.append(np.asarray(extra, dtype=np.float64).reshape(n, len(self.extra_columns)))
        X = np.concatenate(parts, axis=1).astype(np.float32)
        if cfg.time_margin == "roofline":
            margin_time = np.log(t_roof + cfg.launch_floor_ms)
        else:
            margin_time = np.zeros(n)
        if cfg.power_margin == "tdp":
            margin_power = np.log(hw_b[:, _HW_INDEX["tdp_w"]])
        else:
            margin_power = np.zeros(n)
        return Features(X=X, margin_time=margin_time, margin_power=margin_power, kind_index=kind_idx)


def resolve_extra_columns(columns: Iterable[str], patterns: Sequence[str]) -> list[str]:
    """Data columns matching the configured extra-column patterns (sorted, stable)."""
    cols = list(columns)
    return sorted({c for c in cols for p in patterns if fnmatch.fnmatch(c, p)})


# ---------------------------------------------------------------------------------------------
# Recovering operations of measured rows
# ---------------------------------------------------------------------------------------------


class SetExtractor:
    """Feature arrays of model-input sets, built once per (set_key, mode).

    The operations come from the shared extraction cache (``gpurec.ops.cache.SetOperations``).

    ``cache_dir`` keeps the extracted arrays on disk (keyed by the torch and torchvision
    versions and gpurec.ops' source), because extracting ~230 sets takes about 30-60 s and
    repeats every training run.
    """

    def __init__(self, cache_dir: Path | str | None = None, sets: SetOperations | None = None) -> None:
        # The shared extraction cache: it holds few sets, because the arrays kept here are what is reused.
        self.sets = sets if sets is not None else SetOperations(keep_sources=False, max_sets=4)
        self._mem: dict[tuple[str, str], OpBlock | None] = {}
        self.errors: dict[tuple[str, str], str] = {}
        self._cache_file: Path | None = None
        self._disk: dict[str, Any] = {}
        if cache_dir is not None:
            import torch
            import torchvision

            import gpurec.ops as ops_pkg

            # Keyed by everything that can change an extraction: torch, torchvision, gpurec.ops' code.
            h = hashlib.sha1(json.dumps([torch.__version__, torchvision.__version__, FEATURE_NAMES]).encode())
            for src in sorted(Path(ops_pkg.__file__).parent.glob("*.py")):
                h.update(src.read_bytes())
            tag = h.hexdigest()[:12]
            self._cache_file = Path(cache_dir) / f"extracted-{tag}.npz"
            if self._cache_file.exists():
                try:
                    with np.load(self._cache_file, allow_pickle=False) as z:
                        self._disk = {k: z[k] for k in z.files}
                except Exception:
                    self._disk = {}
        self._dirty = False

    def get(self, set_key: str, mode: str, precision: str = "fp32") -> OpBlock | None:
        key = (set_key, mode) if precision == "fp32" else (set_key, mode, precision)
        if key in self._mem:
            return self._mem[key]
        block = self._from_disk(set_key, mode, precision)
        if block is None:
            block = self._extract(set_key, mode, precision)
        self._mem[key] = block
        return block

    def _disk_key(self, set_key: str, mode: str, precision: str = "fp32") -> str:
        return (f"{set_key}|{mode}" + ("" if precision == "fp32" else f"|{precision}")).replace(":", "~")

    def _from_disk(self, set_key: str, mode: str, precision: str = "fp32") -> OpBlock | None:
        k = self._disk_key(set_key, mode, precision)
        if k + "|v" not in self._disk:
            return None
        meta = json.loads(str(self._disk[k + "|m"]))
        free = meta.get("kernel_free")
        return OpBlock(values=self._disk[k + "|v"], kinds=np.array(meta["kinds"], dtype=object),
                       training=np.full(len(meta["kinds"]), mode == "training"),
                       signatures=meta["signatures"], names=meta["names"],
                       kernel_free=None if free is None else np.array(free, dtype=bool))

    def _extract(self, set_key: str, mode: str, precision: str = "fp32") -> OpBlock | None:
        try:
            ops = self.sets.operations(set_key, mode, precision)
        except Exception as exc:  # a set this torchvision cannot build: its rows are reported, not fatal
            self.errors[(set_key, mode) if precision == "fp32" else (set_key, f"{mode}|{precision}")] = \
                f"{type(exc).__name__}: {exc}"[:300]
            return None
        block = OpBlock.from_operations(ops, mode)
        if self._cache_file is not None:
            k = self._disk_key(set_key, mode, precision)
            self._disk[k + "|v"] = block.values
            self._disk[k + "|m"] = np.array(json.dumps({
                "kinds": list(block.kinds), "signatures": block.signatures, "names": block.names,
                "kernel_free": None if block.kernel_free is None else block.kernel_free.tolist()}))
            self._dirty = True
        return block

    def save(self) -> None:
        if self._cache_file is None or not self._dirty:
            return
        self._cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._cache_file.with_suffix(".tmp.npz")
        np.savez_compressed(tmp, **self._disk)
        tmp.replace(self._cache_file)
        self._dirty = False


@dataclass
class RowOps:
    """Measured rows matched to their operations (rows that could not be matched are listed)."""

    block: OpBlock
    row_index: np.ndarray  # positions in the input frame of the matched rows
    unmatched: dict[str, int]  # reason -> count


def _candidate_sets(row: Any) -> list[str]:
    sets = [row.set_key]
    ms = getattr(row, "model_sets", None)
    if isinstance(ms, str) and ms.startswith("["):
        try:
            sets += [s for s in json.loads(ms) if s != row.set_key]
        except json.JSONDecodeError:
            pass
    elif isinstance(ms, (list, tuple, np.ndarray)):
        sets += [s for s in ms if s != row.set_key]
    return sets


def row_precision_of(row: Any) -> str:
    """A row's precision: rows measured before precision was a column are fp32."""
    return precision_or_default(getattr(row, "precision", None))


def operations_of_rows(df: pd.DataFrame, extractor: SetExtractor) -> RowOps:
    """Recover each measured operation row's Operation features from its set (signature lookup)."""
    index_cache: dict[tuple[str, str], dict[str, int]] = {}
    picks: list[tuple[OpBlock, int]] = []
    rows: list[int] = []
    unmatched: dict[str, int] = {}
    for pos, row in enumerate(df.itertuples(index=False)):
        found = None
        precision = row_precision_of(row)
        for set_key in _candidate_sets(row)[:3]:
            block = extractor.get(set_key, row.mode, precision)
            if block is None:
                continue
            key = (set_key, row.mode, precision)
            idx = index_cache.get(key)
            if idx is None:
                idx = index_cache[key] = {}
                for i, s in enumerate(block.signatures):
                    idx.setdefault(s, i)
            if row.op_signature in idx:
                found = (block, idx[row.op_signature])
                break
        if found is None:
            reason = "extraction failed" if all(extractor.get(s, row.mode, precision) is None
                                                for s in _candidate_sets(row)[:1]) \
                else "signature not found (torch/ops version drift)"
            unmatched[reason] = unmatched.get(reason, 0) + 1
            continue
        picks.append(found)
        rows.append(pos)
    if picks:
        values = np.stack([b.values[i] for b, i in picks])
        block = OpBlock(values=values, kinds=np.array([b.kinds[i] for b, i in picks], dtype=object),
                        training=np.array([bool(b.training[i]) for b, i in picks]),
                        signatures=[b.signatures[i] for b, i in picks], names=[b.names[i] for b, i in picks])
    else:
        block = OpBlock.concat([])
    return RowOps(block=block, row_index=np.array(rows, dtype=np.int64), unmatched=unmatched)


def network_blocks(keys: Sequence[tuple[str, ...]], extractor: SetExtractor) -> tuple[OpBlock, np.ndarray, list[int]]:
    """All operations (in order, repeats kept) of each (set_key, mode[, precision]); returns the
    block, segment offsets (len(kept) + 1) and the positions in ``keys`` that could be extracted."""
    blocks, kept = [], []
    for i, key in enumerate(keys):
        b = extractor.get(*key)
        if b is None or len(b) == 0:
            continue
        blocks.append(b)
        kept.append(i)
    offsets = np.cumsum([0, *(len(b) for b in blocks)]).astype(np.int64)
    return OpBlock.concat(blocks), offsets, kept


class MeasuredLookup:
    """Measured per-operation time and power by (GPU, mode, signature).

    A measurement beats a prediction: on a measured GPU, an operation that was measured
    (even as part of another model) takes its measured values; the models fill in the rest.
    """

    def __init__(self, table: dict[tuple[str, str], dict[str, tuple[float, float]]] | None = None) -> None:
        self.table = table or {}

    @staticmethod
    def from_frame(df: pd.DataFrame, time_column: str = "time_ms", power_column: str = "power_w") -> MeasuredLookup:
        """From rows with gpu, mode, op_signature and the GPU-side time and power columns named."""
        table: dict[tuple[str, str], dict[str, tuple[float, float]]] = {}
        for g, m, s, t, w in zip(df["gpu"], df["mode"], df["op_signature"], df[time_column], df[power_column],
                                 strict=True):
            table.setdefault((str(g), str(m)), {})[str(s)] = (float(t), float(w))
        return MeasuredLookup(table)

    def __len__(self) -> int:
        return sum(len(v) for v in self.table.values())

    def to_parquet(self, path: Path) -> None:
        import pandas as pd

        rows = [(g, m, s, t, w) for (g, m), d in sorted(self.table.items()) for s, (t, w) in sorted(d.items())]
        pd.DataFrame(rows, columns=["gpu", "mode", "op_signature", "time_ms", "power_w"]).to_parquet(path, index=False)

    @staticmethod
    def read_parquet(path: Path) -> MeasuredLookup:
        import pandas as pd

        return MeasuredLookup.from_frame(pd.read_parquet(path))

    def apply(self, time_ms: np.ndarray, power_w: np.ndarray, signatures: Sequence[str], gpu: str, mode: str
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Copies of the predictions with measured values where known, and the hit mask."""
        d = self.table.get((gpu, mode))
        hit = np.zeros(len(signatures), dtype=bool)
        if not d:
            return time_ms, power_w, hit
        t, w = time_ms.copy(), power_w.copy()
        for i, s in enumerate(signatures):
            v = d.get(s)
            if v is not None:
                t[i], w[i] = v
                hit[i] = True
        return t, w, hit
