"""Rank GPUs for one step of a network: typed rows, memory fit, ties and host-bound advice.

Runs on a laptop: it needs the trained predictors (``models/``) and the catalogue, and never
imports device, collect or calibrate code.
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpurec.model.predictor import Estimate

# objective -> (what it ranks by, unit)
OBJECTIVES: dict[str, tuple[str, str]] = {
    "time": ("time_ms", "ms"),
    "energy": ("energy_mj", "mJ"),
    "edp": ("edp_mj_ms", "mJ·ms"),
}
TIE_OVERLAP = 0.5  # a rank ties with the best when their bands share at least this much of the narrower width
BAND = "the predictor's uncertainty band (how it was derived is not recorded in its manifest)"
MAX_BATCH_SEARCH = 8192


class UnknownObjective(ValueError):
    """The objective is not one of time, energy, edp."""


def check_objective(objective: str) -> str:
    if objective not in OBJECTIVES:
        near = difflib.get_close_matches(objective, list(OBJECTIVES), n=1)
        hint = f" Did you mean '{near[0]}'?" if near else ""
        raise UnknownObjective(f"Unknown objective '{objective}'.{hint} Valid choices: {', '.join(OBJECTIVES)}.")
    return objective


def default_input_shape(batch_size: int = 32, resolution: int = 224) -> tuple[int, int, int, int]:
    return (int(batch_size), 3, int(resolution), int(resolution))


def band_description(predictor: Any) -> str:
    """What the low/high band is, from the predictor's manifest (how training derived it)."""
    manifest = getattr(predictor, "manifest", None)
    unc = manifest.get("uncertainty") if isinstance(manifest, dict) else None
    if not isinstance(unc, dict) or not isinstance(unc.get("measured_gpu"), dict):
        return BAND
    parts = []
    for key, who in (("measured_gpu", "measured GPUs"), ("unmeasured_gpu", "extrapolated GPUs")):
        band = unc.get(key)
        if not isinstance(band, dict) or "quantiles" not in band:
            continue
        lo, hi = band["quantiles"]
        source = band.get("source") or (unc.get("source") if key == "measured_gpu" else None)
        parts.append(f"{who}: {lo * 100:g}th-{hi * 100:g}th percentile of measured/predicted ratios"
                     + (f" in {source}" if source else ""))
    return "; ".join(parts) if parts else BAND


# -- the one place that reads an estimate --------------------------------------------------------
def estimate_fields(est: Estimate) -> dict[str, Any]:
    """An estimate's time/energy fields, under the names and units RankedGPU and Measurement share."""
    return {
        "time_ms": float(est.time_ms), "energy_mj": float(est.energy_mj), "power_w": float(est.power_w),
        "time_low_ms": float(est.time_low_ms), "time_high_ms": float(est.time_high_ms),
        "energy_low_mj": float(est.energy_low_mj), "energy_high_mj": float(est.energy_high_mj),
        "gpu_time_ms": float(est.gpu_time_ms), "gpu_energy_mj": float(est.gpu_energy_mj),
        "gpu_time_low_ms": float(est.gpu_time_low_ms), "gpu_time_high_ms": float(est.gpu_time_high_ms),
        "gpu_energy_low_mj": float(est.gpu_energy_low_mj), "gpu_energy_high_mj": float(est.gpu_energy_high_mj),
        "host_time_ms": float(est.host_time_ms), "bound": str(est.bound), "host": str(est.host),
        "measured_gpu": bool(est.measured_gpu), "coverage": float(est.coverage),
    }


# -- typed results -------------------------------------------------------------------------------
@dataclass(frozen=True)
class RankedGPU:
    """One GPU's predicted step. Field names and units are those of Estimate and Measurement.

    ``low``/``high`` bound the objective (see :data:`BAND`); ``vs_best_pct`` is a percent;
    energies are per step (one batch).
    """

    rank: int
    gpu: str
    short_name: str
    measured: bool  # the GPU has measurements in the training data; else extrapolated from its specifications
    time_ms: float  # eager step on the given host
    energy_mj: float
    power_w: float
    gpu_time_ms: float  # host-free: the step as one CUDA graph
    gpu_energy_mj: float
    host_time_ms: float
    bound: str  # "gpu" or "host"
    edp_mj_ms: float
    time_low_ms: float
    time_high_ms: float
    energy_low_mj: float
    energy_high_mj: float
    gpu_time_low_ms: float
    gpu_time_high_ms: float
    gpu_energy_low_mj: float
    gpu_energy_high_mj: float
    value: float  # the objective
    low: float
    high: float
    vs_best_pct: float
    tie_with_best: bool
    memory_gb: float  # estimated peak memory of the step
    memory_capacity_gb: float  # the GPU's memory (catalogue)
    fits: bool
    coverage: float  # share of FLOPs in operations the models were trained on

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BoundAdvice:
    """The step is host-bound on the best GPUs: what the GPU choice, CUDA graphs and batch size change."""

    gpus: tuple[str, ...]  # the best GPUs on which the host sets the time
    time_ms: float  # eager time on the best GPU
    gpu_time_ms: float  # the same step as one CUDA graph on it
    gpu_choice_pct: float  # eager time of the slowest fitting GPU vs the fastest, in percent
    gpu_bound_batch_size: int | None  # smallest batch size that is GPU-bound on the best GPU (None: not found)
    searched_up_to: int  # the largest batch size tried (at most what fits the best GPU's memory)

    def sentence(self) -> str:
        batch = (f"it becomes GPU-bound from batch size {self.gpu_bound_batch_size}"
                 if self.gpu_bound_batch_size is not None
                 else f"it stays host-bound up to batch size {self.searched_up_to}, as far as was searched "
                      "within the best GPU's memory")
        return (f"Host-bound on {', '.join(self.gpus)}: the GPU choice changes the eager step by only "
                f"{self.gpu_choice_pct:.0f}%; with CUDA graphs it would take {self.gpu_time_ms:.3g} ms instead of "
                f"{self.time_ms:.3g} ms; {batch}.")


