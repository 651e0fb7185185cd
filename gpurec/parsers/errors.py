"""Errors of external tools whose output the parsers read (ncu); the GPU layer raises them too."""


class ToolNotFound(RuntimeError):
    """A required command-line tool (nvcc, ncu) is not installed or not on PATH."""


class NcuError(RuntimeError):
    """Nsight Compute (ncu) failed: not found, no permission, unknown metric, timeout, no kernel profiled."""


class NcuNotFound(ToolNotFound, NcuError):
    """Nsight Compute's CLI (ncu) was not found."""
