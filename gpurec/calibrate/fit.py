"""Linear regression of measurement-loop energy on access count (the memory-energy model's Eq. 5.4).

E_MEM = #accesses x eps + dE: the slope is the energy of one 32-byte sector access
(``pj_per_sector``), the intercept the per-launch offset (``offset_mj``).  The lower bound for
a level is the smallest eps over the thread/block configurations whose fit is good enough
(the saturation plateau, where more threads stop lowering it).  Pure numpy.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

MJ_TO_PJ = 1e9
R2_MIN = 0.9
# The memory levels the microbenchmarks exercise, in the order the fit and plots list them.
LEVELS: tuple[str, ...] = ("shared", "l1", "l2", "dram")


@dataclass(frozen=True)
class LinearFit:
    slope: float
    intercept: float
    r2: float
    n: int
    slope_stderr: float


def linear_fit(x: Iterable[float], y: Iterable[float]) -> LinearFit:
    """Ordinary least squares y = slope*x + intercept, with r2 and the slope's standard error."""
    xa, ya = np.asarray(list(x), dtype=float), np.asarray(list(y), dtype=float)
    ok = np.isfinite(xa) & np.isfinite(ya)
    xa, ya = xa[ok], ya[ok]
    n = int(xa.size)
    if n < 2 or np.ptp(xa) == 0:
        return LinearFit(math.nan, math.nan, math.nan, n, math.nan)
    A = np.column_stack([xa, np.ones_like(xa)])
    (slope, intercept), *_ = np.linalg.lstsq(A, ya, rcond=None)
    resid = ya - (slope * xa + intercept)
    ss_res = float(resid @ resid)
    ss_tot = float(((ya - ya.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)
    sxx = float(((xa - xa.mean()) ** 2).sum())
    stderr = math.sqrt(ss_res / (n - 2) / sxx) if n > 2 and sxx > 0 else math.nan
    return LinearFit(float(slope), float(intercept), float(r2), n, stderr)


def _groups(rows: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    g: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if not r.get("warmup_only"):
            g.setdefault(r["config_id"], []).append(r)
    return g


def fit_config(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Fit one configuration's full-run rows (meas_energy_mj vs sectors_per_launch)."""
    f = linear_fit([r["sectors_per_launch"] for r in rows], [r["meas_energy_mj"] for r in rows])
    r0 = rows[0]
    out: dict[str, Any] = {
        "config_id": r0["config_id"],
        "level": r0["level"],
        "threads": r0["threads"],
        "blocks": r0["blocks"],
        "array_bytes": r0["array_bytes"],
        "div": bool(r0["div"]),
        "pj_per_sector": f.slope * MJ_TO_PJ,
        "pj_per_sector_stderr": f.slope_stderr * MJ_TO_PJ,
        "offset_mj": f.intercept,
        "r2": f.r2,
        "n_rows": f.n,
        "n_points": len({r["iters"] for r in rows}),
    }
    if r0["level"] == "shared":
        fw = linear_fit([r["wavefronts_per_launch"] for r in rows], [r["meas_energy_mj"] for r in rows])
        out["pj_per_wavefront"] = fw.slope * MJ_TO_PJ
    divs = [r["div_warp_insts_per_launch"] for r in rows if r.get("div_warp_insts_per_launch")]
    if divs:
        out["sectors_per_div_inst"] = statistics.fmean(
            r["sectors_per_launch"] / r["div_warp_insts_per_launch"] for r in rows if r["div_warp_insts_per_launch"]
        )
    return out


def fit_all(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One fit per configuration (warm-up-only rows are already subtracted, so skipped here)."""
    return [fit_config(rs) for rs in _groups(rows).values()]


def _good(f: dict[str, Any], r2_min: float) -> bool:
    return (
        not f["div"] and math.isfinite(f["pj_per_sector"]) and f["pj_per_sector"] > 0
        and math.isfinite(f["r2"]) and f["r2"] >= r2_min
    )


def lower_bounds(fits: list[dict[str, Any]], levels: Iterable[str], r2_min: float = R2_MIN) -> dict[str, dict[str, Any]]:
    """Per level: the smallest positive eps among LOAD fits with r2 >= r2_min.

    If no fit passes r2_min, the best-r2 positive fit is used (its r2 tells the reader).
    Levels without any usable fit get nulls.
    """
    out: dict[str, dict[str, Any]] = {}
    for level in levels:
        cands = [f for f in fits if f["level"] == level and _good(f, r2_min)]
        if not cands:
            cands = sorted(
                (f for f in fits if f["level"] == level and _good(f, -math.inf)), key=lambda f: -f["r2"]
            )[:1]
        if cands:
            best = min(cands, key=lambda f: f["pj_per_sector"])
            out[level] = {
                "pj_per_sector": best["pj_per_sector"],
                "offset_mj": best["offset_mj"],
                "r2": best["r2"],
                "threads_per_block": best["threads"],
            }
        else:
            out[level] = {"pj_per_sector": None, "offset_mj": None, "r2": None, "threads_per_block": None}
    return out


THREADS_PER_SECTOR = 4  # 8-byte loads: 4 threads share one 32-byte sector (cuda/README.md)
SHAPE_KEYS = ("level", "threads", "blocks", "array_bytes")


def load_fits_by_shape(fits: list[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The LOAD-only fits keyed by configuration shape: the baseline of each LOAD+DIV fit."""
    return {tuple(f[k] for k in SHAPE_KEYS): f for f in fits if not f["div"]}


def div_energy(fits: list[dict[str, Any]]) -> dict[str, Any]:
    """Energy of one warp-level div.u64 from LOAD+DIV minus LOAD fits of the same shape.

    nJ per DIV = (eps_div - eps_load) [pJ/sector] x sectors per warp DIV instruction / 1000.
    Returns per-level values and their median (``div_nj``, per *warp* instruction, i.e. 32
    thread-level divisions), plus two normalisations for comparing with the published "~2 nJ per
    DIV" on A100, whose unit is the calibration's access unit:
    ``div_nj_per_sector`` (the extra energy per 32-byte sector access, one DIV per thread
    load, i.e. 4 thread-level divisions) and ``div_nj_per_thread`` (one thread's division).
    div.u64 has no hardware instruction: ptxas expands it into an integer subroutine, so
    "one DIV" is tens of SASS instructions, and the DIV run is ~14x slower per sector, so any
    power that scales with run time (not with work) lands in these numbers too.
    """
    load = load_fits_by_shape(fits)
    per_level: dict[str, float] = {}
    per_sector: dict[str, float] = {}
    per_thread: dict[str, float] = {}
    for f in fits:
        if not f["div"]:
            continue
        base = load.get(tuple(f[k] for k in SHAPE_KEYS))
        if base is None or "sectors_per_div_inst" not in f:
            continue
        delta_pj = f["pj_per_sector"] - base["pj_per_sector"]
        nj = delta_pj * f["sectors_per_div_inst"] / 1000.0
        if math.isfinite(nj):
            key = f"{f['level']}-t{f['threads']}"
            per_level[key] = nj
            per_sector[key] = delta_pj / 1000.0
            per_thread[key] = delta_pj / 1000.0 / THREADS_PER_SECTOR

    def med(d: dict[str, float]) -> float | None:
        return statistics.median(d.values()) if d else None

    return {"div_nj": med(per_level), "per_config": per_level, "div_nj_per_sector": med(per_sector),
            "div_nj_per_thread": med(per_thread), "per_config_per_sector": per_sector}
