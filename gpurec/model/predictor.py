"""The public prediction API: time, energy and power of a network on a GPU, without running it.

    p = gpurec.load_predictor()
    est = p.predict("resnet50", input_shape=(32, 3, 224, 224), mode="inference", gpu="H100", host=None)
    est.gpu_time_ms, est.gpu_energy_mj            # the GPU's work: the step as one CUDA graph
    est.time_ms, est.energy_mj, est.power_w       # eager, on the given host (None: the reference host)
    est.host_time_ms, est.bound, est.host         # the host's issue time, "gpu" or "host", profile name
    est.time_low_ms, est.time_high_ms, ...        # bands; est.per_op, est.uncovered

The GPU side of a network is the sum of per-operation GPU predictions with the learned
whole-network correction (gpurec.model.network); the host dispatch of each operation comes
from gpurec.model.host_model, and the two meet in the two-queue step simulation
(gpurec.model.timeline). Extracted operations are cached per (model name or module
structure, input shape, mode), and all operations of all candidates of ``predict_many`` go
through each booster in one call (each distinct feature row once, and a row seen before not at
all: gpurec.model.rowmemo), so repeated and batched predictions are cheap; extracting
a never-seen model is what costs time (see gpurec/reports/speed.py, docs/speed.md).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gpurec.catalog import HARDWARE_FEATURES, load_catalog, resolve_gpu
from gpurec.host import HostProfile, resolve_host
from gpurec.model._sets import MODES
from gpurec.model.bands import Band, extrapolated_from, measured_bands, widened
from gpurec.model.config import UNMEASURED_BAND_WIDENING
from gpurec.model.crossgpu import (
    PUBLIC_BAND_KEY,
    CrossGPUModel,
    CrossGPUModelError,
    load_crossgpu,
    op_table_from_block,
    recurrent_reread_bytes,
    same_compute_die,
    spec_row,
    transfer_power_w,
)
from gpurec.model.features import (
    FEATURE_NAMES,
    FeatureBuilder,
    FeatureConfig,
    MeasuredLookup,
    OpBlock,
    hardware_row,
    masked,
    target_mask,
)
from gpurec.model.gemm import GEMM_FLOOR_KEY, WIDE_KEY, UnalignedGemmFloor, WideHalfGemm
from gpurec.model.host_model import HostDispatch, NetworkCalibration
from gpurec.model.memory import load_memory_fit
from gpurec.model.network import (
    Correction,
    aggregate,
    bounded_power,
    correction_mode,
    free_consumer_held,
    free_kernel_free,
    is_recurrent,
    power_class,
    waiting_power_w,
)
from gpurec.model.persist import check_manifest, default_model_dir, load_boosters, read_manifest
from gpurec.model.recurrent import RecurrentHost, RecurrentPower, RecurrentTime
from gpurec.model.regressors import KindRouter
from gpurec.model.rowmemo import RowMemo
from gpurec.model.timeline import bound_of, simulate
from gpurec.ops.coverage import warn_if_low, warn_unmeasured_precision
from gpurec.ops.memory import MemoryFit
from gpurec.ops.precision import MIXED, resolve_precision
from gpurec.results import StepCost

if TYPE_CHECKING:
    import pandas as pd
    from torch import nn

DEFAULT_INPUT_SHAPE = (1, 3, 224, 224)


@dataclass(frozen=True)
class GPUEntry:
    """A GPU the predictor can estimate for; ``measured`` = its own measurements are in the training data."""

    nvml_name: str
    short_name: str
    measured: bool
    networks_measured: bool = False  # whole networks measured (a GPU-specific network correction exists)


@dataclass(frozen=True)
class CandidateError:
    """What ``predict_many`` returns in place of an Estimate for a candidate it could not
    estimate (untraceable, a shape the model refuses, ...): which one and why.  The other
    candidates are answered; ``predict`` raises ``exception`` instead."""

    index: int  # position among the candidates
    model: str
    error: str  # the exception's type, e.g. "ExtractionError"
    reason: str
    exception: BaseException = field(repr=False, compare=False)
    ok: bool = field(default=False, init=False)

    def __str__(self) -> str:
        return f"candidate {self.index} ({self.model}): {self.error}: {self.reason}"


@dataclass(frozen=True)
class Bound:
    """One end of the uncertainty band (eager time and energy)."""

    time_ms: float
    energy_mj: float


@dataclass
class _OpsEntry:
    """Extracted operations of one (model, shape, mode, precision), with their coverage verdicts."""

    label: str
    block: OpBlock
    flops: np.ndarray
    covered: np.ndarray
    reason: np.ndarray  # '' when covered
    precision: str = "fp32"
    # training: the checkpointed operations' forward that backward runs again (Operation.recomputed),
    # and where they sit among this entry's operations
    recompute: _OpsEntry | None = None
    recompute_rows: np.ndarray | None = None


@dataclass
class _OpDetail:
    """Per-operation arrays behind an Estimate (set after construction; not part of its fields)."""

    entry: _OpsEntry
    gpu_time_ms: np.ndarray  # per operation, before the whole-network correction
    power_w: np.ndarray
    host_ms: np.ndarray  # dispatch on the estimate's host
    measured: np.ndarray
    covered: np.ndarray
    recompute_ms: np.ndarray | None = None  # per operation, its forward again in backward (checkpointing)


@dataclass
class Estimate:
    """Predicted cost of one forward (inference) or forward+backward (training) step of a network.

    GPU side (host-free, the step as one CUDA graph): ``gpu_time_ms``, ``gpu_energy_mj``.
    Eager on ``host`` (a host profile's name): ``time_ms``, ``energy_mj``, ``power_w`` =
    energy / time, ``host_time_ms`` (the host's issue time), and ``bound``: ``"host"`` when the
    host makes the step >= 20% longer than the GPU alone (gpurec.model.timeline), else ``"gpu"``.
    Each time and energy has a low/high band (measured / predicted ratio quantiles).

    ``per_op`` holds per-operation values before the whole-network correction; ``source``
    says whether a value was measured on this GPU or predicted. ``uncovered`` lists predicted
    operations outside what the models were trained on: still predicted and summed, never
    dropped, but deserving less trust.
    """

    model: str
    input_shape: tuple[int, ...]
    mode: str
    gpu: str
    measured_gpu: bool
    time_ms: float
    energy_mj: float
    power_w: float
    gpu_time_ms: float
    gpu_energy_mj: float
    host_time_ms: float
    bound: str
    host: str
    time_low_ms: float
    time_high_ms: float
    energy_low_mj: float
    energy_high_mj: float
    gpu_time_low_ms: float
    gpu_time_high_ms: float
    gpu_energy_low_mj: float
    gpu_energy_high_mj: float
    op_sum_time_ms: float  # sum of per-operation GPU times, before the network correction
    op_sum_energy_mj: float
    n_ops: int
    coverage: float  # share of FLOPs in covered operations
    correction: str
    measured_share: float = 0.0  # share of operations whose values are measurements, not predictions
    precision: str = "fp32"  # the math mode of the step (gpurec.ops.precision)
    precision_measured: bool = True  # the training data held rows at this precision (else extrapolated)
    # training with activation checkpointing: the operations whose forward backward runs again, and
    # that forward's GPU time (inside gpu_time_ms; per_op lists each operation once, without it)
    recomputed_ops: int = 0
    recompute_gpu_time_ms: float = 0.0
    _ops: _OpDetail | None = field(default=None, init=False, repr=False, compare=False)
    _per_op: Any = field(default=None, init=False, repr=False, compare=False)

    ok = True  # a class constant: an Estimate, not a CandidateError (predict_many's list holds both)

    @property
    def gpu_power_w(self) -> float:
        """Mean GPU power of the host-free step."""
        return self.gpu_energy_mj / self.gpu_time_ms if self.gpu_time_ms > 0 else 0.0

    @property
    def cost(self) -> StepCost:
        """This step's cost as the type measurements and rankings share (gpurec.results)."""
        return StepCost.of(self)

    @property
    def low(self) -> Bound:
        return Bound(self.time_low_ms, self.energy_low_mj)

    @property
    def high(self) -> Bound:
        return Bound(self.time_high_ms, self.energy_high_mj)

    @property
    def per_op(self) -> pd.DataFrame:
        """One row per operation: GPU time, host dispatch, power, energy, shares, coverage (built on first access);
        ``recompute_ms``: the GPU time of its forward again in backward, where it is checkpointed (not in ``time_ms``)."""
        if self._per_op is None:
            import pandas as pd

            d = self._ops
            e = d.entry if d is not None else None
            t = d.gpu_time_ms if d is not None else np.zeros(0)
            w = d.power_w if d is not None else np.zeros(0)
            energy = t * w
            measured = d.measured if d is not None else np.zeros(len(t), dtype=bool)
            covered = d.covered if d is not None else np.ones(len(t), dtype=bool)
            reason = np.where(covered, "", e.reason) if e is not None else np.full(len(t), "")
            flops = e.flops if e is not None else np.zeros(len(t))
            tot_t, tot_e, tot_f = t.sum(), energy.sum(), flops.sum()
            self._per_op = pd.DataFrame({
                "name": e.block.names if e is not None else [],
                "kind": e.block.kinds if e is not None else [],
                "signature": e.block.signatures if e is not None else [],
                "flops": flops,
                "time_ms": t, "host_ms": d.host_ms if d is not None else np.zeros(0), "power_w": w,
                "recompute_ms": d.recompute_ms if d is not None and d.recompute_ms is not None else np.zeros(len(t)),
                "energy_mj": energy,
                "time_share": t / tot_t if tot_t > 0 else 0.0,
                "energy_share": energy / tot_e if tot_e > 0 else 0.0,
                "flops_share": flops / tot_f if tot_f > 0 else 0.0,
                "source": np.where(measured, "measured", "model"),
                "covered": covered,
                "uncovered_reason": reason,
            })
        return self._per_op

    @property
    def unaligned_products(self) -> pd.DataFrame:
        """Half-precision products (``nn.Linear``, ``F.linear``) whose weight has a dimension that is
        not a multiple of gpurec.model.gemm.ALIGN_ELEMENTS: cuBLAS runs them on its unaligned kernels
        (a 50,257-word LM head at about a tenth of the H100's bf16 peak), so padding the dimension
        is worth it.  Columns: name, kind, k, n, time_ms, time_share."""
        from gpurec.model.gemm import unaligned_products

        d = self._ops
        found = unaligned_products(d.entry.block.values, FEATURE_NAMES, d.entry.block.kinds) if d is not None else []
        out = self.per_op.loc[[r for r, _, _ in found], ["name", "kind", "time_ms", "time_share"]].reset_index(drop=True)
        out.insert(2, "k", [k for _, k, _ in found])
        out.insert(3, "n", [n for _, _, n in found])
        return out

    @property
    def uncovered(self) -> pd.DataFrame:
        """Operations the models do not cover, with why and their share of FLOPs and time."""
        df = self.per_op
        return df.loc[~df["covered"], ["name", "kind", "uncovered_reason", "flops_share", "time_share",
                                       "time_ms", "energy_mj"]].reset_index(drop=True)

    def as_dict(self) -> dict[str, Any]:
        """The public fields (JSON-ready)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}
        out["input_shape"] = list(self.input_shape)
        return out

    def __str__(self) -> str:
        gpu = self.gpu + ("" if self.measured_gpu else " (not measured: extrapolated)")
        cov = f", {100 * (1 - self.coverage):.1f}% of FLOPs in uncovered operations" if self.coverage < 1 else ""
        return (f"{self.model} {tuple(self.input_shape)} {self.mode} on {gpu}: GPU {self.gpu_time_ms:.3f} ms "
                f"[{self.gpu_time_low_ms:.3f}, {self.gpu_time_high_ms:.3f}], {self.gpu_energy_mj:.1f} mJ; eager on "
                f"{self.host}: {self.time_ms:.3f} ms [{self.time_low_ms:.3f}, {self.time_high_ms:.3f}], "
                f"{self.energy_mj:.1f} mJ [{self.energy_low_mj:.1f}, {self.energy_high_mj:.1f}], "
                f"{self.power_w:.0f} W, {self.bound}-bound{cov}")


def structure_key(module: nn.Module) -> str:
    """Hash of a module's structure: every submodule's path and class (with its forward's
    code), its ``extra_repr``, its attributes of simple types (a flag such as ``use_res`` read
    by ``forward``), and the shapes of its tensors.

    Two instances with the same structure share extracted operations; weights do not matter,
    nor do train/eval flags (extraction sets them).  The attributes matter because ``forward``
    may branch on them: with ``repr(module)`` alone, blocks that differ only by such a flag
    shared a cache entry.  About 1.5 ms for a MobileNet-sized candidate (strings, not tuples:
    tuples are tracked by the garbage collector and made it twice as slow), less where its
    leaves repeat ones seen before (_module_text).
    """

    h = hashlib.sha1()
    seen: set[type] = set()
    parts: list[str] = []
    skip = _module_bookkeeping()
    for name, m in module.named_modules():
        t = type(m)
        if t not in seen:
            seen.add(t)
            h.update(f"{t.__module__}.{t.__qualname__}".encode())
            code = getattr(getattr(t, "forward", None), "__code__", None)
            if code is not None:
                h.update(code.co_code)
                h.update(repr(code.co_consts).encode())
                h.update(repr(code.co_names).encode())
        parts.append(f"\n{name}:{_module_text(m, t, skip)}")
    h.update("".join(parts).encode())
    return h.hexdigest()


def _module_text(m: nn.Module, t: type, skip: frozenset[str]) -> str:
    """What structure_key hashes of one module besides its path: class, ``extra_repr``, a custom
    repr, attributes, parameter and buffer shapes.  Remembered for a torch.nn module without children whose attributes are all plain scalars or tuples and lists of them:
    a fresh candidate's convolutions and norms repeat ones seen before (the text is a function of
    exactly those, which the memo key holds), and building it was most of structure_key."""
    d = m.__dict__
    fast = _TORCH_NN_PLAIN_REPR.get(t)
    if fast is None:
        fast = _TORCH_NN_PLAIN_REPR[t] = _is_torch_nn_with_plain_repr(t)
    if fast and not m._modules:
        names = tuple(d)
        layout = (t, names)
        kept = _NON_BOOKKEEPING.get(layout)
        if kept is None:
            if len(_NON_BOOKKEEPING) >= _MODULE_TEXT_MEMO_SIZE:
                _NON_BOOKKEEPING.clear()
            kept = _NON_BOOKKEEPING[layout] = tuple(k for k in names if k not in skip)
        values = [d[k] for k in kept]  # private ones too: the key may be finer than the text
        for v in values:
            vt = type(v)
            if vt not in _SIMPLE_TYPES and not ((vt is tuple or vt is list) and all(type(x) in _SIMPLE_TYPES for x in v)):
                return _module_text_computed(m, t, skip)
        # repr tells 1, True and 1.0 apart (== does not); the count splits parameters from buffers
        key = (t, names, repr(values),
               tuple([(k, None) if v is None else (k, tuple(v.shape), v.dtype, v.requires_grad)
                      for store in (m._parameters, m._buffers) for k, v in store.items()]),
               len(m._parameters))
        hit = _MODULE_TEXT_MEMO.get(key)
        if hit is None:
            if len(_MODULE_TEXT_MEMO) >= _MODULE_TEXT_MEMO_SIZE:
                _MODULE_TEXT_MEMO.clear()
            hit = _MODULE_TEXT_MEMO[key] = _module_text_computed(m, t, skip)
        return hit
    return _module_text_computed(m, t, skip)


def _is_torch_nn_with_plain_repr(t: type) -> bool:
    """A torch.nn class that keeps nn.Module's repr (its text is a function of its attributes)."""
    from torch import nn

    return t.__module__.startswith("torch.nn.") and t.__repr__ is nn.Module.__repr__


# per class: _is_torch_nn_with_plain_repr (classes are few); per (class, attribute names): the
# names that are not nn.Module's bookkeeping, in __dict__ order (bounded like the memo)
_TORCH_NN_PLAIN_REPR: dict[type, bool] = {}
_NON_BOOKKEEPING: dict[tuple[type, tuple[str, ...]], tuple[str, ...]] = {}
# _module_text's memo (bounded: cleared when full)
_MODULE_TEXT_MEMO: dict[tuple[Any, ...], str] = {}
_MODULE_TEXT_MEMO_SIZE = 8192


def _module_text_computed(m: nn.Module, t: type, skip: frozenset[str]) -> str:
    import torch
    from torch import nn

    d = m.__dict__
    attrs = []
    for key in sorted(d.keys() - skip):  # skip nn.Module's own bookkeeping in C, not key by key
        value = d[key]
        vt = type(value)
        if vt in _SIMPLE_TYPES or ((vt is tuple or vt is list) and all(type(v) in _SIMPLE_TYPES for v in value)):
            if not key.startswith("_"):
                attrs.append(f"{key}={value!r}")
        elif isinstance(value, torch.Tensor):
            if not key.startswith("_"):
                attrs.append(f"{key}=T{tuple(value.shape)}{value.dtype}")
        elif callable(value) and not isinstance(value, nn.Module):
            # an activation or other function kept as an attribute (private ones too): forward calls it
            attrs.append(f"{key}=F{_callable_token(value)}")
        elif not key.startswith("_") and vt.__repr__ is not object.__repr__ and not isinstance(value, nn.Module):
            text = repr(value)  # a config object (dataclass, enum) forward may branch on
            if " at 0x" not in text:  # never an address: identical fresh instances share a key
                attrs.append(f"{key}=O{text}")
    for tag, store in (("p", m._parameters), ("b", m._buffers)):
        for key, value in store.items():
            attrs.append(f"{tag}:{key}=None" if value is None else
                         f"{tag}:{key}={tuple(value.shape)}{value.dtype}{value.requires_grad}")
    custom = repr(m) if t.__repr__ is not nn.Module.__repr__ else ""
    return f"{t.__module__}.{t.__qualname__}({m.extra_repr()}){custom};{';'.join(attrs)}"


_SIMPLE_TYPES = frozenset({bool, int, float, str, type(None)})


def _callable_token(fn: Any) -> str:
    """What identifies a function attribute: its qualified name and, for Python functions
    (lambdas included, which share one name), its code and constants; partials recursively."""
    if isinstance(fn, functools.partial):
        return f"partial({_callable_token(fn.func)},{fn.args!r},{sorted(fn.keywords.items())!r})"
    inner = getattr(fn, "__func__", fn)  # a bound method: its function
    name = f"{getattr(inner, '__module__', '')}.{getattr(inner, '__qualname__', type(inner).__qualname__)}"
    code = getattr(inner, "__code__", None)
    if code is None:
        return name
    digest = hashlib.sha1(code.co_code + repr(code.co_consts).encode() + repr(code.co_names).encode())
    return f"{name}#{digest.hexdigest()[:12]}"


@functools.cache
def _module_bookkeeping() -> frozenset[str]:
    """The attributes every nn.Module has (hooks, tables, ``training``): not part of a structure."""
    from torch import nn

    return frozenset(nn.Module().__dict__)


class Predictor:
    """Loaded models plus the operation cache. Build with :func:`load_predictor`."""

    def __init__(self, manifest: dict[str, Any], boosters: dict[str, dict[str, Any]], model_dir: Path,
                 cache_size: int = 512, lookup: MeasuredLookup | None = None) -> None:
        self.manifest = manifest
        self.lookup = lookup
        self.model_dir = Path(model_dir)
        # Each booster remembers its predictions per feature row (gpurec.model.rowmemo): warm and
        # repeated predictions skip it; a booster shared by two modes is wrapped once.
        self._boosters = _memoised(boosters)
        self.builder = FeatureBuilder(manifest["kind_categories"], FeatureConfig.from_dict(manifest["feature_config"]),
                                      manifest.get("extra_columns", []))
        self.correction = Correction.from_dict(manifest["network_correction"])
        self.small_op_ms = float(manifest["network_correction"].get("small_op_ms", 0.02))
        # Models trained since kernel-free operations were known give them no GPU time; older
        # ones were fitted with their predicted times in every sum, so they keep them.
        self.kernel_free_no_gpu_time = manifest.get("kernel_free_ops") == "no_gpu_time"
        self.measured = list(manifest.get("gpus_measured", []))
        unc = manifest.get("uncertainty", {})
        self._band_measured: tuple[Band, Band] = measured_bands(unc)
        host_unc = unc.get("host", {})
        self._host_band = tuple(host_unc.get("ratio", (1.0, 1.0)))
        self._host_band_by_bound = {b: tuple(v["ratio"]) for b, v in host_unc.get("by_bound", {}).items()}
        names = self.builder.feature_names
        self._masks = {t: target_mask(t, names) for t in ("time", "power", "host")}
        host_info = manifest.get("host", {})
        self.reference_host = HostProfile.from_dict(host_info["reference"])
        self.host_model = HostDispatch(self.reference_host, self._boosters.get("host"),
                                       NetworkCalibration.from_dict(host_info["network_calibration"]))
        self.waiting_power = manifest.get("waiting_power", {})
        rng = manifest.get("ranges", {})
        self._range_tol = float(rng.get("tolerance", 2.0))
        self._range_feats = list(rng.get("features", ["flops_total", "bytes_total"]))
        self._ranges = {m: {k: np.asarray(v, dtype=np.float64) for k, v in kinds.items()}
                        for m, kinds in rng.get("by_mode_kind", {}).items()}
        self._cache: OrderedDict[tuple[Any, ...], _OpsEntry] = OrderedDict()
        self._cache_size = cache_size
        # One prediction at a time per predictor: the operation cache, and extraction (torch.fx
        # tracing patches module-level state), are not safe to use from several threads at once.
        self._lock = threading.RLock()
        self._sessions: list[Any] | None = None  # predict_many's tracing session: [exit stack, opened]
        self._hw: dict[str, tuple[str, np.ndarray]] = {}
        # Precisions with measured rows in the training data (models trained before precision
        # existed saw fp32 only).
        self.precisions_measured: tuple[str, ...] = tuple(manifest.get("precisions_measured", ["fp32"]))
        # cuDNN LSTM/GRU time from their sequential structure (None: models trained before it,
        # whose boosters predict recurrent layers themselves)
        self.recurrent: RecurrentTime | None = RecurrentTime.from_dict(manifest.get("recurrent_time"),
                                                                       self.builder.feature_names)
        self.host_model.recurrent = RecurrentHost.from_dict(manifest.get("recurrent_host"), self.builder.feature_names)
        self.recurrent_power: RecurrentPower | None = RecurrentPower.from_dict(manifest.get("recurrent_power"),
                                                                               self.builder.feature_names)
        # half-precision products with an unaligned weight run on cuBLAS's slow kernels
        # (gpurec.model.gemm; None: models without it, the boosters alone)
        self.gemm_floor: UnalignedGemmFloor | None = UnalignedGemmFloor.from_dict(
            manifest.get(GEMM_FLOOR_KEY), self.builder.feature_names)
        # half-precision products wider than the boosters learnt from (vocabulary-sized heads)
        self.wide_gemm: WideHalfGemm | None = WideHalfGemm.from_dict(manifest.get(WIDE_KEY),
                                                                     self.builder.feature_names)
        self.crossgpu: CrossGPUModel | None = load_crossgpu(self.model_dir)
        self._band_cross: tuple[Band, Band] | None = None
        self._band_unmeasured = self._unmeasured_band(unc)
        # fitted peak-memory terms (models/memory.json); None: the analytic lower bound alone
        self.memory_fit: MemoryFit | None = load_memory_fit(self.model_dir)
        self.cross_anchors = self._anchors()

    # -- GPUs -------------------------------------------------------------------------------------
    @property
    def gpus(self) -> list[GPUEntry]:
        """Every catalogue GPU; measured ones first. Unmeasured ones are extrapolated via hardware features."""
        measured = set(self.measured)
        nets = set(self.manifest.get("gpus_networks_measured", []))
        entries = [GPUEntry(s.nvml_name, s.short_name, s.nvml_name in measured, s.nvml_name in nets)
                   for s in load_catalog()]
        return sorted(entries, key=lambda e: (not e.measured, not e.networks_measured))

    def _gpu(self, gpu: str) -> tuple[str, np.ndarray]:
        hit = self._hw.get(gpu)
        if hit is None:
            spec = resolve_gpu(gpu)  # raises UnknownGPU (a ValueError listing the choices)
            hit = self._hw[gpu] = (spec.nvml_name, hardware_row(spec))
        return hit

    def _anchors(self) -> list[str]:
        """GPUs whose GPU time comes from their own host-free measurements (the cross-GPU anchors):
        measured GPUs with host-free rows in the cross-GPU model's data.  Every other GPU takes
        the first anchor's time times the cross-GPU model's ratio (see :meth:`_cross_time`)."""
        if self.crossgpu is None:
            return []
        sources = self.crossgpu.info.get("sources", {})
        host_free = {key.split("|", 1)[1] for key in sources if key.startswith("h100_host_free|")}
        return [g for g in self.measured if g in host_free]

    def _unmeasured_band(self, unc: dict[str, Any]) -> tuple[Band, Band]:
        """(time, energy) band of a GPU without rows of its own (gpurec.model.bands.extrapolated):
        the measured band compounded with the cross-GPU ratio's validated error, from training's
        leave-one-GPU-out networks (manifest) and the public whole models (crossgpu.json).
        Neither: the measured band widened in log space."""
        found = extrapolated_from(unc, self.crossgpu.info.get(PUBLIC_BAND_KEY) if self.crossgpu is not None else None)
        if found is None:
            widen = float(unc.get("unmeasured_gpu_widening", UNMEASURED_BAND_WIDENING))
            return widened(self._band_measured[0], widen), widened(self._band_measured[1], widen)
        band, self._band_cross = found
        return band

    def cross_band(self) -> tuple[Band, Band] | None:
        """(time, energy) band of the cross-GPU ratio alone: the error an extrapolated GPU's figure
        adds to its anchor's, which is all that separates the two (the anchor's own error is in
        both).  None: no validated cross-GPU error (the unmeasured band is a widened measured one)."""
        return self._band_cross

    def cross_anchor(self, gpu: str) -> str | None:
        """The anchor GPU whose time ``gpu``'s is transferred from (None: ``gpu`` uses its own)."""
        nvml = self._gpu(gpu)[0]
        if not self.cross_anchors or nvml in self.cross_anchors:
            return None
        return self.cross_anchors[0]

    def _power_bounds(self, gpu: str) -> tuple[float, float]:
        """(idle, limit) board power of a GPU, in W (gpurec.catalog.GPUSpec.power_bounds_w)."""
        return resolve_gpu(gpu).power_bounds_w()

    # -- operations -------------------------------------------------------------------------------
    def _entry(self, model: str | nn.Module | Sequence[Any], input_shape: Sequence[int] | None, mode: str,
               dtype: Any = None, example_inputs: Any = None, precision: str | None = None
               ) -> tuple[_OpsEntry, tuple[int, ...]]:
        inputs: tuple[Any, ...] | Mapping[str, Any] = ()
        precision = resolve_precision(model, precision)  # a bf16 module is bf16; a contradiction raises
        if example_inputs is not None:
            inputs = checked_example_inputs(example_inputs)
            named = inputs.items() if isinstance(inputs, Mapping) else ((None, t) for t in inputs)
            described: Any = tuple((k, tuple(t.shape), str(t.dtype)) for k, t in named)
            shape = first_input_shape(inputs)
        else:
            from gpurec.ops.extract import normalise_input_shape

            shape = normalise_input_shape(input_shape if input_shape is not None else DEFAULT_INPUT_SHAPE)
            described = (shape, str(dtype))
        if isinstance(model, str):
            key: tuple[Any, ...] = ("name", model, described, mode, precision)
        else:
            key = ("module", structure_key(model), described, mode, precision)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit, shape
        from gpurec.ops.extract import extract_at_resolved_precision as extract_operations  # resolved above

        if self._sessions is not None and not self._sessions[1]:  # predict_many's first extraction
            from gpurec.ops.extract import tracing_session

            self._sessions[0].enter_context(tracing_session())
            self._sessions[1] = True
        if inputs:
            ops = extract_operations(model, mode=mode, keep_sources=False, example_inputs=inputs, precision=precision,
                                     shared_records=True)
        else:
            ops = extract_operations(model, shape, mode=mode, keep_sources=False, precision=precision,
                                     shared_records=True, **({"dtype": dtype} if dtype is not None else {}))
        label = model if isinstance(model, str) else type(model).__name__
        if not ops:  # 0 ms, coverage 1 and bound "host" would read as an estimate of real work
            from gpurec.ops.extract import NoOperations

            raise NoOperations(f"{label} runs no operations on input {list(shape)} (e.g. nn.Identity or an empty "
                               "nn.Sequential): there is no GPU work to estimate")
        entry = self._make_entry(label, OpBlock.from_operations(ops, mode), mode)
        entry.precision = precision
        rows = [i for i, op in enumerate(ops) if op.recomputed]
        if rows:
            again = [ops[i].recomputation() for i in rows]
            entry.recompute = self._make_entry(label, OpBlock.from_operations(again, "inference"), "inference")
            entry.recompute.precision = precision
            entry.recompute_rows = np.array(rows)
        self._cache[key] = entry
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return entry, shape

    def _make_entry(self, label: str, block: OpBlock, mode: str) -> _OpsEntry:
        n = len(block)
        covered = np.ones(n, dtype=bool)
        reason = np.full(n, "", dtype=object)
        ranges = self._ranges.get(mode, {})
        vals = np.stack([block.column(f) for f in self._range_feats], axis=1) if n else np.zeros((0, 1))
        k = len(self._range_feats)
        tol = self._range_tol
        by_kind: dict[str, list[int]] = {}
        for i, kind in enumerate(block.kinds):
            by_kind.setdefault(kind, []).append(i)
        for kind, rows in by_kind.items():  # one kind's operations at once (a loop per operation was a few %)
            r = ranges.get(kind)
            if r is None:
                covered[rows] = False
                reason[rows] = f"kind '{kind}' not in training data ({mode})"
                continue
            lo, hi = r[:k], r[k:]
            v = vals[rows]
            bad = (v > hi * tol + 1e-9) | ((lo > 0) & (v < lo / tol - 1e-9))
            for j in np.flatnonzero(bad.any(axis=1)).tolist():
                i = rows[j]
                covered[i] = False
                names = ", ".join(f for f, b in zip(self._range_feats, bad[j].tolist(), strict=True) if b)
                reason[i] = f"{names} outside training range x{tol:g}"
        if self.recurrent is not None and n and is_recurrent(block.kinds).any():
            # the recurrent form replaces the boosters' time on these layers, so its own fitted
            # ranges decide, not the rows the boosters saw
            replaced, chain = self.recurrent.coverage(block.values, FEATURE_NAMES, block.kinds, mode, tol)
            covered[chain], reason[chain] = True, ""
            outside = replaced & ~chain
            covered[outside] = False
            reason[outside] = f"batch or hidden size outside the recurrent form's fitted range x{tol:g}"
        return _OpsEntry(label=label, block=block, flops=block.column("flops_total").copy(), covered=covered,
                         reason=reason)

    # -- prediction -------------------------------------------------------------------------------
    def predict(self, model: str | nn.Module, input_shape: Sequence[int] | None = None, mode: str = "inference",
                gpu: str = "H100", host: HostProfile | str | Path | None = None, dtype: Any = None,
                example_inputs: Any = None, precision: str | None = None, warn: bool = True) -> Estimate:
        """Estimate one network (a torchvision model name, a gpurec.sets sequence architecture or
        an nn.Module) on one GPU.

        ``host``: None = the reference host (``Predictor.reference_host``, the median of the
        collection hosts), ``"local"`` = this machine (``run_host_bench(use_gpu=False)``, once per
        process), a ``gpurec host-bench`` JSON path, or a HostProfile.  ``dtype`` is the input's
        dtype (e.g. torch.long for token ids; default float32).  ``example_inputs`` (a tensor or a
        tuple of tensors, e.g. ``(src, tgt)`` for nn.Transformer, or a dict of tensors passed by
        keyword, e.g. ``{"input_ids": ..., "decoder_input_ids": ...}``; only shapes and dtypes are
        used) replaces ``input_shape`` and ``dtype``.  Raises what made the model unpredictable (e.g.
        ExtractionError).  Warns (gpurec.LowCoverageWarning) when under 90% of the FLOPs are in
        known operations.

        ``precision`` (gpurec.ops.precision.PRECISIONS): None = fp32, or bf16/fp16 for a module
        whose parameters are; a precision contradicting them raises PrecisionMismatch.  Warns
        (UnmeasuredPrecisionWarning) when the training data held no rows at that precision.
        ``warn=False`` leaves both warnings out, for callers that read ``coverage`` and
        ``precision_measured`` themselves (a search over batch sizes that reports them once)."""
        item = (model, input_shape) if example_inputs is None else (model, checked_example_inputs(example_inputs))
        out = self.predict_many([item], mode=mode, gpu=gpu, host=host, dtype=dtype, precision=precision, warn=warn)[0]
        if isinstance(out, CandidateError):
            raise out.exception
        return out

    def predict_many(self, candidates: Iterable[Any], mode: str = "inference", gpu: str = "H100",
                     host: HostProfile | str | Path | None = None, dtype: Any = None,
                     example_inputs: Any = None, precision: str | None = None,
                     warn: bool = True) -> list[Estimate | CandidateError]:
        """Estimate many networks at once (NAS loops): items are a model, (model, input_shape) or
        (model, example inputs: a tensor, a tuple of tensors or a dict of them by keyword); ``example_inputs`` applies to
        every item that gives neither.

        One result per candidate, in order: an Estimate, or a CandidateError (its index and the
        reason) for a candidate that cannot be estimated; the others are still answered.  An
        unknown ``gpu``, ``mode`` or ``host`` raises.  All operations of all candidates go
        through each booster in a single call.  Safe to call from several threads (they take
        turns on this predictor).  ``warn``: as in predict.
        """
        mode = _check_mode(mode)
        with self._lock:
            nvml, hw = self._gpu(gpu)
            profile = resolve_host(host, self.reference_host)
            entries: list[tuple[_OpsEntry, tuple[int, ...]]] = []
            results: list[Estimate | CandidateError | None] = []
            # one torch.fx patch of nn.Module for all candidates, opened at the first extraction
            # (gpurec.ops.extract.tracing_session; a warm call never opens it)
            with _collector_paused() as young_collection, contextlib.ExitStack() as sessions:
                self._sessions = [sessions, False]
                try:
                    self._answer(candidates, mode, dtype, example_inputs, precision, entries, results, young_collection)
                finally:
                    self._sessions = None
            estimates = self._estimate(entries, mode, nvml, hw, profile, warn)
            again = [i for i, (e, _) in enumerate(entries) if e.recompute is not None]
            if again:  # activation checkpointing: backward runs those forwards again
                forwards = self._estimate([(entries[i][0].recompute, entries[i][1]) for i in again], "inference",
                                          nvml, hw, profile, warn=False)  # the step itself warned
                for i, forward in zip(again, forwards, strict=True):
                    estimates[i] = _with_recomputation(estimates[i], forward)
            answers = iter(estimates)
            return [next(answers) if r is None else r for r in results]

    def _answer(self, candidates: Iterable[Any], mode: str, dtype: Any, example_inputs: Any, precision: str | None,
                entries: list[tuple[_OpsEntry, tuple[int, ...]]], results: list[Estimate | CandidateError | None],
                young_collection: Any) -> None:
        """Each candidate's entry into ``entries`` (None into ``results``), or its CandidateError into ``results``."""
        for i, c in enumerate(candidates):
            model, shape, inputs = _split_candidate(c, example_inputs)
            try:
                entries.append(self._entry(model, shape, mode, dtype, inputs, precision))
                results.append(None)
            except Exception as exc:  # one bad candidate must not cost the others their answers
                label = model if isinstance(model, str) else type(model).__name__
                results.append(CandidateError(i, label, type(exc).__name__, str(exc), exc))
            if (i + 1) % _GC_EVERY_CANDIDATES == 0:
                young_collection()

    def host_scale(self, host: HostProfile) -> float:
        """How much slower ``host`` dispatches than the reference host (1 for the reference itself)."""
        return 1.0 if host is self.reference_host else host.dispatch_scale(self.reference_host)

    def _estimate(self, entries: list[tuple[_OpsEntry, tuple[int, ...]]], mode: str, nvml: str, hw: np.ndarray,
                  host: HostProfile, warn: bool = True) -> list[Estimate]:
        if not entries:
            return []
        block = entries[0][0].block if len(entries) == 1 else OpBlock.concat([e.block for e, _ in entries])
        # Operations repeat (a NAS list of 50 MobileNets: 6,000 operations, 900 distinct rows):
        # each distinct feature row goes through the boosters once, and rows are independent.
        rows, inverse = _distinct_rows(block)
        distinct = block if rows is None else block.take(rows)
        spread = (lambda a: a) if inverse is None else (lambda a: a[inverse])
        feats = self.builder.build(distinct, hw[None, :])
        Xw = masked(feats.X, self._masks["power"])
        log_w = self._boosters["power"][mode].predict(Xw, feats.margin_power)
        if self.recurrent_power is not None:
            log_w = self.recurrent_power.apply(log_w, Xw, mode)
        w = spread(np.exp(log_w))
        offsets = np.cumsum([0, *(len(e.block) for e, _ in entries)])
        idle_w, limit_w = self._power_bounds(nvml)
        groups = self.builder.group_index(distinct.kinds)
        classes = power_class(spread(groups), block.column("groups"), spread(is_recurrent(distinct.kinds)))
        anchor = self.cross_anchor(nvml)
        # only autocast inserts casts, whose kernels their consumers' times hold
        mixed = any(getattr(e, "precision", None) in MIXED for e, _ in entries)
        cmodes = [correction_mode(mode, getattr(e, "precision", None)) for e, _ in entries]
        if anchor is None:
            t = spread(np.exp(self._time_log_ms(feats, mode)))
            hit = np.zeros(len(t), dtype=bool)
            if self.lookup is not None:
                t, w, hit = self.lookup.apply(t, w, block.signatures, nvml, mode)
            if self.kernel_free_no_gpu_time:
                t = free_kernel_free(t, block.kernel_free, hit)
            if mixed:
                t = free_consumer_held(t, block.kinds)
            w = bounded_power(w, idle_w, limit_w)
            sums = aggregate(t, w, offsets, self.small_op_ms, hit, classes, idle_w, limit_w)
            t_net, w_net, keys = self.correction.apply_each(sums, nvml, cmodes)
        else:
            w = bounded_power(w, idle_w, limit_w)
            t, t_net, w_net, keys, sums = self._cross_time(distinct, spread, block, offsets, mode, nvml, anchor, w,
                                                           (classes, idle_w, limit_w), mixed=mixed,
                                                           cmodes=cmodes)
            hit = np.zeros(len(t), dtype=bool)
        # The correction rescales each network's GPU work; the timeline then places it behind the host.
        factor = np.repeat(t_net / np.maximum(sums.sum_time_ms, 1e-12), np.diff(offsets))
        d = spread(self.host_model.predict_ms(masked(feats.X, self._masks["host"]), groups, mode,
                                              self.host_scale(host)))
        tl = simulate(t * factor, d, offsets)
        p_wait = float(bounded_power(waiting_power_w(self.waiting_power, nvml,
                                                     float(hw[HARDWARE_FEATURES.index("tdp_w")])), idle_w, limit_w))
        measured = nvml in self.measured
        (tlo, thi), (elo, ehi) = self._band_measured if measured else self._band_unmeasured
        out = []
        for i, (e, shape) in enumerate(entries):
            a, b = offsets[i], offsets[i + 1]
            covered = e.covered | hit[a:b]  # a measured operation needs no model
            ft = e.flops.sum()
            cov = float(e.flops[covered].sum() / ft) if ft > 0 else float(covered.mean() if len(covered) else 1)
            if warn:
                warn_if_low(f"{e.label} {tuple(shape)} {mode}", cov, stacklevel=4)
            precision_measured = e.precision in self.precisions_measured
            if warn and not precision_measured:
                warn_unmeasured_precision(f"{e.label} {tuple(shape)} {mode}", e.precision, self.precisions_measured,
                                          stacklevel=4)
            g_t = float(tl.gpu_time_ms[i])
            g_e = g_t * float(w_net[i])
            eager_t = float(tl.time_ms[i])
            eager_e = g_e + float(tl.gpu_wait_ms[i]) * p_wait
            bound = bound_of(eager_t, g_t)
            # the host side's error widens the eager bands, as much as it did for steps of this bound
            hlo, hhi = self._host_band_by_bound.get(bound, self._host_band)
            est = Estimate(
                model=e.label, input_shape=shape, mode=mode, gpu=nvml, measured_gpu=measured,
                time_ms=eager_t, energy_mj=eager_e, power_w=eager_e / eager_t if eager_t > 0 else 0.0,
                gpu_time_ms=g_t, gpu_energy_mj=g_e, host_time_ms=float(tl.host_time_ms[i]),
                bound=bound, host=host.name,
                time_low_ms=eager_t * tlo * hlo, time_high_ms=eager_t * thi * hhi, energy_low_mj=eager_e * elo * hlo,
                energy_high_mj=eager_e * ehi * hhi, gpu_time_low_ms=g_t * tlo, gpu_time_high_ms=g_t * thi,
                gpu_energy_low_mj=g_e * elo, gpu_energy_high_mj=g_e * ehi,
                op_sum_time_ms=float(sums.sum_time_ms[i]), op_sum_energy_mj=float(sums.sum_energy_mj[i]),
                n_ops=int(b - a), coverage=cov, correction=keys[i],
                measured_share=float(hit[a:b].mean()) if b > a else 0.0, precision=e.precision,
                precision_measured=precision_measured)
            est._ops = _OpDetail(entry=e, gpu_time_ms=t[a:b], power_w=w[a:b], host_ms=d[a:b], measured=hit[a:b],
                                 covered=covered)
            out.append(est)
        return out

    def _time_log_ms(self, feats: Any, mode: str) -> np.ndarray:
        """log GPU time (ms) per feature row: the time booster (the mode's booster of each row's kind
        group, where the model has kind groups), raised to the unaligned-GEMM floor, wide
        half-precision products and recurrent layers by their own models."""
        X = masked(feats.X, self._masks["time"])
        log_t = self._boosters["time"][mode].predict(X, feats.margin_time)
        if self.gemm_floor is not None:
            log_t = self.gemm_floor.apply(log_t, feats.X, mode)
        if self.wide_gemm is not None:
            log_t = self.wide_gemm.apply(log_t, feats.X, mode)
        return log_t if self.recurrent is None else self.recurrent.apply(log_t, X, mode)

    def _cross_time(self, distinct: OpBlock, spread: Any, block: OpBlock, offsets: np.ndarray, mode: str,
                    nvml: str, anchor: str, w: np.ndarray, power: tuple[Any, float, float] | None = None,
                    *, mixed: bool, cmodes: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str], Any]:
        """GPU time on a GPU without host-free measurements: the anchor's (its measured operations
        and its whole-network correction included) times, per operation, the cross-GPU model's
        ratio (gpurec.model.crossgpu) of this GPU to the anchor.  A GPU no worse than the anchor
        in every specification gets ratios <= 1, so it is never predicted slower; power stays
        this GPU's own."""
        a_nvml, a_hw = self._gpu(anchor)
        feats_a = self.builder.build(distinct, a_hw[None, :])
        t_a = spread(np.exp(self._time_log_ms(feats_a, mode)))
        hit_a = np.zeros(len(t_a), dtype=bool)
        if self.lookup is not None:
            t_a, _, hit_a = self.lookup.apply(t_a, np.ones_like(t_a), block.signatures, a_nvml, mode)
        if mixed:
            t_a = free_consumer_held(t_a, block.kinds)
        # the power classes say which networks have recurrent layers (Correction.nonrecurrent_time_coef)
        sums_a = aggregate(t_a, np.ones_like(t_a), offsets, self.small_op_ms, hit_a,
                           power[0] if power is not None else None)
        t_net_a, _, keys_a = self.correction.apply_each(sums_a, a_nvml, cmodes)
        table = op_table_from_block(distinct)
        cross = self.crossgpu
        if cross is None:  # anchors exist only with a cross-GPU model
            raise CrossGPUModelError("no cross-GPU model loaded: a GPU cannot take an anchor's time without it")
        ratio = spread(cross.predict_ms(table, spec_row(nvml)) / cross.predict_ms(table, spec_row(a_nvml)))
        t = t_a * ratio
        if self.kernel_free_no_gpu_time:
            t = free_kernel_free(t, block.kernel_free, np.zeros(len(t), dtype=bool))
        sums = aggregate(t, w, offsets, self.small_op_ms, None, *(power or ()))
        _, w_net, _ = self.correction.apply_each(sums, nvml, cmodes)
        # the anchor's network correction, carried over as a factor on the transferred operations
        t_net = t_net_a / np.maximum(sums_a.sum_time_ms, 1e-12) * sums.sum_time_ms
        if cross.memory_energy_pj_per_byte is not None and power is not None \
                and same_compute_die(spec_row(nvml), spec_row(a_nvml)):
            w_net = self._carried_power_w(feats_a, spread, block, offsets, mode, a_nvml, t_a, hit_a, power[0],
                                          table, t_net_a, t_net, nvml, cmodes)
        return t, t_net, w_net, [f"{k} x cross-GPU ratio to {anchor}" for k in keys_a], sums

    def _carried_power_w(self, feats_a: Any, spread: Any, block: OpBlock, offsets: np.ndarray, mode: str, a_nvml: str,
                         t_a: np.ndarray, hit_a: np.ndarray, classes: np.ndarray, table: Any, t_net_a: np.ndarray,
                         t_net: np.ndarray, nvml: str, cmodes: list[str]) -> np.ndarray:
        """Network power on a GPU of the anchor's compute die: the anchor's own network power (as
        predicted on the anchor, its measured operations included) with this GPU's idle floor and
        DRAM power for the same bytes (recurrent layers' weights re-read at every step included) over
        this GPU's time, at each GPU's memory type's energy per byte (gpurec.model.crossgpu.transfer_power_w).
        The two GPUs' own power models, each off by its own error, would not cancel; the anchor's carries
        its measured operations and network correction."""
        Xa = masked(feats_a.X, self._masks["power"])
        log_w = self._boosters["power"][mode].predict(Xa, feats_a.margin_power)
        if self.recurrent_power is not None:
            log_w = self.recurrent_power.apply(log_w, Xa, mode)
        w_a = spread(np.exp(log_w))
        t_lookup = t_a
        if self.lookup is not None:
            t_lookup, w_a, _ = self.lookup.apply(t_a, w_a, block.signatures, a_nvml, mode)
        idle_a, limit_a = self._power_bounds(a_nvml)
        w_a = bounded_power(w_a, idle_a, limit_a)
        sums_a = aggregate(t_lookup, w_a, offsets, self.small_op_ms, hit_a, classes, idle_a, limit_a)
        _, w_net_a, _ = self.correction.apply_each(sums_a, a_nvml, cmodes)
        moved = np.concatenate([[0.0], np.cumsum(spread(table.raw[:, 1]) + recurrent_reread_bytes(block))])
        idle, limit = self._power_bounds(nvml)
        cross = self.crossgpu
        return transfer_power_w(w_net_a, idle_a, idle, limit, moved[offsets[1:]] - moved[offsets[:-1]], t_net_a, t_net,
                                cross.memory_energy_pj_per_byte_for(nvml),
                                cross.memory_energy_pj_per_byte_for(a_nvml))

    def clear_cache(self) -> None:
        """Forget extracted operations and remembered booster predictions."""
        self._cache.clear()
        for routes in self._boosters.values():
            for memo in routes.values():
                memo.clear()

    def __repr__(self) -> str:
        cv = self.manifest.get("cv", {})
        return (f"Predictor({self.model_dir}, measured GPUs: {', '.join(self.measured) or 'none'}, "
                f"{len(self.builder.kinds)} op kinds, cv: {list(cv)})")