@dataclass(frozen=True)
class Ranking:
    """GPUs ranked best-first for one step; rows that cannot hold the step come last."""

    model: str
    input_shape: tuple[int, ...]
    mode: str
    objective: str
    cuda_graphs: bool  # ranked by host-free time and energy
    host: str  # the host profile the eager figures are for
    rows: tuple[RankedGPU, ...]
    measured_gpus: tuple[str, ...]  # GPUs measured in the predictor's training data
    memory_gb: float
    coverage: float
    uncovered: tuple[dict[str, Any], ...] = ()
    advice: BoundAdvice | None = None
    band: str = BAND
    estimates: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    precision: str = "fp32"  # the math mode every row is predicted at (gpurec.ops.precision)
    precision_measured: bool = True  # the predictors' training data held rows at that precision

    def __iter__(self) -> Any:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> RankedGPU:
        return self.rows[i]

    @property
    def best(self) -> RankedGPU:
        return self.rows[0]

    @property
    def unit(self) -> str:
        return OBJECTIVES[self.objective][1]

    def to_frame(self) -> Any:
        """One row per GPU (a pandas DataFrame); the ranking's own facts stay on the Ranking."""
        import pandas as pd

        return pd.DataFrame([r.to_dict() for r in self.rows])

    def to_json(self) -> dict[str, Any]:
        """The documented JSON shape of ``gpurec recommend --format json``."""
        return {
            "model": self.model, "input_shape": list(self.input_shape), "mode": self.mode,
            "precision": self.precision, "precision_measured": self.precision_measured,
            "objective": self.objective, "objective_unit": self.unit, "cuda_graphs": self.cuda_graphs,
            "host": self.host, "energy_per": "step (one batch)", "band": self.band,
            "memory_gb": self.memory_gb, "coverage": self.coverage,
            "measured_gpus": list(self.measured_gpus),
            "ranking": [_finite(r.to_dict()) for r in self.rows],
            "host_bound": None if self.advice is None else {**asdict(self.advice), "summary": self.advice.sentence()},
            "uncovered": list(self.uncovered),
        }


