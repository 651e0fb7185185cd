"""Check predictions on the GPU at hand: measure a whole network with the collection method
and compare it with (a) the prediction and (b) the sum of its measured operations.

Two halves: ``compare`` (offline, CPU core: field-by-field comparison, the log) and ``run``
(GPU layer: measuring).  The names below load on first use, so the offline half never loads
the GPU layer.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_RUN = {"measure_module", "measure_network", "validate", "validate_module"}
_COMPARE = {"DEFAULT_LOG", "complete_log", "host_of", "input_of", "load_log", "measured_fields", "memory_fields",
            "per_op_errors", "predicted_fields", "record_network",
            "plot_log", "predict_record", "prediction_fields", "record_input", "render", "sum_of_measured_ops",
            "sum_operations"}

__all__ = sorted(_RUN | _COMPARE)


def __getattr__(name: str) -> Any:
    if name in _RUN:
        return getattr(import_module("gpurec.validate.run"), name)
    if name in _COMPARE:
        return getattr(import_module("gpurec.validate.compare"), name)
    raise AttributeError(f"module 'gpurec.validate' has no attribute {name!r}")
