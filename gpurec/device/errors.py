"""Typed device errors; each message says what to do about it."""


class NVMLError(RuntimeError):
    """Base class for everything that goes wrong while talking to the GPU driver."""


class NVMLUnavailable(NVMLError):
    """NVML could not be loaded or initialised (no driver, no GPU, no nvidia-ml-py)."""


class GPUNotFound(NVMLError):
    """The requested GPU index does not exist on this machine."""


class ClockLockNotPermitted(NVMLError):
    """Locking clocks was refused (not root, unsupported GPU, or a GPU we do not own)."""


# The tool errors belong to the offline parsers too (a committed ncu CSV without a header);
# defined there so the CPU core raises them without importing the GPU layer.
from gpurec.parsers.errors import NcuError, NcuNotFound, ToolNotFound  # noqa: E402,F401
