"""A throughput floor for half-precision GEMMs whose weight is not aligned for the tensor cores.

Why: cuBLAS feeds the tensor cores from 16-byte vector loads, so a half-precision product whose
weight has an inner or outer dimension that is not a multiple of 8 elements (a GPT language-model
head over a 50,257-word vocabulary, the usual case) runs on its slower unaligned kernels.
Measured on the H100 and the H200 alike, such a head runs at 95-99 TFLOPS in inference (about a
tenth of the dense bf16 peak) and at 40-42 TFLOPS of forward FLOPs in training, its time linear
in tokens x width; an aligned product of the same size runs 5-7x faster.  The boosters have no
feature for alignment and their rows mix both, so they put an unaligned head between the two
(30-50% too fast at bf16).  This model says what the unaligned rows say:

    time_ms >= flops_mode / (efficiency[mode] x peak_tflops_used x 1e9)

with ``efficiency`` (achieved / the GPU's dense peak for the operation's math mode) the median
over the training architectures' unaligned half-precision Linear rows, per mode
(gpurec.model.fitting.gemm_fit).  The floor holds only where a weight dimension is odd (its
rows are 2-byte aligned, FLOOR_ALIGN_ELEMENTS): the H100's head sweep (session 47) ran a
50,257-word head at 86-121 TFLOPS, a 30,522-word one (a multiple of 2, not of 8) at 186-278 and the
aligned ones at 392-720, so a floor fitted on odd heads held an even, unaligned one 2-3x too slow.
It is a floor, not a replacement, and only for products of at least one wave of output tiles: a
small unaligned product (a classifier head with 2 outputs) is latency-bound and keeps the boosters'
time.  Read from the time feature matrix (FLOPs, input and output elements, math mode), so
``F.linear(x, weight)``, whose row carries no in/out features, is found as well as ``nn.Linear``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpurec.model.persist import IncompatibleModel

KINDS: tuple[str, ...] = ("Linear", "linear")  # products with a weight: (M x K) @ (K x N)
ALIGN_ELEMENTS = 8  # 16 bytes of a half-precision element: cuBLAS's vector load
# The floor's rule: a weight dimension that is not a multiple of 2 elements (odd: 2-byte aligned, cuBLAS's
# slowest kernels).  Products aligned to 2 or 4 elements run 2-3x faster (module docstring) and are only
# listed (unaligned_products), not floored.
FLOOR_ALIGN_ELEMENTS = 2
HALF_MATH = (2.0, 3.0)  # math_mode codes of fp16 and bf16 (gpurec.ops.features.MATH_MODES)
GEMM_FLOOR_KEY = "unaligned_gemm_floor"  # its manifest entry
_COLUMNS = ("flops", "input_elements", "output_elements", "math_mode", "flops_mode", "peak_tflops_used", "waves")
MIN_WAVES = 1.0  # a throughput floor speaks for products that fill the GPU at least once


def gemm_dims(flops: np.ndarray, input_elements: np.ndarray,
              output_elements: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(M, K, N) of products with flops = 2 M K N, input M x K and output M x N elements
    (rounded; 0 where the row has no FLOPs)."""
    ok = flops > 0
    m = np.where(ok, 2.0 * input_elements * output_elements / np.where(ok, flops, 1.0), 0.0)
    m = np.rint(m)
    k = np.where(m > 0, np.rint(input_elements / np.maximum(m, 1.0)), 0.0)
    n = np.where(m > 0, np.rint(output_elements / np.maximum(m, 1.0)), 0.0)
    return m, k, n


