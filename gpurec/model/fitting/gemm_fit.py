"""Fit the unaligned half-precision GEMM floor (gpurec.model.gemm) on measured operation rows."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpurec.model.gemm import (
    WIDE_CLASSES,
    ModeFloor,
    UnalignedGemmFloor,
    WideFit,
    WideHalfGemm,
    gemm_dims,
    roofline_terms_ms,
    unaligned_half,
    wide_half_class,
)

MIN_ROWS = 6  # per mode, over at least two architectures: fewer says nothing about the next one
MIN_ARCHS = 2
MIN_WIDTHS = 2  # the wide model is scored leaving each inner dimension out: at least two


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


def _roofline_coefficients(compute: np.ndarray, memory: np.ndarray, time_ms: np.ndarray) -> tuple[float, float]:
    """(a, b) >= 0 minimising the relative error of a x compute + b x memory against time_ms."""
    from scipy.optimize import nnls

    coef, _ = nnls(np.stack([compute / time_ms, memory / time_ms], axis=1), np.ones(len(time_ms)))
    return float(coef[0]), float(coef[1])


def fit_wide(X: np.ndarray, kinds: np.ndarray, time_ms: np.ndarray, modes: np.ndarray, gpus: Sequence[str],
             feature_names: Sequence[str]) -> tuple[WideHalfGemm | None, dict[str, Any]]:
    """The wide half-precision product model (gpurec.model.gemm.WideHalfGemm) from measured rows
    (``X`` the unmasked time feature matrix, ``time_ms`` the measured GPU time, ``gpus`` each row's
    GPU).  Per mode and class: (a, b) by non-negative least squares on relative error; its error in
    sample and leaving each inner dimension K out in turn.  None (and why, in the report) where too
    few rows or widths."""
    names = list(feature_names)
    cls = wide_half_class(X, names, kinds)
    compute, memory = roofline_terms_ms(X, names)
    ok = (cls != "") & np.isfinite(time_ms) & (time_ms > 0) & (compute > 0) & (memory > 0)
    m_arr = np.asarray(modes, dtype=object)
    g_arr = np.asarray(gpus, dtype=object)
    m, k, _ = gemm_dims(X[:, names.index("flops")].astype(np.float64), X[:, names.index("input_elements")]
                        .astype(np.float64), X[:, names.index("output_elements")].astype(np.float64))
    fits: dict[str, dict[str, WideFit]] = {}
    report: dict[str, Any] = {}
    for mode in sorted(set(m_arr[ok].tolist())):
        for name in WIDE_CLASSES:
            sel = ok & (m_arr == mode) & (cls == name)
            widths = sorted({int(w) for w in k[sel].tolist()})
            key = f"{mode}|{name}"
            if sel.sum() < MIN_ROWS or len(widths) < MIN_WIDTHS:
                report[key] = {"rows": int(sel.sum()), "widths": widths, "fitted": False,
                               "why": f"fewer than {MIN_ROWS} rows or {MIN_WIDTHS} inner dimensions"}
                continue
            a, b = _roofline_coefficients(compute[sel], memory[sel], time_ms[sel])
            mape = float(np.mean(np.abs((a * compute[sel] + b * memory[sel]) / time_ms[sel] - 1.0)))
            errors: list[float] = []
            for w in widths:
                train, held = sel & (k != w), sel & (k == w)
                a_w, b_w = _roofline_coefficients(compute[train], memory[train], time_ms[train])
                errors.extend(np.abs((a_w * compute[held] + b_w * memory[held]) / time_ms[held] - 1.0).tolist())
            fit = WideFit(a, b, int(sel.sum()), tuple(sorted(set(g_arr[sel].tolist()))), tuple(widths),
                          float(m[sel].min()), mape, float(np.mean(errors)))
            fits.setdefault(mode, {})[name] = fit
            report[key] = fit.as_dict() | {"fitted": True}
    return (WideHalfGemm(fits, names) if fits else None), report


def fit_wide_on_data(data_root: Path | str | None, builder: Any) -> tuple[WideHalfGemm | None, dict[str, Any]]:
    """fit_wide on the training rows of Linear and F.linear (as fit_floor_on_data reads them)."""
    from gpurec.model.fitting.data import kind_rows
    from gpurec.model.gemm import KINDS

    rows, X, _, _ = kind_rows(data_root, KINDS, builder)
    model, report = fit_wide(X, rows["_kind"].to_numpy(dtype=object), rows["_t_gpu"].to_numpy(dtype=np.float64),
                             rows["mode"].to_numpy(dtype=object), rows["gpu"].astype(str).tolist(),
                             builder.feature_names)
    return model, {"product_rows": int(len(rows)), "by_mode_class": report}
