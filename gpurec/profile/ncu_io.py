"""Minimal Nsight Compute (ncu) runner and raw-CSV parser for the profile command.

Why our own: the profiled iteration is delimited with ``cudaProfilerStart/Stop``
(``--profile-from-start off``) rather than an NVTX push/pop range, because NVTX push/pop
ranges are per thread and PyTorch launches backward kernels from its autograd device
thread, so an NVTX filter on the main thread would silently drop every backward kernel.

Clock control is always ``--clock-control none``: the GPU runs at the clocks it would
run at without the profiler, never at ncu's locked base clock.
"""

from __future__ import annotations

import csv
import io
import os
import re
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

try:  # share the exception type with gpurec.calibrate.ncu when that module exists
    from gpurec.calibrate.ncu import NcuNotFound as _NcuNotFoundBase  # type: ignore[attr-defined]
except Exception:  # noqa: BLE001 - any import problem there must not break profiling
    _NcuNotFoundBase = RuntimeError  # type: ignore[misc,assignment]


class NcuNotFound(_NcuNotFoundBase):  # type: ignore[valid-type,misc]
    """Nsight Compute (``ncu``) is not installed or not on PATH."""


class NcuError(RuntimeError):
    """ncu ran but produced no usable counters (its log is named in the message)."""


NCU_HOW_TO_FIX = (
    "Nsight Compute (ncu) was not found. Install it with the CUDA toolkit "
    "(https://developer.nvidia.com/nsight-compute), put it on PATH or set NCU=/path/to/ncu; "
    "or profile without hardware counters with ncu=False (CLI: --no-ncu), which still "
    "reports time, GPU utilization and framework overhead."
)

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

_ROLLUPS = {"sum", "avg", "min", "max"}


SAMPLING_MODES = ("all", "per-config")


def find_ncu() -> str:
    """Path of the ncu executable (one lookup for the whole package: gpurec.calibrate.ncu)."""
    from gpurec.calibrate import ncu as _ncu

    try:
        return str(_ncu.find_ncu())
    except _ncu.NcuNotFound as exc:
        raise NcuNotFound(NCU_HOW_TO_FIX) from exc


def base_metric_name(metric: str) -> str:
    """``smsp__cycles_elapsed.sum`` -> ``smsp__cycles_elapsed`` (what --query-metrics lists)."""
    head, _, tail = metric.rpartition(".")
    return head if head and tail in _ROLLUPS else metric


def query_available_metrics(ncu: str, timeout_s: float = 60.0) -> set[str] | None:
    """Base metric names this GPU supports, or None if ncu could not be asked.

    Cached in the temp folder per ncu binary and visible GPUs, failures included, because
    each query costs seconds and a failing one should not be repeated for every run.
    """
    gpu_key = os.environ.get("CUDA_VISIBLE_DEVICES", "all")
    key = re.sub(r"[^A-Za-z0-9]+", "_", f"{ncu}_{gpu_key}")[-120:]
    cache = Path(tempfile.gettempdir()) / f"gpurec_ncu_metrics_{key}.txt"
    if cache.is_file():
        lines = [line.strip() for line in cache.read_text().splitlines() if line.strip()]
        if lines == ["#failed"]:
            return None
        if lines:
            return set(lines)
    names: set[str] = set()
    try:
        proc = subprocess.run(
            [ncu, "--query-metrics"], capture_output=True, text=True, timeout=timeout_s, check=False
        )
        names = parse_query_metrics(proc.stdout)
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        cache.write_text("\n".join(sorted(names)) + "\n" if names else "#failed\n")
    except OSError:
        pass
    return names or None


def parse_query_metrics(text: str) -> set[str]:
    """Base metric names from ``ncu --query-metrics`` output (first token of each row)."""
    names: set[str] = set()
    for line in text.splitlines():
        token = line.strip().split(" ", 1)[0] if line.strip() else ""
        if re.fullmatch(r"[a-z0-9]+__[a-z0-9_]+", token):
            names.add(token)
    return names


def select_metrics(available: set[str] | None, wanted: Sequence[str] = DEFAULT_METRICS) -> list[str]:
    """Core metrics always (every GPU since Volta has them); the optional tensor-core ones
    only when ``ncu --query-metrics`` lists them for this GPU."""
    if available is None:
        return list(FALLBACK_METRICS)
    return [m for m in wanted if m in CORE_METRICS or base_metric_name(m) in available]


