"""Uncertainty bands, and how the errors behind them combine.

A band is a (low, high) pair of measured / predicted ratio quantiles around an estimate, low <= 1
<= high.  Why a module: a GPU without rows of its own is predicted as an anchor GPU's estimate
times the cross-GPU model's ratio, so its error holds both; a band read from one validation alone
could come out narrower than a measured GPU's, the opposite of what the evidence says.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Band = tuple[float, float]


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
