"""Thin, typed wrapper over nvidia-ml-py (``import pynvml``).

Units are converted here, once: power in W, energy in mJ, clocks in MHz, temperature in C.
A fake module with the same function names can be injected with :func:`set_backend`
so that tests exercise this exact code path without a GPU.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any

from gpurec.device.errors import ClockLockNotPermitted, GPUNotFound, NVMLError, NVMLUnavailable

_backend: Any = None
_initialised = False

# Throttle ("clocks event") reason bits, as in nvml.h; decoded for people.
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}


def set_backend(module: ModuleType | Any | None) -> None:
    """Use ``module`` instead of pynvml (tests pass a fake); ``None`` restores pynvml."""
    global _backend, _initialised
    _backend = module
    _initialised = False


def _nvml() -> Any:
    global _backend, _initialised
    if _backend is None:
        try:
            import pynvml  # provided by nvidia-ml-py
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise NVMLUnavailable(
                "nvidia-ml-py is not installed: run `pip install nvidia-ml-py` "
                "(not the deprecated `pynvml` package)."
            ) from exc
        _backend = pynvml
    if not _initialised:
        try:
            _backend.nvmlInit()
        except Exception as exc:
            raise NVMLUnavailable(
                "Could not initialise NVML: no NVIDIA driver or GPU is visible here "
                f"({exc}). Run this command on a machine with an NVIDIA GPU and driver; "
                "prediction and recommendation work without one."
            ) from exc
        _initialised = True
    return _backend


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class GPUInfo:
    """Static facts about one board, for provenance."""

    index: int
    name: str
    uuid: str
    driver_version: str
    cuda_driver_version: str
    memory_total_mib: float
    power_limit_w: float | None
    max_sm_clock_mhz: int | None
    max_mem_clock_mhz: int | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Sample:
    """One reading of the board's dynamic state."""

    t_s: float
    energy_mj: float
    power_w: float
    sm_clock_mhz: int
    mem_clock_mhz: int
    temperature_c: int
    throttle_mask: int


def device_count() -> int:
    nv = _nvml()
    return int(nv.nvmlDeviceGetCount())


def list_gpus() -> list[GPUInfo]:
    """Every GPU NVML sees; an empty list is impossible (NVMLUnavailable is raised instead)."""
    return [open_gpu(i).info() for i in range(device_count())]


def open_gpu(index: int = 0) -> GPU:
    nv = _nvml()
    count = int(nv.nvmlDeviceGetCount())
    if index < 0 or index >= count:
        raise GPUNotFound(f"GPU index {index} does not exist: this machine has {count} GPU(s), 0..{count - 1}.")
    return GPU(index, nv.nvmlDeviceGetHandleByIndex(index))


class GPU:
    """One board.  All readings are in gpurec units; no method changes the card's settings
    except :meth:`lock_sm_clock` / :meth:`reset_sm_clock`, which callers only reach through
    :func:`gpurec.device.clocks.sm_clock_sweep` on GPUs the user owns."""

    def __init__(self, index: int, handle: Any):
        self.index = index
        self._h = handle

    # -- static -----------------------------------------------------------------------------
    def info(self) -> GPUInfo:
        nv = _nvml()
        try:
            power_limit_w = nv.nvmlDeviceGetEnforcedPowerLimit(self._h) / 1000.0
        except Exception:
            power_limit_w = None
        try:
            cuda_v = int(nv.nvmlSystemGetCudaDriverVersion())
            cuda = f"{cuda_v // 1000}.{(cuda_v % 1000) // 10}"
        except Exception:
            cuda = "unknown"
        return GPUInfo(
            index=self.index,
            name=_text(nv.nvmlDeviceGetName(self._h)),
            uuid=_text(nv.nvmlDeviceGetUUID(self._h)),
            driver_version=_text(nv.nvmlSystemGetDriverVersion()),
            cuda_driver_version=cuda,
            memory_total_mib=nv.nvmlDeviceGetMemoryInfo(self._h).total / 2**20,
            power_limit_w=power_limit_w,
            max_sm_clock_mhz=self._safe(lambda: nv.nvmlDeviceGetMaxClockInfo(self._h, nv.NVML_CLOCK_SM)),
            max_mem_clock_mhz=self._safe(lambda: nv.nvmlDeviceGetMaxClockInfo(self._h, nv.NVML_CLOCK_MEM)),
        )

    @staticmethod
    def _safe(fn: Any) -> Any:
        try:
            return fn()
        except Exception:
            return None

    # -- dynamic ----------------------------------------------------------------------------
    def energy_mj(self) -> float:
        """Board energy since driver load (NVML reports mJ; Volta and newer)."""
        try:
            return float(_nvml().nvmlDeviceGetTotalEnergyConsumption(self._h))
        except Exception as exc:
            raise NVMLError(
                f"GPU {self.index} does not report total energy ({exc}); gpurec needs a Volta or newer GPU."
            ) from exc

    def power_w(self) -> float:
        return _nvml().nvmlDeviceGetPowerUsage(self._h) / 1000.0

    def sm_clock_mhz(self) -> int:
        nv = _nvml()
        return int(nv.nvmlDeviceGetClockInfo(self._h, nv.NVML_CLOCK_SM))

    def mem_clock_mhz(self) -> int:
        nv = _nvml()
        return int(nv.nvmlDeviceGetClockInfo(self._h, nv.NVML_CLOCK_MEM))

    def temperature_c(self) -> int:
        nv = _nvml()
        return int(nv.nvmlDeviceGetTemperature(self._h, nv.NVML_TEMPERATURE_GPU))

    def throttle_mask(self) -> int:
        nv = _nvml()
        fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        try:
            return int(fn(self._h))
        except Exception:
            return 0

    def sample(self) -> Sample:
        return Sample(
            t_s=time.perf_counter(),
            energy_mj=self.energy_mj(),
            power_w=self.power_w(),
            sm_clock_mhz=self.sm_clock_mhz(),
            mem_clock_mhz=self.mem_clock_mhz(),
            temperature_c=self.temperature_c(),
            throttle_mask=self.throttle_mask(),
        )

    # -- settings (owned GPUs only) ---------------------------------------------------------
    def lock_sm_clock(self, clock_mhz: int) -> None:
        nv = _nvml()
        try:
            nv.nvmlDeviceSetGpuLockedClocks(self._h, int(clock_mhz), int(clock_mhz))
        except Exception as exc:
            raise ClockLockNotPermitted(
                f"Locking GPU {self.index}'s SM clock at {clock_mhz} MHz was refused ({exc}). "
                "Clock locking needs root and a GPU you own; drop --sm-clocks to measure at default clocks."
            ) from exc

    def reset_sm_clock(self) -> None:
        _nvml().nvmlDeviceResetGpuLockedClocks(self._h)


def decode_throttle(mask: int) -> list[str]:
    """Names of the throttle reasons set in ``mask`` (``gpu_idle`` is not a slowdown)."""
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
