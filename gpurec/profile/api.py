"""profile_network: one stable iteration of a network, traced and counted, then combined.

The parent process never touches CUDA: the trace and the ncu run each happen in a fresh
``python -m gpurec.profile.worker`` child (same model, inputs and iteration index), and
this module only merges their files (``gpurec.profile.analysis``, the offline half, which runs
on any machine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpurec.profile import ncu_io
from gpurec.profile.analysis import (  # noqa: F401 - the offline half, under the names callers use
    META_FILE,
    NCU_CSV,
    TRACE_FILE,
    ProfileError,
    ProfileResult,
    analyze,
    write_outputs,
)
from gpurec.sets import MODES


def _worker_env() -> dict[str, str]:
    """Child environment with this gpurec importable (the repo may not be installed)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _worker_cmd(model_name: str, model_file: str | None, batch_size: int, resolution: int, mode: str,
                precision: str, device: str, out_dir: Path, phase: str, model_globals: Sequence[str] = (),
                **settings: Any) -> list[str]:
    """The child's command line: the worker module and a spec file (it has no argument parser)."""
    from gpurec.profile.worker import WorkerSpec

    spec = WorkerSpec(model=model_name, model_file=model_file, batch_size=batch_size, resolution=resolution,
                      mode=mode, precision=precision, device=device, phase=phase, out_dir=str(out_dir),
                      model_globals=tuple(model_globals), **settings)
    path = spec.write(out_dir / f"worker_{phase}_spec.json")
    return [sys.executable, "-m", "gpurec.profile.worker", str(path)]


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def collect_counters(
    ncu_path: str, target_cmd: list[str], out: Path, timeout_s: float, env: dict[str, str] | None = None,
    sampling: str = "all",
) -> tuple[Path | None, list[str], str | None]:
    """Run target_cmd under ncu and export the raw CSV: (csv path or None, metrics, error or None).

    Tensor-core metrics this GPU lacks are left out up front; if ncu still rejects a metric,
    one retry runs with the core metrics only. Errors are returned, not raised.
    """
    metrics = ncu_io.select_metrics(ncu_io.query_available_metrics(ncu_path))
    attempts = [metrics]
    if list(metrics) != list(ncu_io.CORE_METRICS):
        attempts.append(list(ncu_io.CORE_METRICS))
    error: str | None = None
    for n_try, mset in enumerate(attempts):
        try:
            report = ncu_io.run_ncu_profile(ncu_path, mset, out / "ncu", target_cmd, out / "ncu.log",
                                            timeout_s, env=env, sampling=sampling)
            return ncu_io.export_raw_csv(ncu_path, report, out / NCU_CSV), list(mset), None
        except (ncu_io.NcuError, OSError, subprocess.SubprocessError) as exc:
            error = str(exc)
            body = _tail(out / "ncu.log", 20000).lower().split("\n", 1)[-1]  # minus the command line
            metric_problem = "metric" in body and any(
                w in body for w in ("not found", "failed to find", "invalid", "unknown", "not available",
                                    "not supported"))
            if "timed out" in error or not metric_problem or n_try == len(attempts) - 1:
                break
    return None, [], error


