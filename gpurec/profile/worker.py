"""Child process that runs one network and records one stable iteration.

``python -m gpurec.profile.worker SPEC.json`` runs the phase a :class:`WorkerSpec` file
names (gpurec.profile.api writes it; there is no argument parser):

- ``phase="trace"`` warms up until an iteration time is stable, then records one iteration
  with torch.profiler (every module annotated) and writes ``trace.json.gz`` and
  ``worker_trace.json``.
- ``phase="ncu"`` is what runs under ncu: ``warmup_iters`` unprofiled iterations, then the
  next one inside cudaProfilerStart/Stop, so that ncu (``--profile-from-start off``)
  collects counters for exactly the same iteration index as the trace.

Both phases live in fresh processes so that the CUPTI tracing of one never shares a process
with ncu's counters.  CPU dry run (no GPU needed): ``phase="trace", device="cpu"``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpurec.dataset.store import atomic_write_json, read_spec

ITER_NAME = "gpurec_iter"
PHASES = ("trace", "ncu")


@dataclass
class WorkerSpec:
    """What one worker process runs; written as JSON by the parent, read by the child."""

    model: str  # torchvision model name (a label only with model_file)
    batch_size: int
    resolution: int = 224
    mode: str = "inference"
    precision: str = "fp32"
    device: str = "cuda:0"
    phase: str = "trace"
    out_dir: str | None = None
    model_file: str | None = None  # a saved nn.Module to load instead of the torchvision model
    model_globals: tuple[str, ...] = ()  # the globals model_file may use (weights-only load allows no others)
    warmup_iters: int = 0  # ncu phase: iterations before the profiled one
    max_warmup_iters: int = 40
    max_warmup_s: float = 20.0
    stable_window: int = 5
    stable_tol: float = 0.02
    keep_raw_trace: bool = False

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, not {self.phase!r}")
        if self.phase == "trace" and not self.out_dir:
            raise ValueError("the trace phase needs out_dir")

    def write(self, path: Path) -> Path:
        atomic_write_json(path, asdict(self))
        return path

    @classmethod
    def read(cls, path: Path | str) -> WorkerSpec:
        """The spec in ``path``; ValueError names unknown or missing fields."""
        return read_spec(cls, path, "worker spec")


def first_stable_iteration(times_ms: list[float], window: int = 5, tol: float = 0.02) -> int | None:
    """Index of the first iteration within ``tol`` of the median of the ``window`` before it."""
    for i in range(window, len(times_ms)):
        med = statistics.median(times_ms[i - window:i])
        if med > 0 and abs(times_ms[i] - med) <= tol * med:
            return i
    return None


@dataclass
class Workload:
    """A ready-to-run training or inference step and what it needs."""

    model: Any
    loss_fn: Any
    step: Callable[[], None]
    sync: Callable[[], None]
    device: Any
    n_params: int
    num_classes: int


def _autocast(torch: Any, device_type: str, precision: str) -> contextlib.AbstractContextManager[Any]:
    if precision == "bf16":
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
    if precision == "fp16":
        return torch.autocast(device_type=device_type, dtype=torch.float16)
    return contextlib.nullcontext()


def _logits(out: Any) -> Any:
    if hasattr(out, "logits"):
        return out.logits
    if isinstance(out, (tuple, list)):
        return out[0]
    return out


class UnsafeModelFile(ValueError):
    """A saved module needs a global its saver did not declare, or is not an nn.Module."""


def _resolve_global(name: str) -> Any:
    """``a.b.C`` or ``a.b.C.Inner`` -> the object, importing the longest module prefix."""
    import importlib

    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise UnsafeModelFile(f"cannot import {name!r} named by the model file's saver")


def module_globals(model_file: str | Path) -> list[str]:
    """The globals (module classes, and e.g. ``functools.partial``) a torch.save'd module needs
    beyond tensors and containers: what its saver passes as ``--model-globals``."""
    import torch

    return sorted(torch.serialization.get_unsafe_globals_in_checkpoint(str(model_file)))


def load_module_file(model_file: str | Path, allowed_globals: Sequence[str]) -> Any:
    """A torch.save'd nn.Module, loaded without running pickled code.

    ``torch.load(weights_only=True)`` rebuilds only tensors, containers and the globals
    allowlisted here: exactly ``allowed_globals``, which the process that saved the module
    declares on the command line (``module_globals``).  A file needing any other global (a
    replaced or foreign file: pickle could otherwise call anything, e.g. ``os.system``) is
    refused before loading, and the result must be an nn.Module.
    """
    import torch

    needed = module_globals(model_file)
    undeclared = sorted(set(needed) - set(allowed_globals))
    if undeclared:
        raise UnsafeModelFile(
            f"{model_file} needs globals its saver did not declare: {undeclared[:8]}; refusing to load it. "
            "Save the module with gpurec.profile.profile_network (which declares them), or pass the "
            "globals you trust with --model-globals")
    allowed = [_resolve_global(g) for g in needed]
    with torch.serialization.safe_globals(allowed):
        model = torch.load(str(model_file), map_location="cpu", weights_only=True)
    if not isinstance(model, torch.nn.Module):
        raise UnsafeModelFile(f"{model_file} holds a {type(model).__name__}, not an nn.Module")
    return model


def build_workload(
    model_name: str,
    batch_size: int,
    resolution: int,
    mode: str,
    precision: str,
    device_str: str,
    model_file: str | None = None,
    model_globals: Sequence[str] = (),
) -> Workload:
    """Model, random inputs on the device and a step closure; identical in both phases.

    ``model_file`` is loaded with ``load_module_file`` (no pickled code runs), allowing only
    ``model_globals``."""
    import torch

    torch.manual_seed(0)
    device = torch.device(device_str)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = False  # deterministic algorithm choice across processes
    if precision == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if model_file:
        model = load_module_file(model_file, model_globals)
    else:
        import torchvision

        model = torchvision.models.get_model(model_name, weights=None)
    model = model.to(device)
    x = torch.randn(batch_size, 3, resolution, resolution, device=device)
    with torch.no_grad():  # learn the output width once (same in both phases)
        model.eval()
        num_classes = int(_logits(model(x[:1])).shape[-1])
    y = torch.randint(0, num_classes, (batch_size,), device=device)
    loss_fn = torch.nn.CrossEntropyLoss().to(device)
    ac = functools.partial(_autocast, torch, device.type, precision)

    if mode == "inference":
        model.eval()

        def step() -> None:
            with torch.inference_mode(), ac():
                model(x)
    elif mode == "training":
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            with ac():
                loss = loss_fn(_logits(model(x)), y)
            loss.backward()
            opt.step()
    else:
        raise ValueError(f"mode must be 'inference' or 'training', not {mode!r}")

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    n_params = sum(p.numel() for p in model.parameters())
    return Workload(model, loss_fn, step, sync, device, n_params, num_classes)


@contextlib.contextmanager
def module_annotations(model: Any, loss_fn: Any) -> Iterator[None]:
    """Open ``record_function("module::<name>::<type>")`` around every module's forward."""
    from torch.autograd.profiler import record_function

    open_ranges: dict[str, list[Any]] = {}
    handles = []

    def pre(name: str, module: Any, args: Any) -> None:
        rf = record_function(f"module::{name}::{type(module).__name__}")
        rf.__enter__()
        open_ranges.setdefault(name, []).append(rf)

    def post(name: str, module: Any, args: Any, out: Any) -> None:
        stack = open_ranges.get(name)
        if stack:
            stack.pop().__exit__(None, None, None)

    named = [("model" if not n else n, m) for n, m in model.named_modules()]
    named.append(("loss", loss_fn))
    for name, mod in named:
        handles.append(mod.register_forward_pre_hook(functools.partial(pre, name)))
        handles.append(mod.register_forward_hook(functools.partial(post, name)))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def warm_up(w: Workload, max_iters: int, max_s: float, window: int, tol: float) -> tuple[list[float], int | None]:
    """Run timed iterations until one is stable (or the limits); return times and its index."""
    times: list[float] = []
    t_start = time.perf_counter()
    stable: int | None = None
    min_iters = window + 1
    while len(times) < max(max_iters, min_iters):
        w.sync()
        t0 = time.perf_counter()
        w.step()
        w.sync()
        times.append((time.perf_counter() - t0) * 1e3)
        stable = first_stable_iteration(times, window, tol)
        if stable is not None:
            break
        if len(times) >= min_iters and time.perf_counter() - t_start > max_s:
            break
    return times, stable


