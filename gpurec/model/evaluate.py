"""Error metrics and leakage-free fold construction."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

_FAMILY = re.compile(r"^[a-z]+")


def family(arch: str) -> str:
    """Architecture family: the name's prefix before the first digit or underscore (resnet50 -> resnet)."""
    m = _FAMILY.match(arch.lower())
    return m.group(0) if m else arch.lower()


def arch_of(set_key: str) -> str:
    return set_key.split(":", 1)[0]


def row_families(set_key: str, model_sets: Any) -> frozenset[str]:
    """Families of every model-input set an operation row belongs to (its own set included)."""
    sets = [set_key]
    if isinstance(model_sets, str) and model_sets.startswith("["):
        try:
            sets += list(json.loads(model_sets))
        except json.JSONDecodeError:
            pass
    elif isinstance(model_sets, (list, tuple, np.ndarray)):
        sets += list(model_sets)
    return frozenset(family(arch_of(s)) for s in sets)


def grouped_folds(groups: Sequence[Any], k: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """K folds where every group (e.g. an op signature) sits in exactly one test fold.

    Groups are shuffled with ``seed`` and dealt out largest first, so folds hold similar row counts.
    """
    groups = np.asarray(groups)
    uniq, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
    k = max(2, min(k, len(uniq)))
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(uniq))
    order = order[np.argsort(-counts[order], kind="stable")]
    load = np.zeros(k)
    fold_of = np.empty(len(uniq), dtype=np.int64)
    for g in order:
        f = int(np.argmin(load))
        fold_of[g] = f
        load[f] += counts[g]
    row_fold = fold_of[inverse]
    idx = np.arange(len(groups))
    return [(idx[row_fold != f], idx[row_fold == f]) for f in range(k)]


def ape(pred: Any, measured: Any) -> np.ndarray:
    """Absolute percentage error per row."""
    return np.abs(np.asarray(pred, dtype=np.float64) / np.asarray(measured, dtype=np.float64) - 1.0) * 100.0


def summary(pred: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    e = ape(pred, measured)
    if len(e) == 0:
        return {"n": 0}
    return {"n": int(len(e)), "mape": float(np.mean(e)), "median_ape": float(np.median(e)),
            "p90_ape": float(np.percentile(e, 90)), "within10": float(np.mean(e <= 10.0))}


def triple(pred_t: np.ndarray, pred_p: np.ndarray, meas_t: np.ndarray, meas_p: np.ndarray) -> dict[str, Any]:
    """Time, power and energy (= power x time) summaries for one set of rows."""
    return {"n": int(len(meas_t)), "time": summary(pred_t, meas_t), "power": summary(pred_p, meas_p),
            "energy": summary(pred_t * pred_p, meas_t * meas_p)}


def breakdown(pred_t: np.ndarray, pred_p: np.ndarray, meas_t: np.ndarray, meas_p: np.ndarray,
              gpus: Iterable[str], modes: Iterable[str], extra: dict[str, Iterable[str]] | None = None
              ) -> dict[str, Any]:
    """Overall and per mode, per GPU and per GPU+mode summaries (each with its row count)."""
    gpus, modes = np.asarray(list(gpus)), np.asarray(list(modes))
    out: dict[str, Any] = {"overall": triple(pred_t, pred_p, meas_t, meas_p), "by_mode": {}, "by_gpu": {},
                           "by_gpu_mode": {}}
    for m in sorted(set(modes.tolist())):
        s = modes == m
        out["by_mode"][m] = triple(pred_t[s], pred_p[s], meas_t[s], meas_p[s])
    for g in sorted(set(gpus.tolist())):
        s = gpus == g
        out["by_gpu"][g] = triple(pred_t[s], pred_p[s], meas_t[s], meas_p[s])
        for m in sorted(set(modes[s].tolist())):
            s2 = s & (modes == m)
            out["by_gpu_mode"][f"{g}|{m}"] = triple(pred_t[s2], pred_p[s2], meas_t[s2], meas_p[s2])
    for name, labels in (extra or {}).items():
        lab = np.asarray(list(labels))
        out[f"by_{name}"] = {v: triple(pred_t[lab == v], pred_p[lab == v], meas_t[lab == v], meas_p[lab == v])
                             for v in sorted(set(lab.tolist()))}
    return out
