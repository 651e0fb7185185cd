"""The host: the CPU that runs Python, ATen and autograd and launches every kernel.

A step's eager time is the GPU's work plus the host's work to issue it, and hosts differ a
lot (the same lent H100 machine issued a tiny kernel in 5.7 us at one moment and 10.9 us
later).  ``run_host_bench`` characterises a host in a few seconds so that host costs can be
measured apart from the GPU and rescaled from one host to another:

* ``python_loop_us``: a fixed pure-Python loop (the interpreter's speed);
* ``dispatch_cpu_us``: the cost of a fixed small set of module calls (Conv2d, Linear,
  BatchNorm2d, ReLU, add; forward, and forward + backward) on tiny CPU tensors, which is
  mostly the Python, dispatcher and autograd work: measurable on every machine, with or
  without a GPU, so a user can characterise a host before buying a GPU;
* ``dispatch_cuda_us`` and ``launch_us`` (GPU hosts only): the same calls issued to the GPU
  with no synchronisation, and the cost of issuing one tiny kernel.

Each figure is the median of several timed blocks; ``spread`` keeps each figure's relative
inter-quartile range so a profile says how steady its host was while measured.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HOST_PROFILE_SCHEMA = "gpurec.host_profile/1"
# The module calls of the dispatch benchmark: (key, what it issues).  Small shapes keep the
# GPU's share negligible next to the host's, so the figures are host costs.
DISPATCH_CALLS: tuple[str, ...] = ("conv2d", "linear", "batchnorm2d", "relu", "add")
DISPATCH_MODES: tuple[str, ...] = ("inference", "training")


class HostProfileError(ValueError):
    """A host profile file that cannot be read; the message says how to make a valid one."""


def host_cpu() -> str:
    """This machine's CPU model name."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclass
class HostProfile:
    """What ``gpurec host-bench`` measured on one host (times in microseconds per call)."""

    name: str
    cpu: str
    cores: int
    python: str
    torch: str
    measured_at: str
    python_loop_us: float
    dispatch_cpu_us: dict[str, float]
    dispatch_cuda_us: dict[str, float] | None = None
    launch_us: float | None = None
    gpu: str | None = None
    spread: dict[str, float] = field(default_factory=dict)
    schema: str = HOST_PROFILE_SCHEMA

    def dispatch_scale(self, reference: HostProfile) -> float:
        """How much slower this host dispatches than ``reference`` (geometric mean of the
        per-call ratios of the CPU dispatch calls, which every profile has)."""
        keys = sorted(set(self.dispatch_cpu_us) & set(reference.dispatch_cpu_us))
        ratios = [self.dispatch_cpu_us[k] / reference.dispatch_cpu_us[k] for k in keys
                  if self.dispatch_cpu_us[k] > 0 and reference.dispatch_cpu_us[k] > 0]
        if not ratios:
            raise HostProfileError("the two host profiles share no dispatch measurement; "
                                   "re-run `gpurec host-bench` with this gpurec version")
        return statistics.geometric_mean(ratios)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> HostProfile:
        if data.get("schema") != HOST_PROFILE_SCHEMA:
            raise HostProfileError(f"not a gpurec host profile (schema {data.get('schema')!r}, expected "
                                   f"{HOST_PROFILE_SCHEMA!r}); make one with `gpurec host-bench --out FILE`")
        known = set(HostProfile.__dataclass_fields__)
        missing = [k for k in ("name", "cpu", "python_loop_us", "dispatch_cpu_us") if k not in data]
        if missing:
            raise HostProfileError(f"host profile lacks {', '.join(missing)}; "
                                   "re-run `gpurec host-bench --out FILE`")
        return HostProfile(**{k: v for k, v in data.items() if k in known})

    @staticmethod
    def load(path: str | Path) -> HostProfile:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise HostProfileError(f"cannot read host profile {path}: {exc}; "
                                   "make one with `gpurec host-bench --out FILE`") from exc
        return HostProfile.from_dict(data)


