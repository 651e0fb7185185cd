"""ncu safety checks (seed §5.5.2.3) and the miss-rate sweep that picks array sizes (§5.5.1).

Each configuration is launched twice under ncu: warm-up only, then warm-up + measurement.
Subtracting the first row from the second isolates the measurement loop, on which we check
(1) the target level serves ~100% of the accesses (hit rate of the target cache; DRAM: the
L2 misses) and (2) the counted accesses match the analytic count
``blocks x ceil(threads/4) x measured loads per thread`` (Eq. 5.7 adapted, see
cuda/membench.cu), within a tolerance.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpurec.device import ncu as ncu_mod
from gpurec.device.errors import NcuError

log = logging.getLogger("gpurec.calibrate")

M_L1_SECT = "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"
M_L1_HIT = "l1tex__t_sectors_pipe_lsu_mem_global_op_ld_lookup_hit.sum"
M_L2_SECT = "lts__t_sectors_srcunit_tex_op_read.sum"
M_L2_HIT = "lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum"
M_DRAM = "dram__sectors_read.sum"
M_SH_WF = "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"
M_SH_INST = "smsp__inst_executed_op_shared_ld.sum"
CHECK_METRICS = [
    M_L1_SECT, M_L1_HIT, M_L2_SECT, M_L2_HIT, M_DRAM, M_SH_WF, M_SH_INST,
    "l1tex__t_sector_hit_rate.pct", "lts__t_sector_hit_rate.pct", "gpu__time_duration.sum",
]
SWEEP_METRICS = [M_L1_SECT, M_L1_HIT, M_L2_SECT, M_L2_HIT, M_DRAM]
HIT_MIN = 0.99          # target cache must serve >= 99% of measured sectors
COUNT_TOL = 0.05        # counted / analytic within 5% (DRAM: 10%, adjacent-sector fetches)
DRAM_COUNT_TOL = 0.10
PROBE_ITERS = 2


def _probe_cmd(spec_file: Path) -> list[str]:
    """The probe process ncu profiles (gpurec.calibrate.microbench.run_probe_spec)."""
    return [sys.executable, "-m", "gpurec.calibrate.microbench", str(spec_file)]


def profile_configs(
    lib: Path, spec: list[dict[str, Any]], metrics: Sequence[str], out_csv: Path, device: int = 0,
    timeout_s: float = 300.0, ncu: Path | None = None,
) -> tuple[Any, list[dict[str, Any]]]:
    """Run the probe under ncu; return (parsed rows, analytic counts per configuration)."""
    with tempfile.TemporaryDirectory(prefix="gpurec-probe-") as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps({"lib": str(lib), "configs": spec, "device": device,
                                         "result": str(result_path)}))
        repo = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)}
        df = ncu_mod.run_ncu(
            _probe_cmd(spec_path), metrics, out_csv,
            kernel_regex="chase_kernel", timeout_s=timeout_s, ncu=ncu, env=env,
        )
        analytic = json.loads(result_path.read_text()) if result_path.exists() else []
    if len(df) != 2 * len(spec):
        raise NcuError(f"expected {2 * len(spec)} profiled kernels (warm-up, full per config), got {len(df)}")
    return df, analytic


def _val(row: Any, metric: str) -> float:
    try:
        v = float(row[metric])
    except (KeyError, TypeError, ValueError):
        return math.nan
    return v


def _diff(df: Any, i: int, metric: str) -> float:
    """Measurement-loop value of ``metric`` for configuration i (full row minus warm-up row)."""
    return _val(df.iloc[2 * i + 1], metric) - _val(df.iloc[2 * i], metric)


def _same(row: Any, col: str, expected: int) -> bool:
    """Row's launch dimension equals ``expected`` (True when ncu did not report it)."""
    try:
        return int(row[col]) == expected
    except (KeyError, TypeError, ValueError):
        return True


def _ratio(a: float, b: float) -> float:
    return a / b if b and math.isfinite(a) and math.isfinite(b) else math.nan


