"""Every generated document, from the committed data and models (``gpurec report ...``).

One module per report; each has a ``generate`` that writes its document(s) under a repository
root and returns the Markdown text.  ``speed`` and ``coverage`` render a committed JSON of
benchmark results (``benchmarks/``), re-measured only on request, so that every report can be
regenerated and checked on a small CPU machine.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

REPORTS = ("dataset", "accuracy", "calibration", "profile", "validation", "speed", "coverage")

# What each report writes, relative to the repository root (images next to it are not listed).
OUTPUTS = {
    "dataset": "datasets/README.md",
    "accuracy": "docs/accuracy.md",
    "calibration": "docs/calibration.md",
    "profile": "docs/profile_results.md",
    "validation": "docs/validation.md",
    "speed": "docs/speed.md",
    "coverage": "docs/coverage.md",
}


def generate(name: str, root: Path | str = ".", measure: bool = False, analytic: bool = True,
             progress: Callable[[str], None] | None = None) -> Path:
    """Regenerate one report under the repository ``root``; returns the document's path.

    ``measure`` re-runs the speed or coverage benchmark on this machine first (slow; the other
    reports ignore it); ``analytic=False`` skips the calibration report's re-extraction."""
    root = Path(root)
    if name not in REPORTS:
        raise ValueError(f"unknown report '{name}': choose one of {', '.join(REPORTS)} or all")
    if not (root / "datasets").is_dir():
        raise FileNotFoundError(f"{root.resolve()} has no datasets/ folder: run from the repository root "
                                "or pass its path")
    if name == "dataset":
        from gpurec.reports import dataset

        dataset.generate(root / "datasets", progress=progress)
    elif name == "accuracy":
        from gpurec.reports import accuracy

        accuracy.generate(root / "models", root / "docs" / "accuracy.md", root / "datasets")
    elif name == "calibration":
        from gpurec.reports import calibration

        calibration.generate(root / "datasets", root / "docs", analytic=analytic)
    elif name == "profile":
        from gpurec.reports import profile

        profile.generate(root)
    elif name == "validation":
        from gpurec.reports import validation

        validation.generate(root, warn=progress)
    elif name == "speed":
        from gpurec.reports import speed

        speed.generate(root, measure_first=measure, progress=progress)
    else:
        from gpurec.reports import coverage

        coverage.generate(root, measure_first=measure, progress=progress)
    return root / OUTPUTS[name]
