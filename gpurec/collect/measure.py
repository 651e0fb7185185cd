"""Time and energy of one repeated step (an operation or a whole network) on one GPU.

The window design, chosen to spend little GPU time yet repeat within a few per cent:

1. warm up for ``warmup_s`` (cuDNN/cuBLAS heuristics, allocator, clocks ramp);
2. keep running until the energy counter ticks: that tick opens the window (t_a, e_a);
3. ``torch.utils.benchmark.Timer.blocked_autorange(min_run_time)`` gives the per-call
   median and IQR;
4. keep running until a tick at least ``min_window_s`` after t_a closes the window.

Average power is (e_b - e_a) / (t_b - t_a) over a window in which the GPU ran nothing but
this step, so energy per call is power x median time, with dynamic energy using the idle
power measured in the same state.  Both window ends sit on counter updates, so the counter's
100 ms granularity costs nothing; the sensor's partial sampling averages out over windows of
several updates of a stationary load.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpurec.device.nvml import decode_throttle
from gpurec.device.sampler import Sampler


@dataclass
class WindowConfig:
    min_run_time_s: float = 0.05
    min_window_s: float = 0.39  # four 100 ms counter intervals
    warmup_s: float = 0.0  # waiting for the opening tick (~50 ms on average) already warms up
    tick_timeout_s: float = 2.0


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _run_until(step: Callable[[], None], cond: Callable[[], bool], timeout_s: float) -> int:
    calls = 0
    t_end = time.perf_counter() + timeout_s
    while not cond():
        step()
        calls += 1
        if time.perf_counter() > t_end:
            raise TimeoutError("the GPU energy counter did not update within the timeout")
    return calls


def _wait_tick(sampler: Sampler, step: Callable[[], None], after_s: float, timeout_s: float) -> Any:
    """Run ``step`` until the sampler has seen a tick later than ``after_s``; return it."""
    _run_until(step, lambda: sampler.last_tick().t_s > after_s, timeout_s)
    return sampler.last_tick()


def measure_step(step: Callable[[], None], sampler: Sampler, cfg: WindowConfig,
                 idle_power_w: float | None, inference: bool) -> dict[str, Any]:
    """Measure ``step`` (one call) as described in the module docstring."""
    import torch
    from torch.utils.benchmark import Timer

    ctx = torch.inference_mode() if inference else torch.enable_grad()
    with ctx:
        t0 = time.perf_counter()
        step()
        _sync()
        first_call_s = time.perf_counter() - t0
        t_w = time.perf_counter() + cfg.warmup_s
        while time.perf_counter() < t_w:
            step()
        _sync()
        tick_a = _wait_tick(sampler, step, time.perf_counter(), cfg.tick_timeout_s + first_call_s)
        m = Timer(stmt="step()", globals={"step": step}).blocked_autorange(min_run_time=cfg.min_run_time_s)
        t_timer_end = time.perf_counter()
        deadline = max(tick_a.t_s + cfg.min_window_s, t_timer_end)
        tick_b = _wait_tick(sampler, step, deadline, cfg.tick_timeout_s + cfg.min_window_s + first_call_s)
        _sync()
    window_s = tick_b.t_s - tick_a.t_s
    window_mj = tick_b.energy_mj - tick_a.energy_mj
    power_w = window_mj / 1000.0 / window_s if window_s > 0 else float("nan")
    ticks = sampler.ticks_between(tick_a.t_s, tick_b.t_s)
    tick_powers = [
        (b.energy_mj - a.energy_mj) / 1000.0 / (b.t_s - a.t_s)
        for a, b in zip(ticks, ticks[1:], strict=False) if b.t_s > a.t_s
    ]
    states = sampler.states_between(tick_a.t_s, tick_b.t_s)
    time_ms = m.median * 1000.0
    mask = 0
    for s in states:
        mask |= s.throttle_mask
    row: dict[str, Any] = {
        "time_ms": time_ms,
        "time_iqr_ms": m.iqr * 1000.0,
        "time_mean_ms": m.mean * 1000.0,
        "timer_runs": len(m.times),
        "timer_number_per_run": int(m.number_per_run),
        "first_call_ms": first_call_s * 1000.0,
        "power_w": power_w,
        "energy_mj": power_w * time_ms,  # W x ms = mJ
        "window_s": window_s,
        "window_energy_mj": window_mj,
        "window_ticks": max(0, len(ticks) - 1),
        "tick_power_cv": (statistics.pstdev(tick_powers) / statistics.mean(tick_powers)
                          if len(tick_powers) >= 2 and statistics.mean(tick_powers) > 0 else float("nan")),
        "sampled_power_w": statistics.mean(s.power_w for s in states) if states else float("nan"),
        "sm_clock_mhz": statistics.mean(s.sm_clock_mhz for s in states) if states else float("nan"),
        "sm_clock_min_mhz": min((s.sm_clock_mhz for s in states), default=float("nan")),
        "mem_clock_mhz": statistics.mean(s.mem_clock_mhz for s in states) if states else float("nan"),
        "temperature_c": max((s.temperature_c for s in states), default=float("nan")),
        "throttle_reasons": ",".join(r for r in decode_throttle(mask) if r != "gpu_idle"),
    }
    if idle_power_w is not None:
        row["idle_power_w"] = idle_power_w
        row["dynamic_power_w"] = power_w - idle_power_w
        row["dynamic_energy_mj"] = (power_w - idle_power_w) * time_ms
    return row


def measure_idle(sampler: Sampler, duration_s: float = 1.0, timeout_s: float = 3.0) -> dict[str, Any]:
    """Idle board power with the CUDA context alive, between two counter ticks."""
    _sync()
    start = time.perf_counter()
    tick_a = _wait_tick(sampler, lambda: time.sleep(0.001), start, timeout_s)
    tick_b = _wait_tick(sampler, lambda: time.sleep(0.001), tick_a.t_s + duration_s, timeout_s + duration_s)
    window_s = tick_b.t_s - tick_a.t_s
    states = sampler.states_between(tick_a.t_s, tick_b.t_s)
    return {
        "idle_power_w": (tick_b.energy_mj - tick_a.energy_mj) / 1000.0 / window_s,
        "idle_window_s": window_s,
        "idle_sm_clock_mhz": statistics.mean(s.sm_clock_mhz for s in states) if states else float("nan"),
        "idle_temperature_c": statistics.mean(s.temperature_c for s in states) if states else float("nan"),
        "t_s": time.time(),
    }


def tick_period_s(sampler: Sampler, duration_s: float = 1.0) -> float:
    """Median interval between counter updates seen over ``duration_s`` (for the report)."""
    t0 = time.perf_counter()
    time.sleep(duration_s)
    ticks = sampler.ticks_between(t0, time.perf_counter())
    gaps = [b.t_s - a.t_s for a, b in zip(ticks, ticks[1:], strict=False)]
    return statistics.median(gaps) if gaps else float("nan")
