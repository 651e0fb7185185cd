"""End-to-end calibration of the memory-energy model on the GPU at hand.

Stages, all inside ``budget_s``:
1. build cuda/membench.cu (nvcc), open the GPU (NVML) and the microbenchmark (CUDA);
2. ncu: miss-rate sweep over array sizes (chooses L1/L2 sizes) and safety checks (target
   level hit rate ~100%, counted vs analytic accesses), plus the feature metrics on the same
   kernels; any ncu failure is recorded in ``ncu_checks`` and calibration goes on;
3. energy sweep in priority order until the budget ends (saturated LOAD per level, LOAD+DIV,
   then threads-per-block and blocks sweeps), with idle power before and after;
4. fits, lower bounds, DIV energy, plots, JSON (also checkpointed after every stage).
Clocks are observed, never locked or changed.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import math
import platform
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpurec.calibrate import build as build_mod
from gpurec.calibrate import checks as checks_mod
from gpurec.calibrate import fit as fit_mod
from gpurec.calibrate.errors import CalibrationError
from gpurec.calibrate.microbench import LEVELS, BenchConfig, DeviceProps, Microbench
from gpurec.calibrate.sweep import Sweeper, SweepSettings, finalize_rows
from gpurec.dataset.store import atomic_write_text, json_safe
from gpurec.device import ncu as ncu_mod
from gpurec.device.sampler import Sampler
from gpurec.device.window import EnergyMonitor

log = logging.getLogger("gpurec.calibrate")

KIB, MIB = 1024, 1024 * 1024
CLOCKS_NOTE = "default (not locked; lent GPU)"
THREAD_SWEEP = (256, 32, 4, 1, 128, 512, 64, 16, 8, 2)
# Clock and sleep of the energy sweep; tests replace them with a simulated world, where the
# window's sampler is polled by the waiting code instead of a thread (``_sampler_thread``).
_now = time.perf_counter
_sleep = time.sleep
_sampler_thread = True


def _round_down(x: float, unit: int) -> int:
    return max(unit, int(x) // unit * unit)


def default_sizes(props: DeviceProps) -> dict[str, int]:
    """Array sizes from the cache sizes, with margin (misses start below the nominal size).

    shared: 48 KiB per block (static limit, as the seed); l1: half the unified L1/shared of one
    SM (shared per SM + 28 KiB: 256 KiB on H100, 192 KiB on A100); l2: 30% of L2 in total
    (the A100's L2 misses from ~15 of 40 MB); dram: >= 8x L2 in total.
    """
    unified = props.smem_per_sm_bytes + 28 * KIB
    return {
        "shared": min(48 * KIB, props.smem_per_block_bytes or 48 * KIB),
        "l1": _round_down(unified / 2, 8 * KIB),
        "l2_footprint": _round_down(0.3 * props.l2_bytes, MIB),
        "dram_footprint": _round_down(min(max(8 * props.l2_bytes, 256 * MIB), props.global_mem_bytes / 4), MIB),
        "l1_unified": unified,
    }


def array_bytes_for(level: str, blocks: int, sizes: dict[str, int], sm_count: int) -> int:
    """Per-block array for a level: per-SM resources are shared by the blocks of one SM."""
    per_sm = max(1, math.ceil(blocks / max(sm_count, 1)))
    if level == "shared":
        return sizes["shared"]
    if level == "l1":
        return _round_down(sizes["l1"] / per_sm, 8 * KIB)
    key = "l2_footprint" if level == "l2" else "dram_footprint"
    return _round_down(sizes[key] / blocks, 8 * KIB)


def plan_configs(props: DeviceProps, sizes: dict[str, int], quick: bool = False,
                 levels: Sequence[str] = ("l1", "shared", "l2", "dram"),
                 thread_sweep: Sequence[int] = THREAD_SWEEP, div: bool = True) -> list[BenchConfig]:
    """Energy configurations in priority order (the budget cuts the tail).

    Saturated LOAD per level, LOAD+DIV on L1, the first two thread counts of the sweep, the
    other DIV levels and twice the blocks, then the rest of the thread sweep.
    """
    sms, tmax = props.sm_count, min(1024, props.max_threads_per_block or 1024)

    def cfg(level: str, threads: int, blocks: int, div: bool = False) -> BenchConfig:
        return BenchConfig(level, array_bytes_for(level, blocks, sizes, sms), blocks, threads, div)

    div_levels = [lv for lv in ("l1", "l2", "dram") if lv in levels] if div else []
    plan = [cfg(lv, tmax, sms) for lv in levels] + [cfg(lv, tmax, sms, div=True) for lv in div_levels[:1]]
    if quick:
        return plan
    for i, t in enumerate(t for t in thread_sweep if t != tmax):
        plan += [cfg(lv, t, sms) for lv in levels]
        if i == 1:
            plan += [cfg(lv, tmax, sms, div=True) for lv in div_levels[1:]]
            plan += [cfg(lv, tmax, 2 * sms) for lv in levels]
    if len([t for t in thread_sweep if t != tmax]) < 2:
        plan += [cfg(lv, tmax, sms, div=True) for lv in div_levels[1:]]
    return list(dict.fromkeys(plan))


def check_spec(props: DeviceProps, sizes: dict[str, int]) -> list[dict[str, Any]]:
    """A few configurations for the ncu safety check (saturated and narrow blocks)."""
    sms = props.sm_count
    shapes = [(lv, 1024) for lv in LEVELS] + [("l1", 4), ("l2", 4), ("shared", 32), ("dram", 32)]
    return [{"level": lv, "threads": t, "blocks": sms, "array_bytes": array_bytes_for(lv, sms, sizes, sms),
             "iters": checks_mod.PROBE_ITERS} for lv, t in shapes]


def miss_sweep_spec(props: DeviceProps, sizes: dict[str, int]) -> list[dict[str, Any]]:
    """L1 per-block sizes around the unified L1 and L2 footprints around the L2 size."""
    sms = props.sm_count
    spec = [{"level": "l1", "threads": 1024, "blocks": sms, "iters": checks_mod.PROBE_ITERS,
             "array_bytes": _round_down(sizes["l1_unified"] * f, 8 * KIB)}
            for f in (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0, 1.25)]
    spec += [{"level": "l2", "threads": 1024, "blocks": sms, "iters": checks_mod.PROBE_ITERS,
              "array_bytes": _round_down(props.l2_bytes * f / sms, 8 * KIB)}
             for f in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.0)]
    return spec


def _ncu_stage(lib: Path, props: DeviceProps, sizes: dict[str, int], device: int, out_dir: Path,
               budget_s: float, quick: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Miss-rate sweep (updates ``sizes`` in place) and safety checks; never raises."""
    from gpurec.calibrate import features as features_mod

    res: dict[str, Any] = {"passed": False, "error": None, "configs": [], "missing_metrics": []}
    sweep: list[dict[str, Any]] = []
    t_end = time.monotonic() + budget_s
    try:
        ncu = ncu_mod.find_ncu()
        res["ncu_version"] = ncu_mod.ncu_version(ncu)
        try:
            available: set[str] | None = ncu_mod.query_metrics(ncu, timeout_s=min(60.0, budget_s / 4))
        except Exception as exc:  # noqa: BLE001 - unknown availability: request everything
            available = None
            res["query_metrics_error"] = str(exc)[-500:]
        if available is not None:
            _, res["feature_metrics_unavailable"] = ncu_mod.split_available(features_mod.METRICS, available)
        if not quick:
            log.info("ncu: miss-rate sweep")
            try:
                sweep = checks_mod.run_miss_sweep(lib, miss_sweep_spec(props, sizes), out_dir / "ncu_miss_sweep.csv",
                                                  device, available, timeout_s=max(10.0, 0.5 * (t_end - time.monotonic())),
                                                  ncu=ncu)
                sizes["l1"], src_l1 = checks_mod.choose_size(sweep, "l1", sizes["l1"])
                sizes["l2_footprint"], src_l2 = checks_mod.choose_size(sweep, "l2", sizes["l2_footprint"],
                                                                       key="footprint_bytes")
                res["size_source"] = {"l1": src_l1, "l2": src_l2}
            except Exception as exc:  # noqa: BLE001 - the checks below still run with default sizes
                res["miss_sweep_error"] = str(exc)[-1500:]
                log.warning("ncu miss-rate sweep failed: %s", str(exc)[-300:])
            res["miss_rate_sweep"] = sweep
        log.info("ncu: safety checks")
        chk = checks_mod.run_checks(lib, check_spec(props, sizes), out_dir / "ncu_checks.csv", device,
                                    extra_metrics=features_mod.METRICS, available=available,
                                    timeout_s=max(10.0, t_end - time.monotonic()), ncu=ncu)
        res.update(chk)
    except Exception as exc:  # noqa: BLE001 - an ncu failure must never stop the calibration
        res["passed"] = False
        res["error"] = f"{type(exc).__name__}: {str(exc)[-1500:]}"
        log.warning("ncu checks failed: %s", res["error"][-300:])
    return res, sweep


def write_json(obj: dict[str, Any], path: Path) -> None:
    """Atomic write, so a kill mid-write never leaves a truncated calibration.json."""
    atomic_write_text(path, json.dumps(json_safe(obj), indent=1))


def _observed(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Clocks, temperature and throttle reasons over the sweep's windows.  Reads the window's
    columns (``temperature_c``, ``throttle_reasons``) and the names of rows written before it
    (``temperature_c_max``, ``throttle_mask``)."""
    from gpurec.device.nvml import decode_throttle

    def values(*keys: str) -> list[float]:
        out = []
        for r in rows:
            v = next((r[k] for k in keys if r.get(k) is not None), None)
            if v is not None and math.isfinite(float(v)):
                out.append(float(v))
        return out

    sm, mem = values("sm_clock_mhz"), values("mem_clock_mhz")
    temp = values("temperature_c", "temperature_c_max")
    mask = 0
    named: list[str] = []
    for r in rows:
        mask |= int(r.get("throttle_mask") or 0)
        named += [x for x in str(r.get("throttle_reasons") or "").split(",") if x]
    return {
        "sm_clock_mhz_median": statistics.median(sm) if sm else None,
        "sm_clock_mhz_min": min(sm) if sm else None,
        "sm_clock_mhz_max": max(sm) if sm else None,
        "mem_clock_mhz_median": statistics.median(mem) if mem else None,
        "temperature_c_max": max(temp) if temp else None,
        "throttle_reasons_seen": list(dict.fromkeys(decode_throttle(mask) + named)),
    }


def run_calibration(
    gpu_index: int = 0,
    out: Path = Path("calibration_out"),
    budget_s: float = 300.0,
    quick: bool = False,
    arch: str = build_mod.DEFAULT_ARCH,
    use_ncu: bool = True,
    window_s: float | None = None,
    levels: Sequence[str] | None = None,
    thread_sweep: Sequence[int] | None = None,
    div: bool = True,
) -> dict[str, Any]:
    """Calibrate on GPU ``gpu_index`` within ``budget_s`` seconds; write ``out``/calibration.json.

    Returns the JSON object: gpu, levels (pj_per_sector, offset_mj, r2, threads_per_block per
    level), div_nj, ncu_checks, points (one raw row per energy window), provenance.
    """
    from gpurec.device import open_gpu

    t0 = _now()
    deadline = t0 + budget_s
    out = Path(out)
    (out / "ncu").mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    settings = SweepSettings(window_s=window_s or (0.5 if quick else 1.0), idle_s=3.0 if quick else 5.0,
                             settle_s=1.0 if quick else 2.0)

    log.info("build: nvcc -arch=%s", build_mod.arch_flag(arch))
    nvcc = build_mod.find_nvcc()
    nvcc_ver = build_mod.nvcc_version(nvcc)
    lib = build_mod.build_library(arch, nvcc=nvcc)
    gpu = open_gpu(gpu_index)
    info = gpu.info()
    mb = Microbench(lib, gpu_index)
    props = mb.device_props()
    sizes = default_sizes(props)
    log.info("gpu %s: %d SMs, L2 %.0f MiB, shared/SM %d KiB", info.name, props.sm_count, props.l2_bytes / MIB,
             props.smem_per_sm_bytes // KIB)

    result: dict[str, Any] = {"gpu": info.name, "levels": fit_mod.lower_bounds([], LEVELS), "div_nj": None,
                              "ncu_checks": {"passed": False, "error": "not run"}, "points": [], "provenance": {}}
    fits: list[dict[str, Any]] = []
    sweep_rows: list[dict[str, Any]] = []
    sweeper: Sweeper | None = None
    interrupted = False

    def provenance(extra: dict[str, Any] | None = None) -> dict[str, Any]:
        rows = sweeper.rows if sweeper else []
        p = {
            "gpu_info": info.as_dict(),
            "driver_version": info.driver_version,
            "cuda_driver_version": info.cuda_driver_version,
            "cuda_device": props.as_dict(),
            "nvcc_version": nvcc_ver,
            "arch": build_mod.arch_flag(arch),
            "library": lib.name,
            "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(),
            "python": platform.python_version(),
            "clocks": CLOCKS_NOTE,
            "observed": _observed(rows),
            "energy_counter_period_ms": (sweeper.counter_period_s() or math.nan) * 1000 if sweeper else None,
            "idle": sweeper.idle_rows if sweeper else [],
            "settings": asdict(settings),
            "array_sizes": dict(sizes),
            "budget_s": budget_s,
            "elapsed_s": _now() - t0,
            "quick": quick,
            "fits": fits,
            "errors": errors,
            "method": "seed ch.5: pointer-chasing LOAD, warm-up-only subtracted, dynamic = energy - idle power x "
                      "time, OLS of measurement energy per launch on 32-byte sectors per launch; lower bound = "
                      f"min over thread/block configs with r2 >= {fit_mod.R2_MIN:.2f}",
        }
        p.update(extra or {})
        return p

    json_path = out / "calibration.json"
    extra: dict[str, Any] = {}
    try:
        # -- ncu ------------------------------------------------------------------------------
        if use_ncu:
            ncu_budget = min(0.35 * budget_s, 150.0) if not quick else min(0.3 * budget_s, 90.0)
            result["ncu_checks"], sweep_rows = _ncu_stage(lib, props, sizes, gpu_index, out / "ncu", ncu_budget, quick)
        else:
            result["ncu_checks"] = {"passed": False, "error": "skipped (--no-ncu)"}
        result["provenance"] = provenance()
        write_json(result, json_path)

        # -- energy ---------------------------------------------------------------------------
        reserve_s = settings.idle_s + settings.settle_s + 10.0
        sampler = Sampler(gpu, poll_s=settings.tick_poll_s, state_every_s=settings.sample_period_s, clock=_now,
                          threaded=_sampler_thread)
        sweeper = Sweeper(EnergyMonitor(sampler, settings.tick_timeout_s, sleep=_sleep), mb, settings,
                          deadline_s=deadline - reserve_s)
        plan = plan_configs(props, sizes, quick, levels=tuple(levels or ("l1", "shared", "l2", "dram")),
                            thread_sweep=tuple(THREAD_SWEEP if thread_sweep is None else thread_sweep), div=div)
        done: list[BenchConfig] = []
        skipped: list[BenchConfig] = []
        try:
            mb.prepare(plan[0])  # allocate before the idle window: idle = allocated, not running
            with sampler:
                sweeper.measure_idle("before")
                done, skipped = sweeper.run_all(
                    plan, on_config=lambda c: log.info("done %s (%.0f s left)", c, deadline - _now()))
                sweeper.measure_idle("after")
        except KeyboardInterrupt:
            interrupted = True
            errors.append("interrupted during the energy sweep; partial results")
            log.warning("interrupted: finishing with partial results")
        except Exception as exc:  # keep what was measured (e.g. an NVML read failing late)
            errors.append(f"energy sweep: {type(exc).__name__}: {exc}")
            log.exception("energy sweep failed: finishing with partial results")
        extra["plan"] = {"done": [asdict(c) for c in done], "skipped": [asdict(c) for c in skipped],
                         "failed": sweeper.failed}
        rows = finalize_rows(sweeper.rows, sweeper.idle) if sweeper.idle.samples else list(sweeper.rows)
        result["points"] = rows
        if sweeper.idle.samples:
            fits[:] = fit_mod.fit_all(rows)
        result["levels"] = fit_mod.lower_bounds(fits, LEVELS)
        div = fit_mod.div_energy(fits)
        result["div_nj"] = div["div_nj"]
        extra["div_per_config_nj"] = div["per_config"]
        extra["div_nj_per_sector"] = div["div_nj_per_sector"]
        extra["div_nj_per_thread"] = div["div_nj_per_thread"]
    except KeyboardInterrupt:
        interrupted = True
        errors.append("interrupted")
    except CalibrationError as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
        log.error("%s", exc)
    finally:
        try:
            mb.release()
        except Exception:
            pass
        result["provenance"] = provenance(extra)
        write_json(result, json_path)

    if not interrupted:
        try:
            from gpurec.calibrate import plots

            plots.write_all(result, fits, sweep_rows, out / "plots")
        except Exception as exc:  # plots are a convenience; never lose the JSON over them
            errors.append(f"plots: {exc}")
            write_json(result, json_path)
    log.info("wrote %s (%.0f s)", json_path, _now() - t0)
    return result
