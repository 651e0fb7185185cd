"""Calibration of the memory-energy model: microbenchmarks, regression, ncu counters -> features.

Heavy modules (numpy, pandas, matplotlib, CUDA) load on first use; ``import gpurec.calibrate``
is cheap and works without a GPU.  Entry points: :func:`run_calibration` (the command is
``gpurec calibrate``) and :func:`memory_energy_features`.
"""

from __future__ import annotations

from typing import Any

from gpurec.calibrate.errors import (
    BudgetExhausted,
    BuildError,
    CalibrationError,
    MicrobenchError,
    NcuError,
    NcuNotFound,
    NvccNotFound,
    ToolNotFound,
)

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


def __getattr__(name: str) -> Any:
    if name == "run_calibration":
        from gpurec.calibrate import calibrate

        return getattr(calibrate, name)
    if name in ("memory_energy_features", "METRICS"):
        from gpurec.calibrate import features

        return getattr(features, name)
    raise AttributeError(name)