def _median_block_us(call: Callable[[], Any], calls_per_block: int, blocks: int,
                     sync: Callable[[], None] | None = None) -> tuple[float, float]:
    """Median and relative IQR over ``blocks`` of the per-call wall time of ``call``.

    No synchronisation inside a block: this is the host's cost to issue, not the GPU's.
    ``sync`` runs between blocks so a block never waits on a full launch queue."""
    per_call = []
    for _ in range(blocks):
        if sync is not None:
            sync()
        t0 = time.perf_counter()
        for _ in range(calls_per_block):
            call()
        per_call.append((time.perf_counter() - t0) / calls_per_block * 1e6)
    per_call.sort()
    med = statistics.median(per_call)
    q = statistics.quantiles(per_call, n=4) if len(per_call) >= 4 else [per_call[0], med, per_call[-1]]
    return med, ((q[2] - q[0]) / med if med > 0 else float("nan"))


def _python_loop() -> int:
    total = 0
    for i in range(2000):
        total += i * i % 7
    return total


def _dispatch_calls(device: Any) -> dict[str, Callable[[], Any]]:
    """The fixed module calls, forward and forward + backward, on ``device``.

    Tiny shapes: on the CPU the kernels then cost a few microseconds and the figure is the
    Python, dispatcher and autograd work, the same work that issues a call to the GPU."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    c, hw = (4, 4) if str(device) == "cpu" else (16, 8)
    with torch.device(device):
        mods: dict[str, tuple[nn.Module, tuple[int, ...]]] = {
            "conv2d": (nn.Conv2d(c, c, 3, padding=1), (1, c, hw, hw)),
            "linear": (nn.Linear(4 * c, 4 * c), (2, 4 * c)),
            "batchnorm2d": (nn.BatchNorm2d(c), (1, c, hw, hw)),
            "relu": (nn.ReLU(), (1, c, hw, hw)),
        }
    out: dict[str, Callable[[], Any]] = {}
    for name, (mod, shape) in mods.items():
        x = torch.ones(shape, device=device)
        xg = torch.ones(shape, device=device, requires_grad=True)
        mod.eval()
        out[f"{name}:inference"] = _inference_call(mod, x)
        train_mod = mod
        train_mod.train()
        out[f"{name}:training"] = _training_call(train_mod, xg)
    a = torch.ones((1, c, hw, hw), device=device)
    b = torch.ones((1, c, hw, hw), device=device)
    ag = a.clone().requires_grad_(True)
    out["add:inference"] = lambda: torch.add(a, b)
    out["add:training"] = _training_call(lambda t: t + b, ag)
    return out


def _inference_call(mod: Any, x: Any) -> Callable[[], Any]:
    import torch

    def call() -> Any:
        with torch.inference_mode():
            return mod(x)

    return call


def _training_call(fn: Any, x: Any) -> Callable[[], Any]:
    import torch

    def call() -> Any:
        y = fn(x)
        torch.autograd.backward(y, torch.ones_like(y))
        x.grad = None
        for p in getattr(fn, "parameters", lambda: [])():
            p.grad = None
        return y

    return call


def run_host_bench(use_gpu: bool | None = None, blocks: int = 7, calls_per_block: int = 40,
                   name: str | None = None) -> HostProfile:
    """Measure this host (a few seconds).  ``use_gpu=None`` uses CUDA when torch sees it;
    ``False`` measures the CPU-side parts only (a host with no GPU)."""
    import torch

    if use_gpu is None:
        use_gpu = torch.cuda.is_available()
    spread: dict[str, float] = {}
    for _ in range(200):  # warm the interpreter
        _python_loop()
    loop_us, spread["python_loop"] = _median_block_us(_python_loop, 20, blocks)
    cpu_us: dict[str, float] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # intra-op threads would measure the thread pool, not dispatch
    try:
        for key, call in _dispatch_calls("cpu").items():
            for _ in range(5):
                call()
            cpu_us[key], spread[f"cpu:{key}"] = _median_block_us(call, calls_per_block, blocks)
    finally:
        torch.set_num_threads(threads)
    cuda: dict[str, float] | None = None
    launch_us: float | None = None
    gpu_name: str | None = None
    if use_gpu:
        gpu_name = torch.cuda.get_device_name()
        sync = torch.cuda.synchronize
        cuda = {}
        for key, call in _dispatch_calls("cuda").items():
            for _ in range(5):
                call()
            sync()
            cuda[key], spread[f"cuda:{key}"] = _median_block_us(call, calls_per_block, blocks, sync)
        tiny = torch.zeros(1, device="cuda")
        for _ in range(20):
            tiny.add_(1.0)
        launch_us, spread["launch"] = _median_block_us(lambda: tiny.add_(1.0), 200, blocks, sync)
        sync()
    cpu = host_cpu()
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return HostProfile(
        name=name or f"{cpu} x{os.cpu_count()} @ {when}", cpu=cpu, cores=os.cpu_count() or 0,
        python=platform.python_version(), torch=torch.__version__, measured_at=when,
        python_loop_us=loop_us, dispatch_cpu_us=cpu_us, dispatch_cuda_us=cuda, launch_us=launch_us,
        gpu=gpu_name, spread=spread,
    )


# ---------------------------------------------------------------------------------------------
# Reference host, resolving a host argument, rescaling
# ---------------------------------------------------------------------------------------------

# Which benchmark call stands for an operation's kind group when no host model was learnt
# (gpurec.model.features.KIND_GROUPS -> DISPATCH_CALLS).  Everything without a closer match
# costs what an ``add`` costs: one small op through Python, the dispatcher and autograd.
GROUP_CALL: dict[str, str] = {"conv": "conv2d", "matmul": "linear", "attention": "linear", "norm": "batchnorm2d",
                              "activation": "relu", "pool": "relu"}


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def reference_profile(profiles: list[HostProfile], name: str | None = None) -> HostProfile:
    """The reference host: the per-field median of ``profiles`` (the collection hosts).

    Each timed figure is the median over the profiles that have it, so the reference is a
    typical collection host and no single slow or fast lease sets it.  ``dispatch_cuda_us`` and
    ``launch_us`` are kept only when some profile measured a GPU."""
    if not profiles:
        raise HostProfileError("no host profiles to take a reference from; run `gpurec host-bench --out FILE`")
    if len(profiles) == 1 and name is None:
        return profiles[0]

    def med_dict(dicts: list[dict[str, float] | None]) -> dict[str, float] | None:
        present = [d for d in dicts if d]
        if not present:
            return None
        keys = sorted({k for d in present for k in d})
        return {k: _median([d[k] for d in present if k in d]) for k in keys}

    launches = [p.launch_us for p in profiles if p.launch_us is not None]
    cpus = sorted({p.cpu for p in profiles})
    return HostProfile(
        name=name or f"reference: median of {len(profiles)} host profiles",
        cpu=cpus[0] if len(cpus) == 1 else f"{len(cpus)} CPU models: " + "; ".join(cpus[:4]),
        cores=int(_median([float(p.cores) for p in profiles])),
        python=sorted({p.python for p in profiles})[-1], torch=sorted({p.torch for p in profiles})[-1],
        measured_at=max(p.measured_at for p in profiles),
        python_loop_us=_median([p.python_loop_us for p in profiles]),
        dispatch_cpu_us=med_dict([p.dispatch_cpu_us for p in profiles]) or {},
        dispatch_cuda_us=med_dict([p.dispatch_cuda_us for p in profiles]),
        launch_us=_median(launches) if launches else None,
        gpu=sorted({p.gpu for p in profiles if p.gpu} or {""})[0] or None,
        spread={"profiles": float(len(profiles))},
    )


def profiles_of(entry: Any) -> list[HostProfile]:
    """Host profiles in a provenance ``host_bench`` entry: one profile dict, a list of them, or a
    dict of them (e.g. ``{"start": ..., "end": ...}``).  Unreadable parts are skipped."""
    if isinstance(entry, HostProfile):
        return [entry]
    if isinstance(entry, dict) and "schema" in entry:
        try:
            return [HostProfile.from_dict(entry)]
        except (HostProfileError, TypeError):
            return []
    items = entry.values() if isinstance(entry, dict) else entry if isinstance(entry, list) else []
    return [p for item in items for p in profiles_of(item)]


_LOCAL: dict[str, HostProfile] = {}


def local_profile() -> HostProfile:
    """This machine's CPU-side host profile, measured once per process (a few seconds)."""
    if "local" not in _LOCAL:
        _LOCAL["local"] = run_host_bench(use_gpu=False, name=f"local: {host_cpu()} x{os.cpu_count()}")
    return _LOCAL["local"]


