"""The public prediction API: time, energy and power of a network on a GPU, without running it.

    p = gpurec.load_predictor()
    est = p.predict("resnet50", input_shape=(32, 3, 224, 224), mode="inference", gpu="H100")
    est.time_ms, est.energy_mj, est.power_w, est.low, est.high, est.per_op, est.uncovered

A network's estimate is the sum of per-operation predictions plus the learned whole-network
correction (gpurec.model.network). Extracted operations are cached per (model name or module
structure, input shape, mode), and all operations of all candidates of ``predict_many`` go
through each booster in one call, so repeated and batched predictions are cheap; extracting
a never-seen model is what costs time (see gpurec/reports/speed.py, docs/speed.md).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gpurec.catalog import load_catalog, resolve_gpu
from gpurec.model.features import FeatureBuilder, FeatureConfig, MeasuredLookup, OpBlock, hardware_row
from gpurec.model.network import Correction, aggregate
from gpurec.model.persist import check_manifest, default_model_dir, load_boosters, read_manifest
from gpurec.ops.coverage import warn_if_low
from gpurec.sets import MODES

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
class Bound:
    """One end of the uncertainty band."""

    time_ms: float
    energy_mj: float


@dataclass
class _OpsEntry:
    """Extracted operations of one (model, shape, mode), with their coverage verdicts."""

    label: str
    block: OpBlock
    flops: np.ndarray
    covered: np.ndarray
    reason: np.ndarray  # '' when covered


@dataclass
class Estimate:
    """Predicted whole-network cost of one forward (inference) or forward+backward (training) step.

    ``per_op`` holds the per-operation values before the whole-network correction (their
    shares are of the operation sum); ``source`` says whether a value was measured on this GPU
    (the same operation measured, possibly in another model) or predicted. ``uncovered`` lists
    predicted operations outside what the models were trained on (unknown kind, or features
    beyond the training range x tolerance): they are still predicted and summed, never
    dropped, but deserve less trust.
    """

    model: str
    input_shape: tuple[int, ...]
    mode: str
    gpu: str
    measured_gpu: bool
    time_ms: float
    power_w: float
    energy_mj: float
    low: Bound
    high: Bound
    op_sum_time_ms: float
    op_sum_energy_mj: float
    n_ops: int
    coverage: float  # share of FLOPs in covered operations
    correction: str
    measured_share: float = 0.0  # share of operations whose values are measurements, not predictions
    _op_time_ms: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    _op_power_w: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    _measured: np.ndarray | None = field(repr=False, default=None)
    _covered: np.ndarray | None = field(repr=False, default=None)
    _entry: _OpsEntry | None = field(repr=False, default=None)
    _per_op: Any = field(repr=False, default=None)

    @property
    def time_low_ms(self) -> float:
        return self.low.time_ms

    @property
    def time_high_ms(self) -> float:
        return self.high.time_ms

    @property
    def energy_low_mj(self) -> float:
        return self.low.energy_mj

    @property
    def energy_high_mj(self) -> float:
        return self.high.energy_mj

    @property
    def per_op(self) -> pd.DataFrame:
        """One row per operation: predicted time/power/energy, shares, coverage flag (built on first access)."""
        if self._per_op is None:
            import pandas as pd

            e = self._entry
            t, w = self._op_time_ms, self._op_power_w
            energy = t * w
            measured = self._measured if self._measured is not None else np.zeros(len(t), dtype=bool)
            covered = self._covered if self._covered is not None else (e.covered if e is not None else True)
            reason = np.where(covered, "", e.reason) if e is not None else ""
            flops = e.flops if e is not None else np.zeros(len(t))
            tot_t, tot_e, tot_f = t.sum(), energy.sum(), flops.sum()
            self._per_op = pd.DataFrame({
                "name": e.block.names if e is not None else [""] * len(t),
                "kind": e.block.kinds if e is not None else [""] * len(t),
                "signature": e.block.signatures if e is not None else [""] * len(t),
                "flops": flops,
                "time_ms": t, "power_w": w, "energy_mj": energy,
                "time_share": t / tot_t if tot_t > 0 else 0.0,
                "energy_share": energy / tot_e if tot_e > 0 else 0.0,
                "flops_share": flops / tot_f if tot_f > 0 else 0.0,
                "source": np.where(measured, "measured", "model"),
                "covered": covered,
                "uncovered_reason": reason,
            })
        return self._per_op

    @property
    def uncovered(self) -> pd.DataFrame:
        """Operations the models do not cover, with why and their share of FLOPs and time."""
        df = self.per_op
        return df.loc[~df["covered"], ["name", "kind", "uncovered_reason", "flops_share", "time_share",
                                       "time_ms", "energy_mj"]].reset_index(drop=True)

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "input_shape": list(self.input_shape), "mode": self.mode, "gpu": self.gpu,
                "measured_gpu": self.measured_gpu, "time_ms": self.time_ms, "power_w": self.power_w,
                "energy_mj": self.energy_mj, "time_low_ms": self.low.time_ms, "time_high_ms": self.high.time_ms,
                "energy_low_mj": self.low.energy_mj, "energy_high_mj": self.high.energy_mj,
                "op_sum_time_ms": self.op_sum_time_ms, "n_ops": self.n_ops, "coverage": self.coverage,
                "measured_share": self.measured_share, "correction": self.correction}

    def __str__(self) -> str:
        gpu = self.gpu + ("" if self.measured_gpu else " (not measured: extrapolated)")
        cov = f", {100 * (1 - self.coverage):.1f}% of FLOPs in uncovered operations" if self.coverage < 1 else ""
        return (f"{self.model} {tuple(self.input_shape)} {self.mode} on {gpu}: {self.time_ms:.3f} ms "
                f"[{self.low.time_ms:.3f}, {self.high.time_ms:.3f}], {self.energy_mj:.1f} mJ "
                f"[{self.low.energy_mj:.1f}, {self.high.energy_mj:.1f}], {self.power_w:.0f} W{cov}")


def structure_key(module: nn.Module) -> str:
    """Hash of a module's structure: classes, their forward code, settings (repr) and tensor shapes.

    Two instances with the same structure share extracted operations; weights do not matter.
    """
    h = hashlib.sha1()
    seen: set[type] = set()
    for m in module.modules():
        t = type(m)
        if t not in seen:
            seen.add(t)
            h.update(f"{t.__module__}.{t.__qualname__}".encode())
            code = getattr(getattr(t, "forward", None), "__code__", None)
            if code is not None:
                h.update(code.co_code)
                h.update(repr(code.co_consts).encode())
                h.update(repr(code.co_names).encode())
    h.update(repr(module).encode())
    for name, p in module.named_parameters():
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype}:{p.requires_grad}".encode())
    for name, b in module.named_buffers():
        h.update(f"{name}:{tuple(b.shape)}:{b.dtype}".encode())
    return h.hexdigest()


class Predictor:
    """Loaded models plus the operation cache. Build with :func:`load_predictor`."""

    def __init__(self, manifest: dict[str, Any], boosters: dict[str, dict[str, Any]], model_dir: Path,
                 cache_size: int = 512, lookup: MeasuredLookup | None = None) -> None:
        self.manifest = manifest
        self.lookup = lookup
        self.model_dir = Path(model_dir)
        self._boosters = boosters
        self.builder = FeatureBuilder(manifest["kind_categories"], FeatureConfig.from_dict(manifest["feature_config"]),
                                      manifest.get("extra_columns", []))
        self.correction = Correction.from_dict(manifest["network_correction"])
        self.small_op_ms = float(manifest["network_correction"].get("small_op_ms", 0.02))
        self.measured = list(manifest.get("gpus_measured", []))
        unc = manifest.get("uncertainty", {})
        band = unc.get("measured_gpu", {})
        self._band_measured = (tuple(band.get("time_ratio", (0.8, 1.25))), tuple(band.get("energy_ratio", (0.8, 1.25))))
        widen = float(unc.get("unmeasured_gpu_widening", 3.0))
        cross = unc.get("unmeasured_gpu", {})
        if "time_ratio" in cross:
            self._band_unmeasured = (tuple(cross["time_ratio"]), tuple(cross["energy_ratio"]))
        else:
            self._band_unmeasured = tuple((lo**widen, hi**widen) for lo, hi in self._band_measured)
        rng = manifest.get("ranges", {})
        self._range_tol = float(rng.get("tolerance", 2.0))
        self._range_feats = list(rng.get("features", ["flops_total", "bytes_total"]))
        self._ranges = {m: {k: np.asarray(v, dtype=np.float64) for k, v in kinds.items()}
                        for m, kinds in rng.get("by_mode_kind", {}).items()}
        self._cache: OrderedDict[tuple[Any, ...], _OpsEntry] = OrderedDict()
        self._cache_size = cache_size
        self._hw: dict[str, tuple[str, np.ndarray]] = {}

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

    # -- operations -------------------------------------------------------------------------------
    def _entry(self, model: str | nn.Module | Sequence[Any], input_shape: Sequence[int] | None, mode: str,
               dtype: Any = None) -> tuple[_OpsEntry, tuple[int, ...]]:
        shape = tuple(int(s) for s in (input_shape if input_shape is not None else DEFAULT_INPUT_SHAPE))
        if isinstance(model, str):
            key: tuple[Any, ...] = ("name", model, shape, mode, str(dtype))
        else:
            key = ("module", structure_key(model), shape, mode, str(dtype))
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit, shape
        from gpurec.ops import extract_operations

        ops = extract_operations(model, shape, mode=mode, keep_sources=False,
                                 **({"dtype": dtype} if dtype is not None else {}))
        label = model if isinstance(model, str) else type(model).__name__
        entry = self._make_entry(label, OpBlock.from_operations(ops, mode), mode)
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
        for i, kind in enumerate(block.kinds):
            r = ranges.get(kind)
            if r is None:
                covered[i] = False
                reason[i] = f"kind '{kind}' not in training data ({mode})"
                continue
            lo, hi = r[:k], r[k:]
            v = vals[i]
            bad = [self._range_feats[j] for j in range(k)
                   if v[j] > hi[j] * tol + 1e-9 or (lo[j] > 0 and v[j] < lo[j] / tol - 1e-9)]
            if bad:
                covered[i] = False
                reason[i] = f"{', '.join(bad)} outside training range x{tol:g}"
        return _OpsEntry(label=label, block=block, flops=block.column("flops_total").copy(), covered=covered,
                         reason=reason)

    # -- prediction -------------------------------------------------------------------------------
    def predict(self, model: str | nn.Module, input_shape: Sequence[int] | None = None, mode: str = "inference",
                gpu: str = "H100", dtype: Any = None) -> Estimate:
        """Estimate one network (a torchvision model name or an nn.Module) on one GPU.

        ``dtype`` is the input's dtype (e.g. torch.long for token ids; default float32).
        Warns (gpurec.LowCoverageWarning) when under 90% of the FLOPs are in known operations.
        """
        return self.predict_many([(model, input_shape)], mode=mode, gpu=gpu, dtype=dtype)[0]

    def predict_many(self, candidates: Iterable[Any], mode: str = "inference", gpu: str = "H100",
                     dtype: Any = None) -> list[Estimate]:
        """Estimate many networks at once (NAS loops): items are (model, input_shape) or just a model.

        All operations of all candidates go through each booster in a single call.
        """
        mode = _check_mode(mode)
        nvml, hw = self._gpu(gpu)
        entries: list[tuple[_OpsEntry, tuple[int, ...]]] = []
        for c in candidates:
            model, shape = c if isinstance(c, tuple) and len(c) == 2 and not isinstance(c[1], str) else (c, None)
            entries.append(self._entry(model, shape, mode, dtype))
        return self._estimate(entries, mode, nvml, hw)

    def predict_operations(self, ops: Sequence[Any], mode: str | None = None, gpu: str = "H100",
                           label: str = "operations") -> Estimate:
        """Estimate an explicit list of gpurec.ops Operations (e.g. a filtered extraction)."""
        mode = _check_mode(mode or (ops[0].mode if ops else "inference"))
        nvml, hw = self._gpu(gpu)
        entry = self._make_entry(label, OpBlock.from_operations(ops, mode), mode)
        shape = tuple(ops[0].input_shapes[0]) if ops and ops[0].input_shapes else ()
        return self._estimate([(entry, shape)], mode, nvml, hw)[0]

    def _estimate(self, entries: list[tuple[_OpsEntry, tuple[int, ...]]], mode: str, nvml: str, hw: np.ndarray
                  ) -> list[Estimate]:
        if not entries:
            return []
        block = entries[0][0].block if len(entries) == 1 else OpBlock.concat([e.block for e, _ in entries])
        feats = self.builder.build(block, hw[None, :])
        t = np.exp(self._boosters["time"][mode].predict(feats.X, feats.margin_time))
        w = np.exp(self._boosters["power"][mode].predict(feats.X, feats.margin_power))
        offsets = np.cumsum([0, *(len(e.block) for e, _ in entries)])
        hit = np.zeros(len(t), dtype=bool)
        if self.lookup is not None:
            t, w, hit = self.lookup.apply(t, w, block.signatures, nvml, mode)
        sums = aggregate(t, w, offsets, self.small_op_ms)
        t_net, w_net, key = self.correction.apply(sums, nvml, mode)
        measured = nvml in self.measured
        (tlo, thi), (elo, ehi) = self._band_measured if measured else self._band_unmeasured
        out = []
        for i, (e, shape) in enumerate(entries):
            a, b = offsets[i], offsets[i + 1]
            covered = e.covered | hit[a:b]  # a measured operation needs no model
            ft = e.flops.sum()
            cov = float(e.flops[covered].sum() / ft) if ft > 0 else float(covered.mean() if len(covered) else 1)
            warn_if_low(f"{e.label} {tuple(shape)} {mode}", cov, stacklevel=4)
            tn, wn = float(t_net[i]), float(w_net[i])
            en = tn * wn
            out.append(Estimate(
                model=e.label, input_shape=shape, mode=mode, gpu=nvml, measured_gpu=measured, time_ms=tn, power_w=wn,
                energy_mj=en, low=Bound(tn * tlo, en * elo), high=Bound(tn * thi, en * ehi),
                op_sum_time_ms=float(sums.sum_time_ms[i]), op_sum_energy_mj=float(sums.sum_energy_mj[i]),
                n_ops=int(b - a), coverage=cov, correction=key,
                measured_share=float(hit[a:b].mean()) if b > a else 0.0, _op_time_ms=t[a:b], _op_power_w=w[a:b],
                _measured=hit[a:b], _covered=covered, _entry=e))
        return out

    def clear_cache(self) -> None:
        self._cache.clear()

    def __repr__(self) -> str:
        cv = self.manifest.get("cv", {})
        return (f"Predictor({self.model_dir}, measured GPUs: {', '.join(self.measured) or 'none'}, "
                f"{len(self.builder.kinds)} op kinds, cv: {list(cv)})")


def _check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    return mode


def load_predictor(path: str | Path | None = None, *, check_data: bool | None = None,
                   data_root: str | Path | None = None, nthread: int | None = 1,
                   use_measured: bool = True) -> Predictor:
    """Load trained predictors from ``path`` (default: $GPUREC_MODELS, else models/ beside the package).

    ``use_measured`` (default) lets measured operations of a measured GPU replace predictions.
    ``nthread=1`` (default): prediction batches are small, and OpenMP threads on a busy machine
    made one vit_b_16 prediction 10-20x slower (24 ms instead of 1.2 ms on 2 loaded cores).

    Raises IncompatibleModel when the models cannot be used with this code; warns (ModelWarning)
    on other library versions, or - when ``check_data`` (default: when the dataset is present) -
    when the data on disk differs from the training data.
    """
    model_dir = Path(path) if path is not None else default_model_dir()
    manifest = read_manifest(model_dir)
    if check_data is None:
        from gpurec.dataset.load import default_root

        root = Path(data_root) if data_root is not None else default_root()
        check_data = root.exists() and any(root.glob("*/operations.parquet"))
    check_manifest(manifest, model_dir, data_root=data_root, check_data=bool(check_data))
    lookup = None
    if use_measured and manifest.get("measured_lookup"):
        lookup = MeasuredLookup.read_parquet(model_dir / manifest["measured_lookup"])
    return Predictor(manifest, load_boosters(manifest, model_dir, nthread=nthread), model_dir, lookup=lookup)