# Candidates extracted between two collections of the young generation in predict_many: enough
# to spread one collection over many candidates, few enough to bound the garbage held meanwhile
# (a MobileNet-sized candidate leaves a few thousand objects in reference cycles: the fx graph).
_GC_EVERY_CANDIDATES = 32


# Estimate fields that add up when backward runs a forward again after the step's own work.
_ADDITIVE_FIELDS = ("time_ms", "energy_mj", "gpu_time_ms", "gpu_energy_mj", "host_time_ms", "time_low_ms",
                    "time_high_ms", "energy_low_mj", "energy_high_mj", "gpu_time_low_ms", "gpu_time_high_ms",
                    "gpu_energy_low_mj", "gpu_energy_high_mj", "op_sum_time_ms", "op_sum_energy_mj")


def _with_recomputation(step: Estimate, forward: Estimate) -> Estimate:
    """A training step with activation checkpointing: ``step`` (forward and backward of every
    operation) plus ``forward``, the checkpointed operations' forward that backward runs again,
    host and GPU alike, in sequence (it sits inside backward, which waits on it)."""
    summed = {name: getattr(step, name) + getattr(forward, name) for name in _ADDITIVE_FIELDS}
    t, e = summed["time_ms"], summed["energy_mj"]
    out = replace(step, **summed, power_w=e / t if t > 0 else 0.0, bound=bound_of(t, summed["gpu_time_ms"]),
                  recomputed_ops=forward.n_ops, recompute_gpu_time_ms=forward.gpu_time_ms)
    if step._ops is not None:
        again = np.zeros(len(step._ops.gpu_time_ms))
        if forward._ops is not None and step._ops.entry.recompute_rows is not None:
            again[step._ops.entry.recompute_rows] = forward._ops.gpu_time_ms
        out._ops = replace(step._ops, recompute_ms=again)
    return out


