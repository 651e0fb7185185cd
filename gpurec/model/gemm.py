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


def _unaligned_half_products(values: np.ndarray, names: list[str], min_waves: float = MIN_WAVES,
                             align: int = ALIGN_ELEMENTS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which rows already known to be products with a weight are half-precision with K or N not a
    multiple of ``align`` and at least ``min_waves`` waves (0: any size, and no ``waves`` column
    needed), with each row's K and N."""
    col = {c: values[:, names.index(c)].astype(np.float64)
           for c in ("flops", "input_elements", "output_elements", "math_mode")}
    _, k, n = gemm_dims(col["flops"], col["input_elements"], col["output_elements"])
    half = np.isin(col["math_mode"], HALF_MATH)
    if min_waves > 0:
        half &= values[:, names.index("waves")].astype(np.float64) >= min_waves
    return half & (k > 0) & (n > 0) & (((k % align) != 0) | ((n % align) != 0)), k, n


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
