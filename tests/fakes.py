"""A fake pynvml with the same function names, so tests run the real device code path."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


class FakeNVMLError(Exception):
    pass


@dataclass
class _Mem:
    total: int = 80 * 2**30


@dataclass
class FakeBoard:
    """One board.  With ``idle_power_w`` set it draws ``power_w`` only while work runs
    (:meth:`run`) and idle power otherwise, so a window that misses the work reads idle.
    ``clock_dips`` / ``throttle_bursts`` / ``temp_rise_c_per_s`` make the readings change
    over time, so aggregation over a window (min, max, union) can be checked."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-fake-0000"
    power_w: float = 100.0
    update_period_s: float = 0.02
    sm_clock_mhz: int = 1980
    locked: list = field(default_factory=list)
    idle_power_w: float | None = None
    temp_start_c: float = 40.0
    temp_rise_c_per_s: float = 0.0
    clock_dips: tuple[float, float, int] | None = None  # (period_s, length_s, MHz) of periodic dips
    throttle_bursts: tuple[float, float, int] | None = None  # (period_s, length_s, mask)
    busy_s: float = 0.0
    _t0: float = field(default_factory=time.perf_counter)
    _busy: list = field(default_factory=list)  # (start, end) of work, board time

    def run(self, seconds: float) -> None:
        """Do ``seconds`` of work (sleeping; the counter accrues busy power meanwhile)."""
        t = time.perf_counter() - self._t0
        self._busy.append((t, t + seconds))
        self.busy_s += seconds
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            time.sleep(max(0.0, min(0.0005, end - time.perf_counter())))

    def _busy_until(self, t: float) -> float:
        return sum(max(0.0, min(b, t) - a) for a, b in self._busy if a < t)

    def energy_mj(self) -> int:
        # Counter advances in steps, like the real one (power x time at each update).
        elapsed = time.perf_counter() - self._t0
        t = int(elapsed / self.update_period_s) * self.update_period_s
        if self.idle_power_w is None:
            return int(t * self.power_w * 1000.0)
        busy = self._busy_until(t)
        return int((self.idle_power_w * t + (self.power_w - self.idle_power_w) * busy) * 1000.0)

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def current_clock(self) -> int:
        if self.clock_dips is not None:
            period, length, mhz = self.clock_dips
            if self.now() % period < length:
                return mhz
        return self.sm_clock_mhz

    def current_temp(self) -> int:
        return int(self.temp_start_c + self.temp_rise_c_per_s * self.now())

    def current_throttle(self) -> int:
        if self.throttle_bursts is not None:
            period, length, mask = self.throttle_bursts
            if self.now() % period < length:
                return mask
        return 0


class FakeNVML:
    """Implements the subset of pynvml that gpurec.device uses."""

    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, boards: list[FakeBoard] | None = None, fail_init: bool = False,
                 refuse_lock: bool = False):
        self.boards = boards or [FakeBoard()]
        self.fail_init = fail_init
        self.refuse_lock = refuse_lock
        self.events: list[tuple[str, int, int | None]] = []
        self._lock = threading.Lock()

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise FakeNVMLError("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.boards)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeBoard:
        return self.boards[i]

    def nvmlDeviceGetName(self, h: FakeBoard) -> str:
        return h.name

    def nvmlDeviceGetUUID(self, h: FakeBoard) -> str:
        return h.uuid

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.00.00"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 13000

    def nvmlDeviceGetMemoryInfo(self, h: FakeBoard) -> _Mem:
        return _Mem()

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeBoard) -> int:
        return 700000

    def nvmlDeviceGetMaxClockInfo(self, h: FakeBoard, which: int) -> int:
        return 1980 if which == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeBoard) -> int:
        return h.energy_mj()

    def nvmlDeviceGetPowerUsage(self, h: FakeBoard) -> int:
        return int(h.power_w * 1000)

    def nvmlDeviceGetClockInfo(self, h: FakeBoard, which: int) -> int:
        return h.current_clock() if which == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetTemperature(self, h: FakeBoard, which: int) -> int:
        return h.current_temp()

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeBoard) -> int:
        return h.current_throttle()

    def nvmlDeviceSetGpuLockedClocks(self, h: FakeBoard, lo: int, hi: int) -> None:
        with self._lock:
            self.events.append(("lock", self.boards.index(h), lo))
        if self.refuse_lock:
            raise FakeNVMLError("Insufficient Permissions")
        h.locked.append(lo)
        h.sm_clock_mhz = lo

    def nvmlDeviceResetGpuLockedClocks(self, h: FakeBoard) -> None:
        with self._lock:
            self.events.append(("reset", self.boards.index(h), None))
        h.sm_clock_mhz = 1980
