"""Fit the peak-memory terms (gpurec.ops.memory.MemoryTerms) on measured peaks.

Why: autograd and liveness give parameters, gradients and saved activations exactly, but not
the cuBLAS/cuDNN workspaces, a convolution's or matmul's scratch space or cuDNN's RNN reserve
space.  Their coefficients are fitted per mode by non-negative least squares on relative
error, on the training architectures' peaks only (DATASET_ARCHS, SEQ_DATASET_ARCHS,
SYNTH_ARCHS); the held-out architectures (TEST_ARCHS, SEQ_TEST_ARCHS) only judge the fit.

A peak is used only when nothing else was allocated when its step started.  Network rows
measured before rows recorded ``memory_allocated_before_bytes`` ran after other rows in the
same process, whose reference cycles stayed allocated until Python's collector ran (sequence
peaks of a few MB read 2-6 GB); they are kept and shown, but marked ``leftover_suspect`` and
never fitted on.  Peak rows (``item == "peak"``) start from a fresh unit, and rows that record
``memory_allocated_before_bytes`` are trusted when it is at most the GPU's library floor (the
smallest amount any of its rows found allocated: cuBLAS/cuDNN workspaces that stay for the whole
process) plus LEFTOVER_MARGIN_BYTES, and never above LEFTOVER_LIMIT_BYTES.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from gpurec.model.memory import MEMORY_FILE, MEMORY_MODES, MEMORY_TERMS, memory_fit_to_dict
from gpurec.ops.memory import MemoryFit, MemoryTerms
from gpurec.ops.precision import precision_or_default

LEFTOVER_LIMIT_BYTES = 256 * 2**20  # library workspaces stay allocated; anything more is an earlier row's
# Above the GPU's library floor, what an earlier row left behind.  Read off the committed H100 and
# H200 rows: every run starts at 65.0 or 71.2 MiB (the library workspaces), and rows above it sit
# 60 MiB and more higher (131, 164, 195, 228 MiB...); those read 15-40% above the estimate where
# the same network measured at the floor agrees within a few %, so the leftover was still held
# during the step.  The margin sits between the two.
LEFTOVER_MARGIN_BYTES = 32 * 2**20
# The terms each mode fits (inference has no gradient in flight).  The analytic activations are
# taken as they are (coefficient 1): liveness and autograd's saved tensors hold for every family,
# while a coefficient fitted on the CNNs alone (0.27 in inference, traded against the
# convolution term) would shrink a transformer's attention buffers, which no trusted peak checks.
FITTED_TERMS = {"inference": ("floor_bytes", "conv_io", "matmul_io", "rnn"),
                "training": ("floor_bytes", "largest", "conv_io", "matmul_io", "rnn")}
FIXED_TERMS = {"activations": 1.0}


def family_of(arch: str) -> str:
    """torchvision (and the hand-written synthetic CNNs), transformer or rnn."""
    from gpurec.sets import SEQ_DATASET_ARCHS, SEQ_TEST_ARCHS

    if arch in SEQ_DATASET_ARCHS or arch in SEQ_TEST_ARCHS:
        return "rnn" if arch.startswith(("lstm", "gru", "rnn")) else "transformer"
    return "torchvision"


def split_of(arch: str) -> str | None:
    """"training" (fitted on), "held-out" (judged on) or None (neither list)."""
    from gpurec.sets import DATASET_ARCHS, SEQ_DATASET_ARCHS, SEQ_TEST_ARCHS, SYNTH_ARCHS, TEST_ARCHS

    if arch in DATASET_ARCHS or arch in SEQ_DATASET_ARCHS or arch in SYNTH_ARCHS:
        return "training"
    if arch in TEST_ARCHS or arch in SEQ_TEST_ARCHS:
        return "held-out"
    return None


def _finite_or_none(value: Any) -> float | None:
    """A recorded byte count, or None where the row has none (older rows: NaN in the table)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value)


