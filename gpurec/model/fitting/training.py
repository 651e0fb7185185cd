"""Train the predictors, validate them without leakage, and persist them.

What is learnt, per operation:

* GPU time and GPU power, on host-free targets where the data has them (gpurec.model.fitting.data
  says which; eager targets for data without host-free rows), one booster per mode, on log targets:
  times span five orders of magnitude and what matters is relative error; power is bounded
  between idle and TDP. GPU energy = power x time, so the three never disagree.  Time has one
  booster per mode and kind group (gpurec.model.config.TIME_KIND_GROUPS: convolutions and batch
  norm, and the rest; ``TrainConfig.time_kind_groups=False`` for one per mode).
* Host dispatch on the reference host (gpurec.model.host_model), from ``host_ms`` rows.

Per network: the whole-network correction of the GPU time and power (fitted on out-of-fold
sums, kept only where it helps) and the power the GPU draws while it waits for the host.

The run is split by concern: data preparation (gpurec.model.fitting.data), tuning
(gpurec.model.fitting.tuning), validation schemes (gpurec.model.fitting.validation), the manifest
(gpurec.model.fitting.manifest). Unseen test architectures are never trained on; they are scored at
the end with the final model. ``gpurec train`` (cli.py) calls :func:`train`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from gpurec.model._sets import MODES
from gpurec.model.config import TARGETS, TrainConfig
from gpurec.model.features import MeasuredLookup, monotone_constraints
from gpurec.model.fitting.data import current_data_hash, prepare
from gpurec.model.fitting.evaluate import arch_of
from gpurec.model.fitting.host_fit import fit_host_model
from gpurec.model.fitting.manifest import build_manifest
from gpurec.model.fitting.recurrent_fit import fit_recurrent_host
from gpurec.model.fitting.tuning import auto_nthread, tune_xgboost
from gpurec.model.fitting.validation import (
    GPU_TARGETS,
    Suite,
    fit_host_calibration,
    fit_recurrent_rows,
    grouped_kfold,
    host_side_ratios,
    leave_one_family_out,
    leave_one_gpu_out,
    network_correction,
    network_host_inputs,
    test_set,
)
from gpurec.model.network import fit_waiting_power
from gpurec.model.provenance import dumps, library_versions

__all__ = ["TARGETS", "TrainConfig", "current_data_hash", "dumps", "library_versions", "train"]


def _unmeasured_band(cross_t: np.ndarray, cross_e: np.ndarray, cfg: TrainConfig) -> dict[str, Any]:
    lo_q, hi_q = cfg.band_quantiles
    if len(cross_t) < 5:
        return {"source": "no cross-GPU validation possible: measured band widened in log space"}

    def q(r: np.ndarray) -> list[float]:
        return [float(min(1.0, np.quantile(r, lo_q))), float(max(1.0, np.quantile(r, hi_q)))]

    return {"quantiles": [lo_q, hi_q], "time_ratio": q(cross_t), "energy_ratio": q(cross_e),
            "source": f"leave-one-GPU-out corrected network errors ({len(cross_t)} networks)"}


def _host_band(ratios_bounds: tuple[np.ndarray, np.ndarray], cfg: TrainConfig) -> dict[str, Any]:
    """Quantiles of the host side's error (validation.host_side_ratios), overall and per simulated
    bound: a GPU-bound step hardly moves with the host, a host-bound one moves with it, so one
    pooled band would make GPU-bound eager bands far too wide.  Eager bands are the GPU bands
    times these."""
    ratios, bounds = ratios_bounds
    lo_q, hi_q = cfg.band_quantiles
    if len(ratios) < 5:
        return {"ratio": [1.0, 1.0], "n": int(len(ratios)),
                "source": "no networks measured both eager and host-free: eager bands = GPU bands"}

    def q(r: np.ndarray) -> list[float]:
        return [float(min(1.0, np.quantile(r, lo_q))), float(max(1.0, np.quantile(r, hi_q)))]

    by_bound = {b: {"ratio": q(ratios[bounds == b]), "n": int((bounds == b).sum())}
                for b in ("gpu", "host") if (bounds == b).sum() >= 5}
    return {"ratio": q(ratios), "n": int(len(ratios)), "quantiles": [lo_q, hi_q], "by_bound": by_bound,
            "source": "(measured eager / host-free) / (simulated eager / host-free) of the training networks, "
                      "each with its run's host profile, per simulated bound; in-sample for the GPU models"}


def _reused_tuning(path: str) -> dict[str, Any]:
    """The tuned parameters of an earlier run's report.json, per GPU target that has them."""
    import json

    tuning = json.loads(Path(path).read_text()).get("tuning", {})
    return {t: v for t, v in tuning.items() if t in GPU_TARGETS and "best_params" in v and "rounds" in v}


