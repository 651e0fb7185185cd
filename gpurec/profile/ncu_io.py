"""Profile's use of Nsight Compute: which counters, over which launches, in which shape.

Finding, running and parsing ncu is gpurec.device.ncu's (the one adapter); this module
chooses the profile's metrics and sampling and gives the parsed kernels the shape the
matching needs.

The profiled iteration is delimited with ``cudaProfilerStart/Stop``
(``--profile-from-start off``) rather than an NVTX push/pop range, because NVTX push/pop
ranges are per thread and PyTorch launches backward kernels from its autograd device
thread, so an NVTX filter on the main thread would silently drop every backward kernel.

Clock control is always ``--clock-control none`` (gpurec.device.ncu.ncu_command): the GPU
runs at the clocks it would run at without the profiler, never at ncu's locked base clock.
"""

from __future__ import annotations

import csv
import io
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from gpurec.device.ncu import (  # noqa: F401 - the adapter's names, as profile code uses them
    NcuError,
    NcuNotFound,
    available_metrics,
    export_raw_csv,
    find_ncu,
    metric_base,
    ncu_command,
    parse_query_metrics,
    read_text,
    run_process_group,
)
from gpurec.device.ncu import parse_ncu_csv as parse_raw_csv

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


def query_available_metrics(ncu: str | Path, timeout_s: float = 60.0, cache_dir: Path | None = None
                            ) -> set[str] | None:
    """Base metric names this GPU supports, or None if ncu could not tell (cached per user;
    see gpurec.device.ncu.available_metrics)."""
    return available_metrics(ncu, timeout_s, directory=cache_dir)


def select_metrics(available: set[str] | None, wanted: Sequence[str] = DEFAULT_METRICS) -> list[str]:
    """Core metrics always (every GPU since Volta has them); the optional tensor-core ones
    only when ``ncu --query-metrics`` lists them for this GPU."""
    if available is None:
        return list(FALLBACK_METRICS)
    return [m for m in wanted if m in CORE_METRICS or base_metric_name(m) in available]


def ncu_profile_command(
    ncu: str | Path,
    metrics: Sequence[str],
    report_base: Path,
    target_cmd: Sequence[str],
    launch_limit: int = 5000,
    sampling: str = "all",
) -> list[str]:
    """The ncu command line: counters only inside cudaProfilerStart/Stop, no clock locking.

    ``sampling="per-config"`` profiles the first launch of each distinct launch configuration
    (kernel, grid, block) only; the rest are filled in from it offline (see
    ``metrics.merge_kernels``). A training iteration has ~700 kernels at ~0.3 s of replay
    each, and most repeat a configuration, so this cuts ncu time several-fold.
    """
    if sampling not in SAMPLING_MODES:
        raise ValueError(f"sampling must be one of {SAMPLING_MODES}, not {sampling!r}")
    limit = (["--filter-mode", "per-launch-config", "--launch-count", "1"] if sampling == "per-config"
             else ["--launch-count", str(launch_limit)])
    extra = ["--cache-control", "none", "--profile-from-start", "off", "--replay-mode", "kernel", *limit]
    return ncu_command(ncu, target_cmd, report_base, metrics, extra)


def run_ncu_profile(
    ncu: str | Path,
    metrics: Sequence[str],
    report_base: Path,
    target_cmd: Sequence[str],
    log_path: Path,
    timeout_s: float,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    sampling: str = "all",
) -> Path:
    """Run ``target_cmd`` under ncu; return the .ncu-rep path. Raises NcuError with the log."""
    cmd = ncu_profile_command(ncu, metrics, report_base, target_cmd, sampling=sampling)
    report = Path(str(report_base) + ".ncu-rep")
    if report.exists():
        report.unlink()
    try:
        rc = run_process_group(cmd, log_path, timeout_s, env=env, cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        raise NcuError(f"ncu timed out after {timeout_s:.0f} s; log: {log_path}") from exc
    if rc != 0 or not report.is_file():
        raise NcuError(f"ncu exited with {rc}; log: {log_path}\n{_tail(log_path)}")
    return report


def _tail(path: Path, n_chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n_chars:]
    except OSError:
        return ""


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
