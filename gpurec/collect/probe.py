"""Measurements that justify the collection defaults (window length, instance count).

``gpurec probe --out DIR`` (:func:`run_probe`) measures, on the GPU at hand:
* the energy counter's update period and idle power;
* energy-per-call repeatability against the window length (several repeats each);
* time and energy per call against the number of pre-initialised instances.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from gpurec.collect.measure import WindowConfig, measure_idle, measure_step, tick_period_s
from gpurec.collect.runner import match_nvml_index
from gpurec.dataset.store import atomic_write_json
from gpurec.host import host_cpu

# (arch, batch, mode, kind, index of that kind in the network)
PROBE_OPS = [
    ("resnet50", 32, "inference", "Conv2d", 10),
    ("resnet50", 32, "training", "Conv2d", 10),
    ("resnet50", 1, "inference", "Conv2d", 10),
    ("vit_b_16", 8, "inference", "Linear", 2),
    ("resnet50", 32, "inference", "BatchNorm2d", 10),
    ("resnet50", 8, "inference", "ReLU", 3),
    ("mobilenet_v2", 32, "inference", "Conv2d", 5),
]


def _pick(arch: str, batch: int, mode: str, kind: str, idx: int) -> Any:
    from gpurec.ops import extract_operations

    ops = [o for o in extract_operations(arch, (batch, 3, 224, 224), mode=mode) if o.kind == kind]
    return ops[min(idx, len(ops) - 1)]


def run_probe(out: Path, windows: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0), repeats: int = 3,
              instances: tuple[int, ...] = (1, 2, 4, 8, 16, 32), log: Any = print) -> dict[str, Any]:
    import torch

    from gpurec.device import open_gpu
    from gpurec.device.sampler import Sampler

    dev = torch.device("cuda", 0)
    gpu = open_gpu(match_nvml_index(0))
    result: dict[str, Any] = {"gpu": gpu.info().as_dict(), "host_cpu": host_cpu(), "torch": torch.__version__,
                              "window_sweep": [], "instance_sweep": []}
    with Sampler(gpu) as sampler:
        result["tick_period_s"] = tick_period_s(sampler, 1.0)
        idle = measure_idle(sampler, 1.0)
        result["idle"] = idle
        log(f"tick period {result['tick_period_s'] * 1000:.1f} ms, idle {idle['idle_power_w']:.1f} W")
        for spec in PROBE_OPS[:4]:
            op = _pick(*spec)
            unit = op.materialize(device=dev, instances=4)
            for w in windows:
                for r in range(repeats):
                    t0 = time.perf_counter()
                    row = measure_step(unit.step, sampler, WindowConfig(min_window_s=w), idle["idle_power_w"],
                                       inference=op.mode == "inference")
                    row.update({"op": list(spec), "min_window_s": w, "repeat": r,
                                "gpu_time_s": time.perf_counter() - t0})
                    result["window_sweep"].append(row)
            del unit
            log(f"window sweep done for {spec}")
        for spec in PROBE_OPS:
            op = _pick(*spec)
            for n in instances:
                unit = op.materialize(device=dev, instances=n)
                row = measure_step(unit.step, sampler, WindowConfig(), idle["idle_power_w"],
                                   inference=op.mode == "inference")
                row.update({"op": list(spec), "instances": n, "param_bytes": op.params * 4})
                result["instance_sweep"].append(row)
                del unit
            log(f"instance sweep done for {spec}")
    result["summary"] = summarise(result)
    atomic_write_json(out / "probe.json", result)
    return result


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    """Energy-per-call CV across repeats for each (op, window)."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for row in result["window_sweep"]:
        groups.setdefault((json.dumps(row["op"]), row["min_window_s"]), []).append(row)
    out = []
    for (op, w), rows in sorted(groups.items()):
        e = [r["energy_mj"] for r in rows]
        t = [r["time_ms"] for r in rows]
        out.append({"op": json.loads(op), "min_window_s": w,
                    "energy_cv": statistics.pstdev(e) / statistics.mean(e) if len(e) > 1 else None,
                    "time_cv": statistics.pstdev(t) / statistics.mean(t) if len(t) > 1 else None,
                    "gpu_time_s": statistics.mean(r["gpu_time_s"] for r in rows)})
    return {"window": out}
