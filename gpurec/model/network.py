"""Whole-network estimates: sum of per-operation predictions plus a learned correction.

Summing per-operation times misses what happens between operations in a real network
(launch gaps on the host, allocator, kernels overlapping, caches warmed by the previous
layer). The correction is deliberately small and physical, and fitted on *out-of-fold*
network sums (leave-one-family-out), so it learns the error of unseen networks rather than
of ones the per-operation model has memorised:

* time:  t_net = scale * sum_t_op + intercept_ms + per_op_ms * n_ops + per_small_op_ms * n_small_ops
* power: p_net = p_ops * (scale + small_time_fraction * f_small + log_time * log(sum_t_op / 1 ms))
         + sum_k dyn_k * D_k / sum_t_op

where p_ops is the energy-weighted mean power of the operations (sum E_op / sum t_op) and
f_small the share of time in operations predicted shorter than ``small_op_ms``. The power
form is relative so it carries over to GPUs with other TDPs; the log-time term is the "long,
heavy runs" term (clocks and board power settle differently over long steps).  D_k is the
*dynamic* energy (above the GPU's idle power) of the operations of power class k (dense conv,
grouped conv, matmul/attention, normalisation, the memory-bound rest): an isolated operation
draws a different power than the same operation among its neighbours, and how differently
depends on its kind (CNN sums under-predicted the network's energy, ViT training ones
over-predicted it), so each class's dynamic energy gets its own factor (1 + dyn_k).  Whole
recurrent layers have a power model fitted on whole layers and no factor: the correction leaves
their power (idle under their time included) as predicted and p_ops above is the rest's
(Correction.hold_recurrent).

Every power lies within the GPU's [idle power, power limit] (gpurec.catalog
``GPUSpec.power_bounds_w``): each operation's before summing, and the network's after the
correction.  The firmware lowers clocks to hold the average at the limit, and a board with a
live context never draws less than idle, so a value outside is an extrapolation error.

Each term's benefit is measured (second-level leave-one-family-out) and reported; the
variant with the lowest cross-validated error is the one kept.

The time correction is not extrapolated below the smallest op sum it was fitted on
(Correction.time_floor_ms): there the intercept shrinks with the sum, so a smaller network keeps
the relative correction of the smallest fitted one.  Extrapolated, an intercept fitted on networks
of 0.06 ms and more (0.14 ms) made a one-Linear network of 0.004 ms 0.144 ms, where a one-operation
network measures about its operation's host-free time, as collection's isolated rows do.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

TIME_TERMS: tuple[str, ...] = ("scale", "intercept_ms", "per_op_ms", "per_small_op_ms")
TIME_IDENTITY = {"scale": 1.0, "intercept_ms": 0.0, "per_op_ms": 0.0, "per_small_op_ms": 0.0}
TIME_VARIANTS: dict[str, tuple[str, ...]] = {
    "none": (),
    "scale": ("scale",),
    "scale+intercept": ("scale", "intercept_ms"),
    "scale+intercept+n_ops": ("scale", "intercept_ms", "per_op_ms"),
    "full": TIME_TERMS,
}
# Power classes of operations (their dynamic energy gets one factor each); see power_class().
# "recurrent" (whole cuDNN LSTM/GRU/RNN layers) is a class of its own that no variant fits: its
# power model (gpurec.model.recurrent.RecurrentPower) is fitted on whole layers already, and in
# the memory-bound rest the memory class's factor (about 0.5-0.65 of the dynamic energy, fitted
# on CNNs' elementwise operations) took a quarter off every LSTM network's power.
POWER_CLASSES: tuple[str, ...] = ("conv", "grouped_conv", "matmul", "norm", "memory", "recurrent")
_DYN_TERMS: tuple[str, ...] = tuple(f"dyn_{c}" for c in POWER_CLASSES)
_FITTED_DYN_TERMS: tuple[str, ...] = tuple(t for t in _DYN_TERMS if t != "dyn_recurrent")
POWER_TERMS: tuple[str, ...] = ("scale", "small_time_fraction", "log_time", *_DYN_TERMS)
POWER_IDENTITY = {"scale": 1.0, "small_time_fraction": 0.0, "log_time": 0.0, **{t: 0.0 for t in _DYN_TERMS}}
POWER_VARIANTS: dict[str, tuple[str, ...]] = {
    "none": (),
    "scale": ("scale",),
    "scale+small_fraction": ("scale", "small_time_fraction"),
    "full": ("scale", "small_time_fraction", "log_time"),
    "kinds": _FITTED_DYN_TERMS,
    "kinds+log_time": ("log_time", *_FITTED_DYN_TERMS),
    "kinds+full": ("scale", "small_time_fraction", "log_time", *_FITTED_DYN_TERMS),
}


RECURRENT_KINDS: tuple[str, ...] = ("LSTM", "GRU", "RNN")  # whole cuDNN recurrent layers (gpurec.ops.extract)


def is_recurrent(kinds: np.ndarray) -> np.ndarray:
    """Per operation kind: a whole cuDNN recurrent layer (the "recurrent" power class)."""
    return np.isin(np.asarray(kinds, dtype=object), RECURRENT_KINDS)


def power_class(kind_group: np.ndarray, conv_groups: np.ndarray, recurrent: np.ndarray | None = None) -> np.ndarray:
    """Power class index (into POWER_CLASSES) per operation, from its kind group index (into
    gpurec.model.features.KIND_GROUPS), its convolution ``groups`` (>1: grouped/depthwise) and
    whether it is a whole recurrent layer (``recurrent``, a boolean per operation)."""
    from gpurec.model.features import KIND_GROUPS

    kind_group = np.asarray(kind_group, dtype=np.int64)
    table = np.full(len(KIND_GROUPS), POWER_CLASSES.index("memory"), dtype=np.int64)
    table[KIND_GROUPS.index("conv")] = POWER_CLASSES.index("conv")
    table[KIND_GROUPS.index("matmul")] = table[KIND_GROUPS.index("attention")] = POWER_CLASSES.index("matmul")
    table[KIND_GROUPS.index("norm")] = POWER_CLASSES.index("norm")
    out = table[kind_group]
    grouped = (out == POWER_CLASSES.index("conv")) & (np.nan_to_num(np.asarray(conv_groups, dtype=np.float64)) > 1)
    out[grouped] = POWER_CLASSES.index("grouped_conv")
    if recurrent is not None:
        out[np.asarray(recurrent, dtype=bool)] = POWER_CLASSES.index("recurrent")
    return out


def bounded_power(power_w: np.ndarray, idle_w: Any, limit_w: Any) -> np.ndarray:
    """``power_w`` held inside [idle, limit] (scalars or arrays that broadcast)."""
    return np.minimum(np.maximum(power_w, idle_w), limit_w)


@dataclass
class NetworkSums:
    """Per-network aggregates of per-operation predictions (arrays, one entry per network)."""

    sum_time_ms: np.ndarray
    sum_energy_mj: np.ndarray
    n_ops: np.ndarray
    n_small: np.ndarray
    small_time_ms: np.ndarray
    measured_time_ms: np.ndarray | None = None  # time of operations looked up from measurements (None: none)
    dyn_energy_mj: np.ndarray | None = None  # (networks, len(POWER_CLASSES)): energy above idle per class
    idle_w: np.ndarray | None = None  # per network: the GPU's power bounds (None: unbounded)
    limit_w: np.ndarray | None = None
    recurrent_time_ms: np.ndarray | None = None  # per network: time in whole recurrent layers
    measured_ops: np.ndarray | None = None  # per network: looked-up operations that launch kernels (time > 0)

    @property
    def measured_share(self) -> np.ndarray:
        """Share of each network's summed time that is measured rather than predicted."""
        if self.measured_time_ms is None:
            return np.zeros(len(self.sum_time_ms))
        return np.clip(self.measured_time_ms / np.maximum(self.sum_time_ms, 1e-12), 0.0, 1.0)

    @property
    def without_recurrent(self) -> np.ndarray | None:
        """Per network: whether it has no whole recurrent layer (None: not known, the sums were
        aggregated without power classes)."""
        return None if self.recurrent_time_ms is None else self.recurrent_time_ms <= 0

    @property
    def power_ops_w(self) -> np.ndarray:
        return self.sum_energy_mj / np.maximum(self.sum_time_ms, 1e-12)

    @property
    def small_fraction(self) -> np.ndarray:
        return self.small_time_ms / np.maximum(self.sum_time_ms, 1e-12)

    @property
    def dyn_share_w(self) -> np.ndarray:
        """(networks, classes): each class's dynamic energy over the summed time (W)."""
        if self.dyn_energy_mj is None:
            return np.zeros((len(self.sum_time_ms), len(POWER_CLASSES)))
        return self.dyn_energy_mj / np.maximum(self.sum_time_ms, 1e-12)[:, None]

    def take(self, idx: Any) -> NetworkSums:
        opt = lambda a: None if a is None else a[idx]  # noqa: E731
        return NetworkSums(self.sum_time_ms[idx], self.sum_energy_mj[idx], self.n_ops[idx], self.n_small[idx],
                           self.small_time_ms[idx], opt(self.measured_time_ms), opt(self.dyn_energy_mj),
                           opt(self.idle_w), opt(self.limit_w), opt(self.recurrent_time_ms), opt(self.measured_ops))

    @staticmethod
    def concat(parts: Sequence[NetworkSums]) -> NetworkSums:
        """One NetworkSums of several, in order (optional arrays kept only when every part has them)."""
        def cat(name: str) -> Any:
            vals = [getattr(p, name) for p in parts]
            return None if any(v is None for v in vals) else np.concatenate(vals)

        return NetworkSums(*(cat(f.name) for f in fields(NetworkSums)))


