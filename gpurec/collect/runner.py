"""Resumable, sharded collection: one worker per GPU, one JSON line per measured row.

The energy counter is per board, so never two workers on one GPU.  Each worker writes its
own shard file; ``gpurec dataset build`` merges shards into Parquet.
"""

from __future__ import annotations

import json
import os
import platform
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpurec.collect.measure import WindowConfig, measure_idle, measure_step, tick_period_s
from gpurec.collect.plan import ModelInputSet, WorkItem
from gpurec.dataset.store import JsonlShard, atomic_write_json, read_jsonl
from gpurec.host import host_cpu
from gpurec.ops.cache import SetOperations

L2_BYTES_DEFAULT = 50 * 2**20


class TooManyFailures(RuntimeError):
    """Several rows in a row failed: something is wrong with the machine or the setup."""


@dataclass
class CollectConfig:
    window: WindowConfig = field(default_factory=WindowConfig)
    max_instances: int = 4
    instance_budget_bytes: int = 2 * 2**30
    l2_bytes: int = L2_BYTES_DEFAULT
    time_budget_s: float | None = None
    idle_every_s: float = 120.0
    repeat_every: int = 40  # re-measure an earlier row every N rows (repeatability)
    max_consecutive_failures: int = 12
    retry_failed: bool = False
    seed: int = 0


def provenance(gpu_info: dict[str, Any], cfg: CollectConfig) -> dict[str, Any]:
    import torch

    return {
        "gpu": gpu_info,
        "torch": torch.__version__,
        "torchvision": _version("torchvision"),
        "cuda_runtime": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "host_cpu": host_cpu(),
        "host_cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "clocks": "default (observed, not locked)",
        "settings": {**asdict(cfg), "window": asdict(cfg.window)},
    }


def _version(mod: str) -> str:
    try:
        return __import__(mod).__version__
    except Exception:
        return "unknown"


