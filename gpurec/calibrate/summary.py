"""Read a calibration.json back: acceptance criteria, DIV normalisations, ncu checks, clocks.

Used by gpurec/reports/calibration.py (docs/calibration.md) and the tests; pure Python.

Acceptance (the issue's criteria, checked per GPU):
  * every level's lower-bound fit has r2 >= 0.95;
  * eps_shared <= eps_L1 < eps_L2 < eps_DRAM (pJ per 32-byte sector);
  * the ncu safety checks ran and passed (target-level hit rate >= 99%, counted/analytic
    accesses within 5%, DRAM 10%).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

LEVEL_ORDER = ("shared", "l1", "l2", "dram")
# Seed ch. 5 (A100, clocks locked at the 1065 MHz base clock).
A100_REFERENCE = {"shared": 82.1, "l1": 107.0, "l2": 368.0, "dram": 2090.0}
A100_DIV_NJ = 2.0
R2_ACCEPT = 0.95


def _num(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v


def eps(cal: dict[str, Any]) -> dict[str, float]:
    """pJ per sector per level (NaN where missing)."""
    return {lv: _num((cal.get("levels", {}).get(lv) or {}).get("pj_per_sector")) for lv in LEVEL_ORDER}


def acceptance(cal: dict[str, Any], r2_min: float = R2_ACCEPT) -> dict[str, Any]:
    """The three criteria and the overall verdict, with the numbers behind each."""
    levels = cal.get("levels", {})
    r2 = {lv: _num((levels.get(lv) or {}).get("r2")) for lv in LEVEL_ORDER}
    r2_ok = all(math.isfinite(v) and v >= r2_min for v in r2.values())
    e = eps(cal)
    vals = [e[lv] for lv in LEVEL_ORDER]
    finite = all(math.isfinite(v) for v in vals)
    order_ok = bool(finite and vals[0] <= vals[1] < vals[2] < vals[3])
    nc = cal.get("ncu_checks") or {}
    configs = nc.get("configs") or []
    ncu_ok = bool(nc.get("passed")) and bool(configs) and all(c.get("passed") for c in configs)
    notes = []
    if nc.get("miss_sweep_error"):
        notes.append("ncu miss-rate sweep failed (array sizes stayed at their defaults; the safety checks "
                     "still verify them): " + str(nc["miss_sweep_error"]).split(":", 1)[0])
    if nc.get("error"):
        notes.append(f"ncu error: {nc['error']}")
    plan = (cal.get("provenance") or {}).get("plan") or {}
    if plan.get("skipped"):
        done = plan.get("done") or []
        threads = {lv: sorted({c["threads"] for c in done if c["level"] == lv and not c["div"]}, reverse=True)
                   for lv in LEVEL_ORDER}
        notes.append(f"budget ended the sweep: {len(done)} configurations done, {len(plan['skipped'])} skipped; "
                     "threads per block measured: " + ", ".join(f"{lv} {threads[lv]}" for lv in LEVEL_ORDER))
    return {
        "r2": {"passed": r2_ok, "min": min((v for v in r2.values() if math.isfinite(v)), default=None),
               "per_level": r2, "threshold": r2_min},
        "order": {"passed": order_ok, "pj_per_sector": e},
        "ncu": {"passed": ncu_ok, "n_configs": len(configs), "n_passed": sum(bool(c.get("passed")) for c in configs)},
        "passed": bool(r2_ok and order_ok and ncu_ok),
        "notes": notes,
    }


def div_summary(cal: dict[str, Any]) -> dict[str, Any]:
    """DIV energy in the three units (per warp instruction, per sector access, per thread).

    Recomputed from the fits in provenance, so older calibration.json files (which stored
    only the per-warp ``div_nj``) get the normalisations too.
    """
    from gpurec.calibrate.fit import SHAPE_KEYS, div_energy, load_fits_by_shape

    fits = (cal.get("provenance") or {}).get("fits") or []
    d = div_energy(fits)
    load = load_fits_by_shape(fits)
    rates = {}
    for f in fits:
        if f["div"]:
            base = load.get(tuple(f[k] for k in SHAPE_KEYS))
            if base is not None:
                rates[f"{f['level']}-t{f['threads']}"] = {"eps_load_pj": base["pj_per_sector"],
                                                          "eps_load_div_pj": f["pj_per_sector"],
                                                          "r2_load_div": f["r2"]}
    return {"div_nj_per_warp_inst": d["div_nj"], "div_nj_per_sector": d["div_nj_per_sector"],
            "div_nj_per_thread": d["div_nj_per_thread"], "stored_div_nj": cal.get("div_nj"), "fits": rates}


def ncu_check_rows(cal: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row per ncu safety-check configuration."""
    rows = []
    for c in (cal.get("ncu_checks") or {}).get("configs") or []:
        cfg = c.get("config", {})
        counted = c.get("counted_wavefronts") if cfg.get("level") == "shared" else c.get("counted_sectors")
        analytic = c.get("analytic_wavefronts") if cfg.get("level") == "shared" else c.get("analytic_sectors")
        rows.append({"level": cfg.get("level"), "threads": cfg.get("threads"), "blocks": cfg.get("blocks"),
                     "array_bytes": cfg.get("array_bytes"), "unit": "wavefronts" if cfg.get("level") == "shared"
                     else "sectors", "analytic": analytic, "counted": counted,
                     "count_ratio": c.get("count_ratio"), "hit_rate": c.get("hit_rate"), "passed": c.get("passed")})
    return rows


def observed(cal: dict[str, Any]) -> dict[str, Any]:
    """Clocks, temperature, throttling and idle power seen during the energy sweep."""
    prov = cal.get("provenance") or {}
    obs = dict(prov.get("observed") or {})
    idle = prov.get("idle") or []
    obs["idle_power_w"] = [round(_num(r.get("power_w")), 1) for r in idle]
    obs["clocks_note"] = prov.get("clocks")
    obs["energy_counter_period_ms"] = prov.get("energy_counter_period_ms")
    return obs


def saturated_rates(cal: dict[str, Any]) -> list[dict[str, Any]]:
    """Per configuration at its largest access count: sectors/s and power above idle.

    eps is the slope of energy on sectors; since every launch lasts as long as its accesses
    take, eps = (power above idle) / (sectors per second) for the whole kernel, which is why
    a slow (latency- or DIV-bound) run charges more energy per sector.
    """
    out = []
    pts = cal.get("points") or []
    for cid in dict.fromkeys(p["config_id"] for p in pts):
        full = [p for p in pts if p["config_id"] == cid and not p.get("warmup_only")]
        if not full:
            continue
        p = max(full, key=lambda r: r.get("iters", 0))
        ms = _num(p.get("ms_per_launch"))
        rate = _num(p.get("sectors_per_launch")) / (ms / 1e3) if ms > 0 else math.nan
        # power above idle while the kernel runs: dynamic energy per launch / kernel time per launch
        # (the energy window also holds launch gaps and a tail, so its average power is lower)
        dyn_w = [_num(r.get("dyn_energy_per_launch_mj")) / _num(r.get("ms_per_launch")) for r in full
                 if r.get("iters") == p.get("iters") and _num(r.get("ms_per_launch")) > 0]
        out.append({"config_id": cid, "level": p["level"], "threads": p["threads"], "div": bool(p.get("div")),
                    "gsectors_per_s": rate / 1e9, "gbytes_per_s": rate * 32 / 1e9,
                    "power_above_idle_w": statistics.median(dyn_w) if dyn_w else math.nan,
                    "ms_per_launch": ms})
    return out
