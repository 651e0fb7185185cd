"""Energy sweep: windows of repeated launches, measured with the one measurement window.

Why it is shaped this way:
- NVML's total-energy counter only moves every ~20-100 ms, so each window is >= 1 s and both
  its ends are aligned on a counter update: the window is a
  :class:`gpurec.device.window.EnergyMonitor` window, the same one collect and validate use.
  It opens on a tick, the launches run, and it closes on the first tick at least ``tail_s``
  after them, so the counter has caught up with the last kernel.
- Idle power is measured before and after the sweep (GPU allocated, nothing running) and
  interpolated in time; dynamic energy = window energy - idle power x window time.
- Every configuration is measured as warm-up-only launches and as warm-up+measurement
  launches at >= 6 access counts, each >= 3 times in alternating order (drift does not line
  up with access count).  The measurement-loop energy per launch is the full launch's dynamic
  energy minus the mean warm-up-only one.
- Clocks are observed (the window's sampler reads them), never set.

Raw rows carry the window's :class:`~gpurec.device.window.Measurement` under its own names
(``window_energy_mj``, ``power_w``, mean ``sm_clock_mhz``, ``temperature_c``,
``throttle_reasons``, ``nvml_power_1s_avg_w``, ...).  Rows written before the one window
(the committed calibrations) named the energy ``energy_mj`` and carried median clocks,
``power_w_sampled``, ``temperature_c_max`` and ``throttle_mask``; the readers accept both.
"""

from __future__ import annotations

import bisect
import logging
import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpurec.calibrate.errors import BudgetExhausted, MicrobenchError
from gpurec.calibrate.microbench import BenchConfig, Runner
from gpurec.device.window import EnergyMonitor, Measurement, WindowStart

log = logging.getLogger("gpurec.calibrate")
T = TypeVar("T")


@dataclass
class SweepSettings:
    """Knobs of one sweep; defaults give each fit >= 6 points of >= 3 runs.

    ``tick_poll_s``, ``tick_timeout_s`` and ``sample_period_s`` configure the window's
    sampler (counter poll, stall timeout, clock/temperature reading period)."""

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


def window_around(monitor: EnergyMonitor, work: Callable[[], T], tail_s: float) -> tuple[T, WindowStart, Measurement]:
    """Open a window on a counter tick, run ``work``, and close on the first tick at least
    ``tail_s`` after it returns (the counter lags the last kernel by up to one update)."""
    start = monitor.begin_window(None)
    result = work()
    m = monitor.end_window(start, None, min_window_s=0.0, not_before_s=monitor.sampler.clock() + tail_s)
    return result, start, m


def window_columns(start: WindowStart, m: Measurement) -> dict[str, Any]:
    """A window as raw-row columns: its tick-aligned start and end, and the measurement."""
    cols: dict[str, Any] = {"t_start_s": start.tick.t_s, "t_end_s": start.tick.t_s + m.window_s}
    cols.update(m.as_row())
    del cols["calls"]  # no keep-busy work: the launches are the row's own columns
    return cols


def window_energy_mj(row: dict[str, Any]) -> float:
    """Counter energy of a raw row's window, under the current or the pre-window name."""
    return row["window_energy_mj"] if "window_energy_mj" in row else row["energy_mj"]


def config_id(cfg: BenchConfig) -> str:
    return f"{cfg.level}-t{cfg.threads}-b{cfg.blocks}-a{cfg.array_bytes}{'-div' if cfg.div else ''}"


class Sweeper:
    """Runs configurations through a :class:`Runner`, recording one raw row per window.

    ``monitor``'s sampler must be running (``with sampler:``); its clock is the sweep's clock
    (budget, idle interpolation) and the monitor's ``sleep`` its idle wait."""

    def __init__(
        self,
        monitor: EnergyMonitor,
        runner: Runner,
        settings: SweepSettings | None = None,
        deadline_s: float | None = None,
    ):
        self.monitor, self.runner = monitor, runner
        self.s = settings or SweepSettings()
        self.deadline_s = deadline_s
        self.idle = IdleModel()
        self.idle_rows: list[dict[str, Any]] = []
        self.rows: list[dict[str, Any]] = []
        self.failed: list[dict[str, Any]] = []
        self._window_overhead_s = self.s.tail_s + 0.15

    def clock(self) -> float:
        return self.monitor.sampler.clock()

    def counter_period_s(self) -> float | None:
        """Median spacing of consecutive counter updates the sampler has seen (gaps over 1 s,
        where polling was paused or busy, left out)."""
        ticks = self.monitor.sampler.ticks
        gaps = [b.t_s - a.t_s for a, b in zip(ticks, ticks[1:], strict=False) if 0 < b.t_s - a.t_s < 1.0]
        return statistics.median(gaps) if gaps else None

    # -- idle -------------------------------------------------------------------------------
    def measure_idle(self, label: str, seconds: float | None = None) -> float:
        """Average board power over an aligned idle window; added to the idle model."""
        seconds = self.s.idle_s if seconds is None else seconds
        self.monitor.sleep(self.s.settle_s)  # let power settle after allocation or the last kernel
        start = self.monitor.begin_window(None)
        m = self.monitor.end_window(start, None, min_window_s=seconds)
        row = {"label": label, **window_columns(start, m)}
        self.idle.add(0.5 * (row["t_start_s"] + row["t_end_s"]), m.power_w)
        self.idle_rows.append(row)
        log.info("idle %-6s %.1f W over %.2f s", label, m.power_w, m.window_s)
        return m.power_w

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
        res, start, m = window_around(self.monitor, lambda: self.runner.run(cfg, iters, warmup_only, launches),
                                      self.s.tail_s)
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
            **window_columns(start, m),
            "sectors_per_launch": res.sectors_per_launch,
            "warm_sectors_per_launch": res.warm_sectors_per_launch,
            "wavefronts_per_launch": res.wavefronts_per_launch,
            "div_warp_insts_per_launch": res.div_warp_insts_per_launch,
            "meas_loads_per_thread": res.meas_loads_per_thread,
            "stride_bytes": res.stride_bytes,
        }
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

    dyn_energy_per_launch_mj = (window_energy_mj - idle_power_w * window_s * 1000) / launches
    meas_energy_mj           = dyn per launch (full) - mean dyn per launch (warm-up only),
                               per configuration; this is what the fit regresses on accesses.
    """
    out = []
    for r in rows:
        r = dict(r)
        p_idle = idle.power_at(0.5 * (r["t_start_s"] + r["t_end_s"]))
        r["idle_power_w"] = p_idle
        r["dyn_energy_mj"] = window_energy_mj(r) - p_idle * r["window_s"] * 1000.0
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
