"""Is the choice between two GPUs resolved, given the predictor's errors?

A ranking sells the difference between two GPUs, so a tie is judged on the error of the
*difference*: the log of the predicted ratio ``value_gpu / value_best`` against the spread
of ``log(measured_a / predicted_a) - log(measured_b / predicted_b)``.  Errors of two GPUs are
correlated (the same network, the same operation models), which two independent bands
ignore; overlapping 5th-95th percentile bands called a T4 at +218% a tie.

Where the same networks were measured on both GPUs, the spread comes from those pairs: the
90th percentile of the absolute log-ratio error (:func:`paired_spreads`).  Otherwise, the two
bands' log half-widths (each a 5th-95th percentile band, i.e. a 90% interval) are combined
as for independent errors (square root of the sum of squares): the wider of the two
dominates, and no correlation is assumed that was not measured.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TIE_QUANTILE = 0.9  # the difference is unresolved when it is within 90% of the paired errors
MIN_PAIRS = 10  # fewer pairs than this are too few for a 90th percentile
OBJECTIVE_FIELDS = {"time": ("time_ms",), "energy": ("energy_mj",), "edp": ("time_ms", "energy_mj")}


@dataclass(frozen=True)
class DifferenceSpreads:
    """Per GPU pair (sorted NVML names) and objective: the 90th percentile of |log-ratio error|."""

    spreads: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    pairs: dict[tuple[str, str], int] = field(default_factory=dict)  # how many networks each rests on
    source: str = "none"

    def spread(self, a: str, b: str, objective: str) -> float | None:
        return self.spreads.get(tuple(sorted((a, b))), {}).get(objective)  # type: ignore[arg-type]


def half_width(value: float, low: float, high: float) -> float:
    """Half the band's width in log space (inf for a band that is not positive)."""
    if not (value > 0 and low > 0 and high > 0):
        return math.inf
    return (math.log(high) - math.log(low)) / 2.0


def is_tie(value: float, best_value: float, spread: float) -> bool:
    """The predicted log-ratio is within the error of the difference."""
    if not (value > 0 and best_value > 0):
        return False
    return abs(math.log(value / best_value)) <= spread


def combined_spread(best: tuple[float, float, float], other: tuple[float, float, float]) -> float:
    """Spread of the difference of two independent errors, from each (value, low, high) band."""
    return math.hypot(half_width(*best), half_width(*other))


def paired_spreads(records: Iterable[dict[str, Any]], quantile: float = TIE_QUANTILE,
                   min_pairs: int = MIN_PAIRS) -> DifferenceSpreads:
    """Spreads of the log-ratio error from networks measured and predicted on several GPUs.

    ``records`` carry model, batch_size, resolution, mode, gpu and measured_/predicted_
    time_ms and energy_mj (the rows of ``datasets/validation/validation_log.jsonl``).
    """
    import numpy as np

    by_net: dict[tuple[Any, ...], dict[str, dict[str, float]]] = {}
    for r in records:
        try:
            err = {f: math.log(float(r[f"measured_{f}"]) / float(r[f"predicted_{f}"]))
                   for f in ("time_ms", "energy_mj")}
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            continue  # a record without a prediction (pending) or measurement
        if not all(math.isfinite(v) for v in err.values()):
            continue
        key = (r.get("model"), r.get("batch_size"), r.get("resolution"), r.get("mode"), r.get("precision", "fp32"))
        by_net.setdefault(key, {})[str(r["gpu"])] = err
    diffs: dict[tuple[str, str], dict[str, list[float]]] = {}
    for errs in by_net.values():
        gpus = sorted(errs)
        for i, a in enumerate(gpus):
            for b in gpus[i + 1:]:
                d = diffs.setdefault((a, b), {o: [] for o in OBJECTIVE_FIELDS})
                for objective, fields in OBJECTIVE_FIELDS.items():
                    d[objective].append(sum(errs[a][f] - errs[b][f] for f in fields))
    spreads = {pair: {o: float(np.quantile(np.abs(v), quantile)) for o, v in d.items()}
               for pair, d in diffs.items() if len(d["time"]) >= min_pairs}
    pairs = {pair: len(d["time"]) for pair, d in diffs.items() if pair in spreads}
    return DifferenceSpreads(spreads, pairs)


def load_difference_spreads(manifest: dict[str, Any] | None = None,
                            root: Path | str | None = None) -> DifferenceSpreads:
    """The trained models' own spreads (``uncertainty.difference`` in the manifest) when they
    record them, else the validation log's networks (predictions of the shipped models against
    the collected whole-network measurements), else none."""
    unc = (manifest or {}).get("uncertainty", {})
    diff = unc.get("difference") if isinstance(unc, dict) else None
    if isinstance(diff, dict) and isinstance(diff.get("pairs"), list):
        spreads = {tuple(sorted(p["gpus"])): {o: float(p[o]) for o in OBJECTIVE_FIELDS if o in p}
                   for p in diff["pairs"]}
        counts = {tuple(sorted(p["gpus"])): int(p.get("n", 0)) for p in diff["pairs"]}
        return DifferenceSpreads(spreads, counts, str(diff.get("source", "the trained models' manifest")))  # type: ignore[arg-type]
    from gpurec.dataset.load import default_root

    log = (Path(root) if root is not None else default_root()) / "validation" / "validation_log.jsonl"
    if not log.is_file():
        return DifferenceSpreads()
    records = []
    with log.open(encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a torn line is no evidence
    found = paired_spreads(records)
    if not found.spreads:
        return DifferenceSpreads()
    n = sum(found.pairs.values())
    return DifferenceSpreads(found.spreads, found.pairs,
                             f"{n} networks measured on two GPUs in {log.name} (the shipped models' eager "
                             "predictions against the collected measurements; most of those networks' "
                             "operations were in the training data, so this spread is optimistic)")
