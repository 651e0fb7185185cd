"""Energy sweep: windows of repeated launches bracketed by NVML energy-counter reads.

Why it is shaped this way:
- NVML's total-energy counter only moves every ~20-100 ms, so each window is >= 1 s and both
  its ends are aligned on a counter update (we poll until the value changes); a short tail
  after the launches lets the counter catch up with the last kernel.
- Idle power is measured before and after the sweep (GPU allocated, nothing running) and
  interpolated in time; dynamic energy = window energy - idle power x window time.
- Every configuration is measured as warm-up-only launches and as warm-up+measurement
  launches at >= 6 access counts, each >= 3 times in alternating order (drift does not line
  up with access count).  The measurement-loop energy per launch is the full launch's dynamic
  energy minus the mean warm-up-only one.
- Clocks are observed (sampled during each window), never set.
"""

from __future__ import annotations

import bisect
import logging
import math
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpurec.calibrate.errors import BudgetExhausted, MicrobenchError
from gpurec.calibrate.microbench import BenchConfig, Runner

log = logging.getLogger("gpurec.calibrate")


@dataclass
class SweepSettings:
    """Knobs of one sweep; defaults follow the seed's methodology (>= 6 points, >= 3 runs)."""

    window_s: float = 1.0
    n_points: int = 6
    repeats: int = 3
    idle_s: float = 5.0
    settle_s: float = 2.0
    tail_s: float = 0.12
    target_launch_ms: float = 30.0
    tick_poll_s: float = 0.0005
    tick_timeout_s: float = 0.6
    sample_period_s: float = 0.1


@dataclass
class IdleModel:
    """Idle power samples (time, W), linearly interpolated; constant outside the samples."""

    samples: list[tuple[float, float]] = field(default_factory=list)

    def add(self, t_s: float, power_w: float) -> None:
        bisect.insort(self.samples, (t_s, power_w))

    def power_at(self, t_s: float) -> float:
        if not self.samples:
            raise ValueError("no idle power sample was taken")
        ts = [t for t, _ in self.samples]
        i = bisect.bisect_left(ts, t_s)
        if i <= 0:
            return self.samples[0][1]
        if i >= len(ts):
            return self.samples[-1][1]
        (t0, p0), (t1, p1) = self.samples[i - 1], self.samples[i]
        return p0 + (p1 - p0) * (t_s - t0) / (t1 - t0) if t1 > t0 else p1


class EnergyMeter:
    """Counter reads aligned on NVML's update instants."""

    def __init__(self, gpu: Any, clock: Callable[[], float], sleep: Callable[[float], None], settings: SweepSettings):
        self.gpu, self.clock, self.sleep, self.s = gpu, clock, sleep, settings
        self.tick_periods_s: list[float] = []
        self._last_tick: float | None = None

    def tick(self) -> tuple[float, float]:
        """Wait for the counter to change; return (time of the change, new value in mJ)."""
        e0 = self.gpu.energy_mj()
        start = self.clock()
        while True:
            self.sleep(self.s.tick_poll_s)
            e, t = self.gpu.energy_mj(), self.clock()
            if e != e0 or t - start > self.s.tick_timeout_s:
                if e != e0 and self._last_tick is not None and t - self._last_tick < 1.0:
                    self.tick_periods_s.append(t - self._last_tick)
                self._last_tick = t
                return t, e

    def period_s(self) -> float | None:
        """Median spacing of consecutive counter updates seen so far."""
        return statistics.median(self.tick_periods_s) if self.tick_periods_s else None


