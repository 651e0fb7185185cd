"""What one step costs, one type for predictions, measurements and rankings.

An ``Estimate`` (``Estimate.cost``), a measured network (``StepCost.measured`` from a collected
row) and a ``RankedGPU`` (``RankedGPU.cost``) all give a :class:`StepCost`, so validation
compares them field by field (:func:`compare`) and the bound rule exists once
(:data:`HOST_BOUND_RATIO`, :func:`bound_of`).  Bottom of the package: imports nothing of gpurec.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

# The step is "host"-bound when the host makes it at least 20% longer than the GPU alone.
HOST_BOUND_RATIO = 1.2

# The cost fields validation compares, prediction against measurement.
COMPARED_FIELDS = ("time_ms", "energy_mj", "power_w", "gpu_time_ms", "gpu_energy_mj", "host_time_ms")
BAND_FIELDS = ("time_low_ms", "time_high_ms", "energy_low_mj", "energy_high_mj", "gpu_time_low_ms",
               "gpu_time_high_ms", "gpu_energy_low_mj", "gpu_energy_high_mj")


def bound_of(time_ms: float, gpu_time_ms: float) -> str:
    """``"host"`` when the eager step is >= HOST_BOUND_RATIO x the GPU's own time, else ``"gpu"``."""
    return "host" if time_ms >= HOST_BOUND_RATIO * gpu_time_ms else "gpu"


def bounds_of(time_ms: Any, gpu_time_ms: Any) -> Any:
    """:func:`bound_of` over arrays (numpy): ``"host"``/``"gpu"`` per element, ``""`` where the
    ratio is unknown (a missing or zero GPU time)."""
    import numpy as np

    t, g = np.asarray(time_ms, dtype=np.float64), np.asarray(gpu_time_ms, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        known = np.isfinite(t) & np.isfinite(g) & (g > 0)
    return np.where(~known, "", np.where(t >= HOST_BOUND_RATIO * g, "host", "gpu"))


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


@dataclass(frozen=True)
class StepCost:
    """One step (a forward, or a forward and backward) of a network on one GPU.

    Eager on a host: ``time_ms``, ``energy_mj``, ``power_w`` (energy / time) and
    ``host_time_ms`` (the host's time to issue the step).  Host-free (the step as one CUDA
    graph): ``gpu_time_ms``, ``gpu_energy_mj``.  ``bound`` follows :func:`bound_of`.  A figure
    not known (a measurement without a host-free pass, a prediction's bands) is None."""

    time_ms: float
    energy_mj: float
    power_w: float
    gpu_time_ms: float | None = None
    gpu_energy_mj: float | None = None
    host_time_ms: float | None = None
    bound: str | None = None
    time_low_ms: float | None = None
    time_high_ms: float | None = None
    energy_low_mj: float | None = None
    energy_high_mj: float | None = None
    gpu_time_low_ms: float | None = None
    gpu_time_high_ms: float | None = None
    gpu_energy_low_mj: float | None = None
    gpu_energy_high_mj: float | None = None

    @property
    def gpu_power_w(self) -> float | None:
        """Mean GPU power of the host-free step."""
        if self.gpu_time_ms and self.gpu_energy_mj is not None:
            return self.gpu_energy_mj / self.gpu_time_ms
        return None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, obj: Any) -> StepCost:
        """The cost carried by anything with these field names as attributes or keys (an
        Estimate, a RankedGPU, a dict of them)."""
        get = obj.get if isinstance(obj, dict) else (lambda k, d=None: getattr(obj, k, d))
        values = {k: _num(get(k)) for k in ("time_ms", "energy_mj", "power_w", "gpu_time_ms", "gpu_energy_mj",
                                            "host_time_ms", *BAND_FIELDS)}
        bound = get("bound")
        return cls(bound=str(bound) if bound else None, **values)  # type: ignore[arg-type]

    @classmethod
    def measured(cls, row: dict[str, Any]) -> StepCost:
        """The cost of a measured network, from a collected row (``gpurec.collect``'s fields:
        ``time_ms``, ``energy_mj``, ``power_w``, host-free ``gpu_time_ms``/``gpu_energy_mj`` and
        ``host_ms``, the host's time to enqueue one step); the bound by the one rule.  A step that
        could not be captured as a graph (``captured`` False) has no host-free figures: its
        ``gpu_time_ms`` is the eager step's GPU time (collect.measure's fallback), host gaps included."""
        t, e = _num(row.get("time_ms")), _num(row.get("energy_mj"))
        if t is None or e is None:
            raise ValueError("a measured step needs finite time_ms and energy_mj")
        host_free = row.get("captured") is not False
        g = _num(row.get("gpu_time_ms")) if host_free else None
        power = _num(row.get("power_w"))
        return cls(time_ms=t, energy_mj=e, power_w=power if power is not None else (e / t if t else math.nan),
                   gpu_time_ms=g, gpu_energy_mj=_num(row.get("gpu_energy_mj")) if host_free else None,
                   host_time_ms=_num(row.get("host_ms")), bound=bound_of(t, g) if g else None)


def compare(predicted: StepCost, measured: StepCost) -> dict[str, Any]:
    """Prediction against measurement, field by field: ``<field>_error_pct`` = (predicted -
    measured) / measured in per cent for every compared field both sides know (``time``,
    ``energy``, ``power``, ``gpu_time``, ``gpu_energy``, ``host_time``), and ``bound_right``
    where both have a bound."""
    out: dict[str, Any] = {}
    for f in COMPARED_FIELDS:
        p, m = getattr(predicted, f), getattr(measured, f)
        if p is not None and m:
            out[f"{f.rsplit('_', 1)[0]}_error_pct"] = (p / m - 1.0) * 100.0
    if predicted.bound and measured.bound:
        out["bound_right"] = predicted.bound == measured.bound
    return out
