"""Fit the unaligned half-precision GEMM floor (gpurec.model.gemm) on measured operation rows."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpurec.model.gemm import ModeFloor, UnalignedGemmFloor, unaligned_half

MIN_ROWS = 6  # per mode, over at least two architectures: fewer says nothing about the next one
MIN_ARCHS = 2


def fit_floor(X: np.ndarray, kinds: np.ndarray, time_ms: np.ndarray, modes: np.ndarray, groups: Sequence[str],
              feature_names: Sequence[str]) -> tuple[UnalignedGemmFloor | None, dict[str, Any]]:
    """The floor from measured rows (``X`` the unmasked time feature matrix over ``feature_names``,
    ``kinds`` each row's operation kind, ``time_ms`` its measured GPU time, ``groups`` its
    architecture).  Per mode: efficiency = the median over the unaligned half-precision product
    rows of achieved TFLOPS / peak; its leave-one-architecture-out error is the floor's alone on
    each held-out architecture's rows.  None (and why, in the report) where too few rows."""
    names = list(feature_names)
    picked = unaligned_half(X, names, kinds) & np.isfinite(time_ms) & (time_ms > 0)
    flops_mode = X[:, names.index("flops_mode")].astype(np.float64)
    peak = X[:, names.index("peak_tflops_used")].astype(np.float64)
    picked &= (flops_mode > 0) & (peak > 0)
    eff = np.where(picked, flops_mode / np.where(picked, time_ms, 1.0) / 1e9 / np.where(picked, peak, 1.0), np.nan)
    groups = np.asarray(groups, dtype=object)
    fits: dict[str, ModeFloor] = {}
    report: dict[str, Any] = {}
    for mode in sorted(set(np.asarray(modes, dtype=object)[picked].tolist())):
        sel = picked & (np.asarray(modes, dtype=object) == mode)
        archs = sorted(set(groups[sel].tolist()))
        if sel.sum() < MIN_ROWS or len(archs) < MIN_ARCHS:
            report[mode] = {"rows": int(sel.sum()), "archs": archs, "fitted": False,
                            "why": f"fewer than {MIN_ROWS} rows or {MIN_ARCHS} architectures"}
            continue
        errors = []
        for arch in archs:
            held = sel & (groups == arch)
            e = float(np.median(eff[sel & (groups != arch)]))
            predicted = flops_mode[held] / (e * peak[held] * 1e9)
            errors.extend(np.abs(predicted / time_ms[held] - 1.0).tolist())
        fit = ModeFloor(efficiency=float(np.median(eff[sel])), rows=int(sel.sum()), archs=tuple(archs),
                        loao_mape=float(np.mean(errors)), flops_min=float(flops_mode[sel].min()))
        fits[mode] = fit
        report[mode] = fit.as_dict() | {"fitted": True,
                                        "efficiency_quantiles": np.quantile(eff[sel], [0.05, 0.5, 0.95]).tolist()}
    return (UnalignedGemmFloor(fits, names) if fits else None), report


def fit_floor_on_data(data_root: Path | str | None, builder: Any) -> tuple[UnalignedGemmFloor | None, dict[str, Any]]:
    """fit_floor on the training rows of Linear and F.linear (fitting.data.kind_rows: unmasked
    features, since the floor reads ``waves``, which the time boosters' matrices hide), with
    architectures as groups; the report says how many rows it read."""
    from gpurec.model.fitting.data import kind_rows
    from gpurec.model.fitting.evaluate import arch_of
    from gpurec.model.gemm import KINDS

    rows, X, _, _ = kind_rows(data_root, KINDS, builder)
    floor, report = fit_floor(X, rows["_kind"].to_numpy(dtype=object), rows["_t_gpu"].to_numpy(dtype=np.float64),
                              rows["mode"].to_numpy(dtype=object), [arch_of(str(k)) for k in rows["set_key"]],
                              builder.feature_names)
    return floor, {"product_rows": int(len(rows)), "by_mode": report}