def profile_network(
    model: Any,
    batch_size: int,
    resolution: int = 224,
    mode: str = "inference",
    out_dir: Path | str | None = None,
    gpu_index: int = 0,
    ncu: bool = True,
    *,
    precision: str = "fp32",
    device: str | None = None,
    trace_timeout_s: float = 600.0,
    ncu_timeout_s: float = 1200.0,
    plots: bool = True,
    max_warmup_iters: int = 40,
    max_warmup_s: float = 20.0,
    ncu_sampling: str = "all",
) -> ProfileResult:
    """Profile one stable iteration of ``model`` (torchvision name or nn.Module).

    Writes into ``out_dir`` (a temp folder if None): trace.json.gz, worker_trace.json,
    ncu.csv and ncu.log (with ncu), result.json, table.txt and the plots. Raises NcuNotFound
    before any work when ncu=True and Nsight Compute is missing; a failing ncu run after a
    good trace is reported in ``result.ncu_error`` instead of raising.

    ``ncu_sampling="per-config"`` profiles one launch per (kernel, grid, block) and imputes
    the repeats: several times less ncu time for training iterations, at the cost of
    assuming that repeated launches of one configuration use the chip alike.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if ncu_sampling not in ncu_io.SAMPLING_MODES:
        raise ValueError(f"ncu_sampling must be one of {ncu_io.SAMPLING_MODES}, not {ncu_sampling!r}")
    dev = device or f"cuda:{gpu_index}"
    if ncu and not dev.startswith("cuda"):
        raise ValueError("hardware counters need a CUDA device: pass ncu=False for a CPU dry run")
    ncu_path = str(ncu_io.find_ncu()) if ncu else None
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="gpurec_profile_"))
    out.mkdir(parents=True, exist_ok=True)

    model_file = None
    model_globals: list[str] = []  # what the saved module may use; the worker allows nothing else
    if isinstance(model, str):
        model_name = model
    else:
        import torch

        model_name = type(model).__name__
        model_file = str(out / "model.pt")
        try:
            torch.save(model, model_file)
        except Exception as exc:  # noqa: BLE001
            raise ProfileError(
                f"could not pickle {model_name} for the profiling child process ({exc}); define the "
                "module class in an importable file (not __main__ or a notebook)") from exc
        from gpurec.profile.worker import module_globals

        model_globals = module_globals(model_file)
    env = _worker_env()

    trace_log = out / "worker_trace.log"
    cmd = _worker_cmd(model_name, model_file, batch_size, resolution, mode, precision, dev, out, "trace",
                      model_globals, max_warmup_iters=max_warmup_iters, max_warmup_s=max_warmup_s)
    try:
        rc = ncu_io.run_process_group(cmd, trace_log, trace_timeout_s, env=env)
    except subprocess.TimeoutExpired as exc:
        raise ProfileError(f"trace worker timed out after {trace_timeout_s:.0f} s; log: {trace_log}") from exc
    if rc != 0 or not (out / TRACE_FILE).is_file():
        raise ProfileError(f"trace worker failed (exit {rc}); log: {trace_log}\n{_tail(trace_log)}")
    meta = json.loads((out / META_FILE).read_text())
    if ncu_path is not None:
        meta["ncu_sampling"] = ncu_sampling

    ncu_error: str | None = None
    ncu_csv: Path | None = None
    metrics: list[str] = []
    if ncu_path is not None:
        ncu_cmd = _worker_cmd(model_name, model_file, batch_size, resolution, mode, precision, dev, out, "ncu",
                              model_globals, warmup_iters=int(meta["profiled_iteration"]))
        ncu_csv, metrics, ncu_error = collect_counters(ncu_path, ncu_cmd, out, ncu_timeout_s, env,
                                                       sampling=ncu_sampling)

    try:
        result = analyze(out / TRACE_FILE, ncu_csv, meta)
    except Exception as exc:  # noqa: BLE001 - keep the trace metrics if the ncu side breaks
        if ncu_csv is None:
            raise
        result = analyze(out / TRACE_FILE, None, meta)
        ncu_error = f"could not combine {ncu_csv} with the trace: {exc!r}"
    if ncu_error and not result.ncu_error:
        result.ncu_error = ncu_error.splitlines()[0] + f" (see {out / 'ncu.log'})"
    result.ncu_metrics = metrics if ncu_csv is not None else []
    result.files = {k: str(out / v) for k, v in
                    [("trace", TRACE_FILE), ("meta", META_FILE), ("ncu_csv", NCU_CSV), ("ncu_log", "ncu.log")]
                    if (out / v).is_file()}
    write_outputs(result, out, plots=plots)
    return result