def ncu_profile_command(
    ncu: str,
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
    return [
        ncu,
        "--clock-control", "none",
        "--cache-control", "none",
        "--profile-from-start", "off",
        "--target-processes", "all",
        "--replay-mode", "kernel",
        *limit,
        "--metrics", ",".join(metrics),
        "--force-overwrite",
        "--export", str(report_base),
        *target_cmd,
    ]


def run_process_group(
    cmd: Sequence[str],
    log_path: Path,
    timeout_s: float,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> int:
    """Run cmd in its own process group with output to log_path; kill the whole group on
    timeout or interruption, so no profiled grandchild keeps holding the GPU. Returns rc;
    raises subprocess.TimeoutExpired after the kill."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(str(c) for c in cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)
        try:
            return proc.wait(timeout=timeout_s)
        except BaseException:
            _kill_group(proc)
            raise


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def run_ncu_profile(
    ncu: str,
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


def export_raw_csv(ncu: str, report: Path, out_csv: Path, timeout_s: float = 300.0) -> Path:
    """``ncu --import REPORT --page raw --csv`` into out_csv (base units, e.g. ns, cycles)."""
    base = [ncu, "--import", str(report), "--page", "raw", "--csv"]
    attempts = [
        base + ["--print-units", "base", "--print-kernel-base", "demangled"],
        base + ["--print-units", "base"],
        base,
    ]
    last_err = ""
    for cmd in attempts:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        if proc.returncode == 0 and '"ID"' in proc.stdout:
            out_csv.write_text(proc.stdout)
            return out_csv
        last_err = (proc.stderr or proc.stdout)[-2000:]
    raise NcuError(f"could not export {report} to CSV: {last_err}")


def _tail(path: Path, n_chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n_chars:]
    except OSError:
        return ""


# ----------------------------------------------------------------------------- parsing

_NUMBER = re.compile(r"^[+-]?(\d{1,3}(,\d{3})+|\d+)(\.\d*)?([eE][+-]?\d+)?$")
_TIME_TO_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
               "second": 1e9, "s": 1e9}


def _unit_scale(unit: str) -> float:
    """Factor to base units: times to ns; K/M/G-prefixed counts (e.g. Kcycle) to counts."""
    u = unit.strip()
    if u in _TIME_TO_NS:
        return _TIME_TO_NS[u]
    m = re.fullmatch(r"([KMG])(cycle|inst|warp|thread|block|register|sector|request)s?(/.*)?", u)
    if m:
        return {"K": 1e3, "M": 1e6, "G": 1e9}[m.group(1)]
    return 1.0


def _to_float(value: str) -> float:
    text = value.strip().strip('"')
    if not text or text.lower() in {"n/a", "nan", "-"}:
        return float("nan")
    if _NUMBER.match(text):
        return float(text.replace(",", ""))
    try:
        return float(text)
    except ValueError:
        return float("nan")


def _parse_dims(value: str) -> tuple[int, int, int] | None:
    nums = re.findall(r"\d+", value or "")
    if len(nums) != 3:
        return None
    return int(nums[0]), int(nums[1]), int(nums[2])


def parse_ncu_csv(path_or_text: str | Path) -> pd.DataFrame:
    """Parse ncu's ``--page raw --csv`` export into one row per profiled kernel.

    Columns: ncu_id (launch order), name, grid (x, y, z) or None, block (x, y, z) or None,
    and one float column per metric (durations converted to ns using the units row).
    Accepts a path or the CSV text; skips ncu's ``==PROF==``/``==WARNING==`` lines.
    """
    text = _read_text(path_or_text)
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise NcuError("no ncu raw CSV header (a line starting with \"ID\") found")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header = rows[0]
    data = [r for r in rows[1:] if len(r) == len(header)]
    units: dict[str, str] = {}
    if data and not data[0][0].strip().isdigit():
        units = dict(zip(header, data[0], strict=True))
        data = data[1:]
    name_col = next((c for c in ("Kernel Name", "Function Name", "Name") if c in header), None)
    records = []
    for row in data:
        rec = dict(zip(header, row, strict=True))
        if not rec.get("ID", "").strip().isdigit():
            continue
        out: dict[str, object] = {
            "ncu_id": int(rec["ID"]),
            "name": rec.get(name_col, "") if name_col else "",
            "grid": _parse_dims(rec.get("Grid Size", "")),
            "block": _parse_dims(rec.get("Block Size", "")),
        }
        for col in header:
            if "__" not in col:
                continue
            if col.startswith("device__attribute") or col.startswith("nvtx__"):
                continue
            val = _to_float(rec.get(col, ""))
            val *= _unit_scale(units.get(col, ""))
            out[col] = val
        records.append(out)
    df = pd.DataFrame.from_records(records)
    if df.empty:
        return pd.DataFrame(columns=["ncu_id", "name", "grid", "block"])
    return df.sort_values("ncu_id", kind="stable").reset_index(drop=True)


def _read_text(path_or_text: str | Path) -> str:
    from gpurec.calibrate.ncu import _read_text as read

    return read(path_or_text)


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
