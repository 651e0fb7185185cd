"""Resumable, sharded collection: one worker per GPU, one JSON line per measured row.

The energy counter is per board, so never two workers on one GPU.  Each worker writes its
own shard file; ``gpurec dataset build`` merges shards into Parquet.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import platform
import random
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpurec.collect.measure import (
    ROW_SCHEMA,
    WindowConfig,
    measure_idle,
    measure_network,
    measure_op,
    measure_peak,
    tick_period_s,
)
from gpurec.collect.plan import WorkItem, parse_set_key
from gpurec.dataset.store import (
    JsonlShard,
    atomic_write_json,
    is_shard_name,
    orphaned_temp_files,
    raw_row_files,
    read_jsonl,
)
from gpurec.device.graphs import CpuBackend, StepBackend
from gpurec.device.window import EnergyMonitor
from gpurec.host import host_cpu, run_host_bench
from gpurec.ops.cache import SetOperations
from gpurec.ops.precision import CAST, DEFAULT_PRECISION, check_precision

L2_BYTES_DEFAULT = 50 * 2**20


class ContextLost(RuntimeError):
    """The CUDA context is gone (a device-side assert): this process can measure nothing more.
    The row that hit it is recorded; a fresh process resumes after it."""


class TooManyFailures(RuntimeError):
    """Several rows in a row failed: something is wrong with the machine or the setup."""


class CollectionInProgress(RuntimeError):
    """Another collection is writing to the same output (it would measure every row again and
    load the same board twice)."""


@contextlib.contextmanager
def output_lock(out_dir: Path, name: str = ".collect.lock") -> Iterator[Path]:
    """Hold an exclusive lock on ``out_dir/name`` (fcntl, released when the process dies, so a
    killed run never leaves a stale lock); raise CollectionInProgress if another process holds it."""
    import fcntl

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    fh = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held open for the lock's lifetime
    try:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            raise CollectionInProgress(f"{out_dir} is in use by another gpurec collect ({holder}); wait for it to "
                                       "finish or pass another --out") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} since {datetime.now(timezone.utc).isoformat(timespec='seconds')}\n")
        fh.flush()
        yield path
    finally:
        fh.close()  # closing releases the lock


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
    min_schema: int = ROW_SCHEMA  # rows measured by an older method count as not done
    in_network: bool = True  # the profiler attribution pass for network rows (CUDA only)
    host_bench_blocks: int = 7  # host-bench at a run's start and end (0: skip, tests only)


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
    """A whole network as one step (forward, or forward + backward with a random gradient).

    A torchvision architecture takes a random float image batch; a sequence architecture
    (gpurec.seqmodels) takes random int64 token ids in [0, vocab), shape (batch, seq_len).
    With ``checkpoint_blocks`` every repeated block runs inside torch.utils.checkpoint.

    At a cast precision ("bf16", "fp16") the model and its input are in that dtype; a mixed
    precision or "tf32" is the :meth:`scope` its calls run inside (entered once around the
    timing, as a user enters autocast once around the step)."""

    def __init__(self, arch: str, input_shape: tuple[int, ...], mode: str, device: Any, seed: int = 0,
                 precision: str = DEFAULT_PRECISION, checkpoint_blocks: bool = False):
        import torch

        from gpurec.sets import is_sequence_arch

        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        torch.manual_seed(seed)
        # Built directly on the device: the real initialisers are fast there and set index
        # buffers (e.g. Swin's relative_position_index) that random init would corrupt.
        if is_sequence_arch(arch):
            from gpurec import seqmodels

            with torch.device(device):
                model = seqmodels.build(arch)
            self.x = seqmodels.random_token_ids(model, input_shape, device=device, generator=gen)
        else:
            import torchvision.models as tvm

            from gpurec.synthsets import SYNTH_BUILDERS, build_synthetic

            kwargs = {"init_weights": False} if arch in ("googlenet", "inception_v3") else {}
            with torch.device(device):
                model = (build_synthetic(arch) if arch in SYNTH_BUILDERS
                         else tvm.get_model(arch, weights=None, **kwargs))
            self.x = torch.randn(input_shape, device=device, generator=gen)
        if checkpoint_blocks:  # gpurec.ops.checkpointing, as `predict --checkpoint-blocks` predicts it
            from gpurec.ops.checkpointing import checkpoint_blocks as wrap

            self.checkpointed_blocks = wrap(model)
        self._set_up(model, (self.x,), {}, mode, device, gen, precision)

    def _set_up(self, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], mode: str, device: Any, gen: Any,
                precision: str) -> None:
        """The step's module and inputs (cast at a cast precision) and, in training, its output gradients."""
        import torch
        from torch.utils._pytree import tree_flatten

        from gpurec.ops.precision import low_dtype

        self.training = mode == "training"
        self.precision = check_precision(precision)
        self.device = device
        model.train(self.training)
        if precision in CAST:
            model = model.to(low_dtype(precision))
            cast = [t.to(low_dtype(precision)) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                    for t in (*args, *kwargs.values())]
            args, kwargs = tuple(cast[:len(args)]), dict(zip(kwargs, cast[len(args):], strict=True))
        self.args, self.kwargs = args, kwargs
        self.x = args[0] if args else None
        self.model = model
        self.backward = self.training
        self._flatten = tree_flatten
        if self.training:
            with self.scope():
                outs = [t for t in tree_flatten(model(*args, **kwargs))[0]
                        if isinstance(t, torch.Tensor) and t.requires_grad]
            # output gradients in each output's dtype (bf16 under autocast or a cast model)
            self._grads = [torch.randn(t.shape, device=device, generator=gen).to(t.dtype) for t in outs]
            model.zero_grad(set_to_none=True)
        self.instances = 1

    def scope(self) -> Any:
        """Enter once around the calls of :meth:`step` (gpurec.ops.units.precision_scope)."""
        from gpurec.ops.units import precision_scope

        return precision_scope(self.precision, self.device)

    def step(self) -> None:
        import torch

        out = self.model(*self.args, **self.kwargs)
        if self.training:
            outs = [t for t in self._flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
            torch.autograd.backward(outs, self._grads)
            self.model.zero_grad(set_to_none=True)

    def param_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())