def leftover_reason(item: str, before_bytes: Any, floor_bytes: float | None = None) -> str | None:
    """Why a peak may include memory of earlier rows, or None when it is trusted.  ``floor_bytes``:
    the GPU's library floor (the least any of its rows found allocated before its step); a row
    more than LEFTOVER_MARGIN_BYTES above it, or above LEFTOVER_LIMIT_BYTES, is suspect."""
    if _finite_or_none(before_bytes) is not None:
        limit = LEFTOVER_LIMIT_BYTES if floor_bytes is None else \
            min(LEFTOVER_LIMIT_BYTES, float(floor_bytes) + LEFTOVER_MARGIN_BYTES)
        if float(before_bytes) > limit:
            return f"{float(before_bytes) / 2**20:.0f} MiB allocated before the step"
        return None
    if item == "network":
        return "network row measured after earlier rows, without a collection first"
    return None


def peak_table(data_root: Path | str | None = None) -> Any:
    """Every measured peak (networks and peaks tables of every GPU) with its arch, family, split,
    precision and ``leftover_suspect`` reason ("" when the peak is trusted); no row is dropped."""
    import pandas as pd

    from gpurec.dataset import load_dataset
    from gpurec.sets import parse_set_key

    frames = []
    for table_name in ("networks", "peaks"):
        try:
            frames.append(load_dataset(root=data_root, table=table_name))
        except FileNotFoundError:
            pass
    if not frames:
        raise FileNotFoundError("no networks or peaks table under the dataset root: run `gpurec dataset build`")
    nets = pd.concat(frames, ignore_index=True)
    if "peak_memory_bytes" not in nets:
        return nets.iloc[0:0]
    nets = nets[nets["peak_memory_bytes"].notna()].copy()
    floors: dict[str, float] = {}  # per GPU, the least allocated before any row's step
    if "memory_allocated_before_bytes" in nets:
        floors = {str(g): float(v) for g, v in nets.groupby("gpu")["memory_allocated_before_bytes"].min().items()
                  if _finite_or_none(v) is not None}
    records = []
    for r in nets.to_dict("records"):
        try:
            s = parse_set_key(str(r["set_key"]))
        except ValueError as exc:
            raise ValueError(f"peak row {r.get('id')}: set key {r['set_key']!r} does not parse ({exc})") from exc
        precision = precision_or_default(r.get("precision"))
        item = str(r.get("item") or "network")
        records.append({"gpu": str(r["gpu"]), "id": r.get("id"), "item": item, "set_key": s.key, "arch": s.arch,
                        "batch": int(s.input_shape[0]), "mode": str(r["mode"]), "precision": precision,
                        "family": family_of(s.arch), "split": split_of(s.arch),
                        "measured_bytes": float(r["peak_memory_bytes"]),
                        "allocated_before_bytes": _finite_or_none(r.get("memory_allocated_before_bytes")),
                        "leftover_suspect": leftover_reason(item, r.get("memory_allocated_before_bytes"),
                                                            floors.get(str(r["gpu"]))) or ""})
    return pd.DataFrame.from_records(records)


def terms_for(table: Any, extract: Callable[[str, str, str], Sequence[Any]] | None = None) -> list[MemoryTerms]:
    """The MemoryTerms of each row of ``table`` (one extraction per set, mode and precision)."""
    from gpurec.ops.memory import memory_terms

    if extract is None:
        from gpurec.ops import extract_operations
        from gpurec.sets import parse_set_key

        def extract(set_key: str, mode: str, precision: str) -> Sequence[Any]:
            s = parse_set_key(set_key)
            return extract_operations(s.arch, s.input_shape, mode=mode, keep_sources=False, precision=precision)

    cache: dict[tuple[str, str, str], MemoryTerms] = {}
    out = []
    for r in table.itertuples(index=False):
        key = (r.set_key, r.mode, r.precision)
        if key not in cache:
            cache[key] = memory_terms(extract(*key), r.mode)
        out.append(cache[key])
    return out


