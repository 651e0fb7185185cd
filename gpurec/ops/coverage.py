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
