"""The warning for estimates that rest on operations the models were never trained on."""

from __future__ import annotations

import warnings

LOW_COVERAGE = 0.9  # below this share of FLOPs in known operations, a total is not trustworthy


class LowCoverageWarning(UserWarning):
    """Less than 90% of a network's FLOPs are in operations the models were trained on.

    Filter it like any warning: ``warnings.simplefilter("ignore", gpurec.LowCoverageWarning)``.
    """


def warn_if_low(label: str, coverage: float, stacklevel: int = 3) -> bool:
    """Warn (LowCoverageWarning) when ``coverage`` is below LOW_COVERAGE; True if it was."""
    if coverage >= LOW_COVERAGE:
        return False
    warnings.warn(f"{label}: only {coverage * 100:.1f}% of the FLOPs are in operations the models were trained on; "
                  "the estimate's totals are not trustworthy (see Estimate.uncovered)", LowCoverageWarning,
                  stacklevel=stacklevel)
    return True


class UnmeasuredPrecisionWarning(UserWarning):
    """The predictors were trained on no measured rows at the estimate's precision: its
    operations are predicted through the precision's peak rates and element sizes (the
    roofline features) from models fitted to other precisions, so the estimate is an
    extrapolation, not a learned figure.  ``Estimate.precision_measured`` says the same."""


def warn_unmeasured_precision(label: str, precision: str, measured: tuple[str, ...] | list[str],
                              stacklevel: int = 3) -> None:
    warnings.warn(f"{label}: no {precision} rows in the training data (measured: {', '.join(measured)}); "
                  f"the estimate extrapolates through {precision}'s peak rates and is not trustworthy yet",
                  UnmeasuredPrecisionWarning, stacklevel=stacklevel)
