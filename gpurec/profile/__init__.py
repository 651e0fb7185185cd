"""Multi-level GPU utilization of one training or inference iteration.

One stable iteration is traced with torch.profiler (every module annotated) and, in a
second process, counted with Nsight Compute; kernels are matched offline by their
attributes and the metrics of the method's Table 4.1 are reported per iteration, per
layer type and per kernel. See docs/profile.md.

Two halves: the offline analysis (``analysis``, ``ncu_parse``, ``trace``, ``matching``,
``metrics``, ``report``; CPU core) and the run side (``api.profile_network``, ``ncu_io``,
``worker``; GPU layer).  The names below load on first use, so importing an offline module
never loads the GPU layer.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

# name -> the module that defines it
_WHERE = {
    "ProfileError": "analysis", "ProfileResult": "analysis", "analyze": "analysis", "write_outputs": "analysis",
    "profile_network": "api", "NcuError": "ncu_io", "NcuNotFound": "ncu_io", "find_ncu": "ncu_io",
    "parse_ncu_csv": "ncu_parse", "render_table": "report", "save_plots": "report", "load_trace": "trace",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(f"gpurec.profile.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'gpurec.profile' has no attribute {name!r}")