def evaluate_check(df: Any, i: int, entry: dict[str, Any], counts: dict[str, Any]) -> dict[str, Any]:
    """Hit rate of the target level and counted/analytic accesses for configuration i."""
    cfg = counts["config"]
    full = counts["full"]
    level = cfg["level"]
    sectors = full["sectors_per_launch"]
    res: dict[str, Any] = {"config": cfg, "iters": entry.get("iters", PROBE_ITERS),
                           "analytic_sectors": sectors}
    row_full = df.iloc[2 * i + 1]
    res["grid_ok"] = bool(_same(row_full, "grid_blocks", cfg["blocks"]) and _same(row_full, "threads_per_block",
                                                                                   cfg["threads"]))
    if level == "shared":
        wf, inst = _diff(df, i, M_SH_WF), _diff(df, i, M_SH_INST)
        warps = cfg["blocks"] * math.ceil(cfg["threads"] / 32)
        res.update(
            counted_wavefronts=wf, analytic_wavefronts=full["wavefronts_per_launch"],
            count_ratio=_ratio(wf, full["wavefronts_per_launch"]),
            counted_shared_ld_insts=inst, analytic_shared_ld_insts=warps * full["meas_loads_per_thread"],
            inst_ratio=_ratio(inst, warps * full["meas_loads_per_thread"]),
            global_sectors=_diff(df, i, M_L1_SECT), hit_rate=1.0,
        )
        res["passed"] = bool(abs(res["count_ratio"] - 1) <= COUNT_TOL)
    elif level == "l1":
        s, h = _diff(df, i, M_L1_SECT), _diff(df, i, M_L1_HIT)
        res.update(counted_sectors=s, count_ratio=_ratio(s, sectors), hit_rate=_ratio(h, s))
        res["passed"] = bool(abs(res["count_ratio"] - 1) <= COUNT_TOL and res["hit_rate"] >= HIT_MIN)
    elif level == "l2":
        s, h = _diff(df, i, M_L2_SECT), _diff(df, i, M_L2_HIT)
        res.update(counted_sectors=s, count_ratio=_ratio(s, sectors), hit_rate=_ratio(h, s),
                   dram_sectors=_diff(df, i, M_DRAM))
        res["passed"] = bool(abs(res["count_ratio"] - 1) <= COUNT_TOL and res["hit_rate"] >= HIT_MIN)
    else:
        d, s, h = _diff(df, i, M_DRAM), _diff(df, i, M_L2_SECT), _diff(df, i, M_L2_HIT)
        res.update(counted_sectors=d, count_ratio=_ratio(d, sectors), l2_sectors=s, l2_hit_rate=_ratio(h, s),
                   hit_rate=1.0 - _ratio(h, s) if math.isfinite(_ratio(h, s)) else math.nan)
        res["passed"] = bool(abs(res["count_ratio"] - 1) <= DRAM_COUNT_TOL and res["hit_rate"] >= 1 - 0.1)
    res["passed"] = bool(res["passed"] and res["grid_ok"])
    return res


def run_checks(
    lib: Path, spec: list[dict[str, Any]], out_csv: Path, device: int = 0, extra_metrics: Sequence[str] = (),
    available: set[str] | None = None, timeout_s: float = 300.0, ncu: Path | None = None,
) -> dict[str, Any]:
    """Profile ``spec`` with CHECK_METRICS (+ extra, e.g. the feature metrics) and evaluate each."""
    metrics, missing = ncu_mod.split_available(list(dict.fromkeys([*CHECK_METRICS, *extra_metrics])), available)
    first_error = None
    try:
        df, analytic = profile_configs(lib, spec, metrics, out_csv, device, timeout_s, ncu)
    except NcuError as exc:
        if not extra_metrics:
            raise
        # An unknown extra (feature) metric fails the whole ncu run: retry with the core set.
        first_error = str(exc)[-1500:]
        log.warning("ncu with feature metrics failed, retrying with the check metrics only")
        metrics, missing = ncu_mod.split_available(CHECK_METRICS, available)
        df, analytic = profile_configs(lib, spec, metrics, out_csv, device, timeout_s, ncu)
    results = [evaluate_check(df, i, e, analytic[i]) for i, e in enumerate(spec)]
    return {"passed": all(r["passed"] for r in results), "configs": results, "missing_metrics": missing,
            "metrics": metrics, "csv": out_csv.name, "feature_metrics_error": first_error}


def run_miss_sweep(
    lib: Path, spec: list[dict[str, Any]], out_csv: Path, device: int = 0, available: set[str] | None = None,
    timeout_s: float = 300.0, ncu: Path | None = None,
) -> list[dict[str, Any]]:
    """Measurement-loop hit rate of L1 (ld.ca) / L2 (ld.cg) per array size."""
    metrics, _ = ncu_mod.split_available(SWEEP_METRICS, available)
    df, analytic = profile_configs(lib, spec, metrics, out_csv, device, timeout_s, ncu)
    out = []
    for i, e in enumerate(spec):
        sect, hit = (M_L1_SECT, M_L1_HIT) if e["level"] == "l1" else (M_L2_SECT, M_L2_HIT)
        s, h = _diff(df, i, sect), _diff(df, i, hit)
        used = analytic[i]["full"]["array_bytes_used"] if i < len(analytic) else e["array_bytes"]
        out.append({"level": e["level"], "array_bytes": used, "footprint_bytes": used * e["blocks"],
                    "blocks": e["blocks"], "threads": e["threads"], "hit_rate": _ratio(h, s),
                    "miss_rate": 1 - _ratio(h, s), "counted_sectors": s})
    return out


def choose_size(sweep: list[dict[str, Any]], level: str, default_bytes: int, key: str = "array_bytes") -> tuple[int, str]:
    """Largest swept size <= default whose hit rate >= HIT_MIN; the default if none was measured."""
    ok = [r[key] for r in sweep if r["level"] == level and r[key] <= default_bytes
          and math.isfinite(r["hit_rate"]) and r["hit_rate"] >= HIT_MIN]
    if ok:
        return int(max(ok)), "ncu miss-rate sweep"
    return int(default_bytes), "default (no passing size in the miss-rate sweep)"
