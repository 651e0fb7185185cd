"""Typed calibration errors; each message says what to do about it.

ncu's errors and ToolNotFound belong to gpurec.device (the one ncu adapter) and are
re-exported here.
"""

from gpurec.device.errors import NcuError, NcuNotFound, ToolNotFound

__all__ = ["BudgetExhausted", "BuildError", "CalibrationError", "MicrobenchError", "NcuError", "NcuNotFound",
           "NvccNotFound", "ToolNotFound"]


class CalibrationError(RuntimeError):
    """Base class for everything that goes wrong while calibrating the memory-energy model."""


class NvccNotFound(ToolNotFound, CalibrationError):
    """nvcc (the CUDA compiler) was not found: the microbenchmarks cannot be built."""


class BuildError(CalibrationError):
    """nvcc failed to build cuda/membench.cu."""


class MicrobenchError(CalibrationError):
    """The CUDA microbenchmark library reported an error (its CUDA message is included)."""


class BudgetExhausted(CalibrationError):
    """Not enough of the time budget is left to start the next measurement."""