def _versions() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"torch_version": torch.__version__, "python": sys.version.split()[0]}
    try:
        import torchvision

        info["torchvision_version"] = torchvision.__version__
    except Exception:  # noqa: BLE001
        pass
    info["cuda_version"] = getattr(torch.version, "cuda", None)
    try:
        info["cudnn_version"] = torch.backends.cudnn.version()
    except Exception:  # noqa: BLE001
        info["cudnn_version"] = None
    return info


def run_trace_phase(args: WorkerSpec) -> dict[str, Any]:
    """Warm up, then trace one iteration; write trace.json.gz and worker_trace.json."""
    import torch
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile, schedule

    from gpurec.profile.trace import load_trace_events, trim_trace, write_trace

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    w = build_workload(args.model, args.batch_size, args.resolution, args.mode, args.precision,
                       args.device, args.model_file, list(args.model_globals))
    times, stable = warm_up(w, args.max_warmup_iters, args.max_warmup_s, args.stable_window, args.stable_tol)
    idx = stable if stable is not None else len(times) - 1
    ref = times[max(0, idx - args.stable_window):idx + 1]
    n_before = len(times)
    profiled_iteration = n_before + 1  # one profiler warm-up step, then the traced step

    activities = [ProfilerActivity.CPU]
    if w.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    raw_path = out_dir / "trace_raw.json"
    traced_wall_ms: list[float] = []

    def on_ready(prof: Any) -> None:
        prof.export_chrome_trace(str(raw_path))

    with module_annotations(w.model, w.loss_fn):
        with profile(activities=activities, record_shapes=True,
                     schedule=schedule(wait=0, warmup=1, active=1, repeat=1),
                     on_trace_ready=on_ready) as prof:
            for j in range(2):
                w.sync()
                t0 = time.perf_counter()
                with record_function(f"{ITER_NAME}#{n_before + j}"):
                    w.step()
                    w.sync()
                traced_wall_ms.append((time.perf_counter() - t0) * 1e3)
                prof.step()
    if not raw_path.is_file():
        raise RuntimeError("torch.profiler produced no trace (on_trace_ready was not called)")
    trimmed = trim_trace(load_trace_events(raw_path))
    write_trace(trimmed, out_dir / "trace.json.gz")
    if not args.keep_raw_trace:
        raw_path.unlink()

    meta: dict[str, Any] = {
        "model": args.model, "batch_size": args.batch_size, "resolution": args.resolution,
        "mode": args.mode, "precision": args.precision, "device": str(w.device),
        "device_name": torch.cuda.get_device_name(w.device) if w.device.type == "cuda" else "cpu",
        **_versions(),
        "n_params": w.n_params, "num_classes": w.num_classes,
        "warmup_times_ms": times, "stable_found": stable is not None, "stable_index": idx,
        "stable_window": args.stable_window, "stable_tol": args.stable_tol,
        "untraced_iteration_ms": statistics.median(ref),
        "traced_step_wall_ms": traced_wall_ms[-1],
        "profiled_iteration": profiled_iteration,
        "peak_memory_mb": (torch.cuda.max_memory_allocated(w.device) / 2**20) if w.device.type == "cuda" else None,
    }
    (out_dir / "worker_trace.json").write_text(json.dumps(meta, indent=1))
    return meta


