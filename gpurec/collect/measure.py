"""Time and energy of one repeated step (an operation or a whole network) on one GPU, with
the GPU's work measured apart from the host's.

A step's eager time is GPU work plus the host's Python/ATen/autograd/launch work, and the
host part moves a lot between (and within) lent machines while the GPU part repeats within
1-2 %.  So each step is measured three ways:

1. **eager** (``time_ms``, ``host_ms``): blocks of back-to-back calls, synchronised at the
   end of each block.  ``host_ms`` is the wall time to *enqueue* one call (no
   synchronisation; autograd included in training), taken in the same blocks before the
   synchronise, with the NVML poller paused so it does not steal the interpreter.  Blocks
   are short enough that the launch queue never fills, so the enqueue is never throttled by
   the GPU.  The median of several blocks is reported, with its inter-quartile range.
2. **host-free** (``gpu_time_ms``, ``gpu_power_w``, ``gpu_energy_mj``): the step is captured
   once as a CUDA graph holding enough back-to-back calls that one replay lasts about
   ``target_replay_ms``; replays are timed with CUDA events (several blocks: a real spread)
   and run inside an energy window.  Energy per call = window power x GPU time per call.
   A step that cannot be captured falls back to eager timing with ``captured = False`` and
   the reason; the row is never dropped.
3. (networks) an in-network attribution pass, see :mod:`gpurec.collect.in_network`.

Energy windows open and close on updates of the board's energy counter
(:class:`gpurec.device.window.EnergyMonitor`).  A window whose average power falls outside
[idle power, power limit] is physically impossible for a busy board, so it is measured
again over a window three times as long; if it is still outside, the row keeps the longer
window's value and says so in ``power_out_of_range``.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpurec.device.graphs import CaptureFailed, Paced, Replay, StepBackend
from gpurec.device.sampler import Sampler
from gpurec.device.window import EnergyMonitor, Measurement

ROW_SCHEMA = 2  # 2: host-free columns (gpu_time_ms, gpu_power_w, gpu_energy_mj, host_ms, captured)


@dataclass
class WindowConfig:
    min_window_s: float = 0.3  # three 100 ms counter intervals, on a stationary (graph) load
    eager_blocks: int = 5
    eager_min_block_s: float = 0.003
    eager_max_calls: int = 40  # keeps a block's launches far below the launch-queue depth
    target_replay_ms: float = 2.0
    max_graph_calls: int = 512
    gpu_blocks: int = 5
    gpu_min_block_ms: float = 8.0
    tick_timeout_s: float = 2.0
    capture: bool = True
    retry_window_factor: float = 3.0


def _median_iqr(values: list[float]) -> tuple[float, float]:
    med = statistics.median(values)
    if len(values) >= 4:
        q = statistics.quantiles(values, n=4)
        return med, q[2] - q[0]
    return med, (max(values) - min(values)) if len(values) > 1 else float("nan")


def timed_blocks(step: Callable[[], None], backend: StepBackend, calls: int, blocks: int
                 ) -> tuple[list[float], list[float]]:
    """Per-call milliseconds of ``blocks`` blocks of ``calls`` back-to-back calls, each block
    starting on an idle GPU: (host enqueue time, before the block's synchronise; total time)."""
    host, total = [], []
    for _ in range(blocks):
        backend.sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            step()
        t1 = time.perf_counter()
        backend.sync()
        t2 = time.perf_counter()
        host.append((t1 - t0) / calls * 1e3)
        total.append((t2 - t0) / calls * 1e3)
    return host, total


def eager_blocks(step: Callable[[], None], backend: StepBackend, cfg: WindowConfig,
                 sampler: Sampler | None) -> dict[str, Any]:
    """Eager per-call time and host enqueue time (see the module docstring)."""
    def run() -> dict[str, Any]:
        backend.sync()
        t0 = time.perf_counter()
        step()
        backend.sync()
        one_s = max(time.perf_counter() - t0, 1e-7)
        n = max(1, min(cfg.eager_max_calls, math.ceil(cfg.eager_min_block_s / one_s)))
        host, total = timed_blocks(step, backend, n, cfg.eager_blocks)
        time_ms, time_iqr = _median_iqr(total)
        host_ms, host_iqr = _median_iqr(host)
        return {"time_ms": time_ms, "time_iqr_ms": time_iqr, "host_ms": host_ms, "host_iqr_ms": host_iqr,
                "host_min_ms": min(host), "eager_calls_per_block": n, "eager_blocks": len(total)}

    if sampler is None:
        return run()
    with sampler.paused():
        return run()


def _power_ok(m: Measurement, idle_power_w: float | None, power_limit_w: float | None) -> bool:
    if not math.isfinite(m.power_w):
        return False
    if power_limit_w is not None and m.power_w > power_limit_w:
        return False
    return not (idle_power_w is not None and m.power_w < idle_power_w)


def timed_window(busy: Callable[[], None], timed: Callable[[], list[float]], monitor: EnergyMonitor,
                 cfg: WindowConfig, idle_power_w: float | None, power_limit_w: float | None,
                 extra_timeout_s: float = 0.0) -> tuple[list[float], Measurement, dict[str, Any]]:
    """Open a window on a tick while ``busy`` runs, take ``timed()`` inside it, keep ``busy``
    running until the window is long enough, close on a tick.  Re-measured once over a
    longer window when the power is impossible (see the module docstring)."""
    start = monitor.begin_window(busy, extra_timeout_s)
    times = timed()
    m = monitor.end_window(start, busy, cfg.min_window_s, time.perf_counter(), extra_timeout_s)
    info: dict[str, Any] = {"window_retried": False, "power_out_of_range": False}
    if not _power_ok(m, idle_power_w, power_limit_w):
        info["window_retried"] = True
        info["first_window_power_w"] = m.power_w
        start = monitor.begin_window(busy, extra_timeout_s)
        m = monitor.end_window(start, busy, cfg.min_window_s * cfg.retry_window_factor, None,
                               extra_timeout_s + cfg.min_window_s * cfg.retry_window_factor)
        info["power_out_of_range"] = not _power_ok(m, idle_power_w, power_limit_w)
    return times, m, info


def capture_step(step: Callable[[], None], backend: StepBackend, cfg: WindowConfig, est_call_ms: float,
                 multiple_of: int = 1) -> tuple[Replay, int, float]:
    """Capture enough calls of ``step`` that one replay lasts about ``target_replay_ms``;
    returns the replay, its call count and one replay's GPU milliseconds."""
    def calls_for(call_ms: float) -> int:
        n = math.ceil(cfg.target_replay_ms / max(call_ms, 1e-6))
        n = max(multiple_of, min(cfg.max_graph_calls, n))
        return max(multiple_of, n // multiple_of * multiple_of)

    calls = calls_for(est_call_ms)
    replay = backend.capture(step, calls)
    one_ms = backend.time_gpu_ms(replay.replay, 1)
    if one_ms < cfg.target_replay_ms / 2 and calls < cfg.max_graph_calls:
        # the eager estimate held host time: size the graph on the GPU's own time
        better = calls_for(one_ms / calls)
        if better > calls:
            del replay
            calls = better
            replay = backend.capture(step, calls)
            one_ms = backend.time_gpu_ms(replay.replay, 1)
    return replay, calls, one_ms


def host_free(step: Callable[[], None], backend: StepBackend, monitor: EnergyMonitor, cfg: WindowConfig,
              est_call_ms: float, idle_power_w: float | None, power_limit_w: float | None,
              multiple_of: int = 1) -> dict[str, Any]:
    """GPU time per call, window power and energy per call of ``step`` replayed as a graph
    (eager fallback with the reason when it cannot be captured)."""
    row: dict[str, Any] = {}
    busy: Callable[[], None]
    if cfg.capture:
        try:
            replay, calls, one_ms = capture_step(step, backend, cfg, est_call_ms, multiple_of)
            row.update({"captured": True, "graph_calls": calls})
            busy = replay.replay
        except CaptureFailed as exc:
            row.update({"captured": False, "capture_error": str(exc)})
    else:
        row.update({"captured": False, "capture_error": "capture disabled"})
    if not row["captured"]:
        calls = 1
        busy = step
        one_ms = backend.time_gpu_ms(step, 1)
    busy = Paced(busy, backend, depth=2 if one_ms >= 0.5 else 8)
    reps = max(1, math.ceil(cfg.gpu_min_block_ms / max(one_ms, 1e-6)))

    def timed() -> list[float]:
        return [backend.time_gpu_ms(busy, reps) / (reps * calls) for _ in range(cfg.gpu_blocks)]

    times, m, info = timed_window(busy, timed, monitor, cfg, idle_power_w, power_limit_w,
                                  extra_timeout_s=one_ms / 1e3 * 2)
    gpu_ms, gpu_iqr = _median_iqr(times)
    row.update({
        "gpu_time_ms": gpu_ms,
        "gpu_time_iqr_ms": gpu_iqr,
        "gpu_timer_blocks": len(times),
        "gpu_calls_per_block": reps * calls,
        "gpu_power_w": m.power_w,
        "gpu_energy_mj": m.power_w * gpu_ms,  # W x ms = mJ
        **m.as_row("gpu_"),
        **{f"gpu_{k}": v for k, v in info.items()},
    })
    row.pop("gpu_calls", None)
    if idle_power_w is not None:
        row["gpu_dynamic_energy_mj"] = (m.power_w - idle_power_w) * gpu_ms
    return row


def _first_call(step: Callable[[], None], backend: StepBackend) -> dict[str, Any]:
    """Run the first call (allocations, library heuristics, lazy init) and time it apart."""
    t0 = time.perf_counter()
    step()
    backend.sync()
    return {"schema": ROW_SCHEMA, "first_call_ms": (time.perf_counter() - t0) * 1e3}


def measure_op(step: Callable[[], None], monitor: EnergyMonitor, cfg: WindowConfig, backend: StepBackend,
               inference: bool, idle_power_w: float | None = None, power_limit_w: float | None = None,
               instances: int = 1) -> dict[str, Any]:
    """One operation: eager time and host cost, then host-free time, power and energy."""
    import torch

    ctx = torch.inference_mode() if inference else torch.enable_grad()
    with ctx:
        row = _first_call(step, backend)
        for _ in range(2):
            step()
        row.update(eager_blocks(step, backend, cfg, monitor.sampler))
        row.update(host_free(step, backend, monitor, cfg, row["time_ms"], idle_power_w, power_limit_w,
                             multiple_of=max(1, instances)))
    if idle_power_w is not None:
        row["idle_power_w"] = idle_power_w
    return row


def measure_peak(step: Callable[[], None], backend: StepBackend, inference: bool) -> dict[str, Any]:
    """A step's peak device memory alone: a first call (allocations, library workspaces), then
    the allocator's peak over a second one.  Cheap, so networks measured before rows carried
    ``peak_memory_bytes`` get it without a full three-way measurement."""
    import torch

    ctx = torch.inference_mode() if inference else torch.enable_grad()
    with ctx:
        row = _first_call(step, backend)
        row["peak_memory_bytes"] = backend.peak_memory_bytes(step)
    return row


def measure_network(step: Callable[[], None], monitor: EnergyMonitor, cfg: WindowConfig, backend: StepBackend,
                    inference: bool, idle_power_w: float | None = None,
                    power_limit_w: float | None = None) -> dict[str, Any]:
    """A whole network: eager time and energy (window), host enqueue time of one step, then
    the step as one CUDA graph (time, power, energy)."""
    import torch

    ctx = torch.inference_mode() if inference else torch.enable_grad()
    with ctx:
        row = _first_call(step, backend)
        t0 = time.perf_counter()
        step()
        backend.sync()
        one_ms = (time.perf_counter() - t0) * 1e3
        n = max(1, math.ceil(cfg.eager_min_block_s * 1e3 / max(one_ms, 1e-6)))

        def eager_timed() -> list[float]:
            return timed_blocks(step, backend, n, cfg.eager_blocks)[1]

        times, m, info = timed_window(Paced(step, backend, 2), eager_timed, monitor, cfg, idle_power_w,
                                      power_limit_w,
                                      extra_timeout_s=one_ms / 1e3 * 2)
        time_ms, iqr = _median_iqr(times)
        row.update({"time_ms": time_ms, "time_iqr_ms": iqr, "eager_blocks": len(times),
                    "eager_calls_per_block": n, "power_w": m.power_w, "energy_mj": m.power_w * time_ms,
                    **m.as_row(), **info})
        with monitor.sampler.paused():  # one step's enqueue time, from an idle GPU
            host = timed_blocks(step, backend, 1, cfg.eager_blocks + 4)[0]
        row["host_ms"], row["host_iqr_ms"] = _median_iqr(host)
        row["host_min_ms"] = min(host)
        # The step's peak device memory (after warm-up, so library workspaces are in it).
        row["peak_memory_bytes"] = backend.peak_memory_bytes(step)
        row.update(host_free(step, backend, monitor, cfg, time_ms, idle_power_w, power_limit_w))
    if idle_power_w is not None:
        row["idle_power_w"] = idle_power_w
        row["dynamic_energy_mj"] = (row["power_w"] - idle_power_w) * row["time_ms"]
    return row


def measure_idle(sampler: Sampler, duration_s: float = 1.0, timeout_s: float = 3.0) -> dict[str, Any]:
    """Idle board power with the CUDA context alive, between two counter ticks."""
    m = EnergyMonitor(sampler, timeout_s).idle_window(duration_s)
    return {
        "idle_power_w": m.power_w,
        "idle_window_s": m.window_s,
        "idle_sm_clock_mhz": m.sm_clock_mhz,
        "idle_temperature_c": m.temperature_c,
        "t_s": time.time(),
    }


def tick_period_s(sampler: Sampler, duration_s: float = 1.0) -> float:
    """Median interval between counter updates seen over ``duration_s`` (for the report)."""
    t0 = time.perf_counter()
    time.sleep(duration_s)
    ticks = sampler.ticks_between(t0, time.perf_counter())
    gaps = [b.t_s - a.t_s for a, b in zip(ticks, ticks[1:], strict=False)]
    return statistics.median(gaps) if gaps else float("nan")


def default_backend() -> StepBackend:
    """CUDA graphs on a CUDA machine, the eager CPU stand-in elsewhere."""
    import torch

    if torch.cuda.is_available():
        from gpurec.device.graphs import CudaBackend

        return CudaBackend()
    from gpurec.device.graphs import CpuBackend

    return CpuBackend()


def measure_step(step: Callable[[], None], sampler: Sampler, cfg: WindowConfig, idle_power_w: float | None,
                 inference: bool, backend: StepBackend | None = None) -> dict[str, Any]:
    """:func:`measure_op` for callers that hold a sampler (the probe's sweeps)."""
    return measure_op(step, EnergyMonitor(sampler, cfg.tick_timeout_s), cfg, backend or default_backend(),
                      inference, idle_power_w)