class ModuleUnit(NetworkUnit):
    """A caller's nn.Module as one step (gpurec.validate.validate_module): a copy of the module
    and of its example inputs (a tensor, a tuple of them, or a dict passed by keyword) on
    ``device``, the inputs' values kept (lengths for packing, token ids); the caller's module is
    not moved."""

    def __init__(self, model: Any, example_inputs: Any, mode: str, device: Any, seed: int = 0,
                 precision: str = DEFAULT_PRECISION):
        import copy
        from collections.abc import Mapping

        import torch

        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        torch.manual_seed(seed)
        model = copy.deepcopy(model).to(device)

        def moved(t: Any) -> Any:
            return t.to(device) if isinstance(t, torch.Tensor) else t

        if isinstance(example_inputs, Mapping):
            args, kwargs = (), {k: moved(v) for k, v in example_inputs.items()}
        else:
            items = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
            args, kwargs = tuple(moved(t) for t in items), {}
        self._set_up(model, args, kwargs, mode, device, gen, precision)


def done_ids(out_dir: Path, retry_failed: bool = False, min_schema: int = 1) -> set[str]:
    """Rows already measured in any shard of ``out_dir`` (failed ones too, unless retried).

    Rows of an older measuring method (``schema`` below ``min_schema``; rows without one are
    schema 1, eager only) are kept in the data but do not count as done, and neither do the rows
    of a temporary file an interrupted write left behind (``.rows-*.tmp*``)."""
    ids: set[str] = set()
    for p in raw_row_files(out_dir, prefix="*"):  # includes seed-rows-* copied from datasets/
        if not is_shard_name(p.name):  # an interrupted write's temporary file: never committed
            continue
        for row in read_jsonl(p):
            if row.get("repeat") or (retry_failed and row.get("status") != "ok"):
                continue
            if int(row.get("schema", 1)) < min_schema:
                continue
            ids.add(row["id"])
    return ids


def _grouped_by_set(items: list[WorkItem]) -> list[WorkItem]:
    """Items of one (set, mode) together, sets in plan order: each set is extracted once per
    worker while its rows are measured (extraction takes ~1 s a set on the GPU hosts, which
    the plan's round-robin order paid again and again)."""
    first: dict[tuple[str, str, str], int] = {}
    for i, w in enumerate(items):
        first.setdefault((w.set_key, w.mode, w.precision), i)
    return sorted(items, key=lambda w: first[(w.set_key, w.mode, w.precision)])


