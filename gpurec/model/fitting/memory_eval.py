"""Peak-memory estimate against the measured trusted peaks, per group.

Why: extracting every measured network takes minutes; iterating on gpurec.ops.memory needs
seconds.  The extracted operations are kept in this process per (set key, mode, precision)
(``_OPERATIONS``; no file: the package loads no pickles), so a Python session that calls
``evaluate_memory`` again after editing the memory rules and reloading gpurec.ops.memory gets the
answer in seconds.  With ``refit`` the coefficients are refitted in memory (nothing written) on
the training architectures' trusted peaks, as ``gpurec tools fit-memory`` would, so a changed
analytic part is judged with its own fit.  ``gpurec tools memory-eval`` renders it (one run,
minutes).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

TARGET_PCT = 15.0
_OPERATIONS: dict[tuple[str, str, str], Any] = {}


def cached_operations(table: Any, progress: Callable[[int, int], None] | None = None
                      ) -> dict[tuple[str, str, str], Any]:
    """The extracted operations of every (set key, mode, precision) of ``table``, kept in this
    process (extraction changes need a new process)."""
    from gpurec.ops import extract_operations
    from gpurec.sets import parse_set_key

    missing = sorted({(r.set_key, r.mode, r.precision) for r in table.itertuples(index=False)} - set(_OPERATIONS))
    for n, key in enumerate(missing):
        s = parse_set_key(key[0])
        _OPERATIONS[key] = extract_operations(s.arch, s.input_shape, mode=key[1], keep_sources=False,
                                              precision=key[2])
        if progress is not None:
            progress(n + 1, len(missing))
    return _OPERATIONS


def evaluate_memory(models_dir: Path | str = "models", data_root: Path | str | None = None, refit: bool = False,
                    progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Every trusted peak's estimate (``rows``: set key, mode, precision, split, family, measured
    and estimated bytes, error in %, the terms) and per (split, family, mode, precision) the count
    within TARGET_PCT (``groups``); ``coefficients`` are those used (refitted or loaded)."""
    from gpurec.model.fitting.memory_fit import fit_memory, peak_table
    from gpurec.model.memory import load_memory_fit
    from gpurec.ops.memory import memory_terms

    table = peak_table(data_root)
    table = table[table["leftover_suspect"] == ""].reset_index(drop=True)
    ops = cached_operations(table, progress)
    terms = [memory_terms(ops[(r.set_key, r.mode, r.precision)], r.mode) for r in table.itertuples(index=False)]
    fit = fit_memory(table, terms) if refit else load_memory_fit(models_dir)
    if fit is None:
        raise FileNotFoundError(f"no memory.json under {models_dir}: run `gpurec tools fit-memory` or pass refit")
    rows, groups = [], {}
    for r, t in zip(table.itertuples(index=False), terms, strict=True):
        est = fit.apply(t)
        err = (est.total_bytes / r.measured_bytes - 1.0) * 100.0
        rows.append({"set_key": r.set_key, "arch": r.arch, "mode": r.mode, "precision": r.precision,
                     "split": r.split, "family": r.family, "measured_bytes": r.measured_bytes,
                     "estimated_bytes": est.total_bytes, "error_pct": err, "params_bytes": t.params_bytes,
                     "activations_bytes": t.activations_bytes, "rnn_term_bytes": t.rnn_term_bytes,
                     "workspace_bytes": est.workspace_bytes})
        g = groups.setdefault((r.split, r.family, r.mode, r.precision), [0, 0, 0.0])
        g[0] += 1
        g[1] += abs(err) <= TARGET_PCT
        g[2] += abs(err)
    return {"coefficients": fit.terms, "rows": rows,
            "groups": [{"split": k[0], "family": k[1], "mode": k[2], "precision": k[3], "rows": n, "within": ok,
                        "mean_abs_error_pct": total / n} for k, (n, ok, total) in sorted(groups.items())]}
