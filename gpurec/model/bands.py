"""Uncertainty bands, and how the errors behind them combine.

A band is a (low, high) pair of measured / predicted ratio quantiles around an estimate, low <= 1
<= high.  Why a module: a GPU without rows of its own is predicted as an anchor GPU's estimate
times the cross-GPU model's ratio, so its error holds both; a band read from one validation alone
could come out narrower than a measured GPU's, the opposite of what the evidence says.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

Band = tuple[float, float]
DEFAULT_BAND: Band = (0.8, 1.25)  # a manifest that records no measured band


def as_band(value: Sequence[float] | None) -> Band | None:
    """A (low, high) band from a stored pair, held to low <= 1 <= high; None for none or a bad one."""
    if value is None or len(value) != 2:
        return None
    lo, hi = float(value[0]), float(value[1])
    if not (lo > 0 and math.isfinite(lo) and math.isfinite(hi)):
        return None
    return min(lo, 1.0), max(hi, 1.0)


def compound(*bands: Band) -> Band:
    """Independent errors together: each side's log half-width is the root sum of squares of the
    bands' (a figure that is one estimate times another carries both errors)."""
    lo = math.sqrt(sum(math.log(b[0]) ** 2 for b in bands))
    hi = math.sqrt(sum(math.log(b[1]) ** 2 for b in bands))
    return math.exp(-lo), math.exp(hi)


def widest(*bands: Band | None) -> Band | None:
    """Each side's widest of the bands given (None where none is)."""
    present = [b for b in bands if b is not None]
    if not present:
        return None
    return min(b[0] for b in present), max(b[1] for b in present)


def widened(band: Band, exponent: float) -> Band:
    """The band with its log width multiplied by ``exponent``."""
    return band[0] ** exponent, band[1] ** exponent


def extrapolated(measured: tuple[Band, Band], validated: tuple[Band | None, Band | None],
                 public_time: Band | None) -> tuple[tuple[Band, Band], tuple[Band, Band]] | None:
    """(time, energy) bands of a GPU without rows of its own, and of its cross-GPU ratio alone.

    Its figures are an anchor GPU's estimate times the cross-GPU ratio, so they carry the
    ``measured`` band's error and the ratio's, compounded.  The ratio's error is the widest of
    what validated it: ``validated`` (leave-one-GPU-out network errors, time and energy) and
    ``public_time`` (the public whole models, each GPU held out; energy takes it too, a transferred
    time's error being in its energy).  None where neither validated it."""
    cross_t = widest(validated[0], public_time)
    cross_e = widest(validated[1], public_time)
    if cross_t is None or cross_e is None:
        return None
    return (compound(measured[0], cross_t), compound(measured[1], cross_e)), (cross_t, cross_e)


def measured_bands(unc: Mapping[str, Any]) -> tuple[Band, Band]:
    """(time, energy) band of a measured GPU from a manifest's ``uncertainty``."""
    band = unc.get("measured_gpu", {})
    return as_band(band.get("time_ratio")) or DEFAULT_BAND, as_band(band.get("energy_ratio")) or DEFAULT_BAND


def extrapolated_from(unc: Mapping[str, Any], public: Mapping[str, Any] | None
                      ) -> tuple[tuple[Band, Band], tuple[Band, Band]] | None:
    """``extrapolated`` from what is stored: a manifest's ``uncertainty`` (measured band and
    leave-one-GPU-out ``unmeasured_gpu`` band) and the public whole models' band (``time_ratio``
    of crossgpu.json's ``public_model_band``; None: none)."""
    cross = unc.get("unmeasured_gpu", {})
    return extrapolated(measured_bands(unc), (as_band(cross.get("time_ratio")), as_band(cross.get("energy_ratio"))),
                        as_band(public.get("time_ratio")) if isinstance(public, Mapping) else None)
