"""Typed calibration errors; each message says what to do about it."""


class CalibrationError(RuntimeError):
    """Base class for everything that goes wrong while calibrating the memory-energy model."""


class ToolNotFound(CalibrationError):
    """A required command-line tool (nvcc, ncu) is not installed or not on PATH."""


class NcuNotFound(ToolNotFound):
    """Nsight Compute's CLI (ncu) was not found."""


class NcuError(CalibrationError):
    """ncu ran but failed (permissions, unknown metric, timeout, no kernel profiled)."""


class BuildError(CalibrationError):
    """nvcc failed to build cuda/membench.cu."""


class MicrobenchError(CalibrationError):
    """The CUDA microbenchmark library reported an error (its CUDA message is included)."""


class BudgetExhausted(CalibrationError):
    """Not enough of the time budget is left to start the next measurement."""