def unaligned_half(values: np.ndarray, feature_names: Sequence[str], kinds: np.ndarray) -> np.ndarray:
    """Which rows (``values`` over ``feature_names``; ``kinds`` their operation kinds) the floor
    speaks for: half-precision products with a weight dimension that is not a multiple of
    FLOOR_ALIGN_ELEMENTS (odd) and enough output tiles for at least MIN_WAVES waves over the GPU's SMs
    (``waves``): smaller ones (a classifier head with 2 outputs) are latency-bound, and no throughput
    speaks for them."""
    out = np.zeros(len(kinds), dtype=bool)
    rows = np.flatnonzero(np.isin(np.asarray(kinds, dtype=object), KINDS))
    if len(rows):
        out[rows] = _unaligned_half_products(values[rows], list(feature_names), align=FLOOR_ALIGN_ELEMENTS)[0]
    return out


def _half_products(values: np.ndarray, names: Sequence[str],
                   min_waves: float = MIN_WAVES) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Which rows already known to be products with a weight are half-precision with at least
    ``min_waves`` waves (0: any size, and no ``waves`` column needed), with each row's M, K and N."""
    half = np.isin(values[:, names.index("math_mode")], HALF_MATH)
    if min_waves > 0:
        half &= values[:, names.index("waves")].astype(np.float64) >= min_waves
    m, k, n = (np.zeros(len(values)) for _ in range(3))
    rows = np.flatnonzero(half)  # the dimensions of the others are not needed: fp32 networks skip the work
    if len(rows):
        v = values[rows]
        m[rows], k[rows], n[rows] = gemm_dims(*(v[:, names.index(c)].astype(np.float64)
                                                for c in ("flops", "input_elements", "output_elements")))
    return half & (k > 0) & (n > 0), m, k, n


