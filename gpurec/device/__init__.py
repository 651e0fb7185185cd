"""Device access: the only place gpurec talks to NVML.

Everything here converts NVML's units once (mW -> W, mJ -> mJ kept, MHz) and raises
typed errors that say how to fix the problem.  Import is cheap: pynvml is loaded on
first use.
"""

from gpurec.device.errors import (
    ClockLockNotPermitted,
    GPUNotFound,
    NVMLError,
    NVMLUnavailable,
)
from gpurec.device.nvml import GPU, GPUInfo, Sample, list_gpus, open_gpu

__all__ = [
    "GPU",
    "GPUInfo",
    "Sample",
    "list_gpus",
    "open_gpu",
    "NVMLError",
    "NVMLUnavailable",
    "GPUNotFound",
    "ClockLockNotPermitted",
]
