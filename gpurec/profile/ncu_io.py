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

import subprocess
from collections.abc import Sequence
from pathlib import Path

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
from gpurec.profile.ncu_parse import (  # noqa: F401 - the offline half, under the names profile code uses
    CORE_METRICS,
    DEFAULT_METRICS,
    FALLBACK_METRICS,
    SAMPLING_MODES,
    TC_ACTIVE_METRICS,
    TC_INST_METRICS,
    base_metric_name,
    first_launch_per_config,
    parse_ncu_csv,
    parse_raw_csv,
    select_metrics,
)


def query_available_metrics(ncu: str | Path, timeout_s: float = 60.0, cache_dir: Path | None = None
                            ) -> set[str] | None:
    """Base metric names this GPU supports, or None if ncu could not tell (cached per user;
    see gpurec.device.ncu.available_metrics)."""
    return available_metrics(ncu, timeout_s, directory=cache_dir)


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