def _finite(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


# -- ranking ---------------------------------------------------------------------------------------
def _objective(f: dict[str, Any], objective: str, cuda_graphs: bool) -> tuple[float, float, float]:
    p = "gpu_" if cuda_graphs else ""
    t, tl, th = f[f"{p}time_ms"], f[f"{p}time_low_ms"], f[f"{p}time_high_ms"]
    e = f[f"{p}energy_mj"]
    el, eh = f[f"{p}energy_low_mj"], f[f"{p}energy_high_mj"]
    if objective == "time":
        return t, tl, th
    if objective == "energy":
        return e, el, eh
    return t * e, tl * el, th * eh


def bands_tie(a: tuple[float, float], b: tuple[float, float], share: float = TIE_OVERLAP) -> bool:
    """Do two bands overlap over at least ``share`` of the narrower one's width?"""
    overlap = min(a[1], b[1]) - max(a[0], b[0])
    width = min(a[1] - a[0], b[1] - b[0])
    if width <= 0:
        return overlap >= 0
    return overlap >= share * width


def predict_step(predictor: Any, model: Any, shape: Sequence[int], mode: str, gpu: str, host: Any = None,
                 dtype: Any = None, precision: str | None = None) -> Any:
    """``predictor.predict``, passing ``host``, ``dtype`` and ``precision`` only when given (and supported)."""
    kwargs: dict[str, Any] = {"input_shape": tuple(shape), "mode": mode, "gpu": gpu}
    for name, value in (("host", host), ("dtype", dtype), ("precision", precision)):
        if value is not None:
            if name not in inspect.signature(predictor.predict).parameters:
                raise ValueError(f"these predictors take no '{name}' argument: update gpurec and retrain")
            kwargs[name] = value
    return predictor.predict(model, **kwargs)


def recommend(model: Any, input_shape: Sequence[int] | None = None, mode: str = "inference",
              objective: str = "energy", gpus: Sequence[str] | None = None, predictor: Any = None,
              host: Any = None, cuda_graphs: bool = False, dtype: Any = None,
              batch_search: bool = True, progress: Callable[[str], None] | None = None,
              precision: str | None = None) -> Ranking:
    """GPUs ranked best-first for ``objective`` on one step of ``model`` (a :class:`Ranking`).

    ``objective`` ranks by eager time/energy on ``host`` (None: the reference host; a
    host-bench JSON path, a HostProfile or "local"), or with ``cuda_graphs`` by host-free
    time/energy. GPUs whose memory cannot hold the step rank after all that can. When the
    best GPUs are host-bound and ``batch_search`` is on, the predictor is asked for larger
    batches to find where the step becomes GPU-bound. ``progress`` receives one line per
    slow stage.  ``precision`` (gpurec.ops.precision): None = fp32, or the cast precision of a
    module whose parameters are bf16/fp16; the ranking states it.
    """
    from gpurec.catalog import resolve_gpu
    from gpurec.ops.precision import resolve_precision

    check_objective(objective)
    precision = resolve_precision(model, precision)  # one line (PrecisionMismatch) on a contradiction
    say = progress or (lambda _msg: None)
    if predictor is None:
        from gpurec.model import load_predictor

        say("loading the predictors")
        predictor = load_predictor()
    shape = tuple(int(s) for s in input_shape) if input_shape is not None else default_input_shape()
    specs = []
    for g in (gpus if gpus else [e.nvml_name for e in predictor.gpus]):
        spec = resolve_gpu(g.strip() if isinstance(g, str) else g)
        if spec.nvml_name not in {s.nvml_name for s in specs}:  # "H100, H100" is one GPU
            specs.append(spec)
    say("estimating the step's memory")
    memory = step_memory_of(model, shape, mode, dtype, precision)
    memory_gb = memory.memory_gb
    rows: list[dict[str, Any]] = []
    estimates: dict[str, Any] = {}
    for spec in specs:
        say(f"predicting on {spec.short_name}")
        est = predict_step(predictor, model, shape, mode, spec.nvml_name, host, dtype,
                           None if precision == "fp32" else precision)
        estimates[spec.nvml_name] = est
        f = estimate_fields(est)
        value, lo, hi = _objective(f, objective, cuda_graphs)
        rows.append({**{k: f[k] for k in _ROW_FIELDS}, "gpu": spec.nvml_name, "short_name": spec.short_name,
                     "measured": f["measured_gpu"], "edp_mj_ms": f["time_ms"] * f["energy_mj"],
                     "value": value, "low": lo, "high": hi, "memory_gb": memory_gb,
                     "memory_capacity_gb": float(spec.memory_gb), "fits": memory_gb <= float(spec.memory_gb),
                     "coverage": f["coverage"], "_host": f["host"]})
    rows.sort(key=lambda r: (not r["fits"], r["value"]))
    ranked = _rank(rows)
    host_name = next((r["_host"] for r in rows if r["_host"]), None) or _host_label(host)
    first = next(iter(estimates.values()), None)
    advice = None
    if ranked and ranked[0].bound == "host":
        advice = _bound_advice(ranked, predictor, model, shape, mode, host, dtype, batch_search, say, memory,
                               None if precision == "fp32" else precision)
    measured = tuple(e.nvml_name for e in predictor.gpus if e.measured)
    return Ranking(model=model if isinstance(model, str) else type(model).__name__, input_shape=shape, mode=mode,
                   objective=objective, cuda_graphs=bool(cuda_graphs), host=host_name, rows=tuple(ranked),
                   measured_gpus=measured, memory_gb=memory_gb,
                   coverage=min((r.coverage for r in ranked), default=1.0),
                   uncovered=_uncovered(first), advice=advice, band=band_description(predictor),
                   estimates=estimates, precision=precision,
                   precision_measured=all(getattr(e, "precision_measured", True) for e in estimates.values()))


_ROW_FIELDS = ("time_ms", "energy_mj", "power_w", "gpu_time_ms", "gpu_energy_mj", "host_time_ms", "bound",
               "time_low_ms", "time_high_ms", "energy_low_mj", "energy_high_mj", "gpu_time_low_ms",
               "gpu_time_high_ms", "gpu_energy_low_mj", "gpu_energy_high_mj")


def _rank(rows: list[dict[str, Any]]) -> list[RankedGPU]:
    if not rows:
        return []
    best = rows[0]
    out = []
    for i, r in enumerate(rows):
        tie = i > 0 and r["fits"] == best["fits"] and bands_tie((best["low"], best["high"]), (r["low"], r["high"]))
        vs = (r["value"] / best["value"] - 1.0) * 100.0 if best["value"] > 0 else math.nan
        out.append(RankedGPU(rank=i + 1, vs_best_pct=vs, tie_with_best=bool(tie),
                             **{k: v for k, v in r.items() if not k.startswith("_")}))
    return out


def _host_label(host: Any) -> str:
    if host is None:
        return "reference"
    return str(getattr(host, "name", host))


def _uncovered(est: Any) -> tuple[dict[str, Any], ...]:
    """The estimate's uncovered operations as plain records (JSON-able Python values)."""
    unc = est.uncovered if est is not None else None
    if unc is None or not len(unc):
        return ()
    return tuple({k: (v.item() if hasattr(v, "item") else v) for k, v in rec.items()}
                 for rec in unc.to_dict("records"))


def step_memory_of(model: Any, shape: tuple[int, ...], mode: str, dtype: Any = None,
                   precision: str | None = None) -> Any:
    """Estimated peak memory of one step at ``precision`` (a gpurec.ops.memory.StepMemory)."""
    from gpurec.ops import extract_operations
    from gpurec.ops.memory import step_memory

    kwargs = {"dtype": dtype} if dtype is not None else {}
    ops = extract_operations(model, shape, mode=mode, keep_sources=False, precision=precision, **kwargs)
    return step_memory(ops, mode)


def step_memory_gb(model: Any, shape: tuple[int, ...], mode: str, dtype: Any = None) -> float:
    """Estimated peak memory of one step in GB (gpurec.ops.memory)."""
    return float(step_memory_of(model, shape, mode, dtype).memory_gb)


def largest_fitting_batch(memory: Any, batch: int, capacity_gb: float) -> int:
    """The largest batch size whose step fits ``capacity_gb``: activations grow with the batch,
    parameters and gradients do not."""
    fixed = memory.params_bytes + memory.grads_bytes
    per_sample = memory.activations_bytes / max(batch, 1)
    if per_sample <= 0:
        return MAX_BATCH_SEARCH
    return max(0, int((capacity_gb * 1e9 - fixed) // per_sample))


def _bound_advice(ranked: list[RankedGPU], predictor: Any, model: Any, shape: tuple[int, ...], mode: str,
                  host: Any, dtype: Any, batch_search: bool, say: Callable[[str], None], memory: Any,
                  precision: str | None = None) -> BoundAdvice:
    fitting = [r for r in ranked if r.fits] or ranked
    best = ranked[0]
    host_bound = tuple(r.short_name for r in ranked if r.bound == "host" and (r is best or r.tie_with_best))
    times = [r.time_ms for r in fitting]
    choice = (max(times) / min(times) - 1.0) * 100.0 if min(times) > 0 else math.nan
    found, tried = None, shape[0]
    if batch_search:
        limit = min(MAX_BATCH_SEARCH, largest_fitting_batch(memory, shape[0], best.memory_capacity_gb))
        found, tried = smallest_gpu_bound_batch(predictor, model, shape, mode, best.gpu, host, dtype, say, limit,
                                                precision)
    return BoundAdvice(gpus=host_bound, time_ms=best.time_ms, gpu_time_ms=best.gpu_time_ms, gpu_choice_pct=choice,
                       gpu_bound_batch_size=found, searched_up_to=tried)


def smallest_gpu_bound_batch(predictor: Any, model: Any, shape: tuple[int, ...], mode: str, gpu: str, host: Any,
                             dtype: Any = None, say: Callable[[str], None] | None = None,
                             limit: int = MAX_BATCH_SEARCH, precision: str | None = None) -> tuple[int | None, int]:
    """(smallest batch size whose step is GPU-bound on ``gpu``, largest batch size tried).

    Doubles the batch size until the predictor says "gpu", then bisects (about 2 log2(B)
    predictions); None when ``limit`` is still host-bound. Assumes the verdict changes once
    as the batch grows, which the step timeline makes true: GPU work grows with the batch,
    host work barely does.
    """
    say = say or (lambda _msg: None)

    def gpu_bound(batch: int) -> bool:
        say(f"batch size {batch}")
        est = predict_step(predictor, model, (batch, *shape[1:]), mode, gpu, host, dtype, precision)
        return estimate_fields(est)["bound"] == "gpu"

    lo, hi = shape[0], shape[0] * 2
    while True:
        if hi > limit:
            if lo >= limit or not gpu_bound(limit):
                return None, max(lo, limit)
            hi = limit
            break
        if gpu_bound(hi):
            break
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if gpu_bound(mid):
            hi = mid
        else:
            lo = mid
    return hi, hi