def match_nvml_index(cuda_index: int) -> int:
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


def _host_bench(cfg: CollectConfig, use_gpu: bool) -> dict[str, Any] | None:
    if cfg.host_bench_blocks <= 0:
        return None
    try:
        return run_host_bench(use_gpu=use_gpu, blocks=cfg.host_bench_blocks).to_dict()
    except Exception as exc:  # a failed benchmark is recorded, never a reason to lose the run
        return {"error": f"{type(exc).__name__}: {exc}"}


def run_worker(items: Sequence[WorkItem], out_dir: Path, cfg: CollectConfig, shard_name: str = "0",
               device: str = "cuda:0", log: Callable[[str], None] = print,
               backend: StepBackend | None = None) -> dict[str, Any]:
    """Measure ``items`` not yet in ``out_dir`` on one GPU; return a summary.

    ``device="cpu"`` runs the same path on the CPU against whatever NVML backend is set
    (the tests' fake) and ``backend`` (default: CUDA graphs on CUDA, eager on the CPU)."""
    import torch

    from gpurec.device import open_gpu
    from gpurec.device.sampler import Sampler

    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            from gpurec.device import NVMLUnavailable

            raise NVMLUnavailable("CUDA is not available to torch here: collection needs an NVIDIA GPU.")
        torch.cuda.set_device(dev)
        gpu = open_gpu(match_nvml_index(dev.index or 0))
    else:
        gpu = open_gpu(0)
    device = dev
    if backend is None:
        from gpurec.device.graphs import CudaBackend

        backend = CudaBackend() if dev.type == "cuda" else CpuBackend()
    info = gpu.info().as_dict()
    run_id = f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}-{shard_name}-{uuid.uuid4().hex[:6]}"
    prov = provenance(info, cfg)
    prov["run_id"] = run_id
    prov["host_bench"] = _host_bench(cfg, dev.type == "cuda")
    prov_path = out_dir / f"provenance-{run_id}.json"
    atomic_write_json(prov_path, prov)
    done = done_ids(out_dir, cfg.retry_failed, cfg.min_schema)
    for name, n in orphaned_temp_files(out_dir).items():
        log(f"[{shard_name}] {out_dir / name}: temporary file of an interrupted write ({n} line(s)); its rows do "
            "not count as measured (kept for inspection)")
    todo = _grouped_by_set([w for w in items if w.id not in done])
    log(f"[{shard_name}] {info['name']} (nvml {gpu.index}): {len(todo)} to measure, {len(items) - len(todo)} done")
    source = OperationSource()
    rng = random.Random(f"{cfg.seed}-{shard_name}")
    measured: list[WorkItem] = []
    summary = {"run_id": run_id, "ok": 0, "failed": 0, "repeats": 0, "gpu": info["name"]}
    t_start = time.perf_counter()
    ctx = _Ctx(source, device, cfg, backend, info.get("power_limit_w"))
    shard_path = out_dir / f"rows-{shard_name}.jsonl"
    with Sampler(gpu) as sampler, JsonlShard(shard_path, on_repair=lambda b: log(f"[{shard_name}] resume: {b.describe()}")
                                             ) as shard:
        ctx.monitor = EnergyMonitor(sampler, cfg.window.tick_timeout_s)
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
            row = _measure_item(w, ctx, idle["idle_power_w"])
            row.update({"run_id": run_id, "gpu": info["name"], "gpu_uuid": info["uuid"]})
            shard.append(row)
            if row.get("fatal"):
                log(f"[{shard_name}] CUDA context lost at {w.id}: {row['error'][:200]}; exiting to restart")
                raise ContextLost(f"CUDA context lost at {w.id}: {row['error'][:300]}")
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
                rep = _measure_item(again, ctx, idle["idle_power_w"])
                rep.update({"run_id": run_id, "gpu": info["name"], "repeat": True, "id": again.id + ":rep"})
                shard.append(rep)
                summary["repeats"] += 1
            if (n + 1) % 50 == 0:
                rate = (n + 1) / (time.perf_counter() - t_start)
                log(f"[{shard_name}] {n + 1}/{len(todo)} rows, {rate:.2f} rows/s, "
                    f"ETA {(len(todo) - n - 1) / rate / 60:.1f} min")
            sampler.trim(time.perf_counter() - 30.0)
    prov["host_bench_end"] = _host_bench(cfg, dev.type == "cuda")
    atomic_write_json(prov_path, prov)
    summary["elapsed_s"] = time.perf_counter() - t_start
    log(f"[{shard_name}] done: {json.dumps(summary)}")
    return summary


