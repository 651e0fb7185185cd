"""Validation schemes: grouped K-fold by op signature, leave one family out, leave one GPU out,
the unseen test architectures; and the whole-network correction fitted on out-of-fold sums.

None leaks an operation or a network into its own test fold. Network targets are the GPU-side
targets chosen in gpurec.model.fitting.data (host-free time where measured, else eager).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from gpurec.catalog import resolve_gpu
from gpurec.model._sets import MODES, dataset_arch_names
from gpurec.model.config import TIME_KIND_GROUPS, TrainConfig
from gpurec.model.features import MeasuredLookup, monotone_constraints
from gpurec.model.fitting.data import Prepared
from gpurec.model.fitting.evaluate import arch_of, breakdown, family, grouped_folds
from gpurec.model.fitting.recurrent_fit import fit_recurrent, fit_recurrent_power
from gpurec.model.network import (
    POWER_VARIANTS,
    TIME_VARIANTS,
    Correction,
    NetworkSums,
    aggregate,
    ape,
    bounded_power,
    correction_cv,
    fit_correction,
    free_consumer_held,
    free_kernel_free,
    is_recurrent,
    power_class,
)
from gpurec.model.recurrent import RecurrentPower, RecurrentTime
from gpurec.model.regressors import ForestModel, RooflineLinearModel, Routed, XGBModel

GPU_TARGETS = ("time", "power")


def kind_groups_for(target: str, cfg: TrainConfig) -> dict[str, tuple[str, ...]] | None:
    """The kind groups a target's models are fitted per (gpurec.model.regressors.Routed): the time
    target's TIME_KIND_GROUPS unless ``cfg.time_kind_groups`` is off; None (one model per mode)
    for every other target."""
    return dict(TIME_KIND_GROUPS) if target == "time" and cfg.time_kind_groups else None


class Suite:
    """Model factories for XGBoost and the baselines, with the tuned parameters.  Every fit of the
    GPU targets (final models and every validation scheme) goes through :meth:`fit`, so the
    cross-validated numbers describe the shipped design (kind groups included)."""

    def __init__(self, cfg: TrainConfig, params: dict[str, dict[str, Any]], rounds: dict[str, int],
                 names: list[str]) -> None:
        self.cfg, self.params, self.rounds, self.names = cfg, params, rounds, names

    def kinds(self) -> list[str]:
        return ["xgboost", "random_forest", "roofline_linear"] if self.cfg.baselines else ["xgboost"]

    def fit(self, kind: str, p: Prepared, rows: np.ndarray) -> dict[str, Routed]:
        cfg = self.cfg
        out = {}
        for target in GPU_TARGETS:
            if kind == "xgboost":
                def factory(t: str = target) -> Any:
                    return XGBModel(self.params[t], self.rounds[t], cfg.seed, cfg.nthread,
                                    monotone_constraints(t, self.names))
            elif kind == "random_forest":
                def factory() -> Any:
                    return ForestModel(cfg.forest_trees, cfg.seed, n_jobs=cfg.nthread or -1)
            else:
                def factory() -> Any:
                    return RooflineLinearModel()
            out[target] = Routed(factory, cfg.min_rows_per_mode, kind_groups_for(target, cfg)).fit(
                p.X[target][rows], p.y[target][rows], p.margin[target][rows], p.modes[rows], feature_names=self.names)
        # cuDNN recurrent layers take the sequential-chain model fitted on these rows only, so
        # out-of-fold sums never see the held-out architectures' recurrent rows
        (out["time"].override, _), (out["power"].override, _) = fit_recurrent_rows(p, rows)
        return out


def fit_recurrent_rows(p: Prepared, rows: np.ndarray) -> tuple[tuple[RecurrentTime | None, dict[str, Any]],
                                                                tuple[RecurrentPower | None, dict[str, Any]]]:
    """gpurec.model.fitting.recurrent_fit's time and power models on the selected operation rows
    (architectures as groups), each with its report."""
    groups = [arch_of(str(k)) for k in p.ops["set_key"].to_numpy()[rows]]
    names = p.builder.feature_names
    return (fit_recurrent(p.X["time"][rows], p.y["time"][rows], p.modes[rows], groups, names),
            fit_recurrent_power(p.X["power"][rows], p.y["power"][rows], p.modes[rows], groups, names))


def predict_ops(models: dict[str, Routed], p: Prepared, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    t = np.exp(models["time"].predict(p.X["time"][rows], p.margin["time"][rows], p.modes[rows]))
    w = np.exp(models["power"].predict(p.X["power"][rows], p.margin["power"][rows], p.modes[rows]))
    return t, w


def launching_rows(p: Prepared) -> np.ndarray:
    """Operation rows that launch a kernel: the ones per-operation errors are scored on.  A view's
    measured time is the timer's floor (well under a microsecond), and the predictor gives it no GPU
    time by rule (Operation.kernel_free), so a model's answer for it says nothing and a 0.02-us
    target turned one such row into a 5,000% error that outweighed thousands of real ones."""
    if p.kernel_free is None:
        return np.ones(len(p.ops), dtype=bool)
    return ~np.asarray(p.kernel_free, dtype=bool)


def kernel_free_summary(p: Prepared, rows: np.ndarray | None = None) -> dict[str, Any]:
    """How many rows were left out of the per-operation scores as kernel-free, and their times."""
    free = ~launching_rows(p)
    if rows is not None:
        free = free[rows]
    t = p.ops["_t_gpu"].to_numpy(dtype=np.float64)
    t = t if rows is None else t[rows]
    return {"n": int(free.sum()), "median_measured_ms": float(np.median(t[free])) if free.any() else None}


def predict_networks(models: dict[str, Routed], p: Prepared, net_rows: np.ndarray, small_op_ms: float,
                      lookup: MeasuredLookup | None = None) -> NetworkSums:
    """Raw per-network sums of per-op predictions for the selected network rows.

    With ``lookup``, measured operations of the network's GPU and mode replace predictions,
    exactly as Predictor does.
    """
    if len(net_rows) == 0:
        return aggregate(np.zeros(0), np.zeros(0), np.zeros(1, dtype=np.int64), small_op_ms)
    idx = np.concatenate([np.arange(p.net_offsets[i], p.net_offsets[i + 1]) for i in net_rows])
    offsets = np.concatenate([[0], np.cumsum(np.diff(p.net_offsets)[net_rows])])
    t = np.exp(models["time"].predict(p.net_X["time"][idx], p.net_margin["time"][idx], p.net_modes_ops[idx]))
    w = np.exp(models["power"].predict(p.net_X["power"][idx], p.net_margin["power"][idx], p.net_modes_ops[idx]))
    hit = np.zeros(len(t), dtype=bool)
    if lookup is not None and len(lookup):
        for j, i in enumerate(net_rows):
            a, b = offsets[j], offsets[j + 1]
            sigs = p.net_signatures[p.net_offsets[i]:p.net_offsets[i + 1]]
            t[a:b], w[a:b], hit[a:b] = lookup.apply(t[a:b], w[a:b], sigs, str(p.nets["gpu"].iat[i]),
                                                    str(p.nets["mode"].iat[i]))
    if p.net_kernel_free is not None:
        t = free_kernel_free(t, p.net_kernel_free[idx], hit)
    if p.net_kinds is not None:
        t = free_consumer_held(t, p.net_kinds[idx])
    bounds = {g: resolve_gpu(g).power_bounds_w() for g in set(p.nets["gpu"].to_numpy()[net_rows].astype(str))}
    idle = np.array([bounds[str(p.nets["gpu"].iat[i])][0] for i in net_rows])
    limit = np.array([bounds[str(p.nets["gpu"].iat[i])][1] for i in net_rows])
    counts = np.diff(offsets)
    w = bounded_power(w, np.repeat(idle, counts), np.repeat(limit, counts))
    names = p.builder.feature_names
    conv_groups = p.net_X["power"][idx, names.index("groups")] if "groups" in names else np.zeros(len(idx))
    recurrent = is_recurrent(p.net_kinds[idx]) if p.net_kinds is not None else None
    return aggregate(t, w, offsets, small_op_ms, hit, power_class(p.net_groups[idx], conv_groups, recurrent), idle,
                     limit)


def fp32_rows(p: Prepared, rows: np.ndarray) -> np.ndarray:
    """Mask over ``rows`` of the fp32 networks: the network reports and the uncertainty band keep
    to them (their figures stay comparable across rounds); other precisions only fit and score
    their own correction (network_correction's by_correction_mode)."""
    return p.nets["is_fp32"].to_numpy(dtype=bool)[rows]


def by_correction_mode(cv: dict[str, Any], sums: NetworkSums, t: np.ndarray, w: np.ndarray,
                       modes: np.ndarray) -> dict[str, dict[str, Any]]:
    """Leave-one-family-out network MAPE per correction mode, before (op sums) and after the
    chosen correction, so a precision's own correction shows what it earns."""
    out: dict[str, dict[str, Any]] = {}
    for m in sorted(set(modes.tolist())):
        sel = modes == m
        entry: dict[str, Any] = {"n": int(sel.sum()),
                                 "raw_time_mape": float(np.mean(ape(sums.sum_time_ms[sel], t[sel]))),
                                 "raw_energy_mape": float(np.mean(ape(sums.sum_energy_mj[sel], t[sel] * w[sel])))}
        if "chosen" in cv:
            ct, cw = cv["oof_time_ms"][sel], cv["oof_power_w"][sel]
            entry["corrected_time_mape"] = float(np.mean(ape(ct, t[sel])))
            entry["corrected_energy_mape"] = float(np.mean(ape(ct * cw, t[sel] * w[sel])))
        out[m] = entry
    return out


def net_measured(p: Prepared, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The networks' GPU-side targets: time (ms) and power (W)."""
    return (p.nets["_t_gpu"].to_numpy(dtype=np.float64)[rows], p.nets["_p_gpu"].to_numpy(dtype=np.float64)[rows])


def net_breakdown(s: NetworkSums, t_pred: np.ndarray, w_pred: np.ndarray, p: Prepared, rows: np.ndarray
                   ) -> dict[str, Any]:
    t, w = net_measured(p, rows)
    return breakdown(t_pred, w_pred, t, w, p.nets["gpu"].to_numpy()[rows], p.nets["mode"].to_numpy()[rows],
                     extra={"family": p.nets["family"].to_numpy()[rows]})


def records(s: NetworkSums, t_pred: np.ndarray, w_pred: np.ndarray, p: Prepared, rows: np.ndarray
             ) -> list[dict[str, Any]]:
    """Per-network predictions for the report (plots, tables)."""
    t, w = net_measured(p, rows)
    out = []
    for j, i in enumerate(rows):
        out.append({"set_key": p.nets["set_key"].iat[i], "mode": p.nets["mode"].iat[i], "gpu": p.nets["gpu"].iat[i],
                    "family": p.nets["family"].iat[i], "measured_time_ms": float(t[j]),
                    "measured_power_w": float(w[j]), "sum_time_ms": float(s.sum_time_ms[j]),
                    "sum_power_w": float(s.power_ops_w[j]), "pred_time_ms": float(t_pred[j]),
                    "pred_power_w": float(w_pred[j]), "n_ops": int(s.n_ops[j]), "n_small": int(s.n_small[j]),
                    "small_time_ms": float(s.small_time_ms[j])})
    return out


def leave_one_family_out(p: Prepared, suite: Suite, cfg: TrainConfig, log: Callable[[str], None]
                         ) -> tuple[dict[str, Any], dict[str, tuple[np.ndarray, NetworkSums]]]:
    """Per-operation and whole-network errors with each dataset family held out; also returns the
    out-of-fold network sums per model kind (rows, sums), which the network correction is fitted on."""
    fams = sorted({family(a) for a in dataset_arch_names()}
                  & ({f for fs in p.families for f in fs}
                     | (set(p.nets.loc[~p.nets["is_test"], "family"]) if len(p.nets) else set())))
    out: dict[str, Any] = {"families": fams}
    per_kind_ops: dict[str, list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]] = {k: [] for k in suite.kinds()}
    net_parts: dict[str, list[tuple[np.ndarray, NetworkSums]]] = {k: [] for k in suite.kinds()}
    fold_rows: dict[str, Any] = {}
    log(f"leave-one-family-out over {len(fams)} families")
    for fam in fams:
        test = np.array([fam in fs for fs in p.families], dtype=bool)
        train_idx = np.flatnonzero(~test)
        test_idx = np.flatnonzero(test)
        net_rows = (np.flatnonzero((p.nets["family"] == fam).to_numpy() & ~p.nets["is_test"].to_numpy())
                    if len(p.nets) else np.zeros(0, dtype=np.int64))
        fold_rows[fam] = {"train_ops": int(len(train_idx)), "test_ops": int(len(test_idx)),
                          "test_networks": int(len(net_rows))}
        if len(train_idx) < 4 or (len(test_idx) == 0 and len(net_rows) == 0):
            fold_rows[fam]["skipped"] = True
            continue
        for kind in suite.kinds():
            models = suite.fit(kind, p, train_idx)
            if len(test_idx):
                pt, pw = predict_ops(models, p, test_idx)
                per_kind_ops[kind].append((fam, test_idx, pt, pw))
            if len(net_rows):
                net_parts[kind].append((net_rows, predict_networks(models, p, net_rows, cfg.small_op_ms)))
    out["folds"] = fold_rows
    meas_t = p.ops["_t_gpu"].to_numpy(dtype=np.float64)
    meas_w = p.ops["_p_gpu"].to_numpy(dtype=np.float64)
    oof_nets: dict[str, tuple[np.ndarray, NetworkSums]] = {}
    for kind in suite.kinds():
        parts = per_kind_ops[kind]
        entry: dict[str, Any] = {}
        if parts:
            idx = np.concatenate([a for _, a, _, _ in parts])
            pt = np.concatenate([b for _, _, b, _ in parts])
            pw = np.concatenate([c for _, _, _, c in parts])
            fam_lab = np.concatenate([[f] * len(a) for f, a, _, _ in parts])
            k = launching_rows(p)[idx]
            entry["per_op"] = breakdown(pt[k], pw[k], meas_t[idx][k], meas_w[idx][k], p.gpus[idx][k],
                                        p.modes[idx][k], extra={"family": fam_lab[k]})
            entry["per_op"]["kernel_free_rows"] = kernel_free_summary(p, idx)
        nparts = net_parts[kind]
        if nparts:
            rows = np.concatenate([r for r, _ in nparts])
            sums = NetworkSums.concat([s for _, s in nparts])
            f = fp32_rows(p, rows)
            entry["network_raw"] = net_breakdown(sums.take(f), sums.sum_time_ms[f], sums.power_ops_w[f], p, rows[f])
            oof_nets[kind] = (rows, sums)
        out[kind] = entry
        if "per_op" in entry:
            o = entry["per_op"]["overall"]
            msg = f"  {kind:16s} per-op MAPE time {o['time']['mape']:.1f}% energy {o['energy']['mape']:.1f}%"
            if "network_raw" in entry:
                n = entry["network_raw"]["overall"]
                msg += f" | network (raw sum) time {n['time']['mape']:.1f}% energy {n['energy']['mape']:.1f}% " \
                       f"[{n['n']} networks]"
            log(msg)
    return out, oof_nets


def correction_gpus(p: Prepared, cfg: TrainConfig) -> set[str] | None:
    """GPUs that may get a GPU-specific network correction (None: every GPU).

    ``'network_only'`` (default): only GPUs measured as whole networks but not per operation,
    whose only data is that correction. A GPU with operation rows is already in the per-op
    models, and a correction of its own can reorder GPUs against their specifications (on the
    eager data it made the H200 slower than the H100 for vit_b_16 at batch 32 inference,
    against both measurements): it gets the pooled one, which keeps the order the monotone
    per-op models give."""
    if cfg.per_gpu_correction == "all":
        return None
    if cfg.per_gpu_correction == "none":
        return set()
    if cfg.per_gpu_correction != "network_only":
        raise ValueError(f"per_gpu_correction must be 'all', 'network_only' or 'none', not {cfg.per_gpu_correction!r}")
    net_gpus = set(p.nets["gpu"].astype(str)) if len(p.nets) else set()
    return net_gpus - set(p.gpus.tolist())


def network_correction(p: Prepared, net_oof: dict[str, tuple[np.ndarray, NetworkSums]],
                        op_oof: tuple[np.ndarray, np.ndarray], meas_t: np.ndarray, meas_w: np.ndarray,
                        cfg: TrainConfig, report: dict[str, Any], log: Callable[[str], None]
                        ) -> tuple[Correction, str, dict[str, Any]]:
    """Choose and fit the whole-network correction; derive the uncertainty band."""
    lo_q, hi_q = cfg.band_quantiles
    lofo = report["leave_one_family_out"]
    corr_report: dict[str, Any] = {"available": False}
    correction = Correction.identity()
    ratios_t: np.ndarray | None = None
    ratios_e: np.ndarray | None = None
    if "xgboost" in net_oof:
        rows, sums = net_oof["xgboost"]
        gpus = p.nets["gpu"].to_numpy().astype(str)[rows]
        modes = p.nets["correction_mode"].to_numpy().astype(str)[rows]
        fams = p.nets["family"].to_numpy().astype(str)[rows]
        t, w = net_measured(p, rows)
        specific = correction_gpus(p, cfg)
        cv = correction_cv(sums, gpus, modes, fams, t, w, cfg.min_networks_gpu, 3, cfg.correction_ridge, specific)
        chosen = cv.get("chosen", {"time": "none", "power": "none"})
        correction = fit_correction(sums, gpus, modes, t, w, chosen["time"], chosen["power"],
                                    cfg.min_networks_gpu, 3, cfg.correction_ridge, specific,
                                    nonrecurrent_time_variant=chosen.get("nonrecurrent_time"))
        corr_report = {"available": "chosen" in cv, "n_networks": int(len(rows)),
                       "n_families": cv["n_groups"], "mape_by_variant": {k: cv[k] for k in ("time", "power", "energy")},
                       "mape_by_serving_mode": cv.get("by_mode", {}),
                       "chosen": chosen, "time_variants": {k: list(v) for k, v in TIME_VARIANTS.items()},
                       "power_variants": {k: list(v) for k, v in POWER_VARIANTS.items()}}
        f = fp32_rows(p, rows)
        corr_report["by_correction_mode"] = by_correction_mode(cv, sums, t, w, modes)
        if "chosen" in cv:
            oof_t, oof_w = cv["oof_time_ms"][f], cv["oof_power_w"][f]
            lofo["xgboost"]["network_corrected"] = net_breakdown(sums.take(f), oof_t, oof_w, p, rows[f])
            lofo["xgboost"]["network_records"] = records(sums.take(f), oof_t, oof_w, p, rows[f])
            ratios_t = t[f] / oof_t
            ratios_e = (t[f] * w[f]) / (oof_t * oof_w)
            n = lofo["xgboost"]["network_corrected"]["overall"]
            log(f"  network correction time {chosen['time']}, power {chosen['power']}: "
                f"time MAPE {cv['time']['none']:.1f}% -> {cv['time']['chosen']:.1f}%, "
                f"energy {cv['energy']['none']:.1f}% -> {cv['energy']['chosen']:.1f}% [{n['n']} networks]")
        else:
            lofo["xgboost"]["network_records"] = records(sums.take(f), sums.sum_time_ms[f], sums.power_ops_w[f], p,
                                                         rows[f])
    correction.measured_gap_ms, corr_report["measured_gap"] = p.measured_gap
    report["network_correction"] = corr_report
    if ratios_t is not None and len(ratios_t) >= 5:
        source = f"leave-one-family-out corrected network errors ({len(ratios_t)} networks)"
    else:
        pt, pw = op_oof
        ok = np.isfinite(pt)
        ratios_t = meas_t[ok] / pt[ok]
        ratios_e = (meas_t[ok] * meas_w[ok]) / (pt[ok] * pw[ok])
        source = f"grouped-CV per-operation errors ({int(ok.sum())} rows; too few networks)"

    def q(r: np.ndarray) -> list[float]:
        return [float(min(1.0, np.quantile(r, lo_q))), float(max(1.0, np.quantile(r, hi_q)))]

    band = {"quantiles": [lo_q, hi_q], "time_ratio": q(ratios_t), "energy_ratio": q(ratios_e),
            "meaning": "measured / predicted ratio quantiles; low = estimate x lo, high = estimate x hi"}
    return correction, source, band


def leave_one_gpu_out(p: Prepared, suite: Suite, cfg: TrainConfig,
                       net_oof: dict[str, tuple[np.ndarray, NetworkSums]], report: dict[str, Any],
                      log: Callable[[str], None], final: dict[str, Routed] | None = None
                      ) -> tuple[dict[str, Any], tuple[np.ndarray, np.ndarray]]:
    """Hold each GPU out: per-operation error (GPUs with operation rows, when >= 2 have them) and
    whole-network error on the held-out GPU with models and network correction from the others.

    A GPU with network rows but no operation rows (a GPU measured only as whole networks) is
    the realistic "unmeasured GPU" case: every one of its estimates is a cross-GPU extrapolation.
    """
    op_gpus = sorted(set(p.gpus.tolist()))
    net_gpus = sorted(set(p.nets["gpu"].astype(str).tolist())) if len(p.nets) else []
    out: dict[str, Any] = {"available": False, "gpus": {}, "op_level": len(op_gpus) >= 2,
                           "gpus_with_operation_rows": op_gpus, "gpus_with_network_rows": net_gpus}
    chosen = report["network_correction"].get("chosen", {"time": "none", "power": "none"})
    ratios_t: list[float] = []
    ratios_e: list[float] = []
    log("leave-one-GPU-out")
    for gpu in sorted(set(op_gpus) | set(net_gpus)):
        test_idx = np.flatnonzero(p.gpus == gpu)
        train_idx = np.flatnonzero(p.gpus != gpu)
        entry: dict[str, Any] = {"train_ops": int(len(train_idx)), "test_ops": int(len(test_idx))}
        if len(train_idx) < 4:
            entry["skipped"] = "no operation rows of other GPUs to train on"
            out["gpus"][gpu] = entry
            continue
        if len(train_idx) < cfg.logo_min_train_share * len(test_idx):
            # e.g. the H100 held out leaves a handful of other-GPU rows: such a model says
            # nothing about crossing GPUs, and its errors would widen every unmeasured GPU's band
            entry["skipped"] = (f"only {len(train_idx)} operation rows of other GPUs against {len(test_idx)} of "
                                f"this GPU (under {cfg.logo_min_train_share:.0%}): too few for a cross-GPU model")
            log(f"  {gpu}: skipped ({entry['skipped']})")
            out["gpus"][gpu] = entry
            continue
        kinds = suite.kinds() if len(test_idx) else ["xgboost"]
        for kind in kinds:
            if kind == "xgboost" and not len(test_idx) and final is not None:
                models = final  # nothing of this GPU in training: the final models are the held-out models
            else:
                models = suite.fit(kind, p, train_idx)
            entry[kind] = {}
            if len(test_idx):
                pt, pw = predict_ops(models, p, test_idx)
                k = launching_rows(p)[test_idx]
                entry[kind]["per_op"] = breakdown(pt[k], pw[k], p.ops["_t_gpu"].to_numpy()[test_idx][k],
                                                  p.ops["_p_gpu"].to_numpy()[test_idx][k], p.gpus[test_idx][k],
                                                  p.modes[test_idx][k])
                entry[kind]["per_op"]["kernel_free_rows"] = kernel_free_summary(p, test_idx)
                o = entry[kind]["per_op"]["overall"]
                log(f"  {gpu} {kind:16s} per-op MAPE time {o['time']['mape']:.1f}% "
                    f"energy {o['energy']['mape']:.1f}%")
            if kind != "xgboost" or not len(p.nets):
                continue
            # network-level: correction pooled from the other GPUs' out-of-fold networks
            corr = Correction.identity()
            if "xgboost" in net_oof:
                r0, s0 = net_oof["xgboost"]
                keep = p.nets["gpu"].to_numpy()[r0] != gpu
                if keep.sum() >= 3:
                    t0, w0 = net_measured(p, r0[keep])
                    corr = fit_correction(s0.take(keep), np.full(int(keep.sum()), "*"),
                                          p.nets["correction_mode"].to_numpy()[r0][keep], t0, w0, chosen["time"],
                                          chosen["power"], 10**9, 3, cfg.correction_ridge,
                                          nonrecurrent_time_variant=chosen.get("nonrecurrent_time"))
            for label, test_arch in (("train_archs", False), ("test_archs", True)):
                rows = np.flatnonzero((p.nets["gpu"] == gpu).to_numpy() & (p.nets["is_test"].to_numpy() == test_arch)
                                      & p.nets["is_fp32"].to_numpy())
                if not len(rows):
                    continue
                sums = predict_networks(models, p, rows, cfg.small_op_ms)
                ct, cw = np.empty(len(rows)), np.empty(len(rows))
                for j, i in enumerate(rows):
                    a, b, _ = corr.apply(sums.take([j]), "*", str(p.nets["mode"].iat[i]))
                    ct[j], cw[j] = a[0], b[0]
                entry[kind][f"network_{label}_raw"] = net_breakdown(sums, sums.sum_time_ms, sums.power_ops_w, p,
                                                                     rows)
                entry[kind][f"network_{label}_corrected"] = net_breakdown(sums, ct, cw, p, rows)
                entry[kind][f"network_{label}_records"] = records(sums, ct, cw, p, rows)
                t, w = net_measured(p, rows)
                ratios_t += (t / ct).tolist()
                ratios_e += (t * w / (ct * cw)).tolist()
                o = entry[kind][f"network_{label}_corrected"]["overall"]
                log(f"  {gpu} networks of {label.replace('_', ' ')} from other GPUs: time MAPE "
                    f"{o['time']['mape']:.1f}%, energy {o['energy']['mape']:.1f}% [{o['n']} networks]")
            out["available"] = True
        out["gpus"][gpu] = entry
    if not out["available"]:
        out["reason"] = (f"not available: one GPU measured ({op_gpus[0]})" if len(op_gpus) == 1 and not
                         set(net_gpus) - set(op_gpus) else "not available: no second GPU with usable rows")
    return out, (np.array(ratios_t), np.array(ratios_e))


def test_set(p: Prepared, final: dict[str, Routed], correction: Correction, cfg: TrainConfig,
              lookup: MeasuredLookup | None, log: Callable[[str], None]) -> dict[str, Any]:
    """Unseen test architectures (whole networks only), scored with the final model.

    Scored as the predictor runs (measured operations looked up when ``lookup``) and with the
    models alone, so the benefit of the lookup is visible.
    """
    rows = np.flatnonzero(p.nets["is_test"].to_numpy() & p.nets["is_fp32"].to_numpy()) if len(p.nets) else []
    if not len(rows):
        return {"available": False, "reason": "no fp32 networks of TEST_ARCHS measured"}
    out: dict[str, Any] = {"available": True, "archs": sorted(set(p.nets["arch"].to_numpy()[rows].tolist())),
                           "measured_lookup": lookup is not None}
    variants = [("", lookup), ("_model_only", None)] if lookup is not None else [("", None)]
    for suffix, lk in variants:
        sums = predict_networks(final, p, rows, cfg.small_op_ms, lk)
        ct, cw = np.empty(len(rows)), np.empty(len(rows))
        for j, i in enumerate(rows):
            a, b, _ = correction.apply(sums.take([j]), str(p.nets["gpu"].iat[i]), str(p.nets["mode"].iat[i]))
            ct[j], cw[j] = a[0], b[0]
        out["raw" + suffix] = net_breakdown(sums, sums.sum_time_ms, sums.power_ops_w, p, rows)
        out["corrected" + suffix] = net_breakdown(sums, ct, cw, p, rows)
        if not suffix:
            out["records"] = records(sums, ct, cw, p, rows)
        o, r = out["corrected" + suffix]["overall"], out["raw" + suffix]["overall"]
        log(f"test architectures{' (models only)' if suffix else ''}: network MAPE time {r['time']['mape']:.1f}% "
            f"(raw) -> {o['time']['mape']:.1f}%, energy {r['energy']['mape']:.1f}% -> {o['energy']['mape']:.1f}% "
            f"[{o['n']} networks]")
    if lookup is not None:
        hits = total = 0
        for i in rows:
            d = lookup.table.get((str(p.nets["gpu"].iat[i]), str(p.nets["mode"].iat[i])), {})
            sigs = p.net_signatures[p.net_offsets[i]:p.net_offsets[i + 1]]
            hits += sum(s in d for s in sigs)
            total += len(sigs)
        out["lookup_hit_share_ops"] = hits / total if total else 0.0
    return out




def grouped_kfold(p: Prepared, suite: Suite, cfg: TrainConfig, log: Callable[[str], None]
                  ) -> tuple[dict[str, Any], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Per-operation error with every op signature in exactly one test fold; returns the report and
    the out-of-fold (time, power) predictions per model kind."""
    sig_groups = p.ops["op_signature"].to_numpy().astype(str)
    n_rows = len(p.ops)
    meas_t = p.ops["_t_gpu"].to_numpy(dtype=np.float64)
    meas_w = p.ops["_p_gpu"].to_numpy(dtype=np.float64)
    log(f"grouped {cfg.n_folds}-fold CV by op signature")
    folds = grouped_folds(sig_groups, cfg.n_folds, cfg.seed)
    kfold: dict[str, Any] = {"folds": len(folds), "groups": int(len(set(sig_groups.tolist())))}
    oof: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for kind in suite.kinds():
        pt, pw = np.full(n_rows, np.nan), np.full(n_rows, np.nan)
        for train_idx, test_idx in folds:
            models = suite.fit(kind, p, train_idx)
            pt[test_idx], pw[test_idx] = predict_ops(models, p, test_idx)
        oof[kind] = (pt, pw)
        k = launching_rows(p)
        kfold[kind] = breakdown(pt[k], pw[k], meas_t[k], meas_w[k], p.gpus[k], p.modes[k])
        kfold[kind]["kernel_free_rows"] = kernel_free_summary(p)
        o = kfold[kind]["overall"]
        log(f"  {kind:16s} per-op MAPE time {o['time']['mape']:.1f}%  power {o['power']['mape']:.1f}%  "
            f"energy {o['energy']['mape']:.1f}%")
    return kfold, oof


def network_host_inputs(p: Prepared, final: dict[str, Routed], host: Any) -> dict[str, Any] | None:
    """Per network measured both eager and host-free: its row, per-operation GPU times (final
    models), reference-host dispatch, run host scale and offsets into the concatenated arrays
    (None when no network has both)."""
    if not len(p.nets) or p.targets.get("networks") != "host_free" or "time_ms" not in p.nets:
        return None
    eager = p.nets["time_ms"].to_numpy(dtype=np.float64)
    hf = p.nets["_t_gpu"].to_numpy(dtype=np.float64)
    rows = np.flatnonzero(np.isfinite(eager) & (eager > 0) & np.isfinite(hf) & (hf > 0) & p.nets["is_fp32"].to_numpy())
    if not len(rows):
        return None
    idx = np.concatenate([np.arange(p.net_offsets[i], p.net_offsets[i + 1]) for i in rows])
    offsets = np.concatenate([[0], np.cumsum(np.diff(p.net_offsets)[rows])])
    modes = p.net_modes_ops[idx]
    t = np.exp(final["time"].predict(p.net_X["time"][idx], p.net_margin["time"][idx], modes))
    d = np.empty(len(idx))
    for m in MODES:
        sel = modes == m
        if sel.any():
            d[sel] = host.reference_ms(p.net_X["host"][idx][sel], p.net_groups[idx][sel], m)
    return {"rows": rows, "gpu_ms": t, "ref_ms": d, "op_modes": modes, "offsets": offsets,
            "host_scale": p.net_host_scale[rows], "eager_ms": eager[rows], "host_free_ms": hf[rows]}


def fit_host_calibration(p: Prepared, inputs: dict[str, Any] | None,
                         log: Callable[[str], None]) -> tuple[Any, dict[str, Any]]:
    """The NetworkCalibration (gpurec.model.host_model) from the training architectures' networks:
    each network's predicted per-operation GPU times are scaled to its measured host-free time,
    so only the host side is fitted; unseen test architectures are never used."""
    from gpurec.model.host_model import NetworkCalibration, fit_network_calibration

    if inputs is None:
        return NetworkCalibration(), {"note": "no network measured both eager and host-free: uncalibrated"}
    train = np.flatnonzero(~p.nets["is_test"].to_numpy()[inputs["rows"]])
    off = inputs["offsets"]
    gpu, ref = [], []
    for j in train:
        g = inputs["gpu_ms"][off[j]:off[j + 1]]
        gpu.append(g * inputs["host_free_ms"][j] / max(float(g.sum()), 1e-12))
        ref.append(inputs["ref_ms"][off[j]:off[j + 1]])
    rows = inputs["rows"][train]
    return fit_network_calibration(gpu, ref, inputs["host_scale"][train], inputs["eager_ms"][train],
                                   p.nets["mode"].to_numpy()[rows], p.nets["family"].to_numpy()[rows], log)


def host_side_ratios(inputs: dict[str, Any] | None, host: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per network measured both eager and host-free: (measured eager / host-free) over (simulated
    eager / host-free) with the final models, the host model and its network calibration, and the
    network's run host profile. The GPU side cancels, so this is the host side's error; it widens
    the eager bands (in-sample for the GPU models and the calibration: an optimistic floor, said
    so in the manifest)."""
    from gpurec.model.timeline import simulate

    if inputs is None:
        return np.zeros(0), np.zeros(0, dtype=object)
    off = inputs["offsets"]
    scale = np.repeat(inputs["host_scale"], np.diff(off))
    d = np.empty(len(inputs["ref_ms"]))
    for m in MODES:
        sel = inputs["op_modes"] == m
        if sel.any():
            d[sel] = host.calibration.apply(inputs["ref_ms"][sel], m, scale[sel])
    tl = simulate(inputs["gpu_ms"], d, off)
    ratios = (inputs["eager_ms"] / inputs["host_free_ms"]) / (tl.time_ms / np.maximum(tl.gpu_time_ms, 1e-12))
    return ratios, tl.bound