def free_kernel_free(time_ms: np.ndarray, kernel_free: np.ndarray | None, measured: np.ndarray | None) -> np.ndarray:
    """``time_ms`` with no GPU time for operations that launch no kernel (views, dropout with
    p=0; Operation.kernel_free), unless a measurement stands for them.  Training (the network
    correction's sums) and prediction both apply it, for models whose manifest says so."""
    if kernel_free is None or not kernel_free.any():
        return time_ms
    free = kernel_free if measured is None else kernel_free & ~measured
    return np.where(free, 0.0, time_ms)


# Operations whose kernels run inside their consumer's call: autocast launches the cast of an
# input or weight within the call of the operation that reads the cast copy, so the in-network
# pass attributes its kernels to that consumer.  Every mixed-precision consumer in the training
# data takes its GPU-time target from the in-network pass (datasets/h100, 2026-11-27: 904 of 904
# Conv2d/Linear/attention rows), so the consumer's predicted time already holds the cast.  The
# cast's isolated rows stay valid for what they measure (a cast alone) and its host dispatch
# still counts (isolated consumer rows, the host model's targets, read pre-cast inputs).
CONSUMER_HELD_KINDS: tuple[str, ...] = ("autocast_cast",)


def free_consumer_held(time_ms: np.ndarray, kinds: np.ndarray | None) -> np.ndarray:
    """``time_ms`` with no GPU time for operations whose kernels their consumer's time holds
    (CONSUMER_HELD_KINDS), measured or not: a measured cast is the cast alone, and adding it
    would count its kernels twice.  Training (the network sums) and prediction both apply it."""
    if kinds is None or not len(kinds):
        return time_ms
    held = np.asarray(kinds, dtype=object) == CONSUMER_HELD_KINDS[0]
    for k in CONSUMER_HELD_KINDS[1:]:
        held |= np.asarray(kinds, dtype=object) == k
    return np.where(held, 0.0, time_ms) if held.any() else time_ms


