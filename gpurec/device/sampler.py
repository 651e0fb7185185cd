"""Background sampler of one board's energy counter, power, clocks and temperature.

NVML's total-energy counter only moves when the driver updates it (every ~100 ms on
A100/H100-class boards, per SC24 "Accurate and Convenient Energy Measurements for GPUs").
Energy over a window is therefore only exact between two *updates* ("ticks"); the sampler
polls the counter every ``poll_s`` and timestamps every tick, so a measurement can start
and stop on ticks and divide energy by the time between them.

With ``threaded=False`` no thread is started: whoever waits for a tick calls :meth:`poll`
(``gpurec.device.window.EnergyMonitor`` does).  Together with an injected ``clock`` this lets a
simulated board in simulated time (the calibration tests) run the same window code as the GPU.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from gpurec.device.nvml import GPU


@dataclass
class Tick:
    t_s: float
    energy_mj: float


@dataclass
class StateSample:
    t_s: float
    power_w: float
    sm_clock_mhz: int
    mem_clock_mhz: int
    temperature_c: int
    throttle_mask: int


@dataclass
class Sampler:
    """Polls ``gpu`` in a daemon thread (or, with ``threaded=False``, whenever :meth:`poll` is
    called); use as a context manager.  ``clock`` timestamps every sample."""

    gpu: GPU
    poll_s: float = 0.0005
    state_every_s: float = 0.02
    clock: Callable[[], float] = time.perf_counter
    threaded: bool = True
    ticks: list[Tick] = field(default_factory=list)
    states: list[StateSample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _pause: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _old_switch: float = 0.005
    _next_state_s: float = float("-inf")

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._stop.clear()
        e0 = self.gpu.energy_mj()
        self.ticks.append(Tick(self.clock(), e0))
        if not self.threaded:
            return
        # A short GIL switch interval lets the poller wake promptly while the main thread
        # launches kernels; tick timestamps are then good to well under a millisecond.
        self._old_switch = sys.getswitchinterval()
        sys.setswitchinterval(min(self._old_switch, 0.0005))
        self._thread = threading.Thread(target=self._run, name="gpurec-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:  # no thread (threaded=False): the switch interval was never changed
            self._thread.join(timeout=2.0)
            sys.setswitchinterval(self._old_switch)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Stop polling (and taking the GIL) while the host's own cost is timed.  Ticks that
        fall inside are missed, so no window may span a pause."""
        self._pause.set()
        try:
            yield
        finally:
            self._pause.clear()

    def poll(self) -> None:
        """Read the counter once (a changed value is a tick) and the state when one is due."""
        now = self.clock()
        e = self.gpu.energy_mj()
        if e != self.ticks[-1].energy_mj:
            self.ticks.append(Tick(self.clock(), e))
        if now >= self._next_state_s:
            self.states.append(StateSample(now, self.gpu.power_w(), self.gpu.sm_clock_mhz(),
                                           self.gpu.mem_clock_mhz(), self.gpu.temperature_c(),
                                           self.gpu.throttle_mask()))
            self._next_state_s = now + self.state_every_s

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._pause.is_set():
                time.sleep(0.002)
                continue
            self.poll()
            time.sleep(self.poll_s)

    # -- queries used by the measurement loop ----------------------------------------------
    def n_ticks(self) -> int:
        return len(self.ticks)

    def last_tick(self) -> Tick:
        return self.ticks[-1]

    def ticks_between(self, t0: float, t1: float) -> list[Tick]:
        return [t for t in self.ticks if t0 <= t.t_s <= t1]

    def states_between(self, t0: float, t1: float) -> list[StateSample]:
        return [s for s in self.states if t0 <= s.t_s <= t1]

    def trim(self, keep_after_s: float) -> None:
        """Forget samples older than ``keep_after_s`` (keeps memory flat on long runs)."""
        self.ticks = [t for t in self.ticks if t.t_s >= keep_after_s] or self.ticks[-1:]
        self.states = [s for s in self.states if s.t_s >= keep_after_s] or self.states[-1:]
