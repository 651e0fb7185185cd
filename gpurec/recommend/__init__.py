"""Rank GPUs for a network by time, energy or energy-delay product.

Runs on a laptop: it only needs the shipped predictors (``models/``) and the catalogue;
it never imports device, collect or calibrate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpurec.host import host_cpu as local_host_cpu

OBJECTIVES = {
    "time": ("time_ms", "ms"),
    "energy": ("energy_mj", "mJ"),
    "edp": ("edp_mj_ms", "mJ·ms"),
}


class UnknownObjective(ValueError):
    """The objective is not one of time, energy, edp."""


def check_objective(objective: str) -> str:
    if objective not in OBJECTIVES:
        import difflib

        near = difflib.get_close_matches(objective, list(OBJECTIVES), n=1)
        hint = f" Did you mean '{near[0]}'?" if near else ""
        raise UnknownObjective(f"Unknown objective '{objective}'.{hint} Valid choices: {', '.join(OBJECTIVES)}.")
    return objective


def default_input_shape(batch_size: int = 32, resolution: int = 224) -> tuple[int, int, int, int]:
    return (int(batch_size), 3, int(resolution), int(resolution))


def recommend(model: Any, input_shape: Sequence[int] | None = None, mode: str = "inference",
              objective: str = "energy", gpus: Sequence[str] | None = None, predictor: Any = None,
              host_cpu: str | None = None) -> Any:
    """GPUs ranked best-first for ``objective``; a pandas DataFrame, one row per GPU.

    Columns: gpu (NVML name), short_name, time_ms, energy_mj, power_w, edp_mj_ms, measured
    (the GPU has measurements) or extrapolated from catalogue specifications, low/high (the
    uncertainty band of the objective), vs_best_pct (how much worse than the best), rank.
    """
    import pandas as pd

    from gpurec.catalog import resolve_gpu

    check_objective(objective)
    if predictor is None:
        from gpurec.model import load_predictor

        predictor = load_predictor()
    shape = tuple(input_shape) if input_shape is not None else default_input_shape()
    names = ([resolve_gpu(g).nvml_name for g in gpus] if gpus
             else [getattr(g, "nvml_name", g) for g in predictor.gpus])
    rows = []
    estimates = {}
    for name in names:
        est = predictor.predict(model, input_shape=shape, mode=mode, gpu=name)
        estimates[name] = est
        spec = resolve_gpu(name)
        row = {
            "gpu": spec.nvml_name,
            "short_name": spec.short_name,
            "time_ms": est.time_ms,
            "energy_mj": est.energy_mj,
            "power_w": est.power_w,
            "edp_mj_ms": est.energy_mj * est.time_ms,
            "measured": bool(est.measured_gpu),
        }
        lo, hi = _band(est, objective)
        row["low"], row["high"] = lo, hi
        rows.append(row)
    df = pd.DataFrame(rows)
    col = OBJECTIVES[objective][0]
    df = df.sort_values(col, kind="stable").reset_index(drop=True)
    best = float(df[col].iloc[0])
    df["vs_best_pct"] = (df[col] / best - 1.0) * 100.0
    df["rank"] = range(1, len(df) + 1)
    df.attrs.update({"objective": objective, "mode": mode, "input_shape": list(shape),
                     "host_cpu": host_cpu or local_host_cpu(), "host_cpus_measured": _measured_hosts(predictor),
                     "estimates": estimates, "uncovered": _uncovered(estimates)})
    if len(df) >= 2:
        df.attrs["differences"] = explain_difference(estimates[df["gpu"].iloc[0]], estimates[df["gpu"].iloc[1]],
                                                     objective)
    return df


def _measured_hosts(predictor: Any) -> list[str]:
    """Host CPUs of the measurements behind the models (host overhead is learnt per host)."""
    manifest = getattr(predictor, "manifest", None) or {}
    hosts = manifest.get("host_cpus") if isinstance(manifest, dict) else None
    if hosts:
        return list(hosts)
    try:
        from gpurec.dataset import load_dataset

        return sorted(set(load_dataset(table="networks")["host_cpu"].dropna().astype(str)))
    except Exception:
        return []


def _band(est: Any, objective: str) -> tuple[float, float]:
    """Uncertainty band of the objective from the estimate's time and energy bands."""
    t_lo, t_hi = getattr(est, "time_low_ms", est.time_ms), getattr(est, "time_high_ms", est.time_ms)
    e_lo, e_hi = getattr(est, "energy_low_mj", est.energy_mj), getattr(est, "energy_high_mj", est.energy_mj)
    if objective == "time":
        return float(t_lo), float(t_hi)
    if objective == "energy":
        return float(e_lo), float(e_hi)
    return float(e_lo * t_lo), float(e_hi * t_hi)


def _uncovered(estimates: dict[str, Any]) -> Any:
    for est in estimates.values():
        unc = getattr(est, "uncovered", None)
        if unc is not None and len(unc):
            return unc
    return None


def explain_difference(first: Any, second: Any, objective: str, top: int = 5) -> list[dict[str, Any]]:
    """The operations that cause most of the difference between two GPUs' predictions."""
    col = {"time": "time_ms", "energy": "energy_mj", "edp": "energy_mj"}[objective]
    a, b = first.per_op, second.per_op
    if a is None or b is None or col not in a or col not in b:
        return []
    keys = [k for k in ("kind", "signature") if k in a and k in b]
    if not keys:
        return []
    ga = a.groupby(keys)[col].sum()
    gb = b.groupby(keys)[col].sum()
    count = a.groupby(keys)[col].size()
    example = a.groupby(keys)["name"].first() if "name" in a else None
    diff = (gb - ga).dropna()
    total = float(diff.sum()) or 1.0
    out = []
    for key, d in diff.sort_values(key=lambda s: -s.abs()).head(top).items():
        kind = key[0] if isinstance(key, tuple) else key
        out.append({"op_kind": kind, "signature": key[1] if isinstance(key, tuple) and len(key) > 1 else None,
                    "count": int(count.get(key, 0)),
                    "example": str(example.get(key, "")) if example is not None else "",
                    f"delta_{col}": float(d), "share_of_difference": float(d) / total})
    return out


def to_json(df: Any, model_name: str) -> dict[str, Any]:
    """The documented JSON shape of ``gpurec recommend --format json``."""
    ranking = []
    for r in df.to_dict("records"):
        ranking.append({
            "gpu": r["gpu"], "short_name": r["short_name"], "time_ms": r["time_ms"], "energy_mj": r["energy_mj"],
            "power_w": r["power_w"], "edp_mj_ms": r["edp_mj_ms"], "measured": bool(r["measured"]),
            "low": r["low"], "high": r["high"], "vs_best_pct": r["vs_best_pct"], "rank": int(r["rank"]),
        })
    out = {"model": model_name, "objective": df.attrs.get("objective"), "mode": df.attrs.get("mode"),
           "input_shape": df.attrs.get("input_shape"), "ranking": ranking,
           "differences": df.attrs.get("differences", [])}
    out["host_cpu"] = df.attrs.get("host_cpu")
    out["host_cpus_measured"] = df.attrs.get("host_cpus_measured")
    unc = df.attrs.get("uncovered")
    if unc is not None and len(unc):
        out["uncovered"] = unc.to_dict("records") if hasattr(unc, "to_dict") else unc
    return out