def auto_instances(param_bytes: int, cfg: CollectConfig) -> int:
    """Enough instances that their weights together exceed L2 (so weights come from DRAM
    as in a network), capped by ``max_instances`` and a memory budget."""
    if param_bytes <= 0:
        return 1
    n = -(-cfg.l2_bytes // param_bytes)  # ceil
    n = min(n, cfg.max_instances, max(1, cfg.instance_budget_bytes // param_bytes))
    return max(1, int(n))


# Planned signatures are looked up in the one shared extraction cache.
OperationSource = SetOperations


class NetworkUnit:
    """A whole network as one step (forward, or forward + backward with a random gradient)."""

    def __init__(self, arch: str, input_shape: tuple[int, ...], mode: str, device: Any, seed: int = 0):
        import torch
        import torchvision.models as tvm
        from torch.utils._pytree import tree_flatten

        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        torch.manual_seed(seed)
        # Built directly on the device: the real initialisers are fast there and set index
        # buffers (e.g. Swin's relative_position_index) that random init would corrupt.
        kwargs = {"init_weights": False} if arch in ("googlenet", "inception_v3") else {}
        with torch.device(device):
            model = tvm.get_model(arch, weights=None, **kwargs)
        self.training = mode == "training"
        model.train(self.training)
        self.model = model
        self.x = torch.randn(input_shape, device=device, generator=gen)
        self.backward = self.training
        self._flatten = tree_flatten
        if self.training:
            outs = [t for t in tree_flatten(model(self.x))[0] if isinstance(t, torch.Tensor) and t.requires_grad]
            self._grads = [torch.randn(t.shape, device=device, generator=gen) for t in outs]
            model.zero_grad(set_to_none=True)
        self.instances = 1

    def step(self) -> None:
        import torch

        out = self.model(self.x)
        if self.training:
            outs = [t for t in self._flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
            torch.autograd.backward(outs, self._grads)
            self.model.zero_grad(set_to_none=True)

    def param_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())


def done_ids(out_dir: Path, retry_failed: bool = False) -> set[str]:
    """Rows already measured in any shard of ``out_dir`` (failed ones too, unless retried)."""
    ids: set[str] = set()
    for p in sorted(out_dir.glob("*rows-*.jsonl")):  # includes seed-rows-* copied from datasets/
        for row in read_jsonl(p):
            if row.get("repeat") or (retry_failed and row.get("status") != "ok"):
                continue
            ids.add(row["id"])
    return ids


def _match_nvml_index(cuda_index: int) -> int:
    """NVML index of the board torch calls ``cuda:cuda_index`` (matched by UUID)."""
    import torch

    from gpurec.device import list_gpus

    try:
        u = str(torch.cuda.get_device_properties(cuda_index).uuid)
    except Exception:
        return cuda_index
    for info in list_gpus():
        if info.uuid.replace("GPU-", "") == u.replace("GPU-", ""):
            return info.index
    return cuda_index


def run_worker(items: Sequence[WorkItem], out_dir: Path, cfg: CollectConfig, shard_name: str = "0",
               device: str = "cuda:0", log: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure ``items`` not yet in ``out_dir`` on one GPU; return a summary.

    ``device="cpu"`` runs the same path on the CPU against whatever NVML backend is set
    (the tests' fake)."""
    import torch

    from gpurec.device import open_gpu
    from gpurec.device.sampler import Sampler

    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            from gpurec.device import NVMLUnavailable

            raise NVMLUnavailable("CUDA is not available to torch here: collection needs an NVIDIA GPU.")
        torch.cuda.set_device(dev)
        gpu = open_gpu(_match_nvml_index(dev.index or 0))
    else:
        gpu = open_gpu(0)
    device = dev
    info = gpu.info().as_dict()
    run_id = f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}-{shard_name}-{uuid.uuid4().hex[:6]}"
    prov = provenance(info, cfg)
    prov["run_id"] = run_id
    atomic_write_json(out_dir / f"provenance-{run_id}.json", prov)
    done = done_ids(out_dir, cfg.retry_failed)
    todo = [w for w in items if w.id not in done]
    log(f"[{shard_name}] {info['name']} (nvml {gpu.index}): {len(todo)} to measure, {len(items) - len(todo)} done")
    source = OperationSource()
    rng = random.Random(f"{cfg.seed}-{shard_name}")
    measured: list[WorkItem] = []
    summary = {"run_id": run_id, "ok": 0, "failed": 0, "repeats": 0, "gpu": info["name"]}
    t_start = time.perf_counter()
    with Sampler(gpu) as sampler, JsonlShard(out_dir / f"rows-{shard_name}.jsonl") as shard:
        idle = measure_idle(sampler, 1.0)
        period = tick_period_s(sampler, 0.5)
        summary["tick_period_s"] = period
        log(f"[{shard_name}] idle {idle['idle_power_w']:.1f} W, energy counter updates every {period * 1000:.0f} ms")
        shard.append({"id": f"idle:{run_id}:0", "item": "idle", "run_id": run_id, "repeat": True,
                      "gpu": info["name"], "tick_period_s": period, **idle})
        consecutive = 0
        for n, w in enumerate(todo):
            elapsed = time.perf_counter() - t_start
            if cfg.time_budget_s is not None and elapsed > cfg.time_budget_s:
                log(f"[{shard_name}] time budget reached after {n} rows")
                break
            if time.time() - idle["t_s"] > cfg.idle_every_s:
                idle = measure_idle(sampler, 0.5)
                shard.append({"id": f"idle:{run_id}:{n + 1}", "item": "idle", "run_id": run_id, "repeat": True,
                              "gpu": info["name"], **idle})
            row = _measure_item(w, source, device, sampler, cfg, idle["idle_power_w"])
            row.update({"run_id": run_id, "gpu": info["name"], "gpu_uuid": info["uuid"]})
            shard.append(row)
            if row.get("fatal"):
                log(f"[{shard_name}] CUDA context lost at {w.id}: {row['error'][:200]}; exiting to restart")
                shard.close()
                os._exit(CONTEXT_LOST_EXIT)
            if row["status"] == "ok":
                summary["ok"] += 1
                consecutive = 0
                measured.append(w)
            else:
                summary["failed"] += 1
                consecutive += 1
                log(f"[{shard_name}] failed {w.id} ({w.kind}): {row['error'][:200]}")
                if consecutive >= cfg.max_consecutive_failures:
                    raise TooManyFailures(f"{consecutive} consecutive failures; last: {row['error'][:300]}")
            if cfg.repeat_every and measured and (n + 1) % cfg.repeat_every == 0:
                again = rng.choice(measured)
                rep = _measure_item(again, source, device, sampler, cfg, idle["idle_power_w"])
                rep.update({"run_id": run_id, "gpu": info["name"], "repeat": True, "id": again.id + ":rep"})
                shard.append(rep)
                summary["repeats"] += 1
            if (n + 1) % 50 == 0:
                rate = (n + 1) / (time.perf_counter() - t_start)
                log(f"[{shard_name}] {n + 1}/{len(todo)} rows, {rate:.2f} rows/s, "
                    f"ETA {(len(todo) - n - 1) / rate / 60:.1f} min")
            sampler.trim(time.perf_counter() - 30.0)
    summary["elapsed_s"] = time.perf_counter() - t_start
    log(f"[{shard_name}] done: {json.dumps(summary)}")
    return summary


def _measure_item(w: WorkItem, source: OperationSource, device: Any, sampler: Any, cfg: CollectConfig,
                  idle_power_w: float) -> dict[str, Any]:
    import torch

    t0 = time.perf_counter()
    row: dict[str, Any] = {"id": w.id, "item": w.item, "mode": w.mode, "op_kind": w.kind,
                           "set_key": w.set_key, "model_sets": w.model_sets, "t_unix": time.time()}
    if w.item == "op":
        row["op_signature"] = w.key
    unit = None
    try:
        if w.item == "network":
            s = ModelInputSet.parse(w.key)
            unit = NetworkUnit(s.arch, s.input_shape, w.mode, device, seed=cfg.seed)
        else:
            op = source.get(w.set_key, w.mode, w.key)
            param_bytes = op.params * torch.empty((), dtype=getattr(torch, op.dtype)).element_size()
            unit = op.materialize(device=device, instances=auto_instances(param_bytes, cfg), seed=cfg.seed)
        row["instances"] = unit.instances
        row["backward"] = bool(getattr(unit, "backward", False))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        row["setup_ms"] = (time.perf_counter() - t0) * 1000.0
        row.update(measure_step(unit.step, sampler, cfg.window, idle_power_w, inference=w.mode == "inference"))
        row["status"] = "ok"
    except torch.cuda.OutOfMemoryError as exc:
        row.update({"status": "failed", "error": f"CUDA out of memory: {str(exc)[:300]}"})
    except Exception as exc:  # an unsupported operation must not stop the run
        row.update({"status": "failed", "error": f"{type(exc).__name__}: {str(exc)[:500]}"})
        if _cuda_context_lost():
            row["fatal"] = True
    finally:
        del unit
        if row.get("status") != "ok" and torch.cuda.is_available():
            torch.cuda.empty_cache()
    row["row_wall_ms"] = (time.perf_counter() - t0) * 1000.0
    return row


def _cuda_context_lost() -> bool:
    """A device-side assert poisons the CUDA context: every later call fails."""
    import torch

    if not torch.cuda.is_available():
        return False
    try:
        torch.cuda.synchronize()
        return False
    except Exception:
        return True


CONTEXT_LOST_EXIT = 3


def launch_devices(devices: Sequence[int], argv: Sequence[str], log: Callable[[str], None] = print) -> int:
    """One worker process per local GPU, each its own shard; returns the worst exit code."""
    n = len(devices)
    t0 = time.time()

    def start(i: int, dev: int, budget_s: float | None) -> subprocess.Popen[bytes]:
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(dev), CUDA_DEVICE_ORDER="PCI_BUS_ID")
        extra = ["--time-budget-s", f"{budget_s:.0f}"] if budget_s is not None else []
        cmd = [sys.executable, "-m", "gpurec.collect", *argv, *extra, "--shard", f"{i}/{n}", "--worker"]
        log(f"worker {i}/{n} on GPU {dev}: {' '.join(cmd)}")
        return subprocess.Popen(cmd, env=env)

    budget = _option_float(argv, "--time-budget-s")
    argv = _without_option(list(argv), "--time-budget-s")
    procs = {i: start(i, dev, budget) for i, dev in enumerate(devices)}
    codes: dict[int, int] = {}
    while procs:
        time.sleep(0.5)
        for i, p in list(procs.items()):
            rc = p.poll()
            if rc is None:
                continue
            del procs[i]
            left = None if budget is None else budget - (time.time() - t0)
            if rc == CONTEXT_LOST_EXIT and (left is None or left > 30):
                procs[i] = start(i, devices[i], left)  # resumes: done rows are skipped
            else:
                codes[i] = rc
    return max(codes.values()) if codes else 0


def _option_float(argv: Sequence[str], name: str) -> float | None:
    for j, a in enumerate(argv):
        if a == name and j + 1 < len(argv):
            return float(argv[j + 1])
        if a.startswith(name + "="):
            return float(a.split("=", 1)[1])
    return None


def _without_option(argv: list[str], name: str) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == name:
            skip = True
        elif not a.startswith(name + "="):
            out.append(a)
    return out
