"""Where the whole-network error sits, as data for docs/accuracy.md.

* per_kind_errors: on the unseen test architectures, each operation's predicted GPU time
  against the kernel time the in-network pass attributed to it (datasets/<gpu>/in_network.parquet),
  summed per *error kind*: the kinds issue reports single out (grouped/depthwise convolution,
  channel concatenation, window attention, squeeze-excite, stochastic depth) and the rest.
* gpu_bound_transfer: eager energy (and time) of the networks of a GPU without host-free data
  that are GPU-bound, predicted against measured.  GPU-bound is decided from data: the same
  (set, mode) measured on a GPU with host-free rows spends at least ``min_gpu_share`` of its eager
  time on the GPU (host-free time / eager time), so the host adds little on the faster board too.
* power_bound_violations: estimates above the power limit or below idle over a grid.
* network_error_sources: per network, the operations that carry its in-network time error.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from gpurec.model.network import is_recurrent
from gpurec.ops.precision import rows_at_precision

ERROR_KINDS: tuple[str, ...] = ("conv (dense)", "conv (grouped/depthwise)", "channel concat", "window attention",
                                "squeeze-excite gate", "stochastic depth", "batch norm", "linear / attention",
                                "autocast cast", "recurrent layer", "other")
_WINDOW = frozenset({"shifted_window_attention", "roll", "pad", "_patch_merging_pad", "_get_relative_position_bias",
                     "window_partition", "window_reverse"})
_SE = frozenset({"Sigmoid", "sigmoid", "Hardsigmoid", "hardsigmoid", "mul", "AdaptiveAvgPool2d"})


def error_kind(kind: str, groups: float) -> str:
    """The error kind of an operation (its kind name and, for convolutions, its ``groups``).
    Squeeze-excite is its gate (pooling, sigmoid, the multiply); its 1x1 convolutions stay dense."""
    if "conv" in kind.lower():
        return "conv (grouped/depthwise)" if groups > 1 else "conv (dense)"
    if kind in ("cat", "concat", "stack"):
        return "channel concat"
    if kind in _WINDOW:
        return "window attention"
    if kind in _SE:
        return "squeeze-excite gate"
    if kind.lower() in ("stochasticdepth", "stochastic_depth"):
        return "stochastic depth"
    if kind.startswith("BatchNorm"):
        return "batch norm"
    if kind == "autocast_cast":
        return "autocast cast"
    if kind in ("LSTM", "GRU", "RNN"):
        # predicted as the layer's elapsed time; its in-network kernel sum counts the layers'
        # and directions' concurrent streams one after another, so its "bias" here is not an error
        return "recurrent layer"
    if kind in ("Linear", "MultiheadAttention", "matmul", "bmm", "linear") or "attention" in kind.lower():
        return "linear / attention"
    return "other"


def _in_network_rows(data_root: Any, archs: set[str] | None, precision: str) -> Any:
    """The in-network positions of ``archs`` (None: every architecture) measured at ``precision``."""
    from gpurec.dataset import load_dataset

    inn = load_dataset(root=data_root, table="in_network")
    if archs is not None:
        inn = inn[inn["set_key"].map(lambda k: str(k).split(":", 1)[0] in archs)]
    if "precision" in inn:
        inn = rows_at_precision(inn, precision)
    elif "network_id" in inn:  # positions of fp32 networks only (another precision's id ends in it)
        inn = inn[inn["network_id"].map(lambda i: str(i).count(":") <= 4)] if precision == "fp32" else inn.iloc[:0]
    return inn


def _aligned_networks(predictor: Any, data_root: Any, archs: Sequence[str] | None, precision: str) -> Iterable[
        tuple[str, str, str, Any, list[tuple[int, float]], int]]:
    """Per measured (gpu, set_key, mode): the estimate at ``precision``, the (position, in-network
    kernel ms) of every position whose signature matches the extracted operation, and how many
    did not match (counted apart, never matched)."""
    import warnings

    from gpurec.model._sets import parse_set, test_arch_names

    inn = _in_network_rows(data_root, set(archs if archs is not None else test_arch_names()), precision)
    for (gpu, set_key, mode), rows in inn.groupby(["gpu", "set_key", "mode"], sort=True):
        s = parse_set(set_key)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = predictor.predict(s.arch, s.input_shape, mode=mode, gpu=gpu, precision=precision)
        block = est._ops.entry.block
        rows = rows.sort_values("position")
        aligned, misaligned = [], 0
        for pos, sig, kernel_ms in zip(rows["position"], rows["op_signature"], rows["kernel_ms"], strict=True):
            pos = int(pos)
            if pos >= len(block) or block.signatures[pos] != sig:
                misaligned += 1
                continue
            aligned.append((pos, float(kernel_ms)))
        yield str(gpu), str(set_key), str(mode), est, aligned, misaligned


def per_kind_errors(predictor: Any, data_root: Any = None, archs: Sequence[str] | None = None,
                    precision: str = "fp32") -> list[dict[str, Any]]:
    """Per (gpu, mode, error kind) over the in-network rows of ``archs`` (default: the unseen test
    architectures) measured at ``precision``, each network predicted at it: operations, measured
    and predicted kernel time (ms), bias (predicted/measured - 1, %), weighted error (sum
    |predicted - measured| / sum measured, %) and this kind's share of the absolute error of those
    networks.  Positions whose signature differs from the extracted operation are counted apart
    (``misaligned``), never matched."""
    acc: dict[tuple[str, str, str], dict[str, float]] = {}
    misaligned: dict[tuple[str, str], int] = {}
    for gpu, _, mode, est, aligned, n_bad in _aligned_networks(predictor, data_root, archs, precision):
        if n_bad:
            misaligned[(gpu, mode)] = misaligned.get((gpu, mode), 0) + n_bad
        ops = est._ops
        block = ops.entry.block
        groups = block.column("groups")
        for pos, kernel_ms in aligned:
            k = error_kind(str(block.kinds[pos]), float(groups[pos]))
            a = acc.setdefault((gpu, mode, k), {"n": 0, "measured_ms": 0.0, "predicted_ms": 0.0, "abs_ms": 0.0})
            pred = float(ops.gpu_time_ms[pos])
            a["n"] += 1
            a["measured_ms"] += kernel_ms
            a["predicted_ms"] += pred
            a["abs_ms"] += abs(pred - kernel_ms)
    total_abs: dict[tuple[str, str], float] = {}
    for (gpu, mode, _), a in acc.items():
        total_abs[(gpu, mode)] = total_abs.get((gpu, mode), 0.0) + a["abs_ms"]
    out = []
    for (gpu, mode, k), a in sorted(acc.items(), key=lambda kv: (kv[0][0], kv[0][1], ERROR_KINDS.index(kv[0][2]))):
        m = a["measured_ms"]
        out.append({"gpu": gpu, "mode": mode, "kind": k, "n_ops": int(a["n"]), "measured_ms": m,
                    "predicted_ms": a["predicted_ms"],
                    "bias_pct": (a["predicted_ms"] / m - 1.0) * 100.0 if m > 0 else float("nan"),
                    "weighted_error_pct": a["abs_ms"] / m * 100.0 if m > 0 else float("nan"),
                    "share_of_error": a["abs_ms"] / total_abs[(gpu, mode)] if total_abs[(gpu, mode)] > 0 else 0.0,
                    "misaligned": misaligned.get((gpu, mode), 0)})
    return out


def kernel_sum_over_step(data_root: Any = None, precision: str = "fp32") -> list[dict[str, Any]]:
    """Per (gpu, mode) and network class (with or without a whole recurrent layer): the median of a
    network's in-network kernel times summed over the host-free time of its whole step.

    Why: per_kind_errors scores each operation against its in-network kernel time, which adds up to
    the step's time only where kernels do not overlap.  cuDNN runs a recurrent layer's layers and
    directions on several streams at once, so its kernel times add up to more than the time they
    take; this says by how much, from the data, beside the per-kind bias it inflates."""
    from gpurec.dataset import load_dataset

    inn = _in_network_rows(data_root, None, precision)
    nets = load_dataset(root=data_root, table="networks")
    if "precision" in nets:
        nets = rows_at_precision(nets, precision)
    if not len(inn) or "gpu_time_ms" not in nets:
        return []
    keys = ["gpu", "set_key", "mode"]
    sums = inn.groupby(keys).agg(kernel_ms=("kernel_ms", "sum"),
                                 recurrent=("op_kind", lambda k: bool(is_recurrent(k).any())))
    step = nets.dropna(subset=["gpu_time_ms"]).groupby(keys)["gpu_time_ms"].median()
    both = sums.join(step, how="inner")
    both = both[both["gpu_time_ms"] > 0]
    out = []
    for (gpu, mode, rec), g in both.groupby([both.index.get_level_values("gpu"), both.index.get_level_values("mode"),
                                             "recurrent"], sort=True):
        out.append({"gpu": str(gpu), "mode": str(mode), "recurrent": bool(rec), "networks": int(len(g)),
                    "median_ratio": float(np.median(g["kernel_ms"] / g["gpu_time_ms"]))})
    return out


def network_error_sources(predictor: Any, data_root: Any = None, archs: Sequence[str] | None = None,
                          top: int = 3, precision: str = "fp32") -> list[dict[str, Any]]:
    """Why each network is missed: per measured (gpu, set_key, mode) of ``archs`` (default: the
    unseen test architectures), the predicted and in-network kernel time summed over its matched
    operations, and the ``top`` operations with the largest |predicted - measured| kernel time,
    each with its kind, error kind, conv groups and share of the network's
    absolute error.  Networks come worst first (by |summed bias|).  Why: a network's MAPE says how
    much it is missed, not whether one pathological operation (a cuDNN algorithm 3x slower at
    batch 8 than at 64) or a whole kind carries it, which decides the fix."""
    out = []
    for gpu, set_key, mode, est, aligned, n_bad in _aligned_networks(predictor, data_root, archs, precision):
        ops = est._ops
        block = ops.entry.block
        groups = block.column("groups")
        err = [(pos, float(ops.gpu_time_ms[pos]) - kernel_ms, kernel_ms) for pos, kernel_ms in aligned]
        measured = sum(k for _, _, k in err)
        predicted = sum(float(ops.gpu_time_ms[pos]) for pos, _ in aligned)
        total_abs = sum(abs(e) for _, e, _ in err)
        worst = sorted(err, key=lambda x: -abs(x[1]))[:top]
        out.append({
            "gpu": gpu, "set_key": set_key, "mode": mode, "n_ops": len(aligned), "misaligned": n_bad,
            "measured_kernel_ms": measured, "predicted_ms": predicted,
            "bias_pct": (predicted / measured - 1.0) * 100.0 if measured > 0 else float("nan"),
            "top": [{"position": pos, "name": block.names[pos] if block.names else "", "kind": str(block.kinds[pos]),
                     "error_kind": error_kind(str(block.kinds[pos]), float(groups[pos])),
                     "groups": float(groups[pos]), "measured_ms": k, "predicted_ms": k + e,
                     "share_of_error": abs(e) / total_abs if total_abs > 0 else 0.0} for pos, e, k in worst]})
    return sorted(out, key=lambda r: -abs(r["bias_pct"]) if r["bias_pct"] == r["bias_pct"] else 0.0)


def gpu_bound_transfer(records: Any, min_gpu_share: float = 0.9) -> dict[str, Any]:
    """Predicted against measured eager energy and time on each GPU without host-free network rows,
    over its networks that are GPU-bound by the rule above (``records``:
    gpurec.model.fitting.evaluate.network_records).  Per GPU and mode: n, MAPE and mean signed error of
    eager energy, time and power (energy / time, which separates the power model from the time one)."""
    import pandas as pd

    df = records[records.get("error", "") == ""] if "error" in records else records
    hf = df[np.isfinite(df["measured_gpu_time_ms"].astype(float))]
    share = (hf["measured_gpu_time_ms"] / hf["measured_time_ms"]).groupby([hf["set_key"], hf["mode"]]).min()
    bound = set(share[share >= min_gpu_share].index)
    rows = []
    for gpu in sorted(set(df["gpu"]) - set(hf["gpu"])):
        for mode in sorted(set(df["mode"])):
            g = df[(df["gpu"] == gpu) & (df["mode"] == mode)]
            g = g[[(k, m) in bound for k, m in zip(g["set_key"], g["mode"], strict=True)]]
            row: dict[str, Any] = {"gpu": gpu, "mode": mode, "n": len(g), "n_test_archs": int(g["is_test"].sum())}
            g = g.assign(pred_power_w=g["pred_energy_mj"] / g["pred_time_ms"],
                         measured_power_w=g["measured_energy_mj"] / g["measured_time_ms"])
            for q in ("energy_mj", "time_ms", "power_w"):
                r = (g[f"pred_{q}"].astype(float) / g[f"measured_{q}"].astype(float) - 1.0) * 100.0
                row[f"{q}_mape"] = float(r.abs().mean()) if len(r) else float("nan")
                row[f"{q}_bias"] = float(r.mean()) if len(r) else float("nan")
            rows.append(row)
    return {"min_gpu_share": min_gpu_share, "n_gpu_bound_sets": len(bound),
            "rows": pd.DataFrame(rows).to_dict("records")}


# Networks and batches from tiny to huge steps, both modes (vit_b_16 b4096 inference was
# predicted at 772 W on the 700 W H100 before power was bounded).
POWER_GRID: tuple[tuple[str, int, str], ...] = (
    ("vit_b_16", 4096, "inference"), ("vit_b_16", 256, "training"), ("resnet50", 1, "inference"),
    ("resnet50", 512, "training"), ("mobilenet_v3_small", 1024, "inference"), ("vgg16", 256, "training"))


def power_bound_violations(predictor: Any, grid: Iterable[tuple[str, int, str]],
                           gpus: Sequence[str] | None = None) -> dict[str, Any]:
    """Over every (GPU, network, batch, mode): how many eager, host-free and per-operation
    powers lie above the GPU's power limit or below its idle power."""
    import warnings

    from gpurec.catalog import load_catalog, resolve_gpu

    specs = [resolve_gpu(g) for g in gpus] if gpus is not None else load_catalog()
    n = above = below = 0
    worst = 0.0
    for model, batch, mode in grid:
        for spec in specs:
            idle_w, limit_w = spec.power_bounds_w()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                est = predictor.predict(model, (batch, 3, 224, 224), mode=mode, gpu=spec.nvml_name)
            powers = np.concatenate([[est.power_w, est.gpu_energy_mj / max(est.gpu_time_ms, 1e-12)],
                                     est._ops.power_w])
            n += 1
            tol = 1e-6 * limit_w
            above += int((powers > limit_w + tol).any())
            below += int((powers < idle_w - tol).any())
            worst = max(worst, float(powers.max() / limit_w))
    return {"estimates": n, "above_limit": above, "below_idle": below, "max_power_over_limit": worst}


