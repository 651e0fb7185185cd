"""Calibration of the memory-energy model: microbenchmarks, regression, ncu counters -> features.

Heavy modules (numpy, pandas, matplotlib, CUDA) load on first use; ``import gpurec.calibrate``
is cheap and works without a GPU.  Entry points: :func:`run_calibration` (the command is
``gpurec calibrate``) and :func:`memory_energy_features`.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "run_calibration",
    "memory_energy_features",
    "METRICS",
    "CalibrationError",
    "ToolNotFound",
    "NcuNotFound",
    "NcuError",
    "NvccNotFound",
    "BuildError",
    "MicrobenchError",
    "BudgetExhausted",
]


_ERRORS = {"CalibrationError", "ToolNotFound", "NcuNotFound", "NcuError", "NvccNotFound", "BuildError",
           "MicrobenchError", "BudgetExhausted"}


def __getattr__(name: str) -> Any:
    # Everything loads on first use: the offline modules (features, fit, summary, plots) are
    # CPU core and must not pull in the run side (errors, microbench, device) on import.
    if name in _ERRORS:
        from gpurec.calibrate import errors

        return getattr(errors, name)
    if name == "run_calibration":
        from gpurec.calibrate import calibrate

        return getattr(calibrate, name)
    if name in ("memory_energy_features", "METRICS"):
        from gpurec.calibrate import features

        return getattr(features, name)
    raise AttributeError(name)
