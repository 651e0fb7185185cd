"""Rank GPUs for a network by time, energy or energy-delay product (see ranking.py).

``gpurec.recommend`` is both this package and the function: importing the package replaces
the package attribute of the same name, so the module itself is made callable and
``gpurec.recommend(...)`` works before and after ``import gpurec.recommend``.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from gpurec.recommend.evidence import LEVELS as EVIDENCE_LEVELS
from gpurec.recommend.evidence import EvidenceSets, evidence_of, load_evidence
from gpurec.recommend.names import resolve_noted, split_gpus
from gpurec.recommend.ranking import (
    BAND,
    OBJECTIVES,
    BoundAdvice,
    RankedGPU,
    Ranking,
    UnknownObjective,
    band_description,
    bands_tie,
    bound_rule,
    check_objective,
    default_input_shape,
    estimate_fields,
    predict_step,
    recommend,
    smallest_gpu_bound_batch,
    step_memory_gb,
    widen_bands,
)
from gpurec.recommend.ties import DifferenceSpreads, load_difference_spreads

__all__ = ["BAND", "EVIDENCE_LEVELS", "OBJECTIVES", "BoundAdvice", "DifferenceSpreads", "EvidenceSets", "RankedGPU",
           "Ranking", "UnknownObjective", "band_description", "bands_tie", "bound_rule", "check_objective",
           "default_input_shape", "estimate_fields", "evidence_of", "load_difference_spreads", "load_evidence",
           "predict_step", "recommend", "resolve_noted", "smallest_gpu_bound_batch", "split_gpus", "step_memory_gb",
           "widen_bands"]


class _CallableModule(types.ModuleType):
    """This package, callable as :func:`recommend`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Ranking:
        return recommend(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