def aggregate(time_ms: np.ndarray, power_w: np.ndarray, offsets: np.ndarray, small_op_ms: float,
              measured: np.ndarray | None = None, power_classes: np.ndarray | None = None,
              idle_w: Any = None, limit_w: Any = None) -> NetworkSums:
    """Segment sums over ``offsets`` (len = networks + 1) of per-op predictions; ``measured``
    marks operations whose values were looked up from measurements, ``power_classes`` (per
    operation, power_class()) splits the dynamic energy by class, and ``idle_w``/``limit_w``
    (per network, or one for all) are the GPUs' power bounds the network power is held in.
    Operation powers are summed as given: bound them first (bounded_power)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    n = len(offsets) - 1
    if n <= 0:
        z = np.zeros(0)
        return NetworkSums(z, z, z, z, z)
    small = time_ms < small_op_ms
    cs = lambda a: np.concatenate([[0.0], np.cumsum(a, dtype=np.float64)])  # noqa: E731
    energy = time_ms * power_w
    t, e, s, st = cs(time_ms), cs(energy), cs(small.astype(np.float64)), cs(np.where(small, time_ms, 0.0))
    lo, hi = offsets[:-1], offsets[1:]
    mt = None if measured is None else cs(np.where(measured, time_ms, 0.0))
    mk = None if measured is None else cs((measured & (time_ms > 0)).astype(np.float64))
    idle_n = None if idle_w is None else np.broadcast_to(np.asarray(idle_w, dtype=np.float64), (n,)).copy()
    limit_n = None if limit_w is None else np.broadcast_to(np.asarray(limit_w, dtype=np.float64), (n,)).copy()
    dyn = rec_t = None
    if power_classes is not None:
        idle_op = 0.0 if idle_n is None else np.repeat(idle_n, hi - lo)
        dyn_op = energy - time_ms * idle_op
        dyn = np.empty((n, len(POWER_CLASSES)))
        for k in range(len(POWER_CLASSES)):
            c = cs(np.where(power_classes == k, dyn_op, 0.0))
            dyn[:, k] = c[hi] - c[lo]
        rt = cs(np.where(power_classes == POWER_CLASSES.index("recurrent"), time_ms, 0.0))
        rec_t = rt[hi] - rt[lo]
    return NetworkSums(t[hi] - t[lo], e[hi] - e[lo], (hi - lo).astype(np.float64), s[hi] - s[lo], st[hi] - st[lo],
                       None if mt is None else mt[hi] - mt[lo], dyn, idle_n, limit_n, rec_t,
                       None if mk is None else mk[hi] - mk[lo])


def _time_design(s: NetworkSums, floor_ms: float | None = None) -> np.ndarray:
    """Columns of TIME_TERMS; below ``floor_ms`` of op sum the intercept's column falls with the
    sum (the correction is not extrapolated below the networks it was fitted on)."""
    one = np.ones_like(s.sum_time_ms) if not floor_ms else np.minimum(1.0, s.sum_time_ms / floor_ms)
    return np.stack([s.sum_time_ms, one, s.n_ops, s.n_small], axis=1)


# What of the recurrent layers' predicted power the power correction leaves as predicted
# (Correction.hold_recurrent): "none" (model files of session 11 and before), "dynamic" (the
# power above idle; sessions 12-13) or "whole" (idle included).
HOLD_RECURRENT = ("none", "dynamic", "whole")


def _hold_form(hold_recurrent: bool | str) -> str:
    """A hold form of HOLD_RECURRENT (model files of sessions 12-13 saved a bool: True = "dynamic")."""
    if isinstance(hold_recurrent, (bool, np.bool_)):
        return "dynamic" if hold_recurrent else "none"
    if hold_recurrent not in HOLD_RECURRENT:
        raise ValueError(f"hold_recurrent must be one of {HOLD_RECURRENT}, not {hold_recurrent!r}")
    return hold_recurrent


def _recurrent_w(s: NetworkSums, hold_recurrent: bool | str) -> np.ndarray:
    """The recurrent layers' power (W over the summed time) that the correction leaves as
    predicted: their dynamic power ("dynamic"), that plus the idle power under their time
    ("whole"), else zeros."""
    form = _hold_form(hold_recurrent)
    if form == "none":
        return np.zeros(len(s.sum_time_ms))
    rec = s.dyn_share_w[:, POWER_CLASSES.index("recurrent")]
    if form == "whole" and s.idle_w is not None and s.recurrent_time_ms is not None:
        rec = rec + s.idle_w * s.recurrent_time_ms / np.maximum(s.sum_time_ms, 1e-12)
    return rec


def _power_design(s: NetworkSums, hold_recurrent: bool | str = False) -> np.ndarray:
    p = s.power_ops_w - _recurrent_w(s, hold_recurrent)
    return np.column_stack([p, p * s.small_fraction, p * np.log(np.maximum(s.sum_time_ms, 1e-6)), s.dyn_share_w])


def _fit_relative(D: np.ndarray, y: np.ndarray, terms: Sequence[str], all_terms: Sequence[str],
                  identity: dict[str, float], ridge: float, offset: np.ndarray | None = None) -> dict[str, float]:
    """Least *absolute* relative error (what MAPE measures), shrunk toward the identity.

    Solved by iteratively reweighted least squares. Absolute rather than squared error because
    out-of-fold sums contain a few networks whose operations the model extrapolates badly;
    squared error would let those few set the coefficients for everyone.  ``offset`` (per row) is a
    part of the target the coefficients do not act on: D @ coef + offset = y.
    """
    coef = dict(identity)
    if not terms or len(y) == 0:
        return coef
    theta0 = np.array([identity[t] for t in all_terms])
    free = [all_terms.index(t) for t in terms]
    fixed = [i for i in range(len(all_terms)) if i not in free]
    A = D / y[:, None]
    one = np.ones(len(y)) if offset is None else 1.0 - offset / y
    b = one - A[:, fixed] @ theta0[fixed] if fixed else one
    Af = A[:, free]
    scale = np.sqrt(np.mean(Af**2, axis=0)) + 1e-12
    reg = np.sqrt(ridge) * np.diag(scale)
    b_reg = reg @ theta0[free]
    w = np.ones(len(y))
    sol = theta0[free].copy()
    for _ in range(50):
        sw = np.sqrt(w)[:, None]
        A_aug = np.vstack([Af * sw, reg])
        b_aug = np.concatenate([b * sw[:, 0], b_reg])
        new, *_ = np.linalg.lstsq(A_aug, b_aug, rcond=None)
        done = np.allclose(new, sol, rtol=1e-6, atol=1e-9)
        sol = new
        if done:
            break
        w = 1.0 / np.maximum(np.abs(Af @ sol - b), 1e-3)
        w = w / w.mean()
    for j, i in enumerate(free):
        coef[all_terms[i]] = float(sol[j])
    return coef


def fit_time(s: NetworkSums, measured_ms: np.ndarray, variant: str, ridge: float = 0.1) -> dict[str, float]:
    return _fit_relative(_time_design(s), measured_ms, TIME_VARIANTS[variant], TIME_TERMS, TIME_IDENTITY, ridge)


def fit_power(s: NetworkSums, measured_w: np.ndarray, variant: str, ridge: float = 0.1,
              hold_recurrent: bool | str = False) -> dict[str, float]:
    return _fit_relative(_power_design(s, hold_recurrent), measured_w, POWER_VARIANTS[variant], POWER_TERMS,
                         POWER_IDENTITY, ridge, _recurrent_w(s, hold_recurrent))


def apply_time(s: NetworkSums, coef: dict[str, float], floor_ms: float | None = None) -> np.ndarray:
    D = _time_design(s, floor_ms)
    out = D @ np.array([coef.get(t, TIME_IDENTITY[t]) for t in TIME_TERMS])
    # A correction must never make a network faster than a tenth of its op sum.
    return np.maximum(out, 0.1 * s.sum_time_ms)


def apply_power(s: NetworkSums, coef: dict[str, float], hold_recurrent: bool | str = False) -> np.ndarray:
    """Corrected network power.  ``hold_recurrent`` (HOLD_RECURRENT): what of the recurrent layers'
    power stays as predicted, the relative terms acting on the rest (Correction.hold_recurrent
    says which form a correction was fitted in)."""
    D = _power_design(s, hold_recurrent)
    out = D @ np.array([coef.get(t, POWER_IDENTITY[t]) for t in POWER_TERMS]) + _recurrent_w(s, hold_recurrent)
    out = np.clip(out, 0.3 * s.power_ops_w, 3.0 * s.power_ops_w)
    if s.idle_w is not None and s.limit_w is not None:
        out = bounded_power(out, s.idle_w, s.limit_w)
    return out


# A precision's own network correction needs this many networks: fitted on 12 fp16-mixed or bf16
# networks it scored worse leave-one-family-out than the fp32 one it replaced (time 20.9 -> 24.4%).
MIN_PRECISION_NETWORKS = 30
# Where a precision has too few networks, the one whose networks run the same operations and casts.
PRECISION_SIBLING = {"fp16-mixed": "bf16-mixed", "fp16": "bf16"}


def serving_mode(mode: str, n_by_mode: dict[str, int]) -> str:
    """The correction mode whose coefficients serve networks of ``mode``, given how many networks
    each mode was fitted on (the fallback order of Correction.lookup, pooled keys)."""
    if "|" not in mode:
        return mode
    base, precision = mode.split("|", 1)
    sibling = PRECISION_SIBLING.get(precision)
    for m in (mode, f"{base}|{sibling}" if sibling else None):
        if m and n_by_mode.get(m, 0) >= MIN_PRECISION_NETWORKS:
            return m
    return base


Variant = str | dict[str, str]  # one variant for every correction mode, or one per mode


def variant_for(variant: Variant, mode: str) -> str:
    """The variant fitted for ``mode``: a mode's own, else its step mode's, else "none"."""
    if isinstance(variant, str):
        return variant
    return variant.get(mode) or variant.get(mode.split("|", 1)[0]) or "none"


def correction_mode(mode: str, precision: str | None = None) -> str:
    """The key a network's correction is fitted and looked up under: its step mode, and its
    precision where that is not fp32 (autocast's casts, fused kernels and tensor-core tiles make the
    op sum of a bf16-mixed network miss in another way than an fp32 one's)."""
    return mode if precision in (None, "", "fp32") else f"{mode}|{precision}"


@dataclass
class Correction:
    """Chosen variants and coefficients per (gpu, mode), with ('*', mode) pooled fallbacks.

    The variants are one per correction mode (a dict; model files fitted before that hold one
    string for every mode): the fp32 networks' best power form need not be the bf16-mixed ones'."""

    time_variant: Variant
    power_variant: Variant
    time_coef: dict[str, dict[str, float]]  # "gpu|mode" -> coef
    power_coef: dict[str, dict[str, float]]
    n_rows: dict[str, int]
    # The power terms leave the recurrent layers' dynamic power as predicted (apply_power). Fitted
    # on leave-one-family-out sums, where a held-out "gru" family's layers are predicted from LSTMs
    # alone and over-predicted by 23-68%, 'scale' learnt to cut every network's power by ~40% with
    # the other classes' factors giving it back; recurrent layers, which have no factor, kept the
    # cut, and unseen RNNs of known families (predicted from their own family) lost 25-45 points
    # of energy. Model files fitted before this hold False ("none"). Holding the dynamic power
    # alone ("dynamic", sessions 12-13) still sent the idle power under the layers' time through
    # 'scale' (0.49 inference, 0.57 training): a held-out GRU classifier's layers, predicted at
    # 209 W, came out at 137-153 W against 196-241 W measured. "whole" holds it all.
    hold_recurrent: str = "none"
    # "gpu|mode" -> the smallest op sum (ms) the time coefficients were fitted on (_time_design);
    # a key without one (fitted before it was recorded) takes its step mode's, else none
    time_floor_ms: dict[str, float] = field(default_factory=dict)
    # Networks without recurrent layers: time coefficients (and floors) of their own, fitted and
    # chosen on such networks alone, which replace time_coef's for them where a key has them.  Fitted
    # on every network, the intercept was the recurrent families' held-out error (their out-of-fold
    # sums missed by 2.6x below 0.6 ms) laid on every other network (DEVELOPERS, session 38).
    nonrecurrent_time_coef: dict[str, dict[str, float]] = field(default_factory=dict)
    nonrecurrent_time_floor_ms: dict[str, float] = field(default_factory=dict)
    nonrecurrent_time_variant: Variant = field(default_factory=dict)
    # "*|mode" -> ms each looked-up operation that launches kernels adds to the network's time:
    # the gap between kernels when the step replays as one CUDA graph.  A looked-up operation's
    # time is its kernels' in-network time, and the time correction (fitted on predicted sums)
    # acts on the predicted share alone, so without it a network of measured operations came out
    # 2.5-3.3% fast on average on the H100 and H200 (fit_measured_gap: 0.43 us per operation in
    # fp32 inference, 2.1 us in training).  Absent (model files before session 42): none.
    measured_gap_ms: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.hold_recurrent = _hold_form(self.hold_recurrent)

    def lookup(self, gpu: str, mode: str) -> tuple[dict[str, float], dict[str, float], str]:
        """Coefficients of ``mode`` (a correction_mode()): the precision's own where it was fitted
        on at least MIN_PRECISION_NETWORKS networks, else its sibling's (fp16-mixed takes
        bf16-mixed's: the same autocast casts and fusions), else its step mode's (fp32 networks)."""
        keys = [f"{gpu}|{mode}", f"*|{mode}"]
        if "|" in mode:
            base, precision = mode.split("|", 1)
            sibling = PRECISION_SIBLING.get(precision)
            if sibling:
                keys += [f"{gpu}|{base}|{sibling}", f"*|{base}|{sibling}"]
            keys = [k for k in keys if self.n_rows.get(k, 0) >= MIN_PRECISION_NETWORKS]
            keys += [f"{gpu}|{base}", f"*|{base}"]
        for key in keys:
            if key in self.time_coef:
                return self.time_coef[key], self.power_coef[key], key
        return dict(TIME_IDENTITY), dict(POWER_IDENTITY), "identity"

    def apply(self, s: NetworkSums, gpu: str, mode: str) -> tuple[np.ndarray, np.ndarray, str]:
        """Corrected network time and power.

        The time correction was learnt on sums of *model* predictions (out of fold) against
        network times, and the time targets are the operations' in-network kernel times, so it
        corrects model error only: operations looked up from this GPU's measurements carry none,
        and it acts on the predicted share of the time only (vit_b_16 training on the H100 summed
        to 94.9 ms against 94.8 ms measured as one graph; the full correction made it 87.6 ms).
        Power targets are isolated rows' power, which differs from the power inside the network
        for measured and predicted operations alike, so the power correction applies in full."""
        tc, pc, key = self.lookup(gpu, mode)
        t = apply_time(s, tc, self.floor_of(key))
        plain, own = s.without_recurrent, self.nonrecurrent_time_coef.get(key)
        if own is not None and plain is not None and plain.any():
            t = np.where(plain, apply_time(s, own, self.nonrecurrent_time_floor_ms.get(key)), t)
        t = t + (s.sum_time_ms - t) * s.measured_share
        if s.measured_ops is not None:
            t = t + self.gap_of(key) * s.measured_ops
        return t, apply_power(s, pc, self.hold_recurrent), key

    def gap_of(self, key: str) -> float:
        """measured_gap_ms of a coefficient key: its correction mode's, else its step mode's, else 0."""
        mode = key.split("|", 1)[1] if "|" in key else key
        return self.measured_gap_ms.get(f"*|{mode}", self.measured_gap_ms.get(f"*|{mode.split('|')[0]}", 0.0))

    def floor_of(self, key: str) -> float | None:
        """The op-sum floor of a coefficient key (its step mode's for a precision key of a model
        file whose precision keys hold none)."""
        if key in self.time_floor_ms:
            return self.time_floor_ms[key]
        return self.time_floor_ms.get("|".join(key.split("|")[:2])) if key.count("|") >= 2 else None

    def apply_each(self, s: NetworkSums, gpu: str, modes: Sequence[str]) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """apply() with a correction mode per network (networks of one call may differ in precision)."""
        if len(set(modes)) <= 1:
            t, w, key = self.apply(s, gpu, modes[0] if len(modes) else "inference")
            return t, w, [key] * len(modes)
        t, w = np.empty(len(modes)), np.empty(len(modes))
        keys = [""] * len(modes)
        arr = np.asarray(modes, dtype=object)
        for m in sorted(set(modes)):
            idx = np.flatnonzero(arr == m)
            ti, wi, key = self.apply(s.take(idx), gpu, m)
            t[idx], w[idx] = ti, wi
            for i in idx:
                keys[i] = key
        return t, w, keys

    def as_dict(self) -> dict[str, Any]:
        return {"time_variant": self.time_variant, "power_variant": self.power_variant,
                "time_coef": self.time_coef, "power_coef": self.power_coef, "n_rows": self.n_rows,
                "hold_recurrent": self.hold_recurrent, "time_floor_ms": self.time_floor_ms,
                **({"nonrecurrent_time_coef": self.nonrecurrent_time_coef,
                    "nonrecurrent_time_floor_ms": self.nonrecurrent_time_floor_ms,
                    "nonrecurrent_time_variant": self.nonrecurrent_time_variant}
                   if self.nonrecurrent_time_coef else {}),
                **({"measured_gap_ms": self.measured_gap_ms} if self.measured_gap_ms else {}),
                "time_terms": list(TIME_TERMS), "power_terms": list(POWER_TERMS)}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Correction:
        return Correction(d["time_variant"], d["power_variant"], d["time_coef"], d["power_coef"], d.get("n_rows", {}),
                          d.get("hold_recurrent", False), dict(d.get("time_floor_ms", {})),
                          dict(d.get("nonrecurrent_time_coef", {})), dict(d.get("nonrecurrent_time_floor_ms", {})),
                          d.get("nonrecurrent_time_variant", {}), dict(d.get("measured_gap_ms", {})))

    @staticmethod
    def identity() -> Correction:
        return Correction("none", "none", {}, {}, {})


def fit_correction(s: NetworkSums, gpus: np.ndarray, modes: np.ndarray, time_ms: np.ndarray, power_w: np.ndarray,
                   time_variant: Variant, power_variant: Variant, min_rows_gpu: int = 8, min_rows_pooled: int = 3,
                   ridge: float = 0.1, specific: Any = None, hold_recurrent: str = "whole",
                   nonrecurrent_time_variant: Variant | None = None) -> Correction:
    """Per GPU+mode where there are enough networks (and the GPU is in ``specific``, when given),
    pooled per mode otherwise.  With ``nonrecurrent_time_variant`` (and sums that know their
    recurrent layers) each key also gets time coefficients fitted on its networks without
    recurrent layers alone (Correction.nonrecurrent_time_coef), where there are enough of them."""
    tc: dict[str, dict[str, float]] = {}
    pc: dict[str, dict[str, float]] = {}
    n_rows: dict[str, int] = {}
    floors: dict[str, float] = {}
    own: dict[str, dict[str, float]] = {}
    own_floors: dict[str, float] = {}
    plain = s.without_recurrent if nonrecurrent_time_variant is not None else None
    gpus, modes = np.asarray(gpus), np.asarray(modes)

    def fit_plain(key: str, rows: np.ndarray, min_rows: int, mode: str) -> None:
        if plain is not None and nonrecurrent_time_variant is not None and (rows & plain).sum() >= min_rows:
            r = rows & plain
            own[key] = fit_time(s.take(r), time_ms[r], variant_for(nonrecurrent_time_variant, mode), ridge)
            own_floors[key] = float(np.min(s.sum_time_ms[r]))

    for mode in sorted(set(modes.tolist())):
        sel = modes == mode
        if "|" in mode and sel.sum() < MIN_PRECISION_NETWORKS:
            continue  # too few networks of this precision: lookup falls back (Correction.lookup)
        tv, pv = variant_for(time_variant, mode), variant_for(power_variant, mode)
        if sel.sum() >= min_rows_pooled:
            key = f"*|{mode}"
            tc[key] = fit_time(s.take(sel), time_ms[sel], tv, ridge)
            pc[key] = fit_power(s.take(sel), power_w[sel], pv, ridge, hold_recurrent)
            n_rows[key], floors[key] = int(sel.sum()), float(np.min(s.sum_time_ms[sel]))
            fit_plain(key, sel, min_rows_pooled, mode)
        for gpu in sorted(set(gpus[sel].tolist())):
            if specific is not None and gpu not in specific:
                continue
            g = sel & (gpus == gpu)
            if g.sum() >= min_rows_gpu:
                key = f"{gpu}|{mode}"
                tc[key] = fit_time(s.take(g), time_ms[g], tv, ridge)
                pc[key] = fit_power(s.take(g), power_w[g], pv, ridge, hold_recurrent)
                n_rows[key], floors[key] = int(g.sum()), float(np.min(s.sum_time_ms[g]))
                fit_plain(key, g, min_rows_gpu, mode)
    return Correction(time_variant, power_variant, tc, pc, n_rows, hold_recurrent, floors, own, own_floors,
                      nonrecurrent_time_variant if own else {})


def ape(pred: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Absolute percentage errors."""
    return np.abs(np.asarray(pred, dtype=np.float64) / np.asarray(measured, dtype=np.float64) - 1.0) * 100.0


def _simplest_near_best(mape: dict[str, float], order: list[str], slack: float = 0.01) -> str:
    """The first (simplest) variant within ``slack`` (relative) of the best cross-validated MAPE:
    an extra term has to earn its place, not win a tie."""
    best = min(mape[v] for v in order)
    return next(v for v in order if mape[v] <= best * (1.0 + slack) + 1e-9)


def correction_cv(s: NetworkSums, gpus: np.ndarray, modes: np.ndarray, groups: np.ndarray, time_ms: np.ndarray,
                  power_w: np.ndarray, min_rows_gpu: int = 8, min_rows_pooled: int = 3,
                  ridge: float = 0.1, specific: Any = None) -> dict[str, Any]:
    """Second-level leave-one-group-out: MAPE of every variant, and the out-of-fold corrected values.

    Each serving mode (serving_mode(): the correction mode whose coefficients a network gets)
    chooses its own variants on the networks it serves: modes are fitted apart, so one mode's
    variant does not change another's out-of-fold values.  Chosen over all networks at once, the
    bf16-mixed networks' best power form ('kinds+full') raised the fp32 ones' energy error from
    8.0% to 12.1% on unseen architectures.

    Where the sums know their recurrent layers, the networks without any also choose a time variant
    of their own, on themselves alone ("nonrecurrent_time"; Correction.nonrecurrent_time_coef), and
    their out-of-fold times are that variant's."""
    groups, modes = np.asarray(groups), np.asarray(modes).astype(str)
    uniq = sorted(set(groups.tolist()))
    res: dict[str, Any] = {"time": {}, "power": {}, "energy": {}, "n_networks": int(len(time_ms)),
                           "n_groups": len(uniq), "by_mode": {}}
    oof_t = {v: np.full(len(time_ms), np.nan) for v in TIME_VARIANTS}
    oof_p = {v: np.full(len(time_ms), np.nan) for v in POWER_VARIANTS}
    oof_n = {v: np.full(len(time_ms), np.nan) for v in TIME_VARIANTS}
    plain = s.without_recurrent
    if len(uniq) < 2:
        return res
    for g in uniq:
        test = groups == g
        train = ~test
        for v in TIME_VARIANTS:
            c = fit_correction(s.take(train), gpus[train], modes[train], time_ms[train], power_w[train], v, "none",
                               min_rows_gpu, min_rows_pooled, ridge, specific)
            for i in np.flatnonzero(test):
                oof_t[v][i] = c.apply(s.take([i]), str(gpus[i]), str(modes[i]))[0][0]
        for v in POWER_VARIANTS:
            c = fit_correction(s.take(train), gpus[train], modes[train], time_ms[train], power_w[train], "none", v,
                               min_rows_gpu, min_rows_pooled, ridge, specific)
            for i in np.flatnonzero(test):
                oof_p[v][i] = c.apply(s.take([i]), str(gpus[i]), str(modes[i]))[1][0]
        for v in TIME_VARIANTS if plain is not None and (test & plain).any() else ():
            c = fit_correction(s.take(train), gpus[train], modes[train], time_ms[train], power_w[train], "none", "none",
                               min_rows_gpu, min_rows_pooled, ridge, specific, nonrecurrent_time_variant=v)
            for i in np.flatnonzero(test & plain):
                oof_n[v][i] = c.apply(s.take([i]), str(gpus[i]), str(modes[i]))[0][0]
    energy = time_ms * power_w
    for v in TIME_VARIANTS:
        res["time"][v] = float(np.mean(ape(oof_t[v], time_ms)))
    for v in POWER_VARIANTS:
        res["power"][v] = float(np.mean(ape(oof_p[v], power_w)))
    counts = dict(Counter(modes.tolist()))
    serving = np.array([serving_mode(m, counts) for m in modes], dtype=object)
    chosen: dict[str, dict[str, str]] = {"time": {}, "power": {}}
    best_t, best_p = np.full(len(time_ms), np.nan), np.full(len(time_ms), np.nan)
    for m in sorted(set(serving.tolist())):
        sel = serving == m
        mt = {v: float(np.mean(ape(oof_t[v][sel], time_ms[sel]))) for v in TIME_VARIANTS}
        mp = {v: float(np.mean(ape(oof_p[v][sel], power_w[sel]))) for v in POWER_VARIANTS}
        chosen["time"][m] = _simplest_near_best(mt, list(TIME_VARIANTS))
        chosen["power"][m] = _simplest_near_best(mp, list(POWER_VARIANTS))
        best_t[sel], best_p[sel] = oof_t[chosen["time"][m]][sel], oof_p[chosen["power"][m]][sel]
        res["by_mode"][m] = {"n": int(sel.sum()), "time": mt, "power": mp}
        own = sel & plain if plain is not None else np.zeros(len(sel), dtype=bool)
        if own.any() and all(np.isfinite(oof_n[v][own]).all() for v in TIME_VARIANTS):
            mn = {v: float(np.mean(ape(oof_n[v][own], time_ms[own]))) for v in TIME_VARIANTS}
            chosen.setdefault("nonrecurrent_time", {})[m] = _simplest_near_best(mn, list(TIME_VARIANTS))
            best_t[own] = oof_n[chosen["nonrecurrent_time"][m]][own]
            res["by_mode"][m] |= {"n_nonrecurrent": int(own.sum()), "nonrecurrent_time": mn}
    res["energy"]["none"] = float(np.mean(ape(oof_t["none"] * oof_p["none"], energy)))
    res["energy"]["chosen"] = float(np.mean(ape(best_t * best_p, energy)))
    res["time"]["chosen"] = float(np.mean(ape(best_t, time_ms)))
    res["power"]["chosen"] = float(np.mean(ape(best_p, power_w)))
    res["chosen"] = chosen
    res["oof_time_ms"] = best_t
    res["oof_power_w"] = best_p
    return res


# Without any network rows that say otherwise, a GPU waiting for its host is taken to draw
# this share of its TDP (used only when the data has neither eager+host-free network pairs nor
# idle readings; the manifest says which source was used).
DEFAULT_WAITING_TDP_RATIO = 0.1


def fit_waiting_power(nets: Any) -> dict[str, Any]:
    """Power the GPU draws while it waits for the host, as a share of its TDP (per GPU, and pooled
    under ``*``), learnt from network rows.

    Learnt: where a network was measured eager and host-free and the host made it >= 10% longer,
    (eager energy - host-free energy) / (eager time - host-free time) is the power of the waiting
    time. Until such rows exist: the measured idle power (``idle_power_w``), a lower bound, since
    a waiting GPU keeps its clocks up between kernels."""
    from gpurec.catalog import resolve_gpu

    def tdp(g: str) -> float:
        return float(resolve_gpu(g).features()["tdp_w"])

    out: dict[str, Any] = {"ratio_of_tdp": {}, "n": {}}
    if len(nets) == 0:
        out.update(source="default", ratio_of_tdp={"*": DEFAULT_WAITING_TDP_RATIO})
        return out
    cols = {c: (nets[c].astype(float).to_numpy() if c in nets else np.full(len(nets), np.nan))
            for c in ("time_ms", "energy_mj", "gpu_time_ms", "gpu_energy_mj", "idle_power_w")}
    gap = cols["time_ms"] - cols["gpu_time_ms"]
    pairs = np.isfinite(gap) & (gap > 0.1 * cols["gpu_time_ms"]) & np.isfinite(cols["energy_mj"]) \
        & np.isfinite(cols["gpu_energy_mj"])
    gpus = nets["gpu"].astype(str).to_numpy()
    ratios: dict[str, list[float]] = {}
    if pairs.sum() >= 3:
        out["source"] = "learnt: (eager - host-free energy) / (eager - host-free time) of host-slowed networks"
        p_wait = (cols["energy_mj"] - cols["gpu_energy_mj"]) / np.where(pairs, gap, np.nan)
        for i in np.flatnonzero(pairs):
            ratios.setdefault(gpus[i], []).append(float(np.clip(p_wait[i], 0.0, None)) / tdp(gpus[i]))
    elif np.isfinite(cols["idle_power_w"]).any():
        out["source"] = ("fallback: measured idle power (no network measured both eager and host-free yet); "
                         "a lower bound of the waiting power")
        for i in np.flatnonzero(np.isfinite(cols["idle_power_w"])):
            ratios.setdefault(gpus[i], []).append(float(cols["idle_power_w"][i]) / tdp(gpus[i]))
    else:
        out.update(source="default", ratio_of_tdp={"*": DEFAULT_WAITING_TDP_RATIO})
        return out
    for g, r in sorted(ratios.items()):
        out["ratio_of_tdp"][g] = float(np.median(r))
        out["n"][g] = len(r)
    out["ratio_of_tdp"]["*"] = float(np.median([v for r in ratios.values() for v in r]))
    return out


def waiting_power_w(waiting: dict[str, Any], gpu: str, tdp_w: float) -> float:
    """The waiting power of ``gpu`` (its own learnt share of TDP, else the pooled one)."""
    r = waiting.get("ratio_of_tdp", {})
    return float(r.get(gpu, r.get("*", DEFAULT_WAITING_TDP_RATIO))) * tdp_w