@contextlib.contextmanager
def _collector_paused() -> Iterator[Any]:
    """Python's cyclic garbage collector off while candidates are extracted; yields a function
    that collects the young generation (call it every few candidates).  Back on at the end.

    Why: each extraction leaves its fx graph (reference cycles) behind and a NAS loop holds many
    candidate modules.  With the collector on, collections ran every few hundred allocations
    and the candidates' objects, promoted generation by generation, set off full collections
    that scan every object of the process (two per 50 fresh MobileNets, about 40% of the
    time).  The same garbage is collected here, in few passes over young objects only.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield lambda: gc.collect(0)
    finally:
        if gc.get_count()[0] > gc.get_threshold()[0]:  # as the collector would have (not after cache hits)
            gc.collect(0)
        if was_enabled:
            gc.enable()


class _GroupMemo(KindRouter):
    """A KindRouter (one mode's boosters by kind group) over RowMemos: rows are routed by their
    kind columns with numpy masks once per call, and each group's booster remembers its rows.
    ``model`` is the router over the boosters themselves (no memo)."""

    def __init__(self, router: KindRouter, wrap: Any) -> None:
        super().__init__(router.groups, {g: wrap(b) for g, b in router.models.items()})
        self.model = router

    def _memos(self) -> list[RowMemo]:
        return list({id(m): m for m in self.models.values()}.values())

    def clear(self) -> None:
        for m in self._memos():
            m.clear()

    def __len__(self) -> int:
        return sum(len(m) for m in self._memos())


def _memoised(boosters: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{target: {mode: RowMemo}}, one RowMemo per distinct booster object; a mode's kind-group
    router (gpurec.model.regressors.KindRouter) becomes one over its boosters' RowMemos."""
    wrapped: dict[int, RowMemo] = {}

    def wrap(b: Any) -> RowMemo:
        return wrapped.setdefault(id(b), RowMemo(b))

    return {target: {mode: _GroupMemo(b, wrap) if isinstance(b, KindRouter) else wrap(b) for mode, b in routes.items()}
            for target, routes in boosters.items()}


def _is_tensor_input(x: Any) -> bool:
    """A tensor, a non-empty tuple/list of tensors or a non-empty dict of them by argument name
    (example inputs, not a shape)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return False  # torch never imported: nothing can be a tensor
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, Mapping):
        return bool(x) and all(isinstance(k, str) and isinstance(t, torch.Tensor) for k, t in x.items())
    return isinstance(x, (tuple, list)) and bool(x) and all(isinstance(t, torch.Tensor) for t in x)


def checked_example_inputs(example_inputs: Any) -> tuple[Any, ...] | Mapping[str, Any]:
    """Example inputs as a tuple of tensors, or as the dict of tensors by keyword they were given as."""
    if not _is_tensor_input(example_inputs):
        raise ValueError("example_inputs must be a tensor, a tuple of tensors or a dict of tensors by argument name")
    if isinstance(example_inputs, Mapping):
        return dict(example_inputs)
    return tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)


def first_input_shape(inputs: tuple[Any, ...] | Mapping[str, Any]) -> tuple[int, ...]:
    """The shape of the first of example inputs (as checked_example_inputs returns them): the batch
    the step processes leads it."""
    first = next(iter(inputs.values())) if isinstance(inputs, Mapping) else inputs[0]
    return tuple(int(s) for s in first.shape)


def _split_candidate(c: Any, example_inputs: Any) -> tuple[Any, Sequence[int] | None, Any]:
    """(model, input_shape, example inputs) of one predict_many item."""
    if isinstance(c, tuple) and len(c) == 2 and not isinstance(c[1], str):
        model, second = c
        if _is_tensor_input(second):
            return model, None, second
        if second is None and example_inputs is not None:
            return model, None, example_inputs
        return model, second, None
    return c, None, example_inputs


@functools.cache
def _row_hash_multipliers(width: int) -> np.ndarray:
    """Odd 64-bit multipliers of _distinct_rows' row hash, one per column (a fixed, seeded draw)."""
    return np.random.default_rng(0x9E3779B9).integers(0, 2**62, width, dtype=np.uint64) * np.uint64(2) + np.uint64(1)


def _distinct_rows(block: OpBlock) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Positions of the first of each distinct (kind, mode, feature row) of ``block`` and, per
    operation, the index of its row among them; (None, None) when no row repeats.  The feature
    matrix and every booster's prediction are functions of exactly these (operations with one
    signature but, say, frozen weights differ in their rows, so they are not merged)."""
    n = len(block)
    if n < 2:
        return None, None
    # Rows compared bytewise (kind code, mode, feature values: -0.0 and NaN payloads stay apart),
    # with numpy, not a Python loop: the loop's two objects per row set off collections of every
    # object the candidates' extraction had just left (the collector is back on here), which cost
    # up to 0.7 s of a 60-candidate predict_many.  One 64-bit hash per row is deduplicated and
    # checked against the rows themselves; on a collision the rows are compared whole.
    codes: dict[Any, int] = {}
    kind_code = np.fromiter((codes.setdefault(k, len(codes)) for k in block.kinds), dtype=np.float64, count=n)
    rows = np.ascontiguousarray(np.column_stack([kind_code, np.asarray(block.training, dtype=np.float64),
                                                 np.asarray(block.values, dtype=np.float64)]))
    words = rows.view(np.uint64)
    with np.errstate(over="ignore"):
        hashed = (words * _row_hash_multipliers(words.shape[1])).sum(axis=1, dtype=np.uint64)
    _, first, inverse = np.unique(hashed, return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    if not np.array_equal(words[first][inverse], words):  # a hash collision: compare whole rows
        keys = rows.view(np.dtype((np.void, rows.shape[1] * rows.itemsize))).ravel()
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        inverse = inverse.ravel()
    if len(first) == n:
        return None, None
    order = np.argsort(first, kind="stable")  # distinct rows in order of first appearance
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return first[order].astype(np.int64), rank[inverse]


def _check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    return mode


def load_predictor(path: str | Path | None = None, *, check_data: bool = False,
                   data_root: str | Path | None = None, nthread: int | None = 1,
                   use_measured: bool = True) -> Predictor:
    """Load trained predictors from ``path`` (default: $GPUREC_MODELS, else models/ beside the package).

    ``use_measured`` (default) lets measured operations of a measured GPU replace predictions.
    ``nthread=1`` (default): prediction batches are small, and OpenMP threads on a busy machine
    made one vit_b_16 prediction 10-20x slower (24 ms instead of 1.2 ms on 2 loaded cores).

    Raises IncompatibleModel when the models cannot be used with this code; warns (ModelWarning)
    on other library versions, or - only when ``check_data`` is asked for - when the data on disk
    differs from the training data (hashing the dataset takes seconds and loads the training
    half; ``gpurec models check`` does it on its own).
    """
    model_dir = Path(path) if path is not None else default_model_dir()
    manifest = read_manifest(model_dir)
    check_manifest(manifest, model_dir, data_root=data_root, check_data=check_data)
    lookup = None
    if use_measured and manifest.get("measured_lookup"):
        lookup = MeasuredLookup.read_parquet(model_dir / manifest["measured_lookup"])
    return Predictor(manifest, load_boosters(manifest, model_dir, nthread=nthread), model_dir, lookup=lookup)