def run_ncu_phase(args: WorkerSpec) -> dict[str, Any]:
    """N plain iterations, then iteration N between cudaProfilerStart and cudaProfilerStop."""
    import torch

    w = build_workload(args.model, args.batch_size, args.resolution, args.mode, args.precision,
                       args.device, args.model_file, list(args.model_globals))
    if w.device.type != "cuda":
        raise RuntimeError("the ncu phase needs a CUDA device")
    for _ in range(args.warmup_iters):
        w.step()
    w.sync()
    try:
        torch.cuda.nvtx.range_push(ITER_NAME)  # only a label in the report; filtering uses the API
    except Exception:  # noqa: BLE001
        pass
    torch.cuda.profiler.start()
    t0 = time.perf_counter()
    w.step()
    w.sync()
    wall_ms = (time.perf_counter() - t0) * 1e3
    torch.cuda.profiler.stop()
    try:
        torch.cuda.nvtx.range_pop()
    except Exception:  # noqa: BLE001
        pass
    meta = {"profiled_iteration": args.warmup_iters, "profiled_step_wall_ms": wall_ms, **_versions()}
    if args.out_dir:
        Path(args.out_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.out_dir) / "worker_ncu.json").write_text(json.dumps(meta, indent=1))
    return meta


def run(spec: WorkerSpec) -> dict[str, Any]:
    """Run the spec's phase; returns what it recorded (the trace phase also writes files)."""
    return run_trace_phase(spec) if spec.phase == "trace" else run_ncu_phase(spec)


if __name__ == "__main__":
    # The subprocess entry: one spec file, a JSON summary on stdout, and a traceback on failure.
    _meta = run(WorkerSpec.read(sys.argv[1]))
    _keys = ("profiled_iteration", "untraced_iteration_ms", "stable_found", "device_name", "profiled_step_wall_ms")
    print(json.dumps({k: _meta[k] for k in _keys if k in _meta}))
