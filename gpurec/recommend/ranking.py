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

from gpurec.ops.coverage import LOW_COVERAGE
from gpurec.recommend.evidence import (
    EAGER,
    PUBLIC,
    SPECS,
    UNMEASURED_WIDENING,
    EvidenceSets,
    band_exponent,
    evidence_of,
    load_evidence,
    widen,
)
from gpurec.recommend.ties import (
    DifferenceSpreads,
    combined_spread,
    half_width,
    is_tie,
    load_difference_spreads,
)
from gpurec.results import StepCost

if TYPE_CHECKING:
    from gpurec.model.predictor import Estimate

# objective -> (what it ranks by, unit)
OBJECTIVES: dict[str, tuple[str, str]] = {
    "time": ("time_ms", "ms"),
    "energy": ("energy_mj", "mJ"),
    "edp": ("edp_mj_ms", "mJ·ms"),
}
TIE_OVERLAP = 0.5  # bands_tie: the share of the narrower band two bands must share (kept for callers)
BAND = "the predictor's uncertainty band (how it was derived is not recorded in its manifest)"
MAX_BATCH_SEARCH = 8192


class UnknownObjective(ValueError):
    """The objective is not one of time, energy, edp."""


def check_objective(objective: str) -> str:
    """The objective, lower-cased (choices ignore case); UnknownObjective names the valid ones."""
    if str(objective).lower() in OBJECTIVES:
        return str(objective).lower()
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
    for key, who in (("measured_gpu", "measured GPUs"), ("unmeasured_gpu", "the cross-GPU error")):
        band = unc.get(key)
        if not isinstance(band, dict) or "quantiles" not in band:
            continue
        lo, hi = band["quantiles"]
        source = band.get("source") or (unc.get("source") if key == "measured_gpu" else None)
        parts.append(f"{who}: {lo * 100:g}th-{hi * 100:g}th percentile of measured/predicted ratios"
                     + (f" in {source}" if source else ""))
    from gpurec.model.crossgpu import PUBLIC_BAND_KEY

    cross = getattr(predictor, "crossgpu", None)
    public = getattr(cross, "info", {}).get(PUBLIC_BAND_KEY) if cross is not None else None
    if isinstance(public, dict) and "models" in public:
        parts.append(f"widened to the time errors of {public['models']} {public['source']}")
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
    evidence: str = "specifications only"  # what backs it (gpurec.recommend.evidence.LEVELS)
    gpu_power_w: float = math.nan  # host-free: gpu_energy_mj / gpu_time_ms

    @property
    def cost(self) -> StepCost:
        """The predicted step's cost as the type estimates and measurements share (gpurec.results)."""
        return StepCost.of(self)

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
    # share of the FLOPs in operations the models were trained on, at the batch size the answer
    # names (gpu_bound_batch_size, else searched_up_to); None: not searched or not known
    answer_coverage: float | None = None

    def sentence(self) -> str:
        batch = (f"it becomes GPU-bound from batch size {self.gpu_bound_batch_size}"
                 if self.gpu_bound_batch_size is not None
                 else f"it stays host-bound up to batch size {self.searched_up_to}, as far as was searched "
                      "within the best GPU's memory")
        if self.answer_coverage is not None and self.answer_coverage < LOW_COVERAGE:
            batch += (f" (an extrapolation: at that batch size only {self.answer_coverage * 100:.0f}% of the FLOPs "
                      "are in operations the models were trained on)")
        spread = (f"; across the GPUs that hold the step, the eager step differs by {self.gpu_choice_pct:.0f}% "
                  "from fastest to slowest" if math.isfinite(self.gpu_choice_pct) else "")
        return (f"Host-bound on {', '.join(self.gpus)}: the host's issue time, not the GPU, sets the eager step "
                f"({_num(self.time_ms)} ms; the GPU's own work is {_num(self.gpu_time_ms)} ms, which "
                f"--cuda-graphs ranks by){spread}; {batch}.")