def resolve_host(host: HostProfile | str | Path | dict[str, Any] | None, reference: HostProfile) -> HostProfile:
    """The host an estimate is for: ``None`` = ``reference``; ``"local"`` = this machine
    (``run_host_bench(use_gpu=False)``, cached per process); a path to a ``gpurec host-bench``
    JSON file; a profile dict; or a HostProfile."""
    if host is None:
        return reference
    if isinstance(host, HostProfile):
        return host
    if isinstance(host, dict):
        return HostProfile.from_dict(host)
    if isinstance(host, str) and host == "local":
        return local_profile()
    if isinstance(host, (str, Path)):
        if not Path(host).exists():
            raise HostProfileError(f"no host profile at {host}: pass None (the reference host), 'local', or a "
                                   "file written by `gpurec host-bench --out FILE`")
        return HostProfile.load(host)
    raise HostProfileError(f"host must be None, 'local', a host-bench JSON path or a HostProfile, not "
                           f"{type(host).__name__}")


def call_cost_us(profile: HostProfile, call: str, mode: str) -> float:
    """Per-call dispatch cost of one benchmark call on ``profile``: the CUDA figure where the
    host measured a GPU (what issuing to a GPU costs), else the CPU-side figure."""
    key = f"{call}:{mode}"
    for table in (profile.dispatch_cuda_us, profile.dispatch_cpu_us):
        if table and key in table and table[key] > 0:
            return float(table[key])
    raise HostProfileError(f"host profile {profile.name!r} has no dispatch figure for {key}; "
                           "re-run `gpurec host-bench` with this gpurec version")


