"""One measurement window: energy, average power, clocks, temperature and throttling of one
board while a workload runs, as a typed :class:`Measurement` (the Zeus pattern:
``begin_window`` ... ``end_window``).

NVML's energy counter only moves when the driver updates it (every 100 ms on H100/H200,
measured by ``gpurec.collect.probe``).  A window therefore opens and closes *on counter
updates* ("ticks"): energy between two ticks is exact, and dividing it by the time between
them gives the average power with no quantisation error.  While the window is open the
caller keeps the GPU busy with its workload (``keep_busy``), so the window holds that
workload and nothing else.

The instantaneous power reading (``nvmlDeviceGetPowerUsage``) is *not* the window's power:
on Hopper it is a one-second moving average, so on a window of a few hundred milliseconds
it lags.  It is kept as ``nvml_power_1s_avg_w`` for diagnosis only; every power and energy
figure gpurec reports comes from the counter.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from gpurec.device.nvml import decode_throttle
from gpurec.device.sampler import Sampler, Tick


class CounterStalled(TimeoutError):
    """The energy counter did not update in time: the board, driver or NVML is not answering."""


@dataclass(frozen=True)
class Measurement:
    """What one window saw.  Energy and power come from the counter; clocks, temperature and
    throttle reasons from the sampler's state readings inside the window."""

    window_s: float
    window_energy_mj: float
    power_w: float
    window_ticks: int
    tick_power_cv: float
    sm_clock_mhz: float
    sm_clock_min_mhz: float
    mem_clock_mhz: float
    temperature_c: float
    throttle_reasons: str
    nvml_power_1s_avg_w: float
    calls: int  # keep_busy calls issued while the window was open

    def as_row(self, prefix: str = "") -> dict[str, float | int | str]:
        return {f"{prefix}{k}": v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class WindowStart:
    tick: Tick
    calls: int


class EnergyMonitor:
    """Opens and closes windows on counter ticks of one board's :class:`Sampler`."""

    def __init__(self, sampler: Sampler, tick_timeout_s: float = 2.0,
                 sleep: Callable[[float], None] = time.sleep):
        self.sampler = sampler
        self.tick_timeout_s = tick_timeout_s
        self.sleep = sleep  # waits with nothing to run; a simulated world passes its own

    def wait_tick(self, keep_busy: Callable[[], None] | None, after_s: float, timeout_s: float) -> tuple[Tick, int]:
        """Call ``keep_busy`` (or sleep) until the counter ticks after ``after_s``.

        Without a sampler thread this loop polls; a change found by its first poll happened at
        some unknown moment before it, so only a later tick counts."""
        s = self.sampler
        calls = 0
        if not s.threaded:
            s.poll()
            after_s = max(after_s, s.last_tick().t_s)
        deadline = s.clock() + timeout_s
        while s.last_tick().t_s <= after_s:
            if keep_busy is None:
                self.sleep(0.001 if s.threaded else s.poll_s)
            else:
                keep_busy()
                calls += 1
            if not s.threaded:
                s.poll()
            if s.clock() > deadline:
                raise CounterStalled(f"the GPU energy counter did not update within {timeout_s:.1f} s")
        return s.last_tick(), calls

    def begin_window(self, keep_busy: Callable[[], None] | None = None, extra_timeout_s: float = 0.0) -> WindowStart:
        """Run ``keep_busy`` until the next tick, which opens the window."""
        tick, calls = self.wait_tick(keep_busy, self.sampler.clock(), self.tick_timeout_s + extra_timeout_s)
        return WindowStart(tick, calls)

    def end_window(self, start: WindowStart, keep_busy: Callable[[], None] | None = None,
                   min_window_s: float = 0.3, not_before_s: float | None = None,
                   extra_timeout_s: float = 0.0) -> Measurement:
        """Keep running until a tick at least ``min_window_s`` after the opening one (and after
        ``not_before_s``, e.g. the end of timed work done inside the window); close there."""
        deadline = start.tick.t_s + min_window_s
        if not_before_s is not None:
            deadline = max(deadline, not_before_s)
        timeout = self.tick_timeout_s + max(0.0, deadline - self.sampler.clock()) + extra_timeout_s
        tick_b, calls = self.wait_tick(keep_busy, deadline, timeout)
        return self._measure(start.tick, tick_b, calls)

    def idle_window(self, duration_s: float) -> Measurement:
        """A window with nothing running (the CUDA context alive): idle power."""
        start = self.begin_window(None)
        return self.end_window(start, None, duration_s)

    def _measure(self, a: Tick, b: Tick, calls: int) -> Measurement:
        s = self.sampler
        window_s = b.t_s - a.t_s
        energy = b.energy_mj - a.energy_mj
        ticks = s.ticks_between(a.t_s, b.t_s)
        tick_powers = [(y.energy_mj - x.energy_mj) / 1000.0 / (y.t_s - x.t_s)
                       for x, y in zip(ticks, ticks[1:], strict=False) if y.t_s > x.t_s]
        states = s.states_between(a.t_s, b.t_s)
        mask = 0
        for st in states:  # a reason seen at any moment of the window counts
            mask |= st.throttle_mask
        nan = float("nan")
        mean_p = statistics.mean(tick_powers) if tick_powers else nan
        return Measurement(
            window_s=window_s,
            window_energy_mj=energy,
            power_w=energy / 1000.0 / window_s if window_s > 0 else nan,
            window_ticks=max(0, len(ticks) - 1),
            tick_power_cv=(statistics.pstdev(tick_powers) / mean_p
                           if len(tick_powers) >= 2 and mean_p > 0 else nan),
            sm_clock_mhz=statistics.mean(st.sm_clock_mhz for st in states) if states else nan,
            sm_clock_min_mhz=min((st.sm_clock_mhz for st in states), default=nan),
            mem_clock_mhz=statistics.mean(st.mem_clock_mhz for st in states) if states else nan,
            temperature_c=max((st.temperature_c for st in states), default=nan),
            throttle_reasons=",".join(r for r in decode_throttle(mask) if r != "gpu_idle"),
            nvml_power_1s_avg_w=statistics.mean(st.power_w for st in states) if states else nan,
            calls=calls,
        )