def _num(v: float) -> str:
    """About three significant digits, never in scientific notation."""
    if not math.isfinite(v):
        return "-"
    a = abs(v)
    if a >= 100:
        return f"{v:,.0f}"
    if a >= 1:
        return f"{v:.{2 - (a >= 10)}f}"
    return f"{v:.3g}" if a >= 1e-4 or a == 0 else f"{v:.6f}"


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
    notes: tuple[str, ...] = ()  # how ambiguous GPU names were resolved; unaligned half-precision products
    evidence_source: str = ""  # where the evidence levels were read
    tie_rule: str = ""  # how ties were decided, with the source of the errors
    precision: str = "fp32"  # the math mode every row is predicted at (gpurec.ops.precision)
    precision_measured: bool = True  # the predictors' training data held rows at that precision

    def __iter__(self) -> Any:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> RankedGPU:
        return self.rows[i]

    @property
    def fits_any(self) -> bool:
        """Can any ranked GPU hold the step?"""
        return any(r.fits for r in self.rows)

    @property
    def best(self) -> RankedGPU | None:
        """The first row, or None when no ranked GPU can hold the step (none is best)."""
        return self.rows[0] if self.rows and self.rows[0].fits else None

    @property
    def unit(self) -> str:
        return OBJECTIVES[self.objective][1]

    def to_frame(self) -> Any:
        """One row per GPU (a pandas DataFrame); the ranking's own facts stay on the Ranking."""
        import pandas as pd

        return pd.DataFrame([r.to_dict() for r in self.rows])

    def to_dict(self) -> dict[str, Any]:
        """The documented JSON shape of ``gpurec recommend --format json``, as Python values."""
        return {
            "model": self.model, "input_shape": list(self.input_shape), "mode": self.mode,
            "precision": self.precision, "precision_measured": self.precision_measured,
            "objective": self.objective, "objective_unit": self.unit, "cuda_graphs": self.cuda_graphs,
            "host": self.host, "energy_per": "step (one batch)", "band": self.band,
            "memory_gb": self.memory_gb, "coverage": self.coverage, "fits_any": self.fits_any,
            "best": None if self.best is None else self.best.gpu,
            "measured_gpus": list(self.measured_gpus), "evidence_source": self.evidence_source,
            "tie_rule": self.tie_rule, "bound_rule": bound_rule(),
            "ranking": [_finite(r.to_dict()) for r in self.rows],
            "host_bound": None if self.advice is None else {**asdict(self.advice), "summary": self.advice.sentence()},
            "notes": list(self.notes),
            "uncovered": list(self.uncovered),
        }

    def to_json(self, indent: int | None = 2) -> str:
        """:meth:`to_dict` as a JSON string (it returned the dict before: use to_dict for that)."""
        import json

        return json.dumps(self.to_dict(), indent=indent, default=str)


def bound_rule() -> str:
    """The one bound rule (gpurec.model.timeline), in words."""
    from gpurec.model.timeline import HOST_BOUND_RATIO

    return (f"host-bound when the eager step takes at least {HOST_BOUND_RATIO:g}x the GPU's own time "
            "(the step as one CUDA graph), else GPU-bound")


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
                 dtype: Any = None, example_inputs: Any = None, precision: str | None = None,
                 warn: bool = True) -> Any:
    """``predictor.predict``, passing ``host``, ``dtype``, ``example_inputs`` and ``precision``
    only when given (and supported); ``warn=False`` asks it to leave its coverage and precision
    warnings out where it can (the caller reads the estimate's ``coverage`` instead)."""
    kwargs: dict[str, Any] = {"input_shape": tuple(shape), "mode": mode, "gpu": gpu}
    params = inspect.signature(predictor.predict).parameters
    for name, value in (("host", host), ("dtype", dtype), ("example_inputs", example_inputs),
                        ("precision", precision)):
        if value is not None:
            if name not in params:
                raise ValueError(f"these predictors take no '{name}' argument: update gpurec and retrain")
            kwargs[name] = value
    if not warn and "warn" in params:
        kwargs["warn"] = False
    return predictor.predict(model, **kwargs)


