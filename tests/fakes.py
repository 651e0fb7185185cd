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
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-fake-0000"
    power_w: float = 100.0
    update_period_s: float = 0.02
    sm_clock_mhz: int = 1980
    locked: list = field(default_factory=list)
    _t0: float = field(default_factory=time.perf_counter)

    def energy_mj(self) -> int:
        # Counter advances in steps, like the real one (power x time at each update).
        elapsed = time.perf_counter() - self._t0
        steps = int(elapsed / self.update_period_s)
        return int(steps * self.update_period_s * self.power_w * 1000.0)


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
        return h.sm_clock_mhz if which == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetTemperature(self, h: FakeBoard, which: int) -> int:
        return 40

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeBoard) -> int:
        return 0

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
