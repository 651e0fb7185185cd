"""Profile's ncu counters and the shape of its parsed kernels (offline, CPU core).

Which metrics a profile asks for, and ncu's raw CSV turned into the kernels the matching
needs.  Running ncu is ``gpurec.profile.ncu_io`` (GPU layer), which re-exports these names.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from gpurec.parsers.errors import NcuError
from gpurec.parsers.ncu import metric_base
from gpurec.parsers.ncu import parse_ncu_csv as parse_raw_csv

# Metrics always requested: all are cheap single-pass counters or free launch attributes.
CORE_METRICS: tuple[str, ...] = (
    "gpu__time_duration.sum",
    "smsp__cycles_elapsed.sum",
    "smsp__cycles_elapsed.avg",
    "smsp__cycles_active.sum",
    "smsp__inst_issued.sum",
    "sm__cycles_elapsed.sum",
    "sm__cycles_active.sum",
    "launch__grid_size",
    "launch__block_size",
    "launch__registers_per_thread",
)
# Tensor-core metrics: HMMA (mma.sync, Volta..Hopper) and GMMA (wgmma, Hopper). The pipe
# cycles are counted per SM, so their utilization uses sm__cycles_elapsed as denominator.
TC_ACTIVE_METRICS: tuple[str, ...] = (
    "sm__pipe_tensor_op_hmma_cycles_active.sum",
    "sm__pipe_tensor_op_gmma_cycles_active.sum",
)
TC_INST_METRICS: tuple[str, ...] = (
    "smsp__inst_executed_pipe_tensor_op_hmma.sum",
    "smsp__inst_executed_pipe_tensor_op_gmma.sum",
)
DEFAULT_METRICS: tuple[str, ...] = CORE_METRICS + TC_ACTIVE_METRICS + TC_INST_METRICS
# Used when ncu cannot tell us which metrics exist: what every GPU since Volta has.
FALLBACK_METRICS: tuple[str, ...] = CORE_METRICS + (
    "sm__pipe_tensor_op_hmma_cycles_active.sum",
    "smsp__inst_executed_pipe_tensor_op_hmma.sum",
)

SAMPLING_MODES = ("all", "per-config")


def base_metric_name(metric: str) -> str:
    """``smsp__cycles_elapsed.sum`` -> ``smsp__cycles_elapsed`` (what --query-metrics lists)."""
    return metric_base(metric)


def select_metrics(available: set[str] | None, wanted: Sequence[str] = DEFAULT_METRICS) -> list[str]:
    """Core metrics always (every GPU since Volta has them); the optional tensor-core ones
    only when ``ncu --query-metrics`` lists them for this GPU."""
    if available is None:
        return list(FALLBACK_METRICS)
    return [m for m in wanted if m in CORE_METRICS or base_metric_name(m) in available]


# ----------------------------------------------------------------------------- parsing

def parse_ncu_csv(path_or_text: str | Path) -> pd.DataFrame:
    """ncu's ``--page raw --csv`` export as the kernels profile matches, in launch order.

    Columns: ncu_id (launch order), name, grid (x, y, z) or None, block (x, y, z) or None,
    and one float column per metric in base units (durations in ns), device attributes and
    NVTX columns left out.  Parsed by gpurec.device.ncu.parse_ncu_csv; accepts a path or the
    CSV text.  Raises NcuError when the text holds no ncu header.
    """
    raw = parse_raw_csv(path_or_text)
    if "id" not in raw.columns:
        raise NcuError("no ncu raw CSV header (a line starting with \"ID\") found")
    raw = raw[raw["id"].notna()]
    if raw.empty:
        return pd.DataFrame(columns=["ncu_id", "name", "grid", "block"])

    def dims(prefix: str) -> list[tuple[int, int, int] | None]:
        if f"{prefix}_x" not in raw.columns:
            return [None] * len(raw)
        xyz = raw[[f"{prefix}_x", f"{prefix}_y", f"{prefix}_z"]].astype(object).to_numpy()
        return [None if any(pd.isna(v) for v in r) else (int(r[0]), int(r[1]), int(r[2])) for r in xyz]

    cols: dict[str, object] = {
        "ncu_id": raw["id"].astype(int).to_numpy(),
        "name": raw["kernel_name"].to_numpy() if "kernel_name" in raw.columns else [""] * len(raw),
        "grid": dims("grid"),
        "block": dims("block"),
    }
    for col in raw.columns:
        if "__" in col and not col.startswith(("device__attribute", "nvtx__")):
            cols[col] = pd.to_numeric(raw[col], errors="coerce").astype(float).to_numpy()
    df = pd.DataFrame(cols)
    return df.sort_values("ncu_id", kind="stable").reset_index(drop=True)


def first_launch_per_config(csv_text: str) -> str:
    """What ``--filter-mode per-launch-config --launch-count 1`` keeps of a full raw CSV.

    Lets a full report be reduced to the sampled one, to check the per-config imputation
    against the full counters (tests, gpurec/reports/profile.py).
    """
    lines = csv_text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise NcuError("no ncu raw CSV header (a line starting with \"ID\") found")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header, body = rows[0], rows[1:]
    keep, seen = [header], set()
    name_i, grid_i, block_i = (header.index(c) for c in ("Kernel Name", "Grid Size", "Block Size"))
    for row in body:
        if not row or not row[0].strip().isdigit():
            keep.append(row)  # the units row
            continue
        key = (row[name_i], row[grid_i], row[block_i])
        if key not in seen:
            seen.add(key)
            keep.append(row)
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(keep)
    return buf.getvalue()