def unseen_summary(report: dict[str, Any]) -> dict[str, Any]:
    """Host-free network MAPE and worst network per mode, time and energy, on the unseen test
    architectures, from a training report's ``test_set.records`` (as the predictor runs)."""
    recs = report.get("test_set", {}).get("records", [])
    out: dict[str, Any] = {}
    for mode in sorted({r["mode"] for r in recs}):
        rs = [r for r in recs if r["mode"] == mode]
        t = np.array([r["pred_time_ms"] / r["measured_time_ms"] - 1.0 for r in rs]) * 100.0
        e = np.array([r["pred_time_ms"] * r["pred_power_w"] / (r["measured_time_ms"] * r["measured_power_w"]) - 1.0
                      for r in rs]) * 100.0
        worst_t, worst_e = int(np.argmax(np.abs(t))), int(np.argmax(np.abs(e)))
        out[mode] = {"n": len(rs), "time_mape": float(np.abs(t).mean()), "energy_mape": float(np.abs(e).mean()),
                     "time_bias": float(t.mean()), "energy_bias": float(e.mean()),
                     "worst_time": {"set_key": rs[worst_t]["set_key"], "error_pct": float(t[worst_t])},
                     "worst_energy": {"set_key": rs[worst_e]["set_key"], "error_pct": float(e[worst_e])},
                     "over_15pct": sorted({rs[i]["set_key"] for i in np.flatnonzero((np.abs(t) > 15) | (np.abs(e) > 15))})}
    return out


def snapshot(models_dir: Any, data_root: Any = None) -> dict[str, Any]:
    """What docs/accuracy.md shows of one set of models on the unseen test architectures (per-kind
    in-network time error and host-free network MAPE per mode), so that a later model can be shown
    beside it: ``gpurec tools unseen-snapshot`` writes it to benchmarks/."""
    import json
    from pathlib import Path

    from gpurec.model import load_predictor

    models_dir = Path(models_dir)
    report = json.loads((models_dir / "report.json").read_text())
    predictor = load_predictor(models_dir, data_root=data_root, check_data=False)
    return {"models_created": report.get("created"), "data_sha256": report.get("data_sha256"),
            "network_correction": report.get("network_correction", {}).get("chosen"),
            "unseen": unseen_summary(report), "per_kind": per_kind_errors(predictor, data_root)}