class _Sampler:
    """Background thread reading clocks/power/temperature during a window (read-only NVML)."""

    def __init__(self, gpu: Any, period_s: float):
        self.gpu, self.period_s = gpu, period_s
        self.rows: list[tuple[float, float, float, float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _one(self) -> None:
        g = self.gpu
        try:
            self.rows.append(
                (float(g.sm_clock_mhz()), float(g.mem_clock_mhz()), float(g.power_w()),
                 float(g.temperature_c()), int(g.throttle_mask()))
            )
        except Exception:  # a failed read must not abort the measurement
            pass

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._one()
            self._stop.wait(self.period_s)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
        if not self.rows:
            self._one()

    def summary(self) -> dict[str, Any]:
        if not self.rows:
            return {}
        sm, mem, pw, temp, thr = zip(*self.rows, strict=True)
        mask = 0
        for m in thr:
            mask |= m
        return {
            "sm_clock_mhz": statistics.median(sm),
            "sm_clock_min_mhz": min(sm),
            "mem_clock_mhz": statistics.median(mem),
            "power_w_sampled": statistics.fmean(pw),
            "temperature_c_max": max(temp),
            "throttle_mask": mask,
        }


def config_id(cfg: BenchConfig) -> str:
    return f"{cfg.level}-t{cfg.threads}-b{cfg.blocks}-a{cfg.array_bytes}{'-div' if cfg.div else ''}"


class Sweeper:
    """Runs configurations through a :class:`Runner`, recording one raw row per window."""

    def __init__(
        self,
        gpu: Any,
        runner: Runner,
        settings: SweepSettings | None = None,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
        deadline_s: float | None = None,
        sample_clocks: bool = True,
    ):
        self.gpu, self.runner = gpu, runner
        self.s = settings or SweepSettings()
        self.clock, self.sleep = clock, sleep
        self.deadline_s = deadline_s
        self.sample_clocks = sample_clocks
        self.meter = EnergyMeter(gpu, clock, sleep, self.s)
        self.idle = IdleModel()
        self.idle_rows: list[dict[str, Any]] = []
        self.rows: list[dict[str, Any]] = []
        self.failed: list[dict[str, Any]] = []
        self._window_overhead_s = self.s.tail_s + 0.15

    # -- idle -------------------------------------------------------------------------------
    def measure_idle(self, label: str, seconds: float | None = None) -> float:
        """Average board power over an aligned idle window; added to the idle model."""
        seconds = self.s.idle_s if seconds is None else seconds
        self.sleep(self.s.settle_s)  # let power settle after allocation or the last kernel
        t0, e0 = self.meter.tick()
        self.sleep(seconds)
        t1, e1 = self.meter.tick()
        power_w = (e1 - e0) / max(t1 - t0, 1e-9) / 1000.0
        self.idle.add(0.5 * (t0 + t1), power_w)
        self.idle_rows.append({"label": label, "t_start_s": t0, "t_end_s": t1, "power_w": power_w,
                               "energy_mj": e1 - e0})
        log.info("idle %-6s %.1f W over %.2f s", label, power_w, t1 - t0)
        return power_w

    # -- planning ---------------------------------------------------------------------------
    def estimate_config_s(self) -> float:
        n_windows = self.s.repeats * (self.s.n_points + 1)
        return n_windows * (self.s.window_s + self._window_overhead_s) + 1.0

    def remaining_s(self) -> float:
        return math.inf if self.deadline_s is None else self.deadline_s - self.clock()

    def iters_points(self, t_warm_ms: float, t_pass_ms: float) -> list[int]:
        """``n_points`` distinct pass counts; the largest keeps one launch near target_launch_ms."""
        n = self.s.n_points
        iters_max = max(n, int((self.s.target_launch_ms - t_warm_ms) / max(t_pass_ms, 1e-6)))
        return [int(math.ceil(iters_max * (i + 1) / n)) for i in range(n)]

    # -- measurement ------------------------------------------------------------------------
    def _window(self, cfg: BenchConfig, iters: int, warmup_only: bool, est_ms: float, rep: int) -> dict[str, Any]:
        launches = max(1, int(math.ceil(self.s.window_s * 1000.0 / max(est_ms, 1e-3))))
        wall0 = self.clock()
        t_a, e_a = self.meter.tick()
        if self.sample_clocks:
            with _Sampler(self.gpu, self.s.sample_period_s) as sampler:
                res = self.runner.run(cfg, iters, warmup_only, launches)
        else:
            sampler = None
            res = self.runner.run(cfg, iters, warmup_only, launches)
        self.sleep(self.s.tail_s)
        t_b, e_b = self.meter.tick()
        self._window_overhead_s = 0.8 * self._window_overhead_s + 0.2 * max(
            0.0, (self.clock() - wall0) - res.elapsed_ms / 1000.0
        )
        row: dict[str, Any] = {
            "config_id": config_id(cfg),
            "level": cfg.level,
            "threads": cfg.threads,
            "blocks": cfg.blocks,
            "array_bytes": res.array_bytes_used,
            "div": bool(cfg.div),
            "warmup_only": bool(warmup_only),
            "iters": 0 if warmup_only else int(iters),
            "repeat": rep,
            "launches": res.launches,
            "kernel_ms": res.elapsed_ms,
            "ms_per_launch": res.ms_per_launch,
            "t_start_s": t_a,
            "t_end_s": t_b,
            "window_s": t_b - t_a,
            "energy_mj": e_b - e_a,
            "sectors_per_launch": res.sectors_per_launch,
            "warm_sectors_per_launch": res.warm_sectors_per_launch,
            "wavefronts_per_launch": res.wavefronts_per_launch,
            "div_warp_insts_per_launch": res.div_warp_insts_per_launch,
            "meas_loads_per_thread": res.meas_loads_per_thread,
            "stride_bytes": res.stride_bytes,
        }
        if sampler is not None:
            row.update(sampler.summary())
        return row

    @staticmethod
    def _pass_ms(res: Any, t_warm_ms: float) -> float:
        passes = res.meas_loads_per_thread / max(res.steps_per_pass, 1)
        return max(res.ms_per_launch - t_warm_ms, 1e-5) / max(passes, 1e-9)

    def run_config(self, cfg: BenchConfig) -> list[dict[str, Any]]:
        """All windows of one configuration; raises BudgetExhausted before starting if it can't fit."""
        need = self.estimate_config_s()
        if self.remaining_s() < need:
            raise BudgetExhausted(f"{config_id(cfg)} needs ~{need:.0f} s, {self.remaining_s():.0f} s left")
        self.runner.prepare(cfg)
        # Probes, outside any window: time of a warm-up-only launch and of one measured pass
        # (refined on a ~10 ms launch, since one pass can be shorter than the timing noise).
        self.runner.run(cfg, 0, True, 1)  # first launch pays module load and cold caches
        t_warm_ms = self.runner.run(cfg, 0, True, 3).ms_per_launch
        t_pass_ms = self._pass_ms(self.runner.run(cfg, 1, False, 1), t_warm_ms)
        probe_iters = min(10**6, max(1, int(10.0 / t_pass_ms)))
        if probe_iters > 1:
            t_pass_ms = self._pass_ms(self.runner.run(cfg, probe_iters, False, 1), t_warm_ms)
        points = self.iters_points(t_warm_ms, t_pass_ms)
        rows: list[dict[str, Any]] = []
        for rep in range(self.s.repeats):
            order = points if rep % 2 == 0 else points[::-1]
            for iters in [0, *order]:
                if self.remaining_s() < -3 * self.s.window_s:  # estimate was off: drop this config
                    raise BudgetExhausted(f"{config_id(cfg)} overran the budget; its windows are discarded")
                est_ms = t_warm_ms + iters * t_pass_ms
                rows.append(self._window(cfg, iters, iters == 0, est_ms, rep))
        self.rows.extend(rows)
        log.info("config %s: %d windows, iters %s, %.2f ms/launch max", config_id(cfg), len(rows), points,
                 t_warm_ms + points[-1] * t_pass_ms)
        return rows

    def run_all(self, configs: Iterable[BenchConfig], on_config: Callable[[BenchConfig], None] | None = None
                ) -> tuple[list[BenchConfig], list[BenchConfig]]:
        """Run configs in priority order until the budget ends; returns (done, skipped)."""
        done, skipped = [], []
        for cfg in configs:
            try:
                self.run_config(cfg)
                done.append(cfg)
                if on_config:
                    on_config(cfg)
            except BudgetExhausted as exc:
                log.info("skip: %s", exc)
                skipped.append(cfg)
            except MicrobenchError as exc:  # one bad shape must not end the sweep
                log.warning("config %s failed: %s", config_id(cfg), exc)
                self.failed.append({"config": cfg.as_dict(), "error": str(exc)})
        return done, skipped


def finalize_rows(rows: list[dict[str, Any]], idle: IdleModel) -> list[dict[str, Any]]:
    """Add idle power, dynamic energy and the warm-up-subtracted measurement energy per launch.

    dyn_energy_per_launch_mj = (energy_mj - idle_power_w * window_s * 1000) / launches
    meas_energy_mj           = dyn per launch (full) - mean dyn per launch (warm-up only),
                               per configuration; this is what the fit regresses on accesses.
    """
    out = []
    for r in rows:
        r = dict(r)
        p_idle = idle.power_at(0.5 * (r["t_start_s"] + r["t_end_s"]))
        r["idle_power_w"] = p_idle
        r["dyn_energy_mj"] = r["energy_mj"] - p_idle * r["window_s"] * 1000.0
        r["dyn_energy_per_launch_mj"] = r["dyn_energy_mj"] / max(r["launches"], 1)
        out.append(r)
    warm: dict[str, list[float]] = {}
    for r in out:
        if r["warmup_only"]:
            warm.setdefault(r["config_id"], []).append(r["dyn_energy_per_launch_mj"])
    for r in out:
        w = warm.get(r["config_id"])
        base = statistics.fmean(w) if w else float("nan")
        r["warm_energy_per_launch_mj"] = base
        r["meas_energy_mj"] = (r["dyn_energy_per_launch_mj"] - base) if not r["warmup_only"] else 0.0
    return out