# ---------------------------------------------------------------------------------------------
# Was the host quiet while measured?
# ---------------------------------------------------------------------------------------------
BUSY_LOAD_PER_CORE = 0.7  # 1-minute load average per core above which other work competes for the CPU
UNSTEADY_SPREAD = 0.25  # a figure's relative inter-quartile range above which its blocks disagree


class HostBusy(RuntimeError):
    """The host was too busy to characterise: other work would be measured as dispatch cost."""


def load_per_core() -> float | None:
    """This machine's 1-minute load average per core (None where the OS has none)."""
    try:
        return os.getloadavg()[0] / max(os.cpu_count() or 1, 1)
    except (OSError, AttributeError):
        return None


def load_warnings(profile: HostProfile, load: float | None) -> list[str]:
    """Why ``profile`` may not describe its host at rest: a high load average (``load`` per
    core, taken around the benchmark) or figures whose timed blocks disagree. A busy machine
    measured a conv2d training dispatch at 564 us instead of 150 us."""
    out = []
    if load is not None and load > BUSY_LOAD_PER_CORE:
        out.append(f"the load average was {load:.2f} per core (above {BUSY_LOAD_PER_CORE:g}): other processes "
                   "competed for the CPU, so the dispatch figures are probably too high")
    unsteady = sorted((k for k, v in profile.spread.items() if v == v and v > UNSTEADY_SPREAD),
                      key=lambda k: -profile.spread[k])
    if unsteady:
        worst = ", ".join(f"{k} {profile.spread[k]:.0%}" for k in unsteady[:3])
        out.append(f"{len(unsteady)} figure(s) varied by more than {UNSTEADY_SPREAD:.0%} between blocks "
                   f"({worst}): the host was not steady")
    return out


def checked_host_bench(use_gpu: bool | None = None, refuse_if_busy: bool = False,
                       **kwargs: Any) -> tuple[HostProfile, list[str]]:
    """``run_host_bench`` with a load check before and after: (profile, warnings).

    ``refuse_if_busy`` raises HostBusy instead of returning a profile with warnings."""
    before = load_per_core()
    profile = run_host_bench(use_gpu=use_gpu, **kwargs)
    after = load_per_core()
    loads = [x for x in (before, after) if x is not None]
    warnings = load_warnings(profile, max(loads) if loads else None)
    if warnings and refuse_if_busy:
        raise HostBusy("; ".join(warnings) + ". Run `gpurec host-bench` again when the machine is idle.")
    return profile, warnings
