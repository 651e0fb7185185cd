"""Error metrics and leakage-free fold construction."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from gpurec.ops.precision import precision_or_default
from gpurec.results import HOST_BOUND_RATIO, bounds_of

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


# ---------------------------------------------------------------------------------------------
# Network accuracy: estimates against measured networks (docs/accuracy.md tables)
# ---------------------------------------------------------------------------------------------

BOUND_CLEAR_MARGIN = 0.05  # a measured verdict is "clear" when eager / host-free is outside 1.2 +- this


def _col(df: Any, name: str) -> np.ndarray:
    import pandas as pd

    if name not in df:
        return np.full(len(df), np.nan)
    return pd.to_numeric(df[name], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def network_records(predictor: Any, nets: Any, host_profiles: dict[str, list[Any]] | None = None,
                    use_run_host: bool = True) -> Any:
    """One row per measured network row: measured and estimated gpu_time_ms, gpu_energy_mj,
    time_ms, energy_mj, host-dispatch share and bound, with the estimate made for the host
    that measured it (its run's ``host_bench`` profile, median of start and end) where
    ``use_run_host`` and the profile exists, else for the reference host (``host`` says which).

    Each row is estimated at its own ``precision`` (column absent: fp32).
    ``nets`` is ``gpurec.load_dataset(table="networks")`` (any subset); ``host_profiles`` is
    gpurec.model.provenance.host_profiles_by_run(root). Rows that cannot be estimated (an
    architecture this torchvision cannot build) are kept with ``error`` set, never dropped."""
    import pandas as pd

    from gpurec.host import reference_profile
    from gpurec.model._sets import parse_set, test_arch_names

    host_profiles = host_profiles or {}
    run_host = {r: reference_profile(ps, name=f"run {r}") for r, ps in host_profiles.items() if ps}
    rows = []
    for i, r in enumerate(nets.itertuples(index=False)):
        run = str(getattr(r, "run_id", ""))
        host = run_host.get(run) if use_run_host else None
        precision = precision_or_default(getattr(r, "precision", None))
        rec: dict[str, Any] = {"gpu": r.gpu, "set_key": r.set_key, "mode": r.mode, "run_id": run,
                               "precision": precision,
                               "arch": arch_of(r.set_key), "is_test": arch_of(r.set_key) in test_arch_names(),
                               "host_profile": "run" if host is not None else "reference", "error": ""}
        for k in ("time_ms", "energy_mj", "gpu_time_ms", "gpu_energy_mj"):
            rec[f"measured_{k}"] = float(_col(nets.iloc[[i]], k)[0])
        try:
            s = parse_set(r.set_key)
            est = predictor.predict(s.arch, s.input_shape, mode=r.mode, gpu=r.gpu, host=host, precision=precision)
            for k in ("time_ms", "energy_mj", "gpu_time_ms", "gpu_energy_mj", "host_time_ms"):
                rec[f"pred_{k}"] = getattr(est, k)
            rec["pred_bound"] = est.bound
            rec["host"] = est.host
            if precision in ("bf16-mixed", "fp16-mixed"):  # the casts autocast inserts, predicted on their own
                ops = getattr(est, "_ops", None)
                if ops is not None:
                    cast = np.asarray(ops.entry.block.kinds) == "autocast_cast"
                    rec["pred_cast_gpu_time_ms"] = float(np.asarray(ops.gpu_time_ms)[cast].sum())
        except Exception as exc:  # reported per row, not fatal
            rec["error"] = f"{type(exc).__name__}: {exc}"[:200]
        rows.append(rec)
    df = pd.DataFrame(rows)
    if len(df):
        ratio = df["measured_time_ms"] / df["measured_gpu_time_ms"]
        df["measured_ratio"] = ratio
        df["measured_bound"] = bounds_of(df["measured_time_ms"], df["measured_gpu_time_ms"])
        df["bound_clear"] = (ratio - HOST_BOUND_RATIO).abs() > BOUND_CLEAR_MARGIN
        df["measured_host_share"] = 1.0 - 1.0 / ratio
        if "pred_time_ms" in df:
            df["pred_host_share"] = 1.0 - df["pred_gpu_time_ms"] / df["pred_time_ms"]
    return df


def _mape(pred: Any, meas: Any) -> tuple[float, int]:
    p, m = np.asarray(pred, dtype=np.float64), np.asarray(meas, dtype=np.float64)
    ok = np.isfinite(p) & np.isfinite(m) & (m > 0)
    return (float(np.mean(ape(p[ok], m[ok]))) if ok.any() else float("nan")), int(ok.sum())


def host_free_accuracy(records: Any, test_only: bool = True) -> list[dict[str, Any]]:
    """Host-free time and energy MAPE per GPU and mode (unseen test architectures by default)."""
    df = records[records["is_test"]] if test_only else records
    out = []
    for (gpu, mode), part in df.groupby(["gpu", "mode"]):
        t, n_t = _mape(part.get("pred_gpu_time_ms"), part["measured_gpu_time_ms"])
        e, n_e = _mape(part.get("pred_gpu_energy_mj"), part["measured_gpu_energy_mj"])
        out.append({"gpu": gpu, "mode": mode, "gpu_time_mape": t, "gpu_energy_mape": e, "n_time": n_t,
                    "n_energy": n_e})
    return out


# The sequence-model targets on networks of unseen sequence architectures (host-free MAPE, eager
# MAPE, and every LSTM language model's time and energy within this many per cent).
SEQUENCE_TARGETS_PCT = {"time": 8.0, "energy": 10.0, "eager_time": 25.0, "lstm_lm_each": 10.0}


def sequence_accuracy(records: Any, archs: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Per GPU and family (transformer: BERT/GPT; recurrent: LSTM/GRU; and all), on the networks of
    the unseen sequence architectures (gpurec.sets.SEQ_TEST_ARCHS): host-free time and energy MAPE,
    eager time MAPE (the measuring run's host profile), the worst network, and how many LSTM
    language models are within SEQUENCE_TARGETS_PCT['lstm_lm_each'] in both time and energy."""
    from gpurec.sets import SEQ_TEST_ARCHS

    archs = tuple(archs if archs is not None else SEQ_TEST_ARCHS)
    arch = records["set_key"].map(lambda k: arch_of(str(k)))
    df = records[arch.isin(archs)].assign(arch=arch)
    df = df.assign(family=df["arch"].map(lambda a: "recurrent" if a.startswith(("lstm", "gru")) else "transformer"))
    out = []
    for gpu, by_gpu in df.groupby("gpu", sort=True):
        for fam, part in [("all", by_gpu), *by_gpu.groupby("family", sort=True)]:
            t, n = _mape(part["pred_gpu_time_ms"], part["measured_gpu_time_ms"])
            e, _ = _mape(part["pred_gpu_energy_mj"], part["measured_gpu_energy_mj"])
            g, n_eager = _mape(part["pred_time_ms"], part["measured_time_ms"])
            err_t = (part["pred_gpu_time_ms"] / part["measured_gpu_time_ms"] - 1.0) * 100.0
            err_e = (part["pred_gpu_energy_mj"] / part["measured_gpu_energy_mj"] - 1.0) * 100.0
            worst = np.maximum(err_t.abs(), err_e.abs())
            w = worst.idxmax() if len(worst.dropna()) else None
            lm = part["arch"].str.startswith("lstm_lm")
            within = (err_t.abs() <= SEQUENCE_TARGETS_PCT["lstm_lm_each"]) & (err_e.abs() <= SEQUENCE_TARGETS_PCT["lstm_lm_each"])
            out.append({"gpu": str(gpu), "family": fam, "n": n, "archs": sorted(set(part["arch"])),
                        "gpu_time_mape": t, "gpu_energy_mape": e, "eager_time_mape": g, "n_eager": n_eager,
                        "worst": None if w is None else {"set_key": str(part.at[w, "set_key"]),
                                                         "mode": str(part.at[w, "mode"]),
                                                         "time_error_pct": float(err_t[w]),
                                                         "energy_error_pct": float(err_e[w])},
                        "lstm_lm_networks": int(lm.sum()), "lstm_lm_within": int((lm & within).sum())})
    return out


def eager_accuracy(records: Any, test_only: bool = True) -> list[dict[str, Any]]:
    """Eager time MAPE (estimate for the measuring host's profile) per GPU, mode and measured bound
    (``unknown`` where the network has no host-free measurement to tell)."""
    df = records[records["is_test"]] if test_only else records
    df = df.assign(measured_bound=df["measured_bound"].replace("", "unknown"))
    out = []
    for (gpu, mode, bound), part in df.groupby(["gpu", "mode", "measured_bound"]):
        t, n = _mape(part.get("pred_time_ms"), part["measured_time_ms"])
        out.append({"gpu": gpu, "mode": mode, "measured_bound": bound, "time_mape": t, "n": n,
                    "with_run_host_profile": int((part["host_profile"] == "run").sum())})
    return out


def bound_accuracy(records: Any, test_only: bool = False) -> dict[str, Any]:
    """Share of right verdicts where the measured verdict is clear (eager / host-free outside
    1.2 +- BOUND_CLEAR_MARGIN), overall and per GPU and mode."""
    df = records[records["is_test"]] if test_only else records
    df = df[(df["measured_bound"] != "") & df["bound_clear"] & df.get("pred_bound", "").astype(str).ne("")]

    def share(part: Any) -> dict[str, Any]:
        right = (part["pred_bound"] == part["measured_bound"]).to_numpy()
        return {"n": int(len(part)), "right": float(right.mean()) if len(part) else float("nan"),
                "measured_host_bound": int((part["measured_bound"] == "host").sum())}

    return {"overall": share(df), "clear_margin": BOUND_CLEAR_MARGIN,
            "by_gpu_mode": {f"{g}|{m}": share(p) for (g, m), p in df.groupby(["gpu", "mode"])}}


def host_share_accuracy(records: Any, test_only: bool = True) -> list[dict[str, Any]]:
    """The share of each network's eager time that comes from the host (1 - host-free / eager),
    predicted against measured: mean of each and mean absolute difference in percentage points."""
    df = records[records["is_test"]] if test_only else records
    out = []
    for (gpu, mode), part in df.groupby(["gpu", "mode"]):
        m = part["measured_host_share"].to_numpy(dtype=np.float64)
        p = part.get("pred_host_share", np.full(len(part), np.nan))
        p = np.asarray(p, dtype=np.float64)
        ok = np.isfinite(m) & np.isfinite(p)
        out.append({"gpu": gpu, "mode": mode, "n": int(ok.sum()),
                    "measured_share_mean": float(m[ok].mean()) if ok.any() else float("nan"),
                    "pred_share_mean": float(p[ok].mean()) if ok.any() else float("nan"),
                    "abs_diff_pp": float(np.mean(np.abs(p[ok] - m[ok])) * 100) if ok.any() else float("nan")})
    return out


def noise_floor(rows: Any, columns: tuple[str, ...] = ("gpu_time_ms", "gpu_energy_mj", "time_ms", "energy_mj")
                ) -> list[dict[str, Any]]:
    """The same measurement repeated: mean absolute deviation (%) of each row from its
    (gpu, set_key, mode) group's median, per GPU and mode, over groups measured more than once
    (pass the networks table concatenated with its repeats table)."""
    out = []
    for (gpu, mode), part in rows.groupby(["gpu", "mode"]):
        entry: dict[str, Any] = {"gpu": gpu, "mode": mode}
        for c in columns:
            v = part.assign(_v=_col(part, c)).dropna(subset=["_v"])
            g = v.groupby("set_key")["_v"]
            multi = g.transform("size") > 1
            dev = (v["_v"] / g.transform("median") - 1.0).abs()[multi] * 100
            entry[f"{c}_noise_pct"] = float(dev.mean()) if len(dev) else float("nan")
            entry[f"{c}_groups"] = int((g.size() > 1).sum())
        out.append(entry)
    return out


def board_noise(pairs: Any, columns: tuple[str, ...] = ("gpu_time_ms", "gpu_energy_mj", "gpu_power_w", "time_ms")
                ) -> list[dict[str, Any]]:
    """How far the same row moves between two boards of one GPU kind (``gpurec.dataset.load.
    board_repeats``): mean, median and 90th percentile of |second / first - 1| (%), per GPU kind,
    item and column."""
    out: list[dict[str, Any]] = []
    if not len(pairs):
        return out
    for (gpu, item), part in pairs.groupby(["gpu", "item"]):
        for c in columns:
            if f"first_{c}" not in part or f"second_{c}" not in part:
                continue
            a = part[f"first_{c}"].astype(float).to_numpy()
            b = part[f"second_{c}"].astype(float).to_numpy()
            ok = np.isfinite(a) & np.isfinite(b) & (a > 0) & (b > 0)
            if not ok.any():
                continue
            d = np.abs(b[ok] / a[ok] - 1.0) * 100
            out.append({"gpu": gpu, "item": item, "column": c, "n": int(ok.sum()), "mean_pct": float(d.mean()),
                        "median_pct": float(np.median(d)), "p90_pct": float(np.percentile(d, 90))})
    return out


def leave_one_gpu_out_table(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Leave-one-GPU-out network errors from a training report (models trained without the GPU;
    host-free targets once the data has them, see report['targets'])."""
    out = []
    for gpu, entry in report.get("leave_one_gpu_out", {}).get("gpus", {}).items():
        x = entry.get("xgboost", {})
        for label in ("test_archs", "train_archs"):
            b = x.get(f"network_{label}_corrected")
            if not b:
                continue
            for mode, m in b.get("by_mode", {}).items():
                out.append({"held_out_gpu": gpu, "archs": label, "mode": mode, "n": m["n"],
                            "time_mape": m["time"]["mape"], "energy_mape": m["energy"]["mape"],
                            "targets": report.get("targets", {}).get("networks", "eager")})
    return out


def accuracy_tables(predictor: Any, data_root: Any = None, report: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every network-accuracy table from the data under ``data_root`` and a trained ``predictor`` (and its
    training ``report`` for leave-one-GPU-out): what docs/accuracy.md reports."""
    import pandas as pd

    from gpurec.dataset import load_dataset
    from gpurec.dataset.load import board_repeats, fp32_rows
    from gpurec.model.provenance import host_profiles_by_run

    nets = fp32_rows(load_dataset(root=data_root, table="networks"))
    records = network_records(predictor, nets, host_profiles_by_run(data_root))
    try:
        repeats = load_dataset(root=data_root, table="repeats")
        repeats = repeats[repeats.get("item", "network") == "network"] if "item" in repeats else repeats
    except FileNotFoundError:
        repeats = nets.iloc[:0]
    both = pd.concat([nets, repeats], ignore_index=True)
    return {"host_free": host_free_accuracy(records), "eager": eager_accuracy(records),
            "sequence": sequence_accuracy(records),
            "bound": bound_accuracy(records), "host_share": host_share_accuracy(records),
            "noise_floor": noise_floor(both), "board_noise": board_noise(board_repeats(data_root)),
            "leave_one_gpu_out": leave_one_gpu_out_table(report or {}),
            "records": records}


PRECISION_TARGETS_PCT = {"time": 8.0, "energy": 10.0}  # host-free MAPE, unseen architectures, non-fp32


def planned_networks(plan_file: Any, precision: str) -> list[tuple[str, str]]:
    """(set_key, mode) of the network items a work order (``datasets/plans/*.json``) holds at
    ``precision``; empty where the file does not exist."""
    from pathlib import Path

    path = Path(plan_file)
    if not path.exists():
        return []
    items = json.loads(path.read_text()).get("items", [])
    return sorted({(str(i.get("set_key") or i.get("key")), str(i.get("mode"))) for i in items
                   if i.get("item") == "network" and precision_or_default(i.get("precision")) == precision})


def precision_accuracy(predictor: Any, data_root: Any = None, fp32_records: Any = None,
                       plan_file: Any = None) -> dict[str, Any]:
    """Host-free accuracy of the networks measured at a precision other than fp32, each estimated
    at its own precision: per precision, GPU, architecture group (unseen test / training) and mode,
    every group listed even where no network was measured (``n`` 0, never padded).  With
    ``fp32_records`` (``accuracy_tables``' records) each network also gets its fp32 twin's measured
    and predicted host-free time, so the measured and predicted speed-ups can be compared.  With
    ``plan_file``, the test-architecture networks planned at that precision but not measured."""
    from gpurec.dataset import load_dataset
    from gpurec.model._sets import test_arch_names
    from gpurec.model.provenance import host_profiles_by_run

    nets = load_dataset(root=data_root, table="networks")
    if "precision" not in nets:
        return {"precisions": {}}
    low = nets[nets["precision"].map(precision_or_default) != "fp32"].reset_index(drop=True)
    if not len(low):
        return {"precisions": {}}
    records = network_records(predictor, low, host_profiles_by_run(data_root))
    if fp32_records is not None and len(fp32_records):
        twin = (fp32_records.groupby(["gpu", "set_key", "mode"])[["measured_gpu_time_ms", "pred_gpu_time_ms"]]
                .median().rename(columns=lambda c: f"fp32_{c}").reset_index())
        records = records.merge(twin, on=["gpu", "set_key", "mode"], how="left")
    out: dict[str, Any] = {"precisions": {}, "targets_pct": dict(PRECISION_TARGETS_PCT)}
    for precision, part in records.groupby("precision"):
        groups = []
        for gpu in sorted(set(part["gpu"])):
            for is_test in (True, False):
                for mode in ("inference", "training"):
                    sel = part[(part["gpu"] == gpu) & (part["is_test"] == is_test) & (part["mode"] == mode)]
                    t, n_t = _mape(sel.get("pred_gpu_time_ms"), sel["measured_gpu_time_ms"])
                    e, n_e = _mape(sel.get("pred_gpu_energy_mj"), sel["measured_gpu_energy_mj"])
                    groups.append({"gpu": gpu, "archs": "unseen test" if is_test else "training", "mode": mode,
                                   "n_time": n_t, "n_energy": n_e, "time_mape": t, "energy_mape": e,
                                   "architectures": sorted(set(sel["arch"]))})
        measured = set(zip(part["set_key"], part["mode"], strict=True))
        planned = [k for k in (planned_networks(plan_file, str(precision)) if plan_file is not None else [])
                   if arch_of(k[0]) in test_arch_names()]
        out["precisions"][str(precision)] = {
            "groups": groups, "records": part.reset_index(drop=True),
            "test_planned_not_measured": [k for k in planned if k not in measured],
            "sequence": sequence_accuracy(part),
            "correction_check": precision_correction_check(part)}
    return out


def precision_correction_check(records: Any) -> list[dict[str, Any]]:
    """Would a whole-network correction for this precision help networks of held-out families?
    Per mode: host-free time MAPE as predicted, and after a scale fitted leave-one-family-out
    (the median measured / predicted of the other families' networks); where the predicted
    autocast casts carry GPU time (``pred_cast_gpu_time_ms``), the same with them taken out
    (inside a network autocast launches them in their consumer's call, whose in-network time
    already holds them; gpurec.model.network.free_consumer_held gives them none)."""
    df = records[(records["error"] == "") & records["measured_gpu_time_ms"].notna()]
    if not len(df) or "pred_gpu_time_ms" not in df:
        return []
    out = []
    fams = df["arch"].map(family).to_numpy()
    casts = df["pred_cast_gpu_time_ms"].fillna(0.0).to_numpy() if "pred_cast_gpu_time_ms" in df else np.zeros(len(df))
    variants = [("as predicted", df["pred_gpu_time_ms"].to_numpy(dtype=float))]
    if np.any(casts > 0):  # a predictor that gives no GPU time to consumer-held casts has none to take out
        variants.append(("casts taken out", df["pred_gpu_time_ms"].to_numpy(dtype=float) - casts))
    for variant, pred in variants:
        for mode in sorted(set(df["mode"])):
            sel = (df["mode"] == mode).to_numpy()
            p, m, f = pred[sel], df["measured_gpu_time_ms"].to_numpy(dtype=float)[sel], fams[sel]
            scaled = np.array([p[i] * np.median((m / p)[f != f[i]]) if (f != f[i]).any() else np.nan
                               for i in range(len(p))])
            out.append({"variant": variant, "mode": mode, "n": int(sel.sum()), "families": len(set(f)),
                        "time_mape": float(np.mean(ape(p, m))), "lofo_scaled_time_mape": _mape(scaled, m)[0]})
    return out


def compare_gpu_time_sources(data_root: Any, out_root: Any, log: Any = None, **overrides: Any) -> dict[str, Any]:
    """Train once per GPU-time source ('in_network': in-network kernel time where attributed,
    isolated host-free elsewhere; 'isolated': isolated host-free only) into ``out_root/<source>``
    and return, per source, the errors that decide between them: unseen test architectures
    (network, corrected), leave one family out (network, corrected) and grouped K-fold per
    operation, each for time and energy. ``overrides`` are TrainConfig fields (e.g.
    ``tune_trials=0`` for a quicker comparison)."""
    from pathlib import Path

    from gpurec.model.fitting.training import train

    out: dict[str, Any] = {}
    for source in ("in_network", "isolated"):
        rep = train(data_root, Path(out_root) / source, gpu_time_source=source,
                    log=log or (lambda s: None), **overrides)

        def pick(entry: dict[str, Any] | None) -> dict[str, Any]:
            o = (entry or {}).get("overall", {})
            return {"n": o.get("n", 0), "time_mape": o.get("time", {}).get("mape"),
                    "energy_mape": o.get("energy", {}).get("mape")}

        out[source] = {"targets": rep.get("targets", {}),
                       "test_archs_network": pick(rep.get("test_set", {}).get("corrected")),
                       "lofo_network": pick(rep.get("leave_one_family_out", {}).get("xgboost", {})
                                            .get("network_corrected")),
                       "kfold_per_op": pick(rep.get("grouped_kfold", {}).get("xgboost"))}
    return out