def _unaligned_half_products(values: np.ndarray, names: list[str], min_waves: float = MIN_WAVES,
                             align: int = ALIGN_ELEMENTS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which rows already known to be products with a weight are half-precision with K or N not a
    multiple of ``align`` and at least ``min_waves`` waves (0: any size, and no ``waves`` column
    needed), with each row's K and N."""
    half, _, k, n = _half_products(values, names, min_waves)
    return half & (((k % align) != 0) | ((n % align) != 0)), k, n


def unaligned_products(values: np.ndarray, feature_names: Sequence[str],
                       kinds: np.ndarray) -> list[tuple[int, int, int]]:
    """(row, K, N) of every half-precision product with an unaligned weight among operations
    (``values`` over gpurec.ops.features.FEATURE_NAMES, whatever their size): what a user can pad."""
    rows = np.flatnonzero(np.isin(np.asarray(kinds, dtype=object), KINDS))
    if not len(rows):
        return []
    found, k, n = _unaligned_half_products(values[rows], list(feature_names), min_waves=0.0)
    return [(int(r), int(a), int(b)) for r, a, b in zip(rows[found], k[found], n[found], strict=True)]


def unaligned_note(unaligned: Sequence[dict[str, Any]]) -> str:
    """What to do about half-precision products with an unaligned weight: records of
    Estimate.unaligned_products (name, k, n, time_share)."""
    share = sum(float(u["time_share"]) for u in unaligned) * 100
    shown = ", ".join(f"{u['name']} ({u['k']} x {u['n']})" for u in unaligned[:3])
    more = f" and {len(unaligned) - 3} more" if len(unaligned) > 3 else ""
    what = "1 half-precision product" if len(unaligned) == 1 else f"{len(unaligned)} half-precision products"
    return (f"{what} with a weight dimension that is not a multiple of {ALIGN_ELEMENTS}: {shown}{more}, "
            f"{share:.0f}% of the predicted operation time. cuBLAS runs them on its unaligned kernels (a 50,257-word "
            f"LM head at about a tenth of the bf16 peak on an H100, a 30,522-word one at a fifth to a quarter); padding the "
            f"dimension to a multiple of "
            f"{ALIGN_ELEMENTS} lets them use the tensor cores' aligned kernels.")


@dataclass(frozen=True)
class ModeFloor:
    """One mode's fitted efficiency and what it rests on."""

    efficiency: float  # achieved TFLOPS / the GPU's dense peak for the math mode
    rows: int
    archs: tuple[str, ...]
    loao_mape: float  # leave-one-architecture-out MAPE of the floor alone on the fitted rows
    flops_min: float  # smallest flops_mode fitted

    def as_dict(self) -> dict[str, Any]:
        return {"efficiency": self.efficiency, "rows": self.rows, "archs": list(self.archs),
                "loao_mape": self.loao_mape, "flops_min": self.flops_min}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModeFloor:
        return cls(float(d["efficiency"]), int(d["rows"]), tuple(d["archs"]), float(d["loao_mape"]),
                   float(d["flops_min"]))


class UnalignedGemmFloor:
    """Per-mode throughput floors over a frozen feature-name list (the time feature matrix's)."""

    def __init__(self, fits: dict[str, ModeFloor], feature_names: Sequence[str]) -> None:
        self.fits = dict(fits)
        self.feature_names = list(feature_names)
        names = self.feature_names
        self._cols = [names.index(c) for c in _COLUMNS]
        self._kind_cols = [names.index(f"kind={k}") for k in KINDS if f"kind={k}" in names]

    def as_dict(self) -> dict[str, Any]:
        return {"model": "time >= flops_mode / (efficiency x peak)", "align_elements": FLOOR_ALIGN_ELEMENTS,
                "kinds": list(KINDS), "by_mode": {m: f.as_dict() for m, f in self.fits.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, feature_names: Sequence[str]) -> UnalignedGemmFloor | None:
        """None for models without it (the boosters alone predict every product)."""
        if not d or not d.get("by_mode"):
            return None
        if int(d.get("align_elements", ALIGN_ELEMENTS)) != FLOOR_ALIGN_ELEMENTS or tuple(d.get("kinds", KINDS)) != KINDS:
            raise IncompatibleModel("the saved unaligned-GEMM floor was fitted with another alignment rule: refit it "
                                    "(gpurec tools fit-gemm-floor)")
        if not all(c in feature_names for c in _COLUMNS):
            raise IncompatibleModel("the unaligned-GEMM floor needs features these models do not build: refit it "
                                    "(gpurec tools fit-gemm-floor)")
        return cls({m: ModeFloor.from_dict(f) for m, f in d["by_mode"].items()}, feature_names)

    def floor_ms(self, X: np.ndarray, mode: str) -> np.ndarray:
        """The floor of each row of ``X`` in ``mode`` (0 where it does not apply)."""
        out = np.zeros(len(X))
        fit = self.fits.get(mode)
        if fit is None or not self._kind_cols or not len(X):
            return out
        rows = np.flatnonzero(X[:, self._kind_cols].max(axis=1) > 0.5)
        if not len(rows):
            return out
        sel = rows[_unaligned_half_products(X[rows], self.feature_names, align=FLOOR_ALIGN_ELEMENTS)[0]]
        if not len(sel):
            return out
        flops_mode, peak = X[sel, self._cols[4]], X[sel, self._cols[5]]
        out[sel] = np.where(peak > 0, flops_mode / (fit.efficiency * np.maximum(peak, 1e-9) * 1e9), 0.0)
        return out

    def apply(self, log_t: np.ndarray, X: np.ndarray, mode: str) -> np.ndarray:
        """``log_t`` (log ms per row of ``X``) raised to the floor where it is below it."""
        floor = self.floor_ms(X, mode)
        hit = floor > 0
        if not hit.any():
            return log_t
        out = np.array(log_t, dtype=np.float64, copy=True)
        out[hit] = np.maximum(out[hit], np.log(floor[hit]))
        return out


# -- half-precision products wider than any the boosters learnt from ------------------------------
#
# Why: the widest half-precision products among the training architectures' rows are recurrent
# language models' 10,000-word heads, whose in-network time (their training target) runs 1.6-2.5x their
# graph-replayed time at bf16-mixed.  The boosters carry that to every wider product: over the head
# sweep's aligned heads (32,000-128,256 words) they predict 3.7-4.3x the measured time.  In that regime
# cuBLAS's time is a roofline of the product's work and traffic, and the sweep's rows fit it within a
# few per cent: time = a x flops_mode / peak + b x bytes_mode / bandwidth, with (a, b) per mode and
# alignment class (gpurec.model.fitting.gemm_fit.fit_wide), fitted on the GPUs with rows and carried to
# others by their own peak and bandwidth.  Odd products keep the floor above (a separate, slower regime).
WIDE_MIN_N = 16384  # output width at and above which a half-precision product is "wide" (vocabulary-sized)
WIDE_KEY = "wide_half_gemm"  # its manifest entry
WIDE_CLASSES = ("aligned", "even")  # K and N multiples of ALIGN_ELEMENTS; both even, not both multiples of 8
WIDE_M_TOLERANCE = 2.0  # applied down to half the fewest tokens (rows M) fitted: below, weight streaming decides
_ROOFLINE_COLUMNS = ("flops_mode", "peak_tflops_used", "bytes_mode", "hw_memory_bandwidth_gbs")
_WIDE_COLUMNS = ("flops", "input_elements", "output_elements", "math_mode", "waves") + _ROOFLINE_COLUMNS


def wide_half_class(values: np.ndarray, feature_names: Sequence[str], kinds: np.ndarray) -> np.ndarray:
    """Each row's wide-product class ("aligned", "even"), or "" where the wide model does not speak:
    not a product with a weight, not half precision, narrower than WIDE_MIN_N, under MIN_WAVES waves,
    or with an odd dimension (the floor's regime)."""
    out = np.full(len(kinds), "", dtype=object)
    rows = np.flatnonzero(np.isin(np.asarray(kinds, dtype=object), KINDS))
    if len(rows):
        out[rows] = _wide_classes(values[rows], list(feature_names))[0]
    return out


def _wide_classes(v: np.ndarray, names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """wide_half_class of rows known to be products with a weight, and each row's M (rows, tokens)."""
    half, m, k, n = _half_products(v, names)
    wide = half & (n >= WIDE_MIN_N) & (k % FLOOR_ALIGN_ELEMENTS == 0) & (n % FLOOR_ALIGN_ELEMENTS == 0)
    aligned = (k % ALIGN_ELEMENTS == 0) & (n % ALIGN_ELEMENTS == 0)
    cls = np.full(len(v), "", dtype=object)
    cls[wide & aligned] = "aligned"
    cls[wide & ~aligned] = "even"
    return cls, m


def roofline_terms_ms(values: np.ndarray, feature_names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(compute, memory) time in ms of each row at the GPU's dense peak for its math mode and at its
    DRAM bandwidth: flops_mode / peak and bytes_mode / bandwidth (0 where the GPU's figure is 0)."""
    names = list(feature_names)
    return _roofline_terms(values, {c: names.index(c) for c in _ROOFLINE_COLUMNS})


def _roofline_terms(v: np.ndarray, col: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    peak = v[:, col["peak_tflops_used"]].astype(np.float64)
    bw = v[:, col["hw_memory_bandwidth_gbs"]].astype(np.float64)
    compute = np.where(peak > 0, v[:, col["flops_mode"]] / (np.maximum(peak, 1e-9) * 1e9), 0.0)
    memory = np.where(bw > 0, v[:, col["bytes_mode"]] / (np.maximum(bw, 1e-9) * 1e6), 0.0)
    return compute, memory


@dataclass(frozen=True)
class WideFit:
    """One (mode, class)'s roofline coefficients and what they rest on."""

    compute_scale: float  # a: time per peak-time of the FLOPs (1 / compute efficiency)
    memory_scale: float  # b: time per bandwidth-time of the bytes
    rows: int
    gpus: tuple[str, ...]
    widths: tuple[int, ...]  # the fitted products' inner dimensions K
    m_min: float  # the fewest rows (tokens) M fitted
    mape: float  # in sample
    cv_mape: float  # leaving each inner dimension K out in turn

    def as_dict(self) -> dict[str, Any]:
        return {"compute_scale": self.compute_scale, "memory_scale": self.memory_scale, "rows": self.rows,
                "gpus": list(self.gpus), "widths": list(self.widths), "m_min": self.m_min, "mape": self.mape,
                "cv_mape": self.cv_mape}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WideFit:
        return cls(float(d["compute_scale"]), float(d["memory_scale"]), int(d["rows"]), tuple(d["gpus"]),
                   tuple(int(w) for w in d["widths"]), float(d["m_min"]), float(d["mape"]), float(d["cv_mape"]))


class WideHalfGemm:
    """The roofline time of wide half-precision products, per mode and class, over a frozen
    feature-name list (the time feature matrix's); it replaces the boosters' time on those rows."""

    def __init__(self, fits: dict[str, dict[str, WideFit]], feature_names: Sequence[str]) -> None:
        self.fits = {m: dict(f) for m, f in fits.items()}
        self.feature_names = list(feature_names)
        self._kind_cols = [self.feature_names.index(f"kind={k}") for k in KINDS if f"kind={k}" in self.feature_names]
        self._cols = {c: self.feature_names.index(c) for c in _ROOFLINE_COLUMNS if c in self.feature_names}

    def as_dict(self) -> dict[str, Any]:
        return {"model": "time = a x flops_mode / peak + b x bytes_mode / bandwidth", "min_n": WIDE_MIN_N,
                "kinds": list(KINDS),
                "by_mode": {m: {c: f.as_dict() for c, f in by.items()} for m, by in self.fits.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, feature_names: Sequence[str]) -> WideHalfGemm | None:
        """None for models without it (the boosters alone predict every product)."""
        if not d or not d.get("by_mode"):
            return None
        if int(d.get("min_n", WIDE_MIN_N)) != WIDE_MIN_N or tuple(d.get("kinds", KINDS)) != KINDS:
            raise IncompatibleModel("the saved wide half-precision product model was fitted with another rule: refit "
                                    "it (gpurec tools fit-gemm-floor)")
        if not all(c in feature_names for c in _WIDE_COLUMNS):
            raise IncompatibleModel("the wide half-precision product model needs features these models do not build: "
                                    "refit it (gpurec tools fit-gemm-floor)")
        return cls({m: {c: WideFit.from_dict(f) for c, f in by.items()} for m, by in d["by_mode"].items()},
                   feature_names)

    def time_ms(self, X: np.ndarray, mode: str) -> np.ndarray:
        """Each row's modelled time in ms (NaN where the model does not speak for it: outside its
        classes, or with fewer than half the fewest rows M it was fitted on)."""
        out = np.full(len(X), np.nan)
        by = self.fits.get(mode)
        if not by or not self._kind_cols or not len(X):
            return out
        rows = np.flatnonzero(X[:, self._kind_cols].max(axis=1) > 0.5)
        if not len(rows):
            return out
        cls, m = _wide_classes(X[rows], self.feature_names)
        if not (cls != "").any():
            return out
        compute, memory = _roofline_terms(X[rows], self._cols)
        for name, fit in by.items():
            hit = (cls == name) & (m >= fit.m_min / WIDE_M_TOLERANCE)
            out[rows[hit]] = fit.compute_scale * compute[hit] + fit.memory_scale * memory[hit]
        return out

    def apply(self, log_t: np.ndarray, X: np.ndarray, mode: str) -> np.ndarray:
        """``log_t`` (log ms per row of ``X``) with the wide products' rows replaced by the model's."""
        t = self.time_ms(X, mode)
        hit = np.isfinite(t) & (t > 0)
        if not hit.any():
            return log_t
        out = np.array(log_t, dtype=np.float64, copy=True)
        out[hit] = np.log(t[hit])
        return out