def recommend(model: Any, input_shape: Sequence[int] | None = None, mode: str = "inference",
              objective: str = "energy", gpus: str | Sequence[str] | None = None, predictor: Any = None,
              host: Any = None, cuda_graphs: bool = False, dtype: Any = None,
              batch_search: bool = True, progress: Callable[[str], None] | None = None,
              example_inputs: Any = None, evidence: EvidenceSets | None = None,
              spreads: DifferenceSpreads | None = None, precision: str | None = None) -> Ranking:
    """GPUs ranked best-first for ``objective`` on one step of ``model`` (a :class:`Ranking`).

    ``objective`` ranks by eager time/energy on ``host`` (None: the reference host; a
    host-bench JSON path, a HostProfile or "local"), or with ``cuda_graphs`` by host-free
    time/energy. ``gpus`` is a list of names or one comma-separated string (None: every
    catalogue GPU). GPUs whose memory cannot hold the step rank after all that can. Each row
    says what backs it (``evidence``, read from the data present unless given) and its band
    widens where the evidence is weaker; ties come from the error of the difference
    (gpurec.recommend.ties; ``spreads`` default: the models' manifest or the validation log).
    When the best GPUs are host-bound (eager only) and ``batch_search`` is on, the predictor is
    asked for larger batches to find where the step becomes GPU-bound. ``progress`` receives
    one line per slow stage.  ``example_inputs`` (a tensor, a tuple of tensors or a dict of them by keyword, e.g.
    ``(src, tgt)`` for nn.Transformer) replaces ``input_shape`` and ``dtype``; with it there is
    no batch search (which dimension is the batch of each input is the model's business).
    ``precision`` (gpurec.ops.precision): None = fp32, or the cast precision of a module whose
    parameters are bf16/fp16; the ranking states it.
    """
    from gpurec.ops.precision import resolve_precision
    from gpurec.recommend.names import resolve_noted, split_gpus

    objective = check_objective(objective)
    precision = resolve_precision(model, precision)  # one line (PrecisionMismatch) on a contradiction
    say = progress or (lambda _msg: None)
    names = split_gpus(gpus)
    if predictor is None:
        from gpurec.model import load_predictor

        say("loading the predictors")
        predictor = load_predictor()
    if example_inputs is not None:
        from gpurec.model.predictor import checked_example_inputs, first_input_shape

        example_inputs = checked_example_inputs(example_inputs)
        shape = first_input_shape(example_inputs)
        batch_search = False
    else:
        shape = tuple(int(s) for s in input_shape) if input_shape is not None else default_input_shape()
    specs, notes = [], []
    for g in (names if names else [e.nvml_name for e in predictor.gpus]):
        spec, note = resolve_noted(g)
        if note and names:
            notes.append(note)
        if spec.nvml_name not in {s.nvml_name for s in specs}:  # "H100, H100" is one GPU
            specs.append(spec)
    manifest = getattr(predictor, "manifest", None)
    manifest = manifest if isinstance(manifest, dict) else {}
    if evidence is None:
        evidence = load_evidence(manifest=manifest)
    if spreads is None:
        spreads = load_difference_spreads(manifest)
    widening = float(manifest.get("uncertainty", {}).get("unmeasured_gpu_widening", UNMEASURED_WIDENING))
    say("estimating the step's memory")
    memory = step_memory_of(model, shape, mode, dtype, example_inputs, precision,
                            fit=getattr(predictor, "memory_fit", None))
    memory_gb = memory.memory_gb
    rows: list[dict[str, Any]] = []
    estimates: dict[str, Any] = {}
    for spec in specs:
        say(f"predicting on {spec.short_name}")
        est = predict_step(predictor, model, shape, mode, spec.nvml_name, host, dtype, example_inputs,
                           None if precision == "fp32" else precision)
        estimates[spec.nvml_name] = est
        f = estimate_fields(est)
        level = evidence_of(spec.nvml_name, evidence)
        f = widen_bands(f, level, widening)  # the predictor's band, widened to the evidence behind it
        value, lo, hi = _objective(f, objective, cuda_graphs)
        cross_hw = _cross_half_width(predictor, f["measured_gpu"], level, objective, widening)
        rows.append({**{k: f[k] for k in _ROW_FIELDS}, "gpu": spec.nvml_name, "short_name": spec.short_name,
                     "measured": f["measured_gpu"], "edp_mj_ms": _edp(f, cuda_graphs),
                     "value": value, "low": lo, "high": hi, "memory_gb": memory_gb,
                     "memory_capacity_gb": float(spec.memory_gb), "fits": memory_gb <= float(spec.memory_gb),
                     "coverage": f["coverage"], "evidence": level,
                     "gpu_power_w": f["gpu_energy_mj"] / f["gpu_time_ms"] if f["gpu_time_ms"] > 0 else math.nan,
                     "_host": f["host"], "_cross_hw": cross_hw,
                     "_anchor": _anchor_of(predictor, spec.nvml_name) if cross_hw is not None else None})
    rows.sort(key=lambda r: (not r["fits"], r["value"]))
    ranked = _rank(rows, objective, spreads)
    host_name = next((r["_host"] for r in rows if r["_host"]), None) or _host_label(host)
    first = next(iter(estimates.values()), None)
    unaligned = getattr(first, "unaligned_products", None)
    if unaligned is not None and len(unaligned):  # the same operations on every GPU
        from gpurec.model.gemm import unaligned_note

        notes.append(unaligned_note(unaligned.to_dict("records")))
    advice = None
    if ranked and ranked[0].fits and ranked[0].bound == "host" and not cuda_graphs:
        advice = _bound_advice(ranked, predictor, model, shape, mode, host, dtype, batch_search, say, memory,
                               None if precision == "fp32" else precision)
    measured = tuple(e.nvml_name for e in predictor.gpus if e.measured)
    return Ranking(model=model if isinstance(model, str) else type(model).__name__, input_shape=shape, mode=mode,
                   objective=objective, cuda_graphs=bool(cuda_graphs), host=host_name, rows=tuple(ranked),
                   measured_gpus=measured, memory_gb=memory_gb,
                   coverage=min((r.coverage for r in ranked), default=1.0),
                   uncovered=_uncovered(first), advice=advice,
                   band=band_description(predictor) + "; " + evidence_band_rule(widening),
                   estimates=estimates, notes=tuple(notes), evidence_source=evidence.source,
                   tie_rule=tie_rule_text(spreads), precision=precision,
                   precision_measured=all(getattr(e, "precision_measured", True) for e in estimates.values()))


