"""Rank GPUs for a network by time, energy or energy-delay product (see ranking.py).

``gpurec.recommend`` is both this package and the function: importing the package replaces
the package attribute of the same name, so the module itself is made callable and
``gpurec.recommend(...)`` works before and after ``import gpurec.recommend``.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from gpurec.recommend.ranking import (
    BAND,
    OBJECTIVES,
    BoundAdvice,
    RankedGPU,
    Ranking,
    UnknownObjective,
    band_description,
    bands_tie,
    check_objective,
    default_input_shape,
    estimate_fields,
    predict_step,
    recommend,
    smallest_gpu_bound_batch,
    step_memory_gb,
)

__all__ = ["BAND", "OBJECTIVES", "BoundAdvice", "RankedGPU", "Ranking", "UnknownObjective", "band_description", "bands_tie",
           "check_objective", "default_input_shape", "estimate_fields", "predict_step", "recommend", "smallest_gpu_bound_batch",
           "step_memory_gb"]


class _CallableModule(types.ModuleType):
    """This package, callable as :func:`recommend`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Ranking:
        return recommend(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
