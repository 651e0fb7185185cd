"""Multi-level GPU utilization of one training or inference iteration (GitHub issue 7).

One stable iteration is traced with torch.profiler (every module annotated) and, in a
second process, counted with Nsight Compute; kernels are matched offline by their
attributes and the metrics of the method's Table 4.1 are reported per iteration, per
layer type and per kernel. See docs/profile.md.

Import is cheap: torch loads only in the worker child processes.
"""

from gpurec.profile.api import ProfileError, ProfileResult, analyze, profile_network, write_outputs
from gpurec.profile.ncu_io import NcuError, NcuNotFound, find_ncu, parse_ncu_csv
from gpurec.profile.report import render_table, save_plots
from gpurec.profile.trace import load_trace

__all__ = [
    "NcuError",
    "NcuNotFound",
    "ProfileError",
    "ProfileResult",
    "analyze",
    "find_ncu",
    "load_trace",
    "parse_ncu_csv",
    "profile_network",
    "render_table",
    "save_plots",
    "write_outputs",
]