def _edp(f: dict[str, Any], cuda_graphs: bool) -> float:
    p = "gpu_" if cuda_graphs else ""
    return f[f"{p}time_ms"] * f[f"{p}energy_mj"]


_FIGURES = (("time", "time_ms", "time_low_ms", "time_high_ms"),
            ("energy", "energy_mj", "energy_low_mj", "energy_high_mj"),
            ("gpu_time", "gpu_time_ms", "gpu_time_low_ms", "gpu_time_high_ms"),
            ("gpu_energy", "gpu_energy_mj", "gpu_energy_low_mj", "gpu_energy_high_mj"))


def widen_bands(f: dict[str, Any], level: str, widening: float = UNMEASURED_WIDENING) -> dict[str, Any]:
    """An estimate's fields with each figure's band widened for the evidence behind it
    (gpurec.recommend.evidence.band_exponent)."""
    out = dict(f)
    for figure, v, lo, hi in _FIGURES:
        out[lo], out[hi] = widen(f[v], f[lo], f[hi], band_exponent(level, figure, widening, bool(f["measured_gpu"])))
    return out


def evidence_band_rule(widening: float = UNMEASURED_WIDENING) -> str:
    """How bands follow the evidence, in words (the README says the same)."""
    mid = f"{math.sqrt(widening):.2g}x"
    return (f"bands of GPUs without rows of their own compound the measured band with the cross-GPU "
            f"model's validated error (independent errors, in log space), and widen it {mid} where "
            f"nothing measured of that GPU backs the figure (every figure of '{SPECS}', the energy of "
            f"'{PUBLIC}'); '{EAGER}' keeps the measured band for eager figures and widens host-free "
            f"ones {mid}")


def tie_rule_text(spreads: DifferenceSpreads) -> str:
    pairs = "; ".join(f"{_short(a)}/{_short(b)}: {', '.join(f'{o} x{math.exp(v):.2f}' for o, v in d.items())}"
                      for (a, b), d in spreads.spreads.items())
    paired = (f" For {pairs}, the 90th percentile of the ratio's error over {spreads.source}." if pairs else "")
    return ("A tie: the predicted ratio to the best is within the error of the difference between the two GPUs."
            + paired + " An extrapolated GPU against its anchor (the H100) or another GPU extrapolated from it: "
            "the cross-GPU ratios' errors alone (the anchor's error is in both figures). Other pairs: the two "
            "5th-95th percentile bands combined as independent errors.")


def _short(nvml: str) -> str:
    from gpurec.catalog import resolve_gpu

    try:
        return resolve_gpu(nvml).short_name
    except ValueError:
        return nvml


_ROW_FIELDS = ("time_ms", "energy_mj", "power_w", "gpu_time_ms", "gpu_energy_mj", "host_time_ms", "bound",
               "time_low_ms", "time_high_ms", "energy_low_mj", "energy_high_mj", "gpu_time_low_ms",
               "gpu_time_high_ms", "gpu_energy_low_mj", "gpu_energy_high_mj")


