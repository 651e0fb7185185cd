"""The manifest: what a saved model is, how to rebuild its feature rows, and how well it did.

A saved model describes itself: features and their order, targets and units, the kind
categories, the data hash, library versions, cross-validation scores, the network
correction, the host model and reference host, the waiting power and the uncertainty bands.
"""

from __future__ import annotations

import os
from typing import Any

from gpurec.model._sets import MODES
from gpurec.model.config import TARGETS, UNMEASURED_BAND_WIDENING, TrainConfig
from gpurec.model.features import FEATURE_SCHEMA_VERSION, monotone_constraints, target_mask
from gpurec.model.fitting.data import Prepared
from gpurec.model.host_model import NetworkCalibration
from gpurec.model.network import Correction
from gpurec.model.provenance import library_versions
from gpurec.model.regressors import Routed
from gpurec.ops.precision import precision_or_default


def ranges(p: Prepared, cfg: TrainConfig) -> dict[str, dict[str, list[float]]]:
    """Per mode and kind, min/max of the range-checked features over the training rows."""
    kinds = p.kinds
    out: dict[str, dict[str, list[float]]] = {}
    for mode in MODES:
        out[mode] = {}
        for kind in sorted(set(kinds[p.modes == mode].tolist())):
            sel = (p.modes == mode) & (kinds == kind)
            v = p.range_values[sel]
            out[mode][kind] = [*v.min(axis=0).tolist(), *v.max(axis=0).tolist()]
    return out


def build_manifest(p: Prepared, cfg: TrainConfig, final: dict[str, Routed], correction: Correction,
              band: dict[str, Any], band_source: str, report: dict[str, Any], gpus: list[str],
              band_unmeasured: dict[str, Any], host_report: dict[str, Any], waiting: dict[str, Any],
              host_band: dict[str, Any] | None = None) -> dict[str, Any]:
    """The manifest of a training run (see the module docstring)."""
    from gpurec.model.persist import SCHEMA_VERSION

    def cv_scores(entry: dict[str, Any]) -> dict[str, Any]:
        o = entry.get("overall", {})
        return {t: {k: o.get(t, {}).get(k) for k in ("mape", "within10")} for t in ("time", "power", "energy")} | \
            {"n": o.get("n", 0)}

    lofo = report["leave_one_family_out"].get("xgboost", {})
    cv = {"grouped_kfold_per_op": cv_scores(report["grouped_kfold"]["xgboost"])}
    if "per_op" in lofo:
        cv["lofo_per_op"] = cv_scores(lofo["per_op"])
    if "network_raw" in lofo:
        cv["lofo_network_raw"] = cv_scores(lofo["network_raw"])
    if "network_corrected" in lofo:
        cv["lofo_network_corrected"] = cv_scores(lofo["network_corrected"])
    if report["test_set"].get("available"):
        cv["test_archs_network_corrected"] = cv_scores(report["test_set"]["corrected"])
        if "corrected_model_only" in report["test_set"]:
            cv["test_archs_network_corrected_model_only"] = cv_scores(report["test_set"]["corrected_model_only"])
    return {
        "schema_version": SCHEMA_VERSION,
        "feature_schema_version": FEATURE_SCHEMA_VERSION,
        "created": report["created"],
        "feature_names": p.builder.feature_names,
        "feature_config": p.builder.config.as_dict(),  # cfg.feature with what the data decided
        "extra_columns": p.builder.extra_columns,
        "kind_categories": p.builder.kinds,
        "targets": {t: {**TARGETS[t], "margin": getattr(cfg.feature, f"{t}_margin", "log profile prior")}
                    for t in final},
        "target_sources": p.targets,
        "masked_features": {t: [f for f, m in zip(p.builder.feature_names, target_mask(t, p.builder.feature_names),
                                                  strict=True) if m] for t in final},
        "monotone_features": {t: {f: c for f, c in zip(p.builder.feature_names, mc, strict=True) if c}
                              for t in final if (mc := monotone_constraints(t, p.builder.feature_names))},
        "energy": "gpu_energy_mj = gpu power_w x gpu_time_ms (W x ms = mJ); eager energy_mj adds the waiting "
                  "time at the waiting power; not separate targets",
        "modes": list(MODES),
        "routes": {t: dict(final[t].route_) for t in final},
        "training_data": {"sha256": report["data_sha256"],
                          "hash_of": "cleaned operations and networks tables (gpurec.model.fitting.data.current_data_hash)",
                          "operations": int(len(p.ops)),
                          "networks": int(len(p.nets)), "rows_by_gpu_mode": report["rows"]["by_gpu_mode"]},
        "versions": library_versions(),
        "gpus_measured": gpus,
        # the math modes the operation rows were measured in (the predictor warns outside them)
        "precisions_measured": sorted(set(p.ops["precision"].map(precision_or_default).tolist())
                                      if "precision" in p.ops else ["fp32"]),
        "gpus_networks_measured": sorted(set(p.nets["gpu"].astype(str).tolist())) if len(p.nets) else [],
        "hyperparameters": {t: {"params": next(iter(final[t].models_.values())).params,
                                "rounds": next(iter(final[t].models_.values())).num_rounds} for t in final},
        "cv": cv,
        "network_correction": correction.as_dict() | {"small_op_ms": cfg.small_op_ms},
        # operations that launch no kernel got no GPU time in the correction's sums: so in prediction
        "kernel_free_ops": "no_gpu_time" if p.net_kernel_free is not None else "predicted",
        "uncertainty": {"measured_gpu": band, "source": band_source, "unmeasured_gpu": band_unmeasured,
                        "unmeasured_gpu_widening": UNMEASURED_BAND_WIDENING,
                        "unmeasured_note": "GPUs without operation measurements: band from leave-one-GPU-out "
                                           f"network errors when available, else the measured band widened "
                                           f"{UNMEASURED_BAND_WIDENING:g}x in log space",
                        "host": host_band or {"ratio": [1.0, 1.0]},
                        "eager_note": "time_low/high and energy_low/high (eager) = the GPU band x host.ratio"},
        "host": {"reference": p.reference.to_dict(), "reference_source": p.reference_source,
                 "model": host_report.get("model", "profile_prior"),
                 "network_calibration": host_report.get("network_calibration", {}).get(
                     "calibration", NetworkCalibration().as_dict()),
                 "meaning": "per-operation dispatch is predicted on the reference host; inside a network on "
                            "another host it is (scale x dispatch + per_op_ms) x "
                            "HostProfile.dispatch_scale(reference) ** host_exponent, per mode "
                            "(gpurec.model.host_model.NetworkCalibration)"},
        "waiting_power": waiting,
        # cuDNN LSTM/GRU GPU time: steps x time per step (gpurec.model.recurrent), fitted on all rows
        "recurrent_time": final["time"].override.as_dict() if getattr(final["time"], "override", None) else None,
        "recurrent_power": final["power"].override.as_dict() if getattr(final["power"], "override", None) else None,
        "ranges": {"features": list(cfg.feature.range_features), "tolerance": cfg.feature.range_tolerance,
                   "by_mode_kind": ranges(p, cfg)},
        "train_config": cfg.as_dict(),
        "env": {"GPUREC_MODELS": os.environ.get("GPUREC_MODELS", "")},
    }


