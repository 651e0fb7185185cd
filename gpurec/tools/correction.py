"""Bring the whole-network time correction of trained models that predate it up to what `gpurec
train` now fits, from their own report: the leave-one-family-out network records, the very sums
the pooled fp32 keys were fitted on.

Why: the correction (gpurec.model.network) is linear in the op sum with an intercept, fitted on
networks whose out-of-fold op sums start at about 0.06 ms; below that the intercept, extrapolated,
dominated (a one-Linear network of 0.004 ms became 0.144 ms).  `gpurec train` now records the
smallest op sum per coefficient key (``Correction.time_floor_ms``, floors_into here) and fits the
networks without recurrent layers a correction of their own (nonrecurrent_into here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _network_records(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The training report's leave-one-family-out network records (fp32 networks, out-of-fold sums)."""
    return report.get("leave_one_family_out", {}).get("xgboost", {}).get("network_records") or []


def floors_from_report(report: dict[str, Any]) -> dict[str, float]:
    """``"*|mode"`` -> the smallest out-of-fold op sum (ms) of the fp32 networks the pooled
    correction of that step mode was fitted on (report["leave_one_family_out"]["xgboost"]
    ["network_records"])."""
    floors: dict[str, float] = {}
    for r in _network_records(report):
        key, s = f"*|{r['mode']}", float(r["sum_time_ms"])
        if s > 0:
            floors[key] = min(floors.get(key, s), s)
    return floors


def _manifest_and_report(model_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A trained model directory's manifest and training report (what these refits read)."""
    import json

    from gpurec.model.persist import read_manifest

    report_path = model_dir / "report.json"
    if not report_path.is_file():
        raise FileNotFoundError(f"{report_path} is missing: the correction is refitted from the training report")
    return read_manifest(model_dir), json.loads(report_path.read_text())


def floors_into(model_dir: Path | str) -> dict[str, Any]:
    """Write the fitted range of ``model_dir``'s time correction into its manifest (atomically),
    for the pooled keys its report has records of; keys that already hold one are kept.  Returns
    what was written."""
    from gpurec.model.persist import write_manifest

    model_dir = Path(model_dir)
    manifest, report = _manifest_and_report(model_dir)
    floors = floors_from_report(report)
    corr = dict(manifest["network_correction"])
    known = dict(corr.get("time_floor_ms") or {})
    added = {k: v for k, v in floors.items() if k in corr.get("time_coef", {}) and k not in known}
    if not added:
        return {"written": {}, "kept": known}
    corr["time_floor_ms"] = {**known, **added}
    write_manifest(model_dir, {**manifest, "network_correction": corr})
    return {"written": added, "kept": known}


def nonrecurrent_from_report(report: dict[str, Any]) -> dict[str, Any]:
    """The time correction of the networks without recurrent layers, chosen and fitted as `gpurec
    train` now does (network.correction_cv's second-level leave-one-family-out, then fit_correction),
    on the report's own leave-one-family-out network records: the fp32 networks and the very op
    sums the pooled fp32 keys were fitted on.  Returns the coefficients, floors and variants per
    key and the cross-validated MAPE of every variant."""
    import numpy as np

    from gpurec.model.fitting.evaluate import arch_of
    from gpurec.model.network import NetworkSums, correction_cv, fit_correction
    from gpurec.seqmodels import has_recurrent_layers

    records = _network_records(report)
    if not records:
        raise ValueError("the report holds no leave-one-family-out network records to fit on; retrain")
    col = {k: np.array([r[k] for r in records]) for k in ("sum_time_ms", "sum_power_w", "n_ops", "n_small",
                                                          "small_time_ms", "measured_time_ms", "measured_power_w")}
    recurrent = np.array([has_recurrent_layers(arch_of(str(r["set_key"]))) for r in records])
    s = NetworkSums(col["sum_time_ms"], col["sum_time_ms"] * col["sum_power_w"], col["n_ops"].astype(float),
                    col["n_small"].astype(float), col["small_time_ms"],
                    recurrent_time_ms=np.where(recurrent, col["sum_time_ms"], 0.0))
    modes = np.array([str(r["mode"]) for r in records])
    gpus = np.full(len(records), "*")
    families = np.array([str(r["family"]) for r in records])
    ridge = float(report.get("config", {}).get("correction_ridge", 0.1))
    cv = correction_cv(s, gpus, modes, families, col["measured_time_ms"], col["measured_power_w"], ridge=ridge,
                       specific=set())
    chosen = cv["chosen"].get("nonrecurrent_time", {})
    c = fit_correction(s, gpus, modes, col["measured_time_ms"], col["measured_power_w"], "none", "none", ridge=ridge,
                       specific=set(), nonrecurrent_time_variant=chosen)
    return {"coef": c.nonrecurrent_time_coef, "floor_ms": c.nonrecurrent_time_floor_ms, "variant": chosen,
            "mape_by_mode": {m: {"n": d.get("n_nonrecurrent"), "nonrecurrent_time": d.get("nonrecurrent_time"),
                                 "pooled_time": d.get("time")} for m, d in cv["by_mode"].items()}}


def nonrecurrent_into(model_dir: Path | str) -> dict[str, Any]:
    """Write nonrecurrent_from_report's coefficients into ``model_dir``'s manifest (atomically) for
    models trained before `gpurec train` fitted them; the refit is recorded beside them
    (``nonrecurrent_fitted_after_training``).  Returns what was fitted."""
    from gpurec.model.persist import write_manifest

    model_dir = Path(model_dir)
    manifest, report = _manifest_and_report(model_dir)
    fit = nonrecurrent_from_report(report)
    corr = dict(manifest["network_correction"])
    corr.update({"nonrecurrent_time_coef": fit["coef"], "nonrecurrent_time_floor_ms": fit["floor_ms"],
                 "nonrecurrent_time_variant": fit["variant"],
                 "nonrecurrent_fitted_after_training": {"mape_by_mode": fit["mape_by_mode"]}})
    write_manifest(model_dir, {**manifest, "network_correction": corr})
    return fit


def measured_gap_into(model_dir: Path | str, data_root: Path | str | None = None) -> dict[str, Any]:
    """Fit the gap per looked-up operation (graph_gap.fit_measured_gap, as `gpurec train` now does)
    from the committed network and in-network tables into ``model_dir``'s manifest (atomically),
    for models trained before it was fitted; the refit is recorded beside it
    (``measured_gap_fitted_after_training``).  Returns the gaps and their report."""
    from gpurec.model.fitting.data import load_tables
    from gpurec.model.fitting.graph_gap import fit_measured_gap
    from gpurec.model.persist import read_manifest, write_manifest

    model_dir = Path(model_dir)
    manifest = read_manifest(model_dir)
    _, nets, in_net = load_tables(data_root)
    gaps, report = fit_measured_gap(nets, in_net)
    if not gaps:
        raise ValueError("no network has both a host-free time and in-network kernel rows to fit the gap on; "
                         "collect networks with in-network profiling (`gpurec collect --what networks`)")
    corr = {**manifest["network_correction"], "measured_gap_ms": gaps,
            "measured_gap_fitted_after_training": {"report": report}}
    write_manifest(model_dir, {**manifest, "network_correction": corr})
    return {"measured_gap_ms": gaps, "report": report}
