"""Record the whole-network time correction's fitted range into trained models that predate it.

Why: the correction (gpurec.model.network) is linear in the op sum with an intercept, fitted on
networks whose out-of-fold op sums start at about 0.06 ms; below that the intercept, extrapolated,
dominated (a one-Linear network of 0.004 ms became 0.144 ms).  `gpurec train` now records the
smallest op sum per coefficient key (``Correction.time_floor_ms``) and the correction is not
extrapolated below it.  Models trained before read it here from their own report: the
leave-one-family-out network records, the very sums the pooled fp32 keys were fitted on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def floors_from_report(report: dict[str, Any]) -> dict[str, float]:
    """``"*|mode"`` -> the smallest out-of-fold op sum (ms) of the fp32 networks the pooled
    correction of that step mode was fitted on (report["leave_one_family_out"]["xgboost"]
    ["network_records"])."""
    records = report.get("leave_one_family_out", {}).get("xgboost", {}).get("network_records") or []
    floors: dict[str, float] = {}
    for r in records:
        key, s = f"*|{r['mode']}", float(r["sum_time_ms"])
        if s > 0:
            floors[key] = min(floors.get(key, s), s)
    return floors


def floors_into(model_dir: Path | str) -> dict[str, Any]:
    """Write the fitted range of ``model_dir``'s time correction into its manifest (atomically),
    for the pooled keys its report has records of; keys that already hold one are kept.  Returns
    what was written."""
    import json

    from gpurec.model.persist import read_manifest, write_manifest

    model_dir = Path(model_dir)
    manifest = read_manifest(model_dir)
    report_path = model_dir / "report.json"
    if not report_path.is_file():
        raise FileNotFoundError(f"{report_path} is missing: the floors are read from the training report")
    floors = floors_from_report(json.loads(report_path.read_text()))
    corr = dict(manifest["network_correction"])
    known = dict(corr.get("time_floor_ms") or {})
    added = {k: v for k, v in floors.items() if k in corr.get("time_coef", {}) and k not in known}
    if not added:
        return {"written": {}, "kept": known}
    corr["time_floor_ms"] = {**known, **added}
    write_manifest(model_dir, {**manifest, "network_correction": corr})
    return {"written": added, "kept": known}