def train(data_root: Path | str | None = None, out_dir: Path | str = "models", tune_trials: int = 20,
          seed: int = 0, config: TrainConfig | None = None, log: Callable[[str], None] = print,
          **overrides: Any) -> dict[str, Any]:
    """Train, validate and save the predictors; returns the report (also in out_dir/report.json).

    ``data_root`` defaults to the shipped ``datasets/`` (gpurec.dataset); ``overrides`` set
    TrainConfig fields (e.g. ``n_folds=3, max_rounds=50`` for a quick run).
    """
    from gpurec.model.persist import check_output_dir

    check_output_dir(out_dir)  # now, not after the training
    cfg = replace(config or TrainConfig(), tune_trials=tune_trials, seed=seed, **overrides)
    if cfg.nthread is None:
        cfg = replace(cfg, nthread=auto_nthread())
    t_start = time.perf_counter()
    outer_log = log

    def log(msg: str) -> None:  # noqa: F811 - the same logger, with elapsed seconds
        outer_log(f"[{time.perf_counter() - t_start:6.1f} s] {msg}")

    p = prepare(data_root, cfg.feature, cfg.time_target, cfg.gpu_time_source, cfg.cache_dir, log)
    if len(p.ops) < 4:
        raise ValueError(f"only {len(p.ops)} usable operation rows: too few to train")
    if p.targets.get("note"):
        log(f"note: {p.targets['note']}")
    n_rows = len(p.ops)
    sig_groups = p.ops["op_signature"].to_numpy().astype(str)
    gpus_measured = sorted(set(p.gpus.tolist()))
    report: dict[str, Any] = {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                              "config": cfg.as_dict(), **p.report,
                              "rows": {"operations": n_rows, "networks_train_archs": int((~p.nets["is_test"]).sum())
                                       if len(p.nets) else 0,
                                       "networks_test_archs": int(p.nets["is_test"].sum()) if len(p.nets) else 0,
                                       "by_gpu_mode": {f"{g}|{m}": int(((p.gpus == g) & (p.modes == m)).sum())
                                                       for g in gpus_measured for m in MODES}},
                              "gpus_measured": gpus_measured}

    # -- tuning --------------------------------------------------------------------------------
    params: dict[str, dict[str, Any]] = {}
    rounds: dict[str, int] = {}
    report["tuning"] = {}
    reused = _reused_tuning(cfg.reuse_tuning) if cfg.reuse_tuning else {}
    for target in GPU_TARGETS:
        if target in reused:
            params[target], rounds[target] = dict(reused[target]["best_params"]), int(reused[target]["rounds"])
            report["tuning"][target] = {**reused[target], "reused_from": cfg.reuse_tuning}
            log(f"tuning {target}: reused from {cfg.reuse_tuning} ({rounds[target]} rounds)")
            continue
        log(f"tuning {target} ({cfg.tune_trials} trials)")
        params[target], rounds[target], report["tuning"][target] = tune_xgboost(
            p.X[target], p.y[target], p.margin[target], sig_groups, cfg, log,
            monotone_constraints(target, p.builder.feature_names))
    suite = Suite(cfg, params, rounds, p.builder.feature_names)
    meas_t = p.ops["_t_gpu"].to_numpy(dtype=np.float64)
    meas_w = p.ops["_p_gpu"].to_numpy(dtype=np.float64)

    # -- validation: grouped K-fold, leave one family out, network correction ------------------
    report["grouped_kfold"], op_oof = grouped_kfold(p, suite, cfg, log)
    report["leave_one_family_out"], net_oof = leave_one_family_out(p, suite, cfg, log)
    correction, band_source, band = network_correction(p, net_oof, op_oof["xgboost"], meas_t, meas_w, cfg, report,
                                                       log)

    # -- final models ---------------------------------------------------------------------------
    log("final models on all rows")
    final = suite.fit("xgboost", p, np.arange(n_rows))
    (_, report["recurrent_time"]), (_, report["recurrent_power"]) = fit_recurrent_rows(p, np.arange(n_rows))
    host, host_routed, report["host_dispatch"] = fit_host_model(p, cfg, log)
    host_keys = p.ops["set_key"].to_numpy()[p.host_rows]
    host.recurrent, report["recurrent_host"] = fit_recurrent_host(
        p.X["host"][p.host_rows], p.host_y, p.modes[p.host_rows], [arch_of(str(k)) for k in host_keys],
        p.builder.feature_names)
    host_inputs = network_host_inputs(p, final, host)
    host.calibration, report["host_dispatch"]["network_calibration"] = fit_host_calibration(p, host_inputs, log)
    host_band = _host_band(host_side_ratios(host_inputs, host), cfg)
    report["host_dispatch"]["eager_band"] = host_band
    report["waiting_power"] = waiting = fit_waiting_power(p.nets)
    log(f"waiting power: {waiting['source']}")

    # -- leave one GPU out, unseen test architectures -------------------------------------------
    report["leave_one_gpu_out"], (cross_t, cross_e) = leave_one_gpu_out(p, suite, cfg, net_oof, report, log, final)
    band_unmeasured = _unmeasured_band(cross_t, cross_e, cfg)
    lookup = MeasuredLookup.from_frame(p.ops, "_t_gpu", "_p_gpu") if cfg.use_measured else None
    report["test_set"] = test_set(p, final, correction, cfg, lookup, log)
    report["seconds"] = time.perf_counter() - t_start

    from gpurec.model.persist import save_model

    models = dict(final) | ({"host": host_routed} if host_routed is not None else {})
    manifest = build_manifest(p, cfg, models, correction, band, band_source, report, gpus_measured,
                              band_unmeasured, report["host_dispatch"], waiting, host_band)
    manifest["recurrent_host"] = host.recurrent.as_dict() if host.recurrent is not None else None
    # half-precision products with an unaligned weight, and wide ones (gpurec.model.gemm): fitted on
    # the rows' unmasked features, after the boosters; the test-set scoring above is without them
    from gpurec.model.fitting.gemm_fit import fit_floor_on_data, fit_wide_on_data
    from gpurec.model.gemm import GEMM_FLOOR_KEY, WIDE_KEY

    floor, report["unaligned_gemm_floor"] = fit_floor_on_data(data_root, p.builder)
    manifest[GEMM_FLOOR_KEY] = floor.as_dict() if floor is not None else None
    wide, report["wide_half_gemm"] = fit_wide_on_data(data_root, p.builder)
    manifest[WIDE_KEY] = wide.as_dict() if wide is not None else None
    save_model(Path(out_dir), models, manifest, report, lookup)
    log(f"saved to {out_dir} in {report['seconds']:.0f} s (host dispatch: {host.kind})")
    return report