@dataclass
class _Ctx:
    """What every row's measurement needs from the run."""

    source: OperationSource
    device: Any
    cfg: CollectConfig
    backend: StepBackend
    power_limit_w: float | None
    monitor: EnergyMonitor | None = None


def _measure_item(w: WorkItem, ctx: _Ctx, idle_power_w: float) -> dict[str, Any]:
    import torch

    source, device, cfg, monitor = ctx.source, ctx.device, ctx.cfg, ctx.monitor
    assert monitor is not None
    inference = w.mode == "inference"

    t0 = time.perf_counter()
    row: dict[str, Any] = {"id": w.id, "schema": ROW_SCHEMA, "item": w.item, "mode": w.mode, "op_kind": w.kind,
                           "set_key": w.set_key, "model_sets": w.model_sets, "precision": w.precision,
                           "t_unix": time.time()}
    if w.item == "op":
        row["op_signature"] = w.key
    unit = None
    if w.item in ("network", "peak"):
        # Earlier rows' models, graphs and autograd state can sit in reference cycles that
        # only the cyclic collector frees; until it runs they stay allocated and inflate this
        # row's peak (rows measured without this carried gigabytes of them).  What is still
        # allocated after it (library workspaces) is recorded so the peak can be judged.
        gc.collect()
        row["memory_allocated_before_bytes"] = ctx.backend.allocated_bytes()
    try:
        if w.item in ("network", "peak"):
            s = parse_set_key(w.key)
            unit = NetworkUnit(s.arch, s.input_shape, w.mode, device, seed=cfg.seed, precision=w.precision)
        else:
            op = (source.get(w.set_key, w.mode, w.key) if w.precision == DEFAULT_PRECISION
                  else source.get(w.set_key, w.mode, w.key, precision=w.precision))
            param_bytes = op.params * torch.empty((), dtype=getattr(torch, op.dtype)).element_size()
            unit = op.materialize(device=device, instances=auto_instances(param_bytes, cfg), seed=cfg.seed)
        row["instances"] = unit.instances
        row["backward"] = bool(getattr(unit, "backward", False))
        ctx.backend.sync()
        row["setup_ms"] = (time.perf_counter() - t0) * 1000.0
        # autocast / TF32 around the whole measurement (a unit without a scope is fp32)
        scope = unit.scope() if hasattr(unit, "scope") else contextlib.nullcontext()
        with scope:
            if w.item == "peak":
                row.update(measure_peak(unit.step, ctx.backend, inference))
            elif w.item == "network":
                row.update(measure_network(unit.step, monitor, cfg.window, ctx.backend, inference, idle_power_w,
                                           ctx.power_limit_w))
                if cfg.in_network and getattr(device, "type", str(device)) == "cuda":
                    row.update(in_network_fields(unit, source, w.key, w.mode, w.precision))
            else:
                row.update(measure_op(unit.step, monitor, cfg.window, ctx.backend, inference, idle_power_w,
                                      ctx.power_limit_w, instances=unit.instances))
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


def in_network_fields(unit: NetworkUnit, source: OperationSource, set_key: str, mode: str,
                      precision: str = DEFAULT_PRECISION) -> dict[str, Any]:
    """A network row's in-network attribution (collection and validation); its failure is
    recorded on the row, never a lost row.  At a mixed precision the kernels of the casts
    autocast inserts are attributed to the operation whose call made them."""
    from gpurec.collect.in_network import columnar, profile_network

    inference = mode == "inference"
    try:
        ops = source.operations(set_key, mode) if precision == DEFAULT_PRECISION else \
            source.operations(set_key, mode, precision)
        rows, summary = profile_network(unit.model, unit.x, None if inference else unit._grads, ops, inference)
    except Exception as exc:
        return {"in_network_error": f"{type(exc).__name__}: {str(exc)[:400]}"}
    return {"in_network": columnar(rows), **{f"in_network_{k}": v for k, v in summary.items()}}


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