def _cross_half_width(predictor: Any, measured_gpu: bool, level: str, objective: str,
                      widening: float) -> float | None:
    """Half the log width of the cross-GPU ratio's band for ``objective``, widened to the evidence
    behind a GPU without rows (None for a measured GPU, or a predictor without a validated
    cross-GPU error)."""
    band = predictor.cross_band() if not measured_gpu and hasattr(predictor, "cross_band") else None
    if band is None:
        return None
    hw = {figure: half_width(1.0, *b) * band_exponent(level, figure, widening, False)
          for figure, b in zip(("time", "energy"), band, strict=True)}
    return hw["time"] + hw["energy"] if objective == "edp" else hw[objective]


def _anchor_of(predictor: Any, gpu: str) -> str | None:
    """The GPU whose estimate an extrapolated GPU's is transferred from (None: unknown)."""
    anchor = getattr(predictor, "cross_anchor", None)
    return anchor(gpu) if callable(anchor) else None


def _difference_spread(a: dict[str, Any], b: dict[str, Any], objective: str,
                       spreads: DifferenceSpreads | None) -> float:
    """The error of the log-ratio of two rows' figures.  Measured on both GPUs: the paired spread
    where one was measured, else the two bands as independent errors.  An extrapolated GPU's
    figure is its anchor's times the cross-GPU ratio, so the anchor's error is in both figures and
    cancels; what is left is each ratio's error and, between two different anchors, theirs."""
    def paired(x: str, y: str) -> float | None:
        return spreads.spread(x, y, objective) if spreads is not None else None

    independent = combined_spread((a["value"], a["low"], a["high"]), (b["value"], b["low"], b["high"]))
    hw_a, hw_b = a.get("_cross_hw"), b.get("_cross_hw")
    if hw_a is None and hw_b is None:
        found = paired(a["gpu"], b["gpu"])
        return found if found is not None else independent
    side_a = a.get("_anchor") if hw_a is not None else a["gpu"]
    side_b = b.get("_anchor") if hw_b is not None else b["gpu"]
    if side_a is None or side_b is None:
        return independent
    shared = 0.0 if side_a == side_b else paired(side_a, side_b)
    if shared is None:
        return independent
    return math.hypot(shared, hw_a or 0.0, hw_b or 0.0)


def _rank(rows: list[dict[str, Any]], objective: str = "time",
          spreads: DifferenceSpreads | None = None) -> list[RankedGPU]:
    if not rows:
        return []
    best = rows[0]
    out = []
    for i, r in enumerate(rows):
        tie = False
        if i > 0 and best["fits"] and r["fits"]:
            tie = is_tie(r["value"], best["value"], _difference_spread(best, r, objective, spreads))
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
                   example_inputs: Any = None, precision: str | None = None, fit: Any = None) -> Any:
    """Estimated peak memory of one step at ``precision`` (a gpurec.ops.memory.StepMemory),
    with the fitted terms of ``fit`` (the predictor's ``memory_fit``) where given."""
    from gpurec.ops import extract_operations
    from gpurec.ops.memory import step_memory

    if example_inputs is not None:
        ops = extract_operations(model, mode=mode, keep_sources=False, example_inputs=example_inputs)
        return step_memory(ops, mode, fit)
    kwargs = {"dtype": dtype} if dtype is not None else {}
    ops = extract_operations(model, shape, mode=mode, keep_sources=False, precision=precision, **kwargs)
    return step_memory(ops, mode, fit)


def step_memory_gb(model: Any, shape: tuple[int, ...], mode: str, dtype: Any = None, fit: Any = None) -> float:
    """Estimated peak memory of one step in GB (gpurec.ops.memory)."""
    return float(step_memory_of(model, shape, mode, dtype, fit=fit).memory_gb)


