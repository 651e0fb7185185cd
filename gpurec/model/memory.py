"""The fitted peak-memory terms saved beside the predictors (``models/memory.json``).

Why a file: the coefficients of the terms gpurec.ops.memory cannot derive (library workspaces,
scratch space, cuDNN RNN reserve space) are learnt from measured peaks by
``gpurec tools fit-memory`` (gpurec.model.fitting.memory_fit); prediction only loads and checks them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from gpurec.ops.memory import MemoryFit

MEMORY_FILE = "memory.json"
MEMORY_SCHEMA = 1
MEMORY_TERMS = ("floor_bytes", "activations", "largest", "conv_io", "matmul_io", "rnn")
MEMORY_MODES = ("inference", "training")


class MemoryFitError(ValueError):
    """``memory.json`` is malformed; refit it with ``gpurec tools fit-memory``."""


def memory_fit_from_dict(d: dict[str, Any], where: str = MEMORY_FILE) -> MemoryFit:
    """A checked MemoryFit: the schema this code reads, both modes, every term, each a finite
    non-negative number, and the provenance of the fit."""
    fix = "refit it with `gpurec tools fit-memory`"
    if d.get("schema") != MEMORY_SCHEMA:
        raise MemoryFitError(f"{where}: schema {d.get('schema')!r}, this code reads {MEMORY_SCHEMA}; {fix}")
    terms = d.get("terms")
    if not isinstance(terms, dict) or set(terms) != set(MEMORY_MODES):
        raise MemoryFitError(f"{where}: terms must hold exactly the modes {MEMORY_MODES}; {fix}")
    clean: dict[str, dict[str, float]] = {}
    for mode, coefs in terms.items():
        if not isinstance(coefs, dict) or set(coefs) != set(MEMORY_TERMS):
            raise MemoryFitError(f"{where}: mode {mode} must hold exactly the terms {MEMORY_TERMS}; {fix}")
        for name, value in coefs.items():
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise MemoryFitError(f"{where}: {mode}.{name} is {value!r}, not a finite non-negative number; {fix}")
        clean[mode] = {k: float(v) for k, v in coefs.items()}
    if not isinstance(d.get("provenance"), dict) or "rows" not in d["provenance"]:
        raise MemoryFitError(f"{where}: no provenance (which rows the terms were fitted on); {fix}")
    return MemoryFit(clean, dict(d["provenance"]))


def memory_fit_to_dict(fit: MemoryFit) -> dict[str, Any]:
    return {"schema": MEMORY_SCHEMA, "terms": fit.terms, "provenance": fit.provenance}


def load_memory_fit(model_dir: Path | str) -> MemoryFit | None:
    """The fitted memory terms saved in ``model_dir``, or None when there are none (the
    estimate is then the analytic part alone, a lower bound)."""
    path = Path(model_dir) / MEMORY_FILE
    if not path.exists():
        return None
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise MemoryFitError(f"{path}: not JSON ({exc}); refit it with `gpurec tools fit-memory`") from exc
    return memory_fit_from_dict(d, str(path))
