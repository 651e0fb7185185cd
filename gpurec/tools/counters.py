"""Per-operation ncu counters -> features: datasets/<gpu>/counters/op_features.parquet.

For each profiled (op_signature, mode) in counters.jsonl (gpurec.collect.counters: kernels of
one step summed), the raw summed counters plus the features of
gpurec.calibrate.features.memory_energy_features with that GPU's calibration: memory-energy
lower bound per level and in total (mJ per call), its share of the measured dynamic energy
(joined on op_signature + mode with operations.parquet), SMSP active / issue-slot and
tensor-core active / issue-slot utilization.  Run through ``gpurec tools counters-features``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpurec.dataset.store import atomic_write_parquet


def build(gpu_dir: Path, calibration: Path | None = None, root: Path | None = None) -> Any:
    """The feature table (a DataFrame) of ``gpu_dir``'s counters; ``calibration_file`` names the
    calibration used, relative to ``root`` (the repository) where it lies inside it."""
    import pandas as pd

    from gpurec.calibrate.features import op_feature_table

    counters_path = gpu_dir / "counters" / "counters.jsonl"
    if not counters_path.exists():
        raise FileNotFoundError(f"{counters_path} is missing: collect counters first (`gpurec collect` with "
                                "counters on a GPU with ncu)")
    cal_path = calibration or gpu_dir / "calibration" / "calibration.json"
    counters = pd.read_json(counters_path, lines=True, dtype=False)
    cal = json.loads(cal_path.read_text())
    ops_path = gpu_dir / "operations.parquet"
    ops = pd.read_parquet(ops_path) if ops_path.exists() else None
    if ops is not None and "status" in ops:
        ops = ops[ops["status"] == "ok"]
    table = op_feature_table(counters, cal, None if ops is None else eager_figures(ops))
    root = (root or Path.cwd()).resolve()
    cal_abs = cal_path.resolve()
    table["calibration_file"] = cal_abs.relative_to(root).as_posix() if cal_abs.is_relative_to(root) else str(cal_path)
    return table


EAGER_FIGURES = ("time_ms", "energy_mj", "power_w", "dynamic_energy_mj")


def eager_figures(ops: Any) -> Any:
    """The operations with their eager figures: where a host-free row superseded the eager one
    (gpurec.dataset.build keeps the latter as ``v1_*``), the eager row's.  The counters were
    collected beside the eager measurements, and their shares are of eager (per-call) energy.  The
    eager row's idle power and clock are not kept: those columns are the host-free run's."""
    ops = ops.copy()
    for col in EAGER_FIGURES:
        old = f"v1_{col}"
        if old in ops:
            ops[col] = ops[old].where(ops[old].notna(), ops[col] if col in ops else float("nan"))
    return ops


def write(gpu_dir: Path, calibration: Path | None = None, out: Path | None = None,
          root: Path | None = None) -> tuple[Path, Any]:
    """Build the table and write it (atomically); returns (path, table)."""
    table = build(gpu_dir, calibration, root)
    out = out or gpu_dir / "counters" / "op_features.parquet"
    atomic_write_parquet(out, table)
    return out, table
