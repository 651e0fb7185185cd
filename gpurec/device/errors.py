"""Typed device errors; each message says what to do about it."""


class NVMLError(RuntimeError):
    """Base class for everything that goes wrong while talking to the GPU driver."""


class NVMLUnavailable(NVMLError):
    """NVML could not be loaded or initialised (no driver, no GPU, no nvidia-ml-py)."""


class GPUNotFound(NVMLError):
    """The requested GPU index does not exist on this machine."""


class ClockLockNotPermitted(NVMLError):
    """Locking clocks was refused (not root, unsupported GPU, or a GPU we do not own)."""


class ToolNotFound(RuntimeError):
    """A required command-line tool (nvcc, ncu) is not installed or not on PATH."""


class NcuError(RuntimeError):
    """Nsight Compute (ncu) failed: not found, no permission, unknown metric, timeout, no kernel profiled."""


class NcuNotFound(ToolNotFound, NcuError):
    """Nsight Compute's CLI (ncu) was not found."""