def _columns(t: MemoryTerms, names: Sequence[str]) -> list[float]:
    value = {"floor_bytes": 1.0, "activations": t.activations_bytes, "largest": t.largest_bytes,
             "conv_io": t.conv_term_bytes, "matmul_io": t.matmul_io_bytes, "rnn": t.rnn_term_bytes}
    return [float(value[n]) for n in names]


def fit_memory(table: Any, terms: Sequence[MemoryTerms]) -> MemoryFit:
    """Per mode, the non-negative coefficients minimising the relative error of
    params + grads + activations + floor + sum(coefficient x term) on the trusted
    training-architecture rows (the activations' coefficient is fixed: FIXED_TERMS).
    A term no such row exercises (e.g. ``rnn`` without a trusted RNN peak) stays 0 and the
    provenance says so."""
    from scipy.optimize import nnls

    use = [(r, t) for r, t in zip(table.itertuples(index=False), terms, strict=True)
           if r.split == "training" and not r.leftover_suspect and r.measured_bytes > 0]
    coefs: dict[str, dict[str, float]] = {}
    rows: dict[str, Any] = {}
    unfitted: dict[str, list[str]] = {}
    for mode in MEMORY_MODES:
        names = FITTED_TERMS[mode]
        sub = [(r, t) for r, t in use if r.mode == mode]
        if not sub:
            raise ValueError(f"no trusted training-architecture peak in {mode}: collect peaks first "
                             "(`gpurec tools plan --sets peaks-networks`, then `gpurec collect --plan ...`)")
        x = np.array([_columns(t, names) for _, t in sub])
        y = np.array([r.measured_bytes - t.params_bytes - t.grads_bytes
                      - FIXED_TERMS["activations"] * t.activations_bytes for r, t in sub])
        w = 1.0 / np.array([r.measured_bytes for r, _ in sub])
        scale = np.maximum(np.abs(x).max(axis=0), 1.0)  # columns of comparable size for the solver
        sol, _ = nnls((x / scale) * w[:, None], y * w)
        sol = sol / scale
        coefs[mode] = {n: FIXED_TERMS.get(n, 0.0) for n in MEMORY_TERMS}
        coefs[mode].update({n: float(v) for n, v in zip(names, sol, strict=True)})
        unfitted[mode] = [n for n, col in zip(names, x.T, strict=True) if not np.any(col > 0)]
        rows[mode] = {"rows": len(sub), "by_family": _count(r.family for r, _ in sub),
                      "by_precision": _count(r.precision for r, _ in sub), "gpus": sorted({r.gpu for r, _ in sub})}
    excluded = _count(r.leftover_suspect for r in table.itertuples(index=False) if r.leftover_suspect)
    provenance = {"rows": rows, "terms_without_rows": unfitted, "fixed_terms": FIXED_TERMS,
                  "excluded_leftover_suspect": excluded, "leftover_limit_bytes": LEFTOVER_LIMIT_BYTES,
                  "leftover_margin_bytes": LEFTOVER_MARGIN_BYTES,
                  "fitted_on": "training architectures (DATASET_ARCHS, SEQ_DATASET_ARCHS, SYNTH_ARCHS)",
                  "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "command": "gpurec tools fit-memory"}
    return MemoryFit(coefs, provenance)


def _count(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return dict(sorted(out.items()))


def write_memory_fit(models_dir: Path | str = "models", data_root: Path | str | None = None) -> dict[str, Any]:
    """Fit on the committed peaks and write ``models_dir/memory.json`` atomically; returns it."""
    from gpurec.dataset.store import atomic_write_json

    table = peak_table(data_root)
    fit = fit_memory(table, terms_for(table))
    d = memory_fit_to_dict(fit)
    atomic_write_json(Path(models_dir) / MEMORY_FILE, d)
    return d