def largest_fitting_batch(memory: Any, batch: int, capacity_gb: float) -> int:
    """The largest batch size whose step fits ``capacity_gb``: activations and scratch space grow
    with the batch, parameters, gradients and the library workspaces' floor do not."""
    fixed = memory.params_bytes + memory.grads_bytes + getattr(memory, "floor_bytes", 0)
    per_sample = (memory.activations_bytes + getattr(memory, "workspace_bytes", 0)) / max(batch, 1)
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
    found, tried, coverage = None, shape[0], None
    if batch_search:
        limit = min(MAX_BATCH_SEARCH, largest_fitting_batch(memory, shape[0], best.memory_capacity_gb))
        seen: dict[int, float] = {}
        found, tried = smallest_gpu_bound_batch(predictor, model, shape, mode, best.gpu, host, dtype, say, limit,
                                                precision, coverage=seen)
        coverage = seen.get(found if found is not None else tried)
    return BoundAdvice(gpus=host_bound, time_ms=best.time_ms, gpu_time_ms=best.gpu_time_ms, gpu_choice_pct=choice,
                       gpu_bound_batch_size=found, searched_up_to=tried, answer_coverage=coverage)


def smallest_gpu_bound_batch(predictor: Any, model: Any, shape: tuple[int, ...], mode: str, gpu: str, host: Any,
                             dtype: Any = None, say: Callable[[str], None] | None = None,
                             limit: int = MAX_BATCH_SEARCH, precision: str | None = None,
                             coverage: dict[int, float] | None = None) -> tuple[int | None, int]:
    """(smallest batch size whose step is GPU-bound on ``gpu``, largest batch size tried).

    Doubles the batch size until the predictor says "gpu", then bisects (about 2 log2(B)
    predictions); None when ``limit`` is still host-bound. Assumes the verdict changes once
    as the batch grows, which the step timeline makes true: GPU work grows with the batch,
    host work barely does.  The probes do not warn about coverage (a dozen warnings for one
    question); ``coverage``, when given, receives each tried batch size's estimate coverage, so
    the caller can say whether the answer rests on trained operations.
    """
    say = say or (lambda _msg: None)

    def gpu_bound(batch: int) -> bool:
        say(f"batch size {batch}")
        est = predict_step(predictor, model, (batch, *shape[1:]), mode, gpu, host, dtype, precision=precision,
                           warn=False)
        if coverage is not None and getattr(est, "coverage", None) is not None:
            coverage[batch] = float(est.coverage)
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


def predict_on(model: Any, input_shape: Sequence[int], mode: str, gpu: str, predictor: Any, host: Any = None,
               cuda_graphs: bool = False, dtype: Any = None, evidence: EvidenceSets | None = None,
               precision: str | None = None) -> dict[str, Any]:
    """One GPU's step as ``gpurec predict`` reports it: the estimate's fields (bands widened for
    the evidence behind the GPU, as in a ranking), the evidence, the step's memory and whether it
    fits, the bound rule, and a note when ``gpu`` fits several catalogue GPUs.

    With ``cuda_graphs``, ``power_w`` is the host-free power (gpu_energy_mj / gpu_time_ms).
    """
    from gpurec.recommend.names import resolve_noted

    spec, note = resolve_noted(gpu)
    est = predict_step(predictor, model, tuple(input_shape), mode, spec.nvml_name, host, dtype,
                       precision=None if precision in (None, "fp32") else precision)
    manifest = getattr(predictor, "manifest", None)
    manifest = manifest if isinstance(manifest, dict) else {}
    sets = evidence if evidence is not None else load_evidence(manifest=manifest)
    level = evidence_of(spec.nvml_name, sets)
    f = estimate_fields(est)
    widening = float(manifest.get("uncertainty", {}).get("unmeasured_gpu_widening", UNMEASURED_WIDENING))
    f = widen_bands(f, level, widening)
    f["gpu_power_w"] = f["gpu_energy_mj"] / f["gpu_time_ms"] if f["gpu_time_ms"] > 0 else math.nan
    memory = step_memory_of(model, tuple(input_shape), mode, dtype, precision=precision,
                            fit=getattr(predictor, "memory_fit", None))
    return {**f, "gpu": spec.nvml_name, "short_name": spec.short_name, "evidence": level,
            "evidence_source": sets.source, "memory_gb": memory.memory_gb,
            "memory_capacity_gb": float(spec.memory_gb), "fits": memory.memory_gb <= float(spec.memory_gb),
            "cuda_graphs": bool(cuda_graphs), "bound_rule": bound_rule(), "note": note,
            "recomputed_ops": int(getattr(est, "recomputed_ops", 0)),
            "recompute_gpu_time_ms": float(getattr(est, "recompute_gpu_time_ms", 0.0)),
            "band": band_description(predictor) + "; " + evidence_band_rule(widening), "estimate": est}
