"""The one Nsight Compute (ncu) adapter: find it, ask it, run it, read its CSV.

Calibration, per-operation counters (gpurec.collect.counters) and profiling all use it.

- Every ncu command line comes from :func:`ncu_command`, which always passes
  ``--clock-control none`` and refuses an override: ncu otherwise locks the GPU to base
  clocks, which we must not do on a lent GPU and which would not match normal runs.
- Reports are exported to ``.ncu-rep`` first and then printed with ``--csv --page raw
  --print-units base``, so the application's own stdout never mixes with the CSV.
- Reading that raw page is offline work (``gpurec.parsers.ncu.parse_ncu_csv``, re-exported
  here), so reports parse committed CSVs without loading the GPU layer.
- :func:`available_metrics` caches which metrics this GPU has in a per-user cache
  directory (never the shared temp directory); a failed query is remembered only briefly.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpurec.device.errors import NcuError, NcuNotFound
from gpurec.parsers.ncu import (  # noqa: F401 - the offline parsers, kept under the adapter's names
    IDENTITY_COLUMNS,
    describe,
    metric_base,
    metric_columns,
    parse_ncu_csv,
    parse_query_metrics,
    read_text,
    unit_scale,
)

if TYPE_CHECKING:  # pandas is imported lazily
    import pandas as pd

__all__ = [
    "NcuError", "NcuNotFound", "find_ncu", "ncu_version", "ncu_command", "run_ncu", "export_raw_csv",
    "run_process_group", "parse_query_metrics", "query_metrics", "available_metrics", "split_available",
    "metric_base", "parse_ncu_csv", "metric_columns", "read_text", "unit_scale", "cache_dir",
]

NCU_FIX = (
    "Nsight Compute's CLI (ncu) was not found on PATH, in $NCU, $CUDA_HOME/bin, /usr/local/cuda/bin "
    "or /opt/nvidia/nsight-compute/*/. Install Nsight Compute (it ships with the CUDA toolkit, "
    "https://developer.nvidia.com/nsight-compute) and put it on PATH, or set NCU=/path/to/ncu. "
    "Without ncu, profile with ncu=False (CLI: gpurec profile --no-ncu), which still reports time, "
    "GPU utilization and framework overhead, and calibrate with --no-ncu."
)
DEFAULT_NCU_GLOBS: tuple[str, ...] = (
    "/usr/local/cuda/bin/ncu",
    "/usr/local/cuda-*/bin/ncu",
    "/usr/local/cuda/nsight-compute-*/ncu",
    "/opt/nvidia/nsight-compute/*/ncu",
    "/opt/nvidia/nsight-compute*/ncu",
    "/usr/local/NVIDIA-Nsight-Compute*/ncu",
)
# How long a failed metric query is remembered (so a batch of runs does not repeat a slow
# failure), after which ncu is asked again.
QUERY_FAILURE_TTL_S = 600.0


def find_ncu() -> Path:
    """Locate ncu ($NCU, $GPUREC_NCU, PATH, $CUDA_HOME, usual install folders) or raise NcuNotFound."""
    for var in ("NCU", "GPUREC_NCU"):
        env = os.environ.get(var)
        if env and Path(env).is_file() and os.access(env, os.X_OK):
            return Path(env)
    found = shutil.which("ncu")
    if found:
        return Path(found)
    cands = [str(Path(os.environ[v]) / "bin" / "ncu") for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    for pattern in cands + list(DEFAULT_NCU_GLOBS):
        for c in sorted(glob.glob(pattern), reverse=True):
            if os.access(c, os.X_OK):
                return Path(c)
    raise NcuNotFound(NCU_FIX)


def ncu_version(ncu: Path | str | None = None) -> str:
    ncu = ncu or find_ncu()
    out = subprocess.run([str(ncu), "--version"], capture_output=True, text=True, timeout=60).stdout
    m = re.search(r"Version\s+([\w.\-() ]+)", out)
    return m.group(1).strip() if m else out.strip().splitlines()[-1] if out.strip() else "unknown"


# -- which metrics exist --------------------------------------------------------------------------

def query_metrics(ncu: Path | str | None = None, timeout_s: float = 120.0) -> set[str]:
    """Base metric names available on the visible GPU (needs a GPU and counter permission)."""
    ncu = ncu or find_ncu()
    try:
        proc = subprocess.run([str(ncu), "--query-metrics"], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise NcuError(f"ncu --query-metrics timed out after {timeout_s:.0f} s") from exc
    except OSError as exc:
        raise NcuError(f"could not run {ncu} --query-metrics: {exc}") from exc
    names = parse_query_metrics(proc.stdout)
    if proc.returncode != 0 or not names:
        raise NcuError(f"ncu --query-metrics failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}")
    return names


def cache_dir() -> Path:
    """This user's gpurec cache: ``$GPUREC_CACHE_DIR``, else ``$XDG_CACHE_HOME/gpurec``, else ``~/.cache/gpurec``."""
    if os.environ.get("GPUREC_CACHE_DIR"):
        return Path(os.environ["GPUREC_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpurec"


def _gpu_names() -> list[str]:
    try:
        from gpurec.device.nvml import list_gpus

        return [g.name for g in list_gpus()]
    except Exception:  # noqa: BLE001 - no NVML: the visible-device list alone keys the cache
        return ["unknown"]


def _metrics_cache_file(ncu: Path | str, directory: Path) -> Path:
    """One file per ncu binary (path, size, mtime), visible GPUs and their names."""
    p = Path(ncu)
    try:
        st = p.stat()
        ident = [str(p.resolve()), st.st_size, int(st.st_mtime)]
    except OSError:
        ident = [str(p), 0, 0]
    key = json.dumps([ident, os.environ.get("CUDA_VISIBLE_DEVICES", "all"), _gpu_names()])
    return directory / f"ncu_metrics_{hashlib.sha1(key.encode()).hexdigest()[:16]}.json"


def available_metrics(ncu: Path | str, timeout_s: float = 60.0, directory: Path | None = None,
                      failure_ttl_s: float = QUERY_FAILURE_TTL_S) -> set[str] | None:
    """Base metric names this GPU supports, or None if ncu could not tell.

    Cached under ``directory`` (default :func:`cache_dir`), because each query costs seconds.
    A success is kept; a failure only for ``failure_ttl_s``, then ncu is asked again.
    """
    directory = Path(directory) if directory is not None else cache_dir()
    path = _metrics_cache_file(ncu, directory)
    try:
        saved = json.loads(path.read_text())
        if saved.get("metrics"):
            return set(saved["metrics"])
        if time.time() - float(saved.get("failed_at", 0)) < failure_ttl_s:
            return None
    except (OSError, ValueError, TypeError, AttributeError):
        pass  # no cache yet, or a damaged one: ask ncu
    try:
        names: set[str] | None = query_metrics(ncu, timeout_s)
        record: dict[str, Any] = {"ncu": str(ncu), "metrics": sorted(names or ())}
    except NcuError as exc:
        names = None
        record = {"ncu": str(ncu), "failed_at": time.time(), "error": str(exc)[-500:]}
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(path)
    except OSError:
        pass  # an unwritable cache only costs a repeated query
    return names


def split_available(metrics: Sequence[str], available: set[str] | None) -> tuple[list[str], list[str]]:
    """(metrics whose base name is available, the others); everything is kept if unknown."""
    if not available:
        return list(metrics), []
    keep = [m for m in metrics if metric_base(m) in available]
    return keep, [m for m in metrics if metric_base(m) not in available]


# -- running --------------------------------------------------------------------------------------

def ncu_command(ncu: Path | str, target_cmd: Sequence[str], report_base: Path | str,
                metrics: Sequence[str] = (), extra: Sequence[str] = ()) -> list[str]:
    """The ncu command line: clocks never locked, every process followed, a report exported.

    ``--clock-control none`` is always passed; ``extra`` may not name ``--clock-control``.
    """
    _check_extra(extra)
    args = [str(ncu), "--clock-control", "none", "--target-processes", "all", *map(str, extra)]
    if metrics:
        args += ["--metrics", ",".join(metrics)]
    return [*args, "--force-overwrite", "--export", str(report_base), *map(str, target_cmd)]


def _check_extra(extra: Sequence[str]) -> None:
    if any(str(a).startswith("--clock-control") for a in extra):
        raise ValueError("ncu always runs with --clock-control none (clocks are never locked); "
                         "do not pass --clock-control")


def export_raw_csv(ncu: Path | str, report: Path, out_csv: Path, timeout_s: float = 300.0) -> Path:
    """``ncu --import REPORT --page raw --csv`` into ``out_csv`` (base units, demangled names if possible)."""
    base = [str(ncu), "--import", str(report), "--csv", "--page", "raw"]
    attempts = [base + ["--print-units", "base", "--print-kernel-base", "demangled"],
                base + ["--print-units", "base"], base]
    last_err = ""
    for cmd in attempts:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            raise NcuError(f"ncu --import timed out after {timeout_s:.0f} s") from exc
        if proc.returncode == 0 and '"ID"' in proc.stdout:
            out_csv.parent.mkdir(parents=True, exist_ok=True)
            out_csv.write_text(proc.stdout)
            return out_csv
        last_err = (proc.stderr or proc.stdout)[-2000:]
    raise NcuError(f"could not export {report} to CSV: {last_err}")


def run_ncu(
    cmd: Sequence[str],
    metrics: Sequence[str],
    out_csv: Path,
    nvtx_include: Sequence[str] | None = None,
    extra: Sequence[str] = (),
    kernel_regex: str | None = None,
    timeout_s: float = 600.0,
    ncu: Path | str | None = None,
    env: dict[str, str] | None = None,
) -> pd.DataFrame:
    """Profile ``cmd`` under ncu and return the parsed raw page (also written to ``out_csv``).

    ``nvtx_include`` entries become ``--nvtx --nvtx-include X``; ``kernel_regex`` becomes
    ``-k regex:X``.  Raises :class:`NcuError` with ncu's output on failure.
    """
    flags: list[str] = []
    if nvtx_include:
        flags += ["--nvtx"]
        for item in nvtx_include:
            flags += ["--nvtx-include", item]
    if kernel_regex:
        flags += ["-k", f"regex:{kernel_regex}"]
    flags += list(extra)
    _check_extra(flags)
    ncu = ncu or find_ncu()
    out_csv = Path(out_csv)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpurec-ncu-") as tmp:
        report = Path(tmp) / "report"
        args = ncu_command(ncu, cmd, report, metrics, flags)
        try:
            proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired as exc:
            raise NcuError(f"ncu timed out after {timeout_s:.0f} s: {' '.join(args)}") from exc
        rep = report.with_suffix(".ncu-rep")
        if proc.returncode != 0 or not rep.exists():
            raise NcuError(
                f"ncu failed ({proc.returncode}): {' '.join(args)}\n{(proc.stdout + proc.stderr)[-4000:]}"
            )
        try:
            exp = subprocess.run(
                [str(ncu), "--import", str(rep), "--csv", "--page", "raw", "--print-units", "base"],
                capture_output=True, text=True, timeout=timeout_s,
            )
        except subprocess.TimeoutExpired as exc:
            raise NcuError(f"ncu --import timed out after {timeout_s:.0f} s") from exc
        if exp.returncode != 0:
            raise NcuError(f"ncu --import failed ({exp.returncode}): {exp.stderr[-2000:]}")
        out_csv.write_text(exp.stdout)
    df = parse_ncu_csv(out_csv)
    if df.empty:
        raise NcuError(f"ncu profiled no kernel: {' '.join(args)}\n{(proc.stdout + proc.stderr)[-2000:]}")
    return df


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
        proc = subprocess.Popen([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
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
